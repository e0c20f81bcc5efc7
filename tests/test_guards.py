"""In-process guards around the kernel call: a kernel that exits, interrupts or prints costs its own case only.

`sys.exit` and `KeyboardInterrupt` inside a kernel are that case's error, never the tool's exit
code, and the next case still runs; what a kernel prints (from Python or at the file-descriptor
level) lands in its case's `stdout`, not in the report. Driven through the CLI, as a user would.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from pathlib import Path

import pytest
import torch

from ssmcheck import api
from ssmcheck.core.capture import Transcript, captured_stdout
from ssmcheck.core.guard import guarded_call
from ssmcheck.drift import run as drift_run
from tests.cli_invoke import invoke

KERNELS = Path(__file__).parent / "misbehaving_kernels.py"
# The guard kernels misbehave at batch 1 only: the batch-2 case runs after them.
SCAN = ("--preset", "smoke", "--regime", "normal", "--batch", "1,2")
DRIFT = ("--preset", "smoke", "--regime", "normal", "--rounding", "nearest", "--batch", "1,2")
MISBEHAVIOURS = [
    ("sys_exit_0", "SystemExit: 0 (the kernel called sys.exit)"),
    ("sys_exit_3", "SystemExit: 3 (the kernel called sys.exit)"),
    ("keyboard_interrupt", "KeyboardInterrupt raised by the kernel"),
]


def _statuses(report) -> list[str]:
    return [case["status"] for case in report["cases"]]


@pytest.mark.parametrize(("name", "message"), MISBEHAVIOURS)
def test_a_scan_kernel_that_exits_or_interrupts_is_its_case_error(tmp_path, name, message):
    result, report = invoke("scan", "--kernel", f"{KERNELS}:scan_{name}", *SCAN, json_path=tmp_path / "r.json")
    assert result.exit_code == 4, result.output  # the verdict's code (error), not the kernel's
    assert _statuses(report) == ["error", "pass"]
    assert report["cases"][0]["message"] == message


@pytest.mark.parametrize(("name", "message"), MISBEHAVIOURS)
def test_a_drift_kernel_that_exits_or_interrupts_is_its_case_error(tmp_path, name, message):
    result, report = invoke("drift", "--kernel", f"{KERNELS}:drift_{name}", *DRIFT, json_path=tmp_path / "r.json")
    assert result.exit_code == 4, result.output
    assert _statuses(report) == ["error", "pass"]
    assert report["cases"][0]["message"] == f"{message} (trial 0, step 1)"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
@pytest.mark.parametrize("command", ["scan", "drift"])
def test_a_kernel_that_needs_cuda_on_the_cpu_is_told_so(tmp_path, command):
    # mamba_ssm's kernels on the CPU raised "TypeError: '<' not supported between instances of 'NoneType'
    # and 'int'" from inside torch.cuda: the message now names the call and the reason.
    args = SCAN if command == "scan" else DRIFT
    result, report = invoke(command, "--kernel", f"{KERNELS}:{command}_cuda_only", *args,
                            json_path=tmp_path / "r.json")
    assert result.exit_code == 4, result.output
    assert _statuses(report) == ["error", "pass"]
    message = report["cases"][0]["message"]
    assert message.startswith("TypeError: '<' not supported"), message
    assert re.search(r"\(the kernel called torch\.cuda at \S*misbehaving_kernels\.py:\d+, and this machine has no "
                     r"CUDA GPU\)", message), message


def _printed_only_under_cases(stdout: str) -> bool:
    """The kernel's noise appears only indented under a `stdout of CASE:` title, never in the table."""
    lines = stdout.splitlines()
    noisy = [i for i, line in enumerate(lines) if "noise" in line]
    return bool(noisy) and all(lines[i].startswith("  ") for i in noisy) and lines[noisy[0] - 1].startswith("stdout of ")


