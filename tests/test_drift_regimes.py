"""Drift regimes: inputs as Mamba2 passes them, replayable streams, and the properties each regime promises."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ssmcheck.core.tensors import whole_storage
from ssmcheck.drift.regimes import (
    ACTIVATIONS,
    CACHE_LAYERS,
    DRIFT_REGIMES,
    LONG_STEPS_FACTOR,
    STEP_BLOCK,
    DecodeShape,
    make_problem,
    regime_steps,
)
from ssmcheck.ops.rounding.naive import round_to
from ssmcheck.ops.state_update.naive import state_update_step

shapes = st.builds(
    DecodeShape,
    batch=st.integers(1, 2),
    nheads=st.sampled_from([1, 2, 4]),
    headdim=st.sampled_from([1, 3, 8]),
    dstate=st.sampled_from([1, 4, 16]),
    ngroups=st.just(1),
)


def _truth(problem):
    """The float64 recurrence over the whole run: yields (state, out) after every step."""
    state = problem.initial_state.double()
    fixed = {"D": problem.D.double(), "dt_bias": problem.dt_bias.double(), "dt_softplus": problem.dt_softplus}
    for step in problem.steps():
        state, out = state_update_step(
            state, step.x.double(), step.dt.double(), problem.A.double(), step.B.double(), step.C.double(), **fixed
        )
        yield state, out


def test_every_regime_is_named_and_explained_in_one_line():
    assert set(DRIFT_REGIMES) == {"normal", "stagnation", "overflow", "long", "untied", "strided", "dt-extreme",
                                  "no-softplus", "optional-none", "gate-without-d", "dt-bias-none", "small-dt",
                                  "bf16-inputs", "fp16-inputs", "subnormal"}
    assert all(text and "\n" not in text for text in DRIFT_REGIMES.values())
    assert regime_steps("long", 10) == 10 * LONG_STEPS_FACTOR and regime_steps("normal", 10) == 10


def test_strided_s_state_is_one_layers_slice_of_a_state_cache_and_normal_s_its_own():
    shape = DecodeShape(3, 2, 4, 8, 1)
    sliced = make_problem("strided", shape, torch.float16, 4, seed=3, device="cpu").initial_state
    whole = make_problem("normal", shape, torch.float16, 4, seed=3, device="cpu").initial_state
    state = 2 * 4 * 8
    assert whole.is_contiguous() and torch.equal(sliced, whole)  # the same values, laid out otherwise
    assert sliced.stride() == (CACHE_LAYERS * state, 4 * 8, 8, 1) and sliced.storage_offset() == state
    cache = whole_storage(sliced).view(3, CACHE_LAYERS, state)
    assert torch.equal(cache[:, 0], -whole.reshape(3, state))  # the other layer: finite, and not the state


@pytest.mark.parametrize("regime", list(DRIFT_REGIMES))
@settings(max_examples=5, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**31 - 1))
def test_inputs_have_mamba2_shapes_strides_and_replay(regime, shape, seed):
    s = shape
    problem = make_problem(regime, s, torch.float16, 3, seed, "cpu")
    assert problem.initial_state.shape == (s.batch, s.nheads, s.headdim, s.dstate)
    assert problem.initial_state.dtype == torch.float16
    assert problem.A.shape == (s.nheads, s.headdim, s.dstate)
    assert problem.D.shape == problem.dt_bias.shape == (s.nheads, s.headdim)
    # Per-head values expanded with stride 0, as Mamba2 passes them; in `untied`, whole tensors, and in `no-softplus`
    # D alone (per channel beside a per-head dt_bias).
    for name, param in {"A": problem.A, "D": problem.D, "dt_bias": problem.dt_bias}.items():
        inner = [stride for stride, size in zip(param.stride()[1:], param.shape[1:]) if size > 1]
        whole = regime == "untied" or (regime == "no-softplus" and name == "D")
        assert all(stride != 0 for stride in inner) if whole else all(stride == 0 for stride in inner)
    first, again = list(problem.steps()), list(problem.steps())
    assert len(first) == 3
    for a, b in zip(first, again):
        assert a.x.shape == a.dt.shape == (s.batch, s.nheads, s.headdim)
        assert (a.dt.stride(2) != 0) == (regime == "untied") or s.headdim == 1
        assert a.B.shape == a.C.shape == (s.batch, s.ngroups, s.dstate)
        for name in ("x", "dt", "B", "C"):
            assert getattr(a, name).dtype == ACTIVATIONS.get(regime, torch.float32)
            assert torch.equal(getattr(a, name), getattr(b, name))
    assert not torch.equal(first[0].x, first[1].x)  # a stream, not one step repeated


def test_tied_parameters_stay_stride_0_views_on_another_device():
    # Moving an expanded view to another device copies it whole: the regimes expand after the move. ("meta" stands
    # for the GPU here: a device the parameters are not drawn on.)
    problem = make_problem("normal", DecodeShape(1, 2, 3, 4, 1), torch.float16, 3, 0, "meta")
    assert problem.A.device.type == "meta"
    assert problem.A.stride()[1:] == (0, 0) and problem.D.stride()[1:] == problem.dt_bias.stride()[1:] == (0,)


@settings(max_examples=5, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**31 - 1))
def test_no_softplus_passes_dt_processed_but_for_its_bias(shape, seed):
    problem = make_problem("no-softplus", shape, torch.float16, 3, seed, "cpu")
    assert problem.dt_softplus is False
    assert all(make_problem(r, shape, torch.float16, 3, seed, "cpu").dt_softplus for r in DRIFT_REGIMES
               if r not in ("no-softplus", "small-dt"))
    for step in problem.steps():
        dt = step.dt + problem.dt_bias  # the step's dt as the kernel is to take it: no softplus
        assert (step.dt > 0).all() and (dt >= 0.011 - 1e-6).all() and (dt <= 0.1 + 1e-6).all()
        # a softplus taken anyway would give 0.69 or more: seven times the largest dt
        assert (torch.nn.functional.softplus(dt) > 0.69).all()


@settings(max_examples=5, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**31 - 1))
def test_optional_none_passes_no_D_nor_dt_bias_and_its_raw_dt_alone_is_normals(shape, seed):
    problem = make_problem("optional-none", shape, torch.float16, 3, seed, "cpu")
    passed = problem.parameters()
    assert passed["D"] is None and passed["dt_bias"] is None and passed["A"] is problem.A
    assert not problem.D.any() and not problem.dt_bias.any()  # what the float64 side computes with: nothing
    # The parameters each regime leaves out: optional-none both, dt-bias-none and small-dt dt_bias, gate-without-d D;
    # every other regime passes both.
    left_out = {"optional-none": {"D", "dt_bias"}, "dt-bias-none": {"dt_bias"}, "gate-without-d": {"D"},
                "small-dt": {"dt_bias"}}
    for regime in DRIFT_REGIMES:
        given = make_problem(regime, shape, torch.float16, 3, seed, "cpu").parameters()
        assert {name for name in ("D", "dt_bias") if given[name] is None} == left_out.get(regime, set()), regime
    assert problem.dt_softplus
    for step in problem.steps():
        dt = torch.nn.functional.softplus(step.dt.double())
        assert (dt >= 1e-3 - 1e-9).all() and (dt <= 0.1 + 1e-9).all()  # normal's range, from the raw dt alone
        assert (step.dt < 0).all()  # a kernel that skips the softplus without a bias decays by exp(-|dt| A) > 1


@settings(max_examples=5, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**31 - 1))
def test_gate_without_d_is_normal_with_a_gate_and_no_skip_term(shape, seed):
    """normal's parameters and steps, D passed as None (zeros to the float64 side), and a unit-scale gate z every
    step, drawn after the step's other inputs: x, dt, B and C are normal's own."""
    gated = make_problem("gate-without-d", shape, torch.float16, 3, seed, "cpu")
    plain = make_problem("normal", shape, torch.float16, 3, seed, "cpu")
    assert gated.parameters()["D"] is None and not gated.D.any()
    assert torch.equal(gated.dt_bias, plain.dt_bias) and torch.equal(gated.A, plain.A)
    for with_gate, without in zip(gated.steps(), plain.steps(), strict=True):
        assert with_gate.z is not None and without.z is None and bool(with_gate.z.ne(0).all())
        assert all(torch.equal(getattr(with_gate, name), getattr(without, name)) for name in ("x", "dt", "B", "C"))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@settings(max_examples=4, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**31 - 1))
def test_stagnation_updates_are_below_half_an_ulp_yet_the_truth_grows(dtype, shape, seed):
    # Round-to-nearest of every step's exact update of the initial state gives the
    # initial state back: RN never moves, whatever the step.
    problem = make_problem("stagnation", shape, dtype, 200, seed, "cpu")
    initial = problem.initial_state.double()
    fixed = {"D": problem.D.double(), "dt_bias": problem.dt_bias.double(), "dt_softplus": True}
    for step in problem.steps():
        exact, _ = state_update_step(
            initial, step.x.double(), step.dt.double(), problem.A.double(), step.B.double(), step.C.double(), **fixed
        )
        assert torch.equal(round_to(exact, dtype, "nearest").double(), initial)
    *_, (final, _) = _truth(problem)
    growth = final[..., ::2] / initial[..., ::2] - 1  # about 0.11 ulp of 1.0 a step, from 1..1.125
    eps = torch.finfo(dtype).eps
    assert growth.min() > 200 * 0.03 * eps and growth.max() < 200 * 0.5 * eps
    # The odd state indices start at most two ulps below 2 (rounded: some at 2), where a round-up carries into the
    # exponent (tests/test_drift_cli.py: a rounding that drops such carries is biased there).
    below_two = initial[..., 1::2]
    assert (below_two <= 2).all() and (below_two >= 2 - 2 * eps).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@settings(max_examples=4, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**31 - 1), nsteps=st.integers(1, 300))
def test_overflow_grows_toward_the_maximum_and_stays_below_0_9_of_it(dtype, shape, nsteps, seed):
    problem = make_problem("overflow", shape, dtype, nsteps, seed, "cpu")
    top = torch.finfo(dtype).max
    peak = 0.0
    for state, out in _truth(problem):
        peak = max(peak, state.abs().max().item())
        assert torch.isfinite(out).all()
    assert peak <= 0.9 * top
    if nsteps >= 8:
        assert peak >= 0.2 * top


@pytest.mark.parametrize("regime", list(DRIFT_REGIMES))
@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), start=st.integers(0, 2 * STEP_BLOCK), count=st.integers(1, 2 * STEP_BLOCK))
def test_any_run_of_steps_is_drawn_as_the_stream_has_it(regime, seed, start, count):
    # Blocks of steps come from generators of their own: a window drawn on its own, across block
    # boundaries, holds what the step-by-step stream holds there.
    nsteps = start + count + 3
    problem = make_problem(regime, DecodeShape(1, 2, 3, 4, 1), torch.float16, nsteps, seed, "cpu")
    stream = list(problem.host_steps())
    assert len(stream) == nsteps
    run = problem.host_inputs(start, count)
    for name in ("x", "dt", "B", "C"):
        expected = torch.stack([getattr(step, name) for step in stream[start:start + count]])
        assert torch.equal(getattr(run, name), expected)
    if nsteps > STEP_BLOCK:  # the blocks' generators differ
        assert not torch.equal(stream[0].x, stream[STEP_BLOCK].x)
    for threads in (1, 3):  # block by block, drawn one after another or at once in threads: the same run
        parts = list(problem.host_blocks(start, count, threads))
        assert [at for at, _ in parts] == [0, *range(STEP_BLOCK - start % STEP_BLOCK, count, STEP_BLOCK)]
        for name, expected in run.given():
            assert torch.equal(torch.cat([getattr(part, name) for _, part in parts]), expected)


@settings(max_examples=5, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**31 - 1))
def test_small_dt_passes_a_dt_far_below_normals_with_moderate_decays(shape, seed):
    """small-dt's dt is passed as it is (no softplus, no dt_bias), each head's within 2x of a centre in 1e-6..1e-4, and
    its A is such that a step decays the state by 5-20% (|A| dt in 0.05/2..0.2*2): small dt, moderate decays."""
    problem = make_problem("small-dt", shape, torch.float16, 3, seed, "cpu")
    assert problem.dt_softplus is False and problem.parameters()["dt_bias"] is None
    A = problem.A[:, 0, 0].double()
    for step in problem.steps():
        dt = step.dt.double()
        assert (dt >= 0.5e-6 * (1 - 1e-6)).all() and (dt <= 2e-4 * (1 + 1e-6)).all()
        rate = (dt[..., 0] * A.abs()).flatten()
        assert (rate >= 0.025 * (1 - 1e-5)).all() and (rate <= 0.4 * (1 + 1e-5)).all()


@pytest.mark.parametrize("regime", ["bf16-inputs", "fp16-inputs"])
@pytest.mark.parametrize(("state_dtype", "gated"), [(torch.float32, True), (torch.float16, False),
                                                    (torch.bfloat16, False)])
def test_half_precision_inputs_are_gated_into_an_fp32_state_alone(regime, state_dtype, gated):
    """Into an fp32 state the half-precision inputs' regimes pass a gate z in their activations' dtype (a path for
    such inputs that reads z wrong fails there); into fp16 and bf16 states none, where a gate over a few outputs
    made a stochastically rounded state's output error a heavy-tailed draw."""
    problem = make_problem(regime, DecodeShape(2, 4, 16, 16, 2), state_dtype, 3, seed=11, device="cpu")
    steps = list(problem.steps())
    assert all((s.z is not None) == gated for s in steps)
    assert all(s.x.dtype == ACTIVATIONS[regime] for s in steps)
    if gated:
        assert all(s.z.dtype == ACTIVATIONS[regime] and s.z.shape == s.x.shape and s.z.abs().max() > 0 for s in steps)
