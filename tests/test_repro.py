"""Reproducers (`scan --repro DIR`, issue #11): a failing case shrunk and written as a standalone script that
reproduces the verdict in a fresh process, without ssmcheck; nothing written for passing cases; usage errors."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import torch
from cli_invoke import assert_usage_error, invoke

from ssmcheck.core.status import Status
from ssmcheck.scan import repro
from ssmcheck.scan.results import ScanResult
from ssmcheck.scan.spec import ScanCase

ROOT = Path(__file__).resolve().parent.parent
WIDTHS = ["--nheads", "4", "--headdim", "16", "--dstate", "16", "--ngroups", "1"]


def _run_script(folder: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # for the kernels under test, which import ssmcheck's
    env.pop("TRITON_INTERPRET", None)  # the script chooses the interpreter itself, before importing triton
    return subprocess.run([sys.executable, str(Path(folder) / "repro.py")], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def test_script_needs_no_ssmcheck():
    tree = ast.parse(repro.SCRIPT.read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported and not any(name.partition(".")[0] == "ssmcheck" for name in imported), imported


def test_planted_nan_reproduces_in_a_fresh_process(tmp_path):
    out = tmp_path / "repros"
    result, report = invoke("scan", "--kernel", "tests/broken_scan_kernels.py:nan_in_partial_last_chunk",
                            "--regime", "normal", "--dtype", "bf16", "--seqlen", "200", "--chunk-size", "32",
                            "--batch", "2", *WIDTHS, "--repro", out, "--quiet", json_path=tmp_path / "r.json")
    assert result.exit_code == 3, result.output
    case = report["cases"][0]
    assert case["status"] == "nonfinite" and Path(case["repro"]) == out / case["id"]
    run = _run_script(case["repro"], tmp_path)
    assert run.returncode == 3, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    shrunk = lines[0]
    assert "L200" not in shrunk and "-b1-" in shrunk, shrunk  # fewer tokens, one row
    assert lines[-1].startswith("nonfinite: y non-finite from sequence 0 token"), run.stdout


def _script_verdict_on_a_bias(tmp_path, kernel: str, output: str, *options: str,
                              signed: str = "signed error") -> str:
    """The last line the reproducer prints for the one case of `options`, which fails on `output`'s rounding bias
    alone in the sweep and must in the script too (exit 1, on that bias: its mean `signed` negative)."""
    out = tmp_path / "repros"
    result, report = invoke("scan", "--kernel", f"tests/broken_scan_kernels.py:{kernel}", *options, "--repro", out,
                            "--quiet", json_path=tmp_path / "r.json")
    case = report["cases"][0]
    assert result.exit_code == 1 and case["message"].startswith(f"{output} stored with a bias"), result.output
    run = _run_script(case["repro"], tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    last = run.stdout.splitlines()[-1]
    assert last.startswith("fail: ") and f"{output} stored with a bias: mean {signed} -0." in last, run.stdout
    return last


def test_y_stored_toward_zero_reproduces_on_its_bias(tmp_path):
    """A case that fails on y's rounding bias alone fails the script too, on the bias."""
    _script_verdict_on_a_bias(tmp_path, "y_stored_toward_zero", "y", "--regime", "normal", "--dtype", "bf16",
                              "--seqlen", "64", "--chunk-size", "16", "--batch", "2", "--nheads", "2", "--headdim",
                              "16", "--dstate", "8", "--ngroups", "1")


def test_y_stored_toward_minus_inf_reproduces_on_its_bias_toward_plus_inf(tmp_path):
    """A y rounded down whatever its sign cancels along its values of both signs: the sweep and the script both fail
    it on the mean signed toward +inf."""
    _script_verdict_on_a_bias(tmp_path, "y_stored_toward_minus_inf", "y", "--regime", "normal", "--dtype", "bf16",
                              "--seqlen", "64", "--chunk-size", "16", "--batch", "1", "--nheads", "2", "--headdim",
                              "16", "--dstate", "8", "--ngroups", "1", signed="error signed toward +inf")


def test_final_states_stored_toward_zero_reproduce_on_their_bias(tmp_path):
    """A case that fails on its final states' rounding bias alone (fp16 states, stored toward zero) fails the script
    too, on that bias: the script passes the kernel the state options the sweep did."""
    last = _script_verdict_on_a_bias(tmp_path, "final_states_stored_toward_zero", "final states", "--regime",
                                     "ragged", "--dtype", "fp16", "--state-dtype", "fp16", "--seqlen", "100",
                                     "--chunk-size", "32", "--batch", "3", "--nheads", "4", "--headdim", "16",
                                     "--dstate", "16", "--ngroups", "2")
    assert "y stored" not in last