def test_what_a_scan_kernel_prints_goes_to_its_case(tmp_path):
    result, report = invoke("scan", "--kernel", f"{KERNELS}:scan_printing", *SCAN, json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert _printed_only_under_cases(result.stdout)
    # Printed in every call of each case: as it is, and without D and z (the SSM part); in bf16 also for y alone
    # with D and z (the training forward's call: scan.run.judges_y_alone); on a GPU also in the warm-up call before
    # a shape's first case in the process (which compiles Triton kernels untimed).
    calls = [2 + (case["params"]["dtype"] == "bf16") + (case["warmup_seconds"] is not None)
             for case in report["cases"]]
    assert [case["stdout"] for case in report["cases"]] == ["noise\nc-level noise\n" * n for n in calls]


def test_what_a_drift_kernel_prints_accumulates_over_its_steps(tmp_path):
    result, report = invoke("drift", "--kernel", f"{KERNELS}:drift_printing", *DRIFT, "--steps", "5",
                            json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert _printed_only_under_cases(result.stdout)
    assert [case["stdout"] for case in report["cases"]] == ["noise\nc-level noise\n" * 5] * 2


def test_a_quiet_kernel_has_an_empty_stdout(tmp_path):
    _, report = invoke("drift", "--kernel", "torch", *DRIFT, "--steps", "2", json_path=tmp_path / "r.json")
    assert [case["stdout"] for case in report["cases"]] == ["", ""]


# ---------------------------------------------------------------------------- the capture itself


def _fd1_target() -> tuple[int, int]:
    st = os.fstat(1)
    return st.st_dev, st.st_ino


def test_the_capture_restores_fd_1_and_sys_stdout_even_when_the_call_raises():
    before, stream = _fd1_target(), sys.stdout
    transcript = Transcript()
    with pytest.raises(ValueError), captured_stdout(transcript):
        print("before the error")
        raise ValueError
    assert _fd1_target() == before and sys.stdout is stream
    assert transcript.text == "before the error\n"


def test_the_capture_keeps_the_start_and_counts_the_rest():
    transcript = Transcript(limit=10)
    for _ in range(3):
        with captured_stdout(transcript):
            os.write(1, b"0123456789abcdef")
    assert transcript.text == "0123456789\n[... 38 more bytes not kept]"


def test_an_exception_without_a_message_is_described_by_where_it_was_raised(tmp_path, monkeypatch):
    """mamba_ssm's varlen chunk scan rejects per-sequence initial states with a bare `assert`: the
    case's message names the file, line and source of the assertion instead of 'AssertionError'."""
    from ssmcheck.core.guard import describe

    package = tmp_path / "peerpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "ops.py").write_text("def scan(n):\n    assert n == 1\n    return n\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from peerpkg import ops

    with pytest.raises(AssertionError) as raised:
        ops.scan(3)
    assert describe(raised.value) == "AssertionError at peerpkg/ops.py:2: assert n == 1"
    assert describe(ValueError("bad shape\n")) == "ValueError: bad shape"  # never raised: nowhere to name
    assert describe(KeyError()) == "KeyError"  # never raised: no traceback to name


def test_an_exception_with_a_message_names_the_line_outside_torch_that_raised_it(tmp_path, monkeypatch):
    """mamba_ssm 2.3.2's state update given no dt_bias raises "'NoneType' object has no attribute 'stride'"
    from its own wrapper: the message says whose line. A failure inside a torch op is placed at the kernel's
    line that called it, not in torch."""
    from ssmcheck.core.guard import describe

    package = tmp_path / "updatepkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "update.py").write_text("import torch\n\n\ndef update(bias=None):\n    return bias.stride(-1)\n\n\n"
                                       "def mismatched():\n    return torch.ones(2, 3) @ torch.ones(2, 3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from updatepkg import update

    with pytest.raises(AttributeError) as raised:
        update.update()
    assert describe(raised.value) == ("AttributeError: 'NoneType' object has no attribute 'stride' "
                                      "(raised at updatepkg/update.py:5)")
    with pytest.raises(RuntimeError) as raised:
        update.mismatched()
    assert describe(raised.value).endswith(" (raised at updatepkg/update.py:9)")


def test_a_drift_case_our_side_fails_to_measure_is_that_case_error_and_the_sweep_goes_on(monkeypatch):
    make_problem = drift_run.make_problem

    def failing_in_stagnation(regime, *args, **kwargs):
        if regime == "stagnation":
            raise RuntimeError("a planted failure of ssmcheck's own")
        return make_problem(regime, *args, **kwargs)

    monkeypatch.setattr(drift_run, "make_problem", failing_in_stagnation)
    raising_line = failing_in_stagnation.__code__.co_firstlineno + 2
    report = api.drift(kernel="torch", preset="smoke")
    by_regime = {}
    for case in report.cases:
        by_regime.setdefault(case.params["regime"], set()).add((case.status, case.message))
    assert by_regime["stagnation"] == {("error", "measuring the case raised RuntimeError: a planted failure of "
                                                 f"ssmcheck's own (raised at test_guards.py:{raising_line})")}
    assert {status for status, _ in by_regime["normal"]} == {"pass"}


def test_a_kernels_runtime_warnings_are_dropped_and_others_kept():
    # numpy's RuntimeWarnings from Triton's interpreter (masked lanes: exp overflow, 0/0) flooded stderr in
    # `drift --regime dt-extreme` on the CPU; a kernel's other warnings, and the caller's, still show.
    def kernel():
        warnings.warn("overflow encountered in exp", RuntimeWarning)
        warnings.warn("a deprecated keyword", DeprecationWarning)
        return 7

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert guarded_call(kernel, (), {}, None) == 7
        warnings.warn("the caller's own", RuntimeWarning)
    assert [(w.category, str(w.message)) for w in seen] == [(DeprecationWarning, "a deprecated keyword"),
                                                             (RuntimeWarning, "the caller's own")]
