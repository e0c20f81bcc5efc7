"""`ssmcheck drift --from-prefill N`: the decode starts from the states of a chunk-scan prefill of N tokens."""

import pytest
import torch
from cli_invoke import assert_usage_error, invoke

from ssmcheck.core import runtime
from ssmcheck.core.capture import Transcript
from ssmcheck.drift.prefill import _prefill_inputs, prefilled
from ssmcheck.drift.regimes import make_problem
from ssmcheck.drift.spec import DriftCase
from ssmcheck.ops.chunk_scan.naive import scan_recurrent
from ssmcheck.scan.adapter import resolve


def drift(*args, json_path=None):
    return invoke("drift", *args, json_path=json_path)


def _last_state_errors(report) -> list[float]:
    return [case["checkpoints"][-1]["state_rel"] for case in report["cases"]]


def test_the_builtin_kernels_pass_from_a_prefill_and_the_start_is_the_prefills(tmp_path):
    args = ("--preset", "smoke", "--rounding", "nearest")
    result, report = drift(*args, "--from-prefill", "100", json_path=tmp_path / "p.json")
    assert result.exit_code == 0, result.output
    assert report["settings"]["from_prefill"] == 100 and report["settings"]["prefill_kernel"] == "builtin"
    assert all(c["id"].endswith("-prefill100") and c["params"]["from_prefill"] == 100 for c in report["cases"])
    _, plain = drift(*args, json_path=tmp_path / "d.json")
    assert plain["cases"][0]["params"]["from_prefill"] == 0 and not plain["cases"][0]["id"].endswith("prefill0")
    # Another start, the same decode stream: the figures differ.
    assert _last_state_errors(report) != _last_state_errors(plain)


@pytest.mark.parametrize("state_dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("regime", ["normal", "stagnation", "overflow"])
def test_the_prefilled_state_is_the_float64_recurrence_over_the_prefill_stored(regime, state_dtype, device):
    case = DriftCase("builtin", state_dtype, "nearest", regime, 8, 2, 2, 16, 16, 1, None, seed=1234 + len(regime),
                     trials=1, from_prefill=77)
    problem = make_problem(regime, case.shape(), case.dtype, case.steps, case.seed, device)
    start = prefilled(problem, case, resolve("builtin", runtime.environment().interpreter), Transcript()).initial_state
    inputs = _prefill_inputs(problem, case)
    truth = scan_recurrent(inputs.x, inputs.dt, inputs.A, inputs.B, inputs.C, **inputs.kwargs()).final_states
    assert start.dtype == case.dtype and bool(torch.isfinite(start).all())
    assert not torch.equal(start.double(), problem.initial_state.double())
    rel = (torch.linalg.vector_norm(start.double() - truth) / torch.linalg.vector_norm(truth)).item()
    assert rel < 2 * torch.finfo(case.dtype).eps, rel


@pytest.mark.parametrize("value", ["-1", "many"])
def test_usage_errors(value):
    assert_usage_error(drift("--preset", "smoke", "--from-prefill", value)[0], "--from-prefill")


def test_help_documents_the_option():
    assert "--from-prefill" in drift("--help")[0].stdout
