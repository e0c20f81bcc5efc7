"""Verdicts of `ssmcheck drift` on deliberately broken state-update kernels, and on correct ones.

The broken kernels (tests/broken_state_update_kernels.py) are plain PyTorch, so
these run in well under a second each; the built-in Triton kernel runs through
the interpreter on the CPU, so its runs are kept to a few steps of one small head.
"""

import importlib.util
import itertools
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ssmcheck.core import runtime
from ssmcheck.core.status import Status
from ssmcheck.drift import lockstep
from ssmcheck.drift import run as drift_run
from ssmcheck.drift.adapter import resolve as resolve_kernel
from ssmcheck.drift.regimes import DRIFT_REGIMES, make_problem
from ssmcheck.drift.run import run_case
from ssmcheck.drift.spec import build_cases, resolve
from ssmcheck.drift.stats import log_checkpoints

BROKEN = Path(__file__).parent / "broken_state_update_kernels.py"
_spec = importlib.util.spec_from_file_location("broken_state_update_kernels", BROKEN)
bk = importlib.util.module_from_spec(_spec)  # for the broken kernels' constants
_spec.loader.exec_module(bk)
SMALL = {"nheads": "2", "headdim": "16", "dstate": "16", "steps": 32, "trials": 2}


def run(kernel: str, **options):
    settings_ = resolve({**SMALL, **options}, {}, "test")
    env = runtime.environment()
    under_test = resolve_kernel(kernel, 10, "software", env.interpreter)
    device = env.device
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
        # declared stochastic, a truncating store is judged on its bias (always -1/2 ulp on average)
        ("truncating", "normal", "stochastic", Status.FAIL, "biased"),
        ("truncating", "stagnation", "stochastic", Status.FAIL, "biased"),
        ("skips_last_head_store", "normal", "nearest", Status.FAIL, "state drift"),
        ("skips_last_head_store", "overflow", "stochastic", Status.FAIL, "state drift"),
        ("forgets_decay", "overflow", "nearest", Status.NONFINITE, "non-finite state"),
        ("clamps_at_half_max", "overflow", "nearest", Status.FAIL, "state drift"),
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


def _first_overflow_without_decay(case, device):
    """Independently of ssmcheck's measurement: (step, batch, head, channel, state index) of the first
    element, in index order, that forgets_decay's state (the update without exp(dt * A), computed in
    float64 and stored in the case's dtype) makes non-finite while the decaying float64 recurrence
    stays finite."""
    problem = make_problem(case.regime, case.shape(), case.dtype, case.steps, case.seed, device)
    state = problem.initial_state.double()
    truth = state.clone()
    A = problem.A.double()
    heads_per_group = case.nheads // case.ngroups
    for n, step in enumerate(problem.steps(), start=1):
        dt = torch.nn.functional.softplus(step.dt.double() + problem.dt_bias.double())  # (batch, nheads, headdim)
        B = step.B.double().repeat_interleave(heads_per_group, dim=1)[:, :, None, :]
        update = (dt * step.x.double())[..., None] * B
        state = (state + update).to(case.dtype).double()
        truth = truth * torch.exp(dt[..., None] * A) + update
        if bool(torch.isfinite(state).all()):
            continue
        for b, h, p, i in itertools.product(*(range(size) for size in state.shape)):
            if not math.isfinite(state[b, h, p, i]) and math.isfinite(truth[b, h, p, i]):
                return n, b, h, p, i
    return None