def _script_verdict_on_another_call(tmp_path, kernel: str, call: str) -> str:
    """The last line the reproducer prints for a ragged bf16 case that fails through `call` alone (the timed call
    is right): it must fail the script too (exit 1), naming that call."""
    out = tmp_path / "repros"
    result, report = invoke("scan", "--kernel", f"tests/broken_scan_kernels.py:{kernel}", "--regime", "ragged",
                            "--dtype", "bf16", "--seqlen", "200", "--chunk-size", "64", "--batch", "3", *WIDTHS,
                            "--repro", out, "--quiet", json_path=tmp_path / "r.json")
    case = report["cases"][0]
    assert result.exit_code == 1 and case["message"].startswith(call), result.output
    run = _run_script(case["repro"], tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    last = run.stdout.splitlines()[-1]
    assert last.startswith("fail: ") and call in last, run.stdout
    return last


def test_a_case_run_on_int32_after_a_refusal_of_int64_reproduces_on_int32(tmp_path):
    """`ragged` passes int64 indices; a kernel that refuses them runs on int32, and so does its reproducer, which
    fails on the kernel's wrong y where, on int64, it would only have met the refusal again."""
    out = tmp_path / "repros"
    result, report = invoke("scan", "--kernel", "tests/broken_scan_kernels.py:cu_seqlens_int32_only_y_off", "--regime",
                            "ragged", "--dtype", "fp32", "--seqlen", "64", "--chunk-size", "16", "--batch", "3",
                            *WIDTHS, "--repro", out, "--quiet", json_path=tmp_path / "r.json")
    case = report["cases"][0]
    assert result.exit_code == 1 and "the kernel refused int64 cu_seqlens and seq_idx (" in case["inputs"], result.output
    shrunk = torch.load(Path(case["repro"]) / "inputs.pt", weights_only=False)
    assert shrunk["kwargs"]["cu_seqlens"].dtype == shrunk["kwargs"]["seq_idx"].dtype == torch.int32
    run = _run_script(case["repro"], tmp_path)
    assert run.returncode == 1 and run.stdout.splitlines()[-1].startswith("fail: y error "), run.stdout + run.stderr


def test_y_alone_failure_reproduces(tmp_path):
    """A kernel wrong only when called for y alone (a training forward's call) fails the script on that call's y,
    where the script once re-ran the timed call alone and printed pass."""
    last = _script_verdict_on_another_call(tmp_path, "y_alone_without_d", "the call without the return flags")
    assert "y of the call without the return flags error" in last and "states error" not in last


def test_both_flags_failure_reproduces(tmp_path):
    """A kernel whose final state of a packed row is the whole row's (both return flags, as Mamba2's inference
    prefill calls it) fails the script on that final state, beside its own last sequence's varlen state."""
    last = _script_verdict_on_another_call(tmp_path, "final_state_of_the_whole_row", "the call with both return flags")
    assert "final states of the call with both return flags, off its last sequence's varlen state error" in last


def _seed_check_failure(tmp_path, kernel: str) -> tuple[str, str, int]:
    """(the sweep's message, the script's last line, its exit code) for the ragged fp16-state stochastic case of a
    scan kernel that fails the seed check alone."""
    out = tmp_path / "repros"
    result, report = invoke("scan", "--kernel", f"tests/broken_scan_kernels.py:{kernel}", "--regime", "ragged",
                            "--dtype", "fp32", "--chunk-size", "64", "--seqlen", "40", "--batch", "3", *WIDTHS,
                            "--state-dtype", "fp16", "--rounding", "stochastic", "--repro", out, "--quiet",
                            json_path=tmp_path / "r.json")
    case = report["cases"][0]
    assert result.exit_code == 1, result.output
    run = _run_script(case["repro"], tmp_path)
    return case["message"], run.stdout.splitlines()[-1], run.returncode


def test_seed_ignored_reproduces_on_the_seed_check(tmp_path):
    """A kernel that takes the state options and rounds to nearest when told stochastic fails the sweep's seed check
    alone; the script calls it again with another seed and fails it on the same bits."""
    message, last, code = _seed_check_failure(tmp_path, "stochastic_rounding_to_nearest")
    assert message.startswith("stochastic rounding: its states stored with two seeds are the same bits"), message
    assert code == 1 and last.startswith("fail: stochastic rounding: its states stored with two seeds are the same "
                                         "bits in all"), last


def test_a_seed_cut_to_a_byte_reproduces_on_the_flipped_bit(tmp_path):
    """A kernel keyed on `seed % 256` passes seed + 1 and fails the seed with bit 30 flipped, in the sweep and in the
    script, which makes the same third call."""
    message, last, code = _seed_check_failure(tmp_path, "stochastic_rounding_from_an_8_bit_seed")
    expected = "stochastic rounding: its states stored with seeds that differ only in bit 30 are the same bits"
    assert message.startswith(expected), message
    assert code == 1 and last.startswith(f"fail: {expected} in all"), last
    assert last.endswith("the rounding does not depend on bit 30 of the seed"), last


def test_the_scripts_seed_check_passes_two_draws():
    """The script's seed check fails equal bits only: two states that differ in one element pass it."""
    spec = importlib.util.spec_from_file_location("repro_script", repro.SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    first = torch.randn(64, 16, generator=torch.Generator().manual_seed(3)).to(torch.float16)
    second = first.clone()
    check = {"expected": 30.0, "false_alarm": 1e-9}
    assert "the same bits in all 1024 elements" in script.seed_ignored(first, second, check)
    second.view(torch.int16)[5, 7] += 1  # the next fp16 value of the same sign
    assert second[5, 7] != first[5, 7] and script.seed_ignored(first, second, check) is None
    assert script.seed_ignored(first, first.clone(), {**check, "expected": 5.0}) is None  # e^-5: no alarm


def test_failed_serving_checks_are_named_as_not_made(tmp_path):
    """A case that fails a serving-shaped check alone (a kernel whose results depend on the packing, --invariance)
    gets a script that says it does not make that check's calls, before judging the kernel's own."""
    out = tmp_path / "repros"
    result, report = invoke("scan", "--kernel", "tests/serving_kernels.py:batch_dependent", "--regime", "normal",
                            "--dtype", "fp32", "--seqlen", "100", "--chunk-size", "32", "--batch", "2", *WIDTHS,
                            "--invariance", "--repro", out, "--quiet", json_path=tmp_path / "r.json")
    case = report["cases"][0]
    assert result.exit_code == 1 and case["message"].startswith("batch invariance"), result.output
    run = _run_script(case["repro"], tmp_path)
    lines = run.stdout.splitlines()
    assert run.returncode == 0 and lines[-1].startswith("pass: "), run.stdout + run.stderr
    assert lines[-2].startswith("not made here: the serving-shaped checks that failed in ssmcheck (batch;"), run.stdout


def test_config_only_bug_reproduces_with_its_config(tmp_path):
    out = tmp_path / "repros"
    result, report = invoke("scan", "--kernel", "tests.tuned_kernels.scan:chunk_scan", "--configs", "all",
                            "--regime", "normal", "--dtype", "fp32", "--seqlen", "40", "--chunk-size", "16",
                            "--batch", "1", *WIDTHS, "--repro", out, "--quiet", json_path=tmp_path / "r.json")
    failing = [c for c in report["cases"] if c["status"] != "pass"]
    assert result.exit_code in (1, 3) and len(failing) == 1, result.output
    status, index = failing[0]["status"], failing[0]["params"]["config"]["index"]
    assert [c["repro"] for c in report["cases"] if c["status"] == "pass"] == [None]
    run = _run_script(failing[0]["repro"], ROOT)
    assert run.returncode == result.exit_code, run.stdout + run.stderr
    assert f"pinned _copy_kernel config {index}:" in run.stdout
    assert run.stdout.splitlines()[-1].startswith(f"{status}: y "), run.stdout


def test_the_terminal_names_each_reproducer(tmp_path):
    """Below the failing case's line, the terminal report names the script --repro wrote for it."""
    out = tmp_path / "repros"
    result, report = invoke("scan", "--kernel", "tests/broken_scan_kernels.py:y_alone_without_d", "--regime", "ragged",
                            "--dtype", "bf16", "--seqlen", "200", "--chunk-size", "64", "--batch", "3", *WIDTHS,
                            "--repro", out, json_path=tmp_path / "r.json")
    case = report["cases"][0]
    lines = result.output.splitlines()
    at = lines.index(next(line for line in lines if line.startswith(f"fail: {case['id']}: ")))
    assert lines[at + 1] == f"reproducer: {case['id']}: {Path(case['repro']) / 'repro.py'}", result.output


def test_passing_cases_write_nothing(tmp_path):
    out = tmp_path / "repros"
    result, report = invoke("scan", "--regime", "normal", "--dtype", "fp32", "--seqlen", "40", "--chunk-size", "16",
                            "--batch", "1", *WIDTHS, "--repro", out, "--quiet", json_path=tmp_path / "r.json")
    assert result.exit_code == 0 and report["cases"][0]["repro"] is None
    assert not out.exists() or not any(out.iterdir())


def test_repro_must_be_a_folder(tmp_path):
    existing = tmp_path / "file.txt"
    existing.write_text("")
    result, _ = invoke("scan", "--regime", "normal", "--repro", existing)
    assert_usage_error(result, "--repro")


def _case(**params) -> ScanCase:
    base = dict(kernel="k", regime="normal", dtype="bf16", chunk_size=16, seqlen=100, batch=4, nheads=8, headdim=16,
                dstate=32, ngroups=2, state_dtype="fp32", rounding="nearest", model=None, seed=7)
    return ScanCase(**{**base, **params})


def test_shrink_keeps_the_status():
    """A bug that needs a partial last chunk and a second head shrinks to one row, the partial chunk alone,
    two heads of one group, and the smallest widths tried; every case run was smaller than the last kept."""
    runs = []

    def run(case: ScanCase) -> ScanResult:
        runs.append(case)
        broken = case.seqlen % case.chunk_size != 0 and case.nheads >= 2
        return ScanResult(case, Status.NONFINITE if broken else Status.PASS)

    small, result = repro.shrink(_case(), Status.NONFINITE, run)
    assert result.status is Status.NONFINITE and result.case == small
    assert (small.batch, small.seqlen, small.ngroups, small.nheads, small.headdim, small.dstate) == (1, 4, 1, 2, 4, 8)
    assert len(runs) <= repro.SHRINK_RUNS + 1
