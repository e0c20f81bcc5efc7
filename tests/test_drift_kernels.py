"""Verdicts of `ssmcheck drift` on deliberately broken state-update kernels, and on correct ones.

The broken kernels (tests/broken_state_update_kernels.py) are plain PyTorch, so
these run in well under a second each; the built-in Triton kernel runs through
the interpreter on the CPU, so its runs are kept to a few steps of one small head.
"""

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ssmcheck import runtime
from ssmcheck.drift import run_case
from ssmcheck.drift_kernels import resolve_kernel
from ssmcheck.drift_spec import build_cases, resolve
from ssmcheck.verdict import Status

BROKEN = Path(__file__).parent / "broken_state_update_kernels.py"
SMALL = {"nheads": "2", "headdim": "16", "dstate": "16", "steps": 32, "trials": 2}


def run(kernel: str, **options):
    settings_ = resolve({**SMALL, **options}, {}, "test")
    under_test = resolve_kernel(kernel, 10, "software")
    device = runtime.environment().device
    return [run_case(c, under_test, settings_.tolerance, device) for c in build_cases(settings_, kernel)]


def broken(name: str) -> str:
    return f"{BROKEN}:{name}"


@pytest.mark.parametrize(
    "name, regime, rounding, status, message",
    [
        ("sr_3bit", "normal", "stochastic", Status.FAIL, "biased"),
        ("sr_3bit", "stagnation", "stochastic", Status.FAIL, "biased"),
        ("truncating", "normal", "nearest", Status.FAIL, "state drift"),
        ("truncating", "long", "nearest", Status.FAIL, "state drift"),
        ("skips_last_head_store", "normal", "nearest", Status.FAIL, "state drift"),
        ("skips_last_head_store", "overflow", "stochastic", Status.FAIL, "state drift"),
        ("forgets_decay", "overflow", "nearest", Status.NONFINITE, "non-finite state"),
        ("raises", "normal", "nearest", Status.ERROR, "out of resources"),
        # no `rounding` keyword: --rounding declares the intent, and round-to-nearest is no SR
        ("plain_nearest", "stagnation", "stochastic", Status.FAIL, "biased"),
    ],
)
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**20))
def test_broken_kernels_are_flagged(name, regime, rounding, status, message, seed):
    for state_dtype in ("fp16", "bf16"):
        [result] = run(broken(name), regime=regime, rounding=rounding, state_dtype=state_dtype, seed=seed)
        assert result.status is status, result.verdict.message
        assert message in result.verdict.message


def test_nonfinite_state_is_located():
    [result] = run(broken("forgets_decay"), regime="overflow", rounding="nearest", state_dtype="fp16", batch="2")
    where = result.run.first_nonfinite
    case = result.case
    assert where.output == "state" and 1 <= where.step <= case.steps and where.trial == 0
    assert 0 <= where.batch < case.batch and 0 <= where.head < case.nheads
    assert 0 <= where.channel < case.headdim and 0 <= where.state_index < case.dstate
    assert result.run.checkpoints[-1].step == where.step  # the run stops there


@pytest.mark.parametrize("name, rounding", [("plain_nearest", "nearest"), ("plain_stochastic", "stochastic")])
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**20))
def test_correct_callables_without_rounding_keyword_pass_what_they_declare(name, rounding, seed):
    results = run(broken(name), rounding=rounding, state_dtype="fp16,bf16", seed=seed)
    assert len(results) == 8
    assert all(r.status is Status.PASS for r in results), [(r.case.id, r.verdict.message) for r in results]


def test_torch_generator_is_seeded_per_trial():
    def curves(seed):
        [result] = run(broken("plain_stochastic"), regime="normal", rounding="stochastic", state_dtype="fp16",
                       seed=seed)
        return [c.state_rel for c in result.run.checkpoints]

    torch.manual_seed(12345)  # whatever the global generator held before, the run is the same
    first = curves(0)
    torch.manual_seed(54321)
    assert curves(0) == first
    assert curves(1) != first


@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**20))
def test_torch_kernel_passes_in_both_modes(seed):
    results = run("torch", state_dtype="fp16,bf16,fp32", rounding="nearest,stochastic", seed=seed)
    ran = [r for r in results if r.status is not Status.SKIPPED]
    assert len(ran) == 4 * 5  # every regime, (fp16, bf16) x both modes + fp32 nearest
    assert all(r.status is Status.PASS for r in ran), [(r.case.id, r.verdict.message) for r in ran]
    skipped = [r for r in results if r.status is Status.SKIPPED]
    assert {(r.case.state_dtype, r.case.rounding) for r in skipped} == {("fp32", "stochastic")}


def test_builtin_kernel_passes_in_both_modes():
    results = run("builtin", nheads="1", steps=12, regime="normal,stagnation", state_dtype="fp16,bf16",
                  rounding="nearest,stochastic")
    assert len(results) == 8
    assert all(r.status is Status.PASS for r in results), [(r.case.id, r.verdict.message) for r in results]