@pytest.mark.parametrize("state_dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("seed", [0, 7, 12345])
def test_nonfinite_state_is_located_exactly_where_it_first_overflows(state_dtype, seed, device):
    [result] = run(broken("forgets_decay"), regime="overflow", rounding="nearest", state_dtype=state_dtype,
                   batch="2", seed=seed)
    assert result.status is Status.NONFINITE, result.verdict.message
    expected = _first_overflow_without_decay(result.case, device)
    assert expected is not None
    where = result.run.first_nonfinite
    assert (where.output, where.trial) == ("state", 0)
    assert (where.step, where.batch, where.head, where.channel, where.state_index) == expected
    assert result.run.checkpoints[-1].step == where.step  # the run stops there
    step, b, h, p, i = expected
    assert result.verdict.message == (
        f"non-finite state at step {step} (trial 0, batch {b}, head {h}, channel {p}, state index {i})"
    )


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_an_inf_stored_at_a_known_element_is_located_there(rounding):
    [result] = run(broken("inf_at_one_element"), regime="normal", rounding=rounding, state_dtype="fp16",
                   batch="3")
    assert result.status is Status.NONFINITE, result.verdict.message
    where = result.run.first_nonfinite
    assert (where.output, where.step, where.trial, where.batch, where.head, where.channel, where.state_index) == (
        "state", bk.INF_STEP, 0, bk.INF_BATCH, bk.INF_HEAD, bk.INF_CHANNEL, bk.INF_STATE_INDEX)
    assert result.run.checkpoints[-1].step == bk.INF_STEP and result.run.trials == 1  # the run stops there


@pytest.mark.parametrize(
    "regime, state_dtype",
    # overflow: constant-sign updates, so one lost update is never averaged away (ratio >= ~9 in
    # bf16); long: slow decay (fp16 only: in bf16 one lost step of it can hide in 2x the baseline)
    [("overflow", "fp16"), ("overflow", "bf16"), ("long", "fp16")],
)
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**20))
def test_a_single_skipped_state_store_fails_in_both_modes(regime, state_dtype, rounding, seed):
    # The kernel implements both modes itself (it takes `rounding` and `seed`); its control, the same
    # code storing every step, passes, so the failure is the one skipped store.
    [control] = run(broken("stores_every_step"), regime=regime, rounding=rounding, state_dtype=state_dtype,
                    seed=seed)
    assert control.status is Status.PASS, control.verdict.message
    [result] = run(broken("skips_one_store"), regime=regime, rounding=rounding, state_dtype=state_dtype,
                   seed=seed)
    assert result.status is Status.FAIL, result.verdict.message
    assert "state drift" in result.verdict.message
    # Same inputs and rounding bits: identical to the control until the skip (a step between
    # checkpoints), and well beyond it at the next checkpoint (later, the lost update decays away).
    steps = [c.step for c in result.run.checkpoints]
    assert steps == [c.step for c in control.run.checkpoints] and bk.SKIPPED_STORE_STEP not in steps
    pairs = list(zip(result.run.checkpoints, control.run.checkpoints))
    assert all(b.state_rel == c.state_rel for b, c in pairs if b.step < bk.SKIPPED_STORE_STEP)
    next_broken, next_control = next((b, c) for b, c in pairs if b.step > bk.SKIPPED_STORE_STEP)
    assert next_broken.state_rel > 2 * next_control.state_rel, (next_broken, next_control)


@pytest.mark.parametrize("name, rounding", [("plain_nearest", "nearest"), ("plain_stochastic", "stochastic")])
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**20))
def test_correct_callables_without_rounding_keyword_pass_what_they_declare(name, rounding, seed):
    results = run(broken(name), rounding=rounding, state_dtype="fp16,bf16", seed=seed)
    assert len(results) == 2 * len(DRIFT_REGIMES)
    ran = [r for r in results if r.status is not Status.SKIPPED]  # subnormal is fp16's alone
    assert len(ran) == 2 * len(DRIFT_REGIMES) - 1
    assert all(r.status is Status.PASS for r in ran), [(r.case.id, r.verdict.message) for r in ran]


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
    # every regime, (fp16, bf16) x both modes + fp32 nearest; subnormal fp16's alone
    assert len(ran) == 5 * len(DRIFT_REGIMES) - 3
    assert all(r.status is Status.PASS for r in ran), [(r.case.id, r.verdict.message) for r in ran]
    skipped = [r for r in results if r.status is Status.SKIPPED]
    assert {(r.case.state_dtype, r.case.rounding) for r in skipped if r.case.regime != "subnormal"} == {
        ("fp32", "stochastic")}


