"""The Python API as a kernel author uses it: callables, module paths and named kernels, Reports, errors."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

import ssmcheck
from ssmcheck import api
from ssmcheck.scan.adapter import torch_kernel

BROKEN = Path(__file__).with_name("broken_scan_kernels.py")
_spec = importlib.util.spec_from_file_location("broken_scan_kernels_constants", BROKEN)
bk = importlib.util.module_from_spec(_spec)  # for the broken kernel's constants
_spec.loader.exec_module(bk)


def my_chunk_scan(*args, **kwargs):
    """A user's kernel, handed over as a callable (the torch baseline behind the mamba signature)."""
    return torch_kernel(*args, **kwargs)


def test_scan_takes_a_callable_and_returns_a_report(capsys):
    report = ssmcheck.scan(kernel=my_chunk_scan, preset="smoke", regime=["normal", "ragged"], dtype="fp16")
    assert capsys.readouterr().out == ""  # prints nothing
    assert report.exit_code == 0 and report.summary["pass"] == 2 and report.command == "scan"
    case = report.cases[0]
    assert case.id.startswith("normal-fp16") and case.status == "pass" and case.message == ""
    assert case.params["kernel"] == f"{__name__}:my_chunk_scan" and case.params["dtype"] == "fp16"
    assert case.error["ratio"] > 0 and case.error["first_nonfinite"] is None
    data = report.to_json()
    json.dumps(data, allow_nan=False)  # plain JSON, as --json writes it
    assert data["cases"][0]["id"] == case.id and data["exit_code"] == 0


def test_a_module_path_kernel_reports_its_nonfinite_location():
    report = ssmcheck.scan(kernel=f"{BROKEN}:nan_in_partial_last_chunk", preset="smoke", regime="normal")
    (case,) = report.cases
    assert case.status == "nonfinite" and report.exit_code == 3
    # NAN_OFFSET tokens into the last (partial) chunk of 40 = 2 x 16 + 8 tokens, in head NAN_HEAD
    token = 32 + bk.NAN_OFFSET
    assert case.message.startswith(f"y non-finite from sequence 0 token {token} (chunk 2) head {bk.NAN_HEAD}")
    assert case.error["first_nonfinite"]["token"] == token and math.isnan(case.error["y_max_rel"])


def test_drift_through_the_api():
    report = ssmcheck.drift(kernel="torch", preset="smoke", regime="stagnation", rounding=["nearest"])
    (case,) = report.cases
    assert case.status == "pass" and case.params["rounding"] == "nearest"
    assert set(case.error) == {"state_rel", "out_rel", "ratio", "bias_z", "first_nonfinite"}


@pytest.mark.parametrize(("call", "named"), [
    (lambda: ssmcheck.scan(kernel="torch", preset="smoke", colour=["red"]), "unknown option 'colour'"),
    (lambda: ssmcheck.scan(kernel="torch", preset="smoke", seqlen="40,,"), "--seqlen"),
    (lambda: ssmcheck.scan(kernel="torch", preset="nope"), "--preset"),
    (lambda: ssmcheck.scan(kernel="no_such_module:fn", preset="smoke"), "--kernel"),
    (lambda: ssmcheck.scan(kernel="builtin", preset="smoke", chunk_size=[48]), "--chunk-size"),
    (lambda: ssmcheck.scan(kernel="torch", preset="smoke", case_timeout=5), "--case-timeout"),
    (lambda: ssmcheck.drift(kernel="torch", preset="smoke", philox_rounds=0), "--philox-rounds"),
])
def test_bad_options_raise_one_line_usage_errors(call, named):
    with pytest.raises(api.UsageError) as info:
        call()
    assert named in str(info.value) and "\n" not in str(info.value)


def test_one_case_by_id():
    report = ssmcheck.scan(kernel="torch", preset="smoke", case="ragged-bf16-c16-L40-b2-h2x8n8g1")
    assert [c.id for c in report.cases] == ["ragged-bf16-c16-L40-b2-h2x8n8g1"]


def test_the_api_runs_from_a_thread_other_than_the_main_one():
    """Signal handlers can only be set in the main thread: a sweep run elsewhere must not try."""
    import threading  # noqa: PLC0415

    reports = []
    worker = threading.Thread(target=lambda: reports.append(ssmcheck.scan(kernel="torch", preset="smoke",
                                                                          regime="normal")))
    worker.start()
    worker.join()
    assert len(reports) == 1 and reports[0].exit_code == 0