def test_builtin_kernel_passes_in_both_modes():
    results = run("builtin", nheads="1", steps=12, regime="normal,stagnation", state_dtype="fp16,bf16",
                  rounding="nearest,stochastic")
    assert len(results) == 8
    assert all(r.status is Status.PASS for r in results), [(r.case.id, r.verdict.message) for r in results]


@pytest.mark.gpu
@pytest.mark.parametrize("seed", [0, 7])
def test_a_graph_replayed_decode_locates_a_nonfinite_state_between_checkpoints(seed):
    # forgets_decay keeps nothing between calls, so it may run as CUDA graph replays; the device is then read
    # only at checkpoints, and the overflow (well past step 1, between two checkpoints) is found by replaying.
    settings_ = resolve({**SMALL, "steps": 400, "trials": 1, "regime": "overflow", "rounding": "nearest",
                         "state_dtype": "fp16", "batch": "2", "seed": seed}, {}, "test")
    graphed = replace(resolve_kernel(broken("forgets_decay"), 10, "software", False), graphable=True)
    [case] = build_cases(settings_, broken("forgets_decay"))
    result = run_case(case, graphed, settings_.tolerance, "cuda")
    assert result.run.decode_loop == "graph", result.run.decode_loop
    expected = _first_overflow_without_decay(case, "cuda")
    assert expected is not None and expected[0] not in log_checkpoints(case.steps)
    where = result.run.first_nonfinite
    assert (where.step, where.batch, where.head, where.channel, where.state_index) == expected
    assert result.run.checkpoints[-1].step == where.step


@pytest.mark.gpu
def test_graph_replays_give_the_eager_decode_bit_for_bit():
    settings_ = resolve({**SMALL, "steps": 300, "trials": 2, "regime": "normal", "rounding": "stochastic",
                         "state_dtype": "fp16", "seed": 3}, {}, "test")
    builtin = resolve_kernel("builtin", 10, "software", False)
    [case] = build_cases(settings_, "builtin")
    graphed = run_case(case, builtin, settings_.tolerance, "cuda")
    eager = run_case(case, replace(builtin, graphable=False), settings_.tolerance, "cuda")
    assert graphed.run.decode_loop == "graph" and eager.run.decode_loop.startswith("eager: ")
    # The kernel's trajectory is the same bits; only the baseline's random draws may differ.
    assert graphed.run.checkpoints == eager.run.checkpoints
    assert graphed.run.store_errors == eager.run.store_errors


@pytest.mark.gpu
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_runs_of_steps_in_one_graph_give_the_single_step_replays_bit_for_bit(monkeypatch, rounding):
    # Between checkpoints the steps run RUN_STEPS to a replay (drift.lockstep.Lockstep.advance_run); with runs
    # longer than any gap between checkpoints none runs so, every step its own replay.
    settings_ = resolve({**SMALL, "steps": 700, "trials": 2, "regime": "normal", "rounding": rounding,
                         "state_dtype": "fp16", "seed": 5}, {}, "test")
    builtin = resolve_kernel("builtin", 10, "software", False)
    [case] = build_cases(settings_, "builtin")
    replays = []
    kept = lockstep.Lockstep.advance_run
    monkeypatch.setattr(lockstep.Lockstep, "advance_run", lambda self: replays.append(self.step) or kept(self))
    in_runs = run_case(case, builtin, settings_.tolerance, "cuda")
    # Most of the steps in runs (the gaps of 700 steps' 16 checkpoints, past the graph's first 2 steps: 38 runs a trial)
    assert len(replays) * lockstep.RUN_STEPS > 0.8 * case.steps * in_runs.run.trials, len(replays)
    monkeypatch.setattr(drift_run, "RUN_STEPS", 10**9)
    one_by_one = run_case(case, builtin, settings_.tolerance, "cuda")
    assert in_runs.run.decode_loop == one_by_one.run.decode_loop == "graph"
    assert in_runs.run.checkpoints == one_by_one.run.checkpoints
    assert in_runs.run.store_errors == one_by_one.run.store_errors
