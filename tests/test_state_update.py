"""The built-in Triton state update (ssmcheck/ops/state_update/fused_recurrent.py)
against the float64 decode step (ssmcheck/ops/state_update/naive.py).

Error bounds are derived, not tuned: the stored state may differ from the
float64 state by the storage rounding (half a spacing to nearest, under one
spacing stochastically) plus the fp32 arithmetic: dt carries about four
roundings (dt_bias, softplus's exp and log1p), which the decay amplifies by
|dt * A|; the exp of the decay is within EXP_ERR (2**-21, generous for
libdevice's expf); each product and sum adds one 2**-24 of its magnitude.
"""

import math

import pytest
import sr_model
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ssmcheck.core import runtime
from ssmcheck.core.accesses import checked_accesses
from ssmcheck.ops import interpreting
from ssmcheck.ops.rounding.stochastic import DEFAULT_PHILOX_ROUNDS
from ssmcheck.ops.state_update.fused_recurrent import PAD_SLOT_ID, selective_state_update
from ssmcheck.ops.state_update.naive import state_update_step

DEVICE = runtime.environment().device
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MANTISSA = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}
EPS32 = 2.0**-24
EXP_ERR = 2.0**-21
DT_ROUNDINGS = 4  # dt + dt_bias, and softplus's exp, log1p and add
Z_LIMIT = 4.5


def _spacing(v: torch.Tensor, dtype) -> torch.Tensor:
    """Distance between neighbouring `dtype` values around |v| (float64), subnormals included."""
    emin = int(math.log2(torch.finfo(dtype).tiny))
    _, e = torch.frexp(v.abs())
    return torch.ldexp(torch.ones_like(v), torch.clamp(e - 1, min=emin) - MANTISSA[dtype])


class Inputs:
    """One decode step's inputs, drawn from a recorded seed (never zeros)."""

    def __init__(self, seed, batch, nheads, ngroups, headdim, dstate, *, state_dtype, input_dtype=torch.float32,
                 param_dtype=torch.float32, has_D=True, has_z=True, has_bias=True, softplus=True, tie_a=False,
                 tie_dt=False, strided=False, device=DEVICE):
        g = torch.Generator().manual_seed(seed)

        def draw(*shape, dtype=input_dtype, scale=1.0):
            return (torch.randn(*shape, generator=g) * scale).to(dtype).to(device)

        state = draw(batch, nheads, headdim, dstate, dtype=state_dtype)
        if strided:  # a view into a wider cache, channels strided
            wide = torch.full((batch, nheads, headdim, dstate + 3), float("nan"), dtype=state_dtype, device=device)
            wide[..., :dstate] = state
            state = wide[..., :dstate]
        self.state = state
        self.x = draw(batch, nheads, headdim)
        if strided:
            self.x = draw(headdim, nheads, batch).permute(2, 1, 0)
        self.z = draw(batch, nheads, headdim) if has_z else None
        self.B = draw(batch, ngroups, dstate)
        self.C = draw(batch, ngroups, dstate)
        log_a = torch.rand(nheads, generator=g) * math.log(16)  # A = -exp(U(log 1, log 16))
        # Raw dt: around softplus's knee when dt_softplus (dt_bias shifts it to ~0.02), else positive and small.
        if softplus:
            dt_raw, bias = (lambda *shape: draw(*shape)), (lambda *shape: draw(*shape, dtype=param_dtype) - 4)
        else:
            dt_raw = lambda *shape: (0.001 + 0.05 * torch.rand(*shape, generator=g)).to(input_dtype).to(device)
            bias = lambda *shape: (0.01 * torch.rand(*shape, generator=g)).to(param_dtype).to(device)
        # Mamba2 ties A, D, dt and dt_bias per head: stride-0 expanded views.
        if tie_a:
            self.A = (-torch.exp(log_a)).to(param_dtype).to(device)[:, None, None].expand(nheads, headdim, dstate)
            self.D = draw(nheads, dtype=param_dtype)[:, None].expand(nheads, headdim)
        else:
            self.A = (-torch.exp(log_a[:, None, None] + 0.1 * torch.rand(nheads, headdim, dstate, generator=g))
                      ).to(param_dtype).to(device)
            self.D = draw(nheads, headdim, dtype=param_dtype)
        if tie_dt:
            self.dt = dt_raw(batch, nheads)[..., None].expand(batch, nheads, headdim)
            self.dt_bias = bias(nheads)[:, None].expand(nheads, headdim)
        else:
            self.dt = dt_raw(batch, nheads, headdim)
            self.dt_bias = bias(nheads, headdim)
        if not has_bias:
            self.dt_bias = None
        if not has_D:
            self.D = None
        self.softplus = softplus

    def args(self, state):
        return (state, self.x, self.dt, self.A, self.B, self.C, self.D, self.z, self.dt_bias, self.softplus)

    def reference(self):
        """(new state, out, |decayed state|, |update|, scale of the out terms), float64."""
        d = {k: (v.double() if v is not None else None) for k, v in vars(self).items() if k != "softplus"}
        new, out = state_update_step(d["state"], d["x"], d["dt"], d["A"], d["B"], d["C"], D=d["D"], z=d["z"],
                                     dt_bias=d["dt_bias"], dt_softplus=self.softplus)
        # The same step on magnitudes bounds the fp32 arithmetic's error.
        update = (self._dt() * d["x"])[..., None] * self._heads(d["B"])[:, :, None, :]
        decayed = new - update
        terms = ((decayed.abs() + update.abs()) * self._heads(d["C"]).abs()[:, :, None, :]).sum(-1)
        if self.D is not None:
            terms = terms + (d["D"] * d["x"]).abs()
        if self.z is not None:
            terms = terms * (d["z"] * torch.sigmoid(d["z"])).abs()
        return new, out, decayed.abs(), update.abs(), terms

    def _dt(self):
        dt = self.dt.double() + (self.dt_bias.double() if self.dt_bias is not None else 0)
        return torch.nn.functional.softplus(dt) if self.softplus else dt

    def _heads(self, t):
        return t.repeat_interleave(self.state.shape[1] // t.shape[1], dim=1)


def _check_step(inp: Inputs, rounding="nearest", seed=0):
    state = inp.state.clone()
    out = torch.full(inp.x.shape, float("nan"), dtype=inp.x.dtype, device=inp.x.device)
    returned = selective_state_update(*inp.args(state), rounding=rounding, seed=seed, out=out)
    assert returned is out
    new, ref_out, decayed, update, out_scale = inp.reference()
    dtA = (inp._dt()[..., None] * inp.A.double()).abs()
    # The decay's exponent also rounds in dt * A; the update in two products and the sum.
    arithmetic = (EXP_ERR + EPS32 * (2 + (DT_ROUNDINGS + 1) * dtA)) * decayed + EPS32 * (DT_ROUNDINGS + 3) * update
    got = state.double()
    rounding_room = 0.5 if rounding == "nearest" else 1.0
    allowed = rounding_room * _spacing(torch.maximum(new.abs(), got.abs()), state.dtype) + arithmetic
    assert bool(torch.isfinite(got).all())
    excess = (got - new).abs() - allowed
    # (A skipped store keeps the old value: wherever that is further from the truth than the bound allows,
    # the bound fails it; where it is not, the step changes the element by less than its rounding, and
    # no count of changed elements can tell. Such a count failed a correct step of 4 bf16 elements, 2 of
    # them moved by less than half an ulp.)
    assert float(excess.max()) <= 0, f"state off by {float(excess.max()):.3g} beyond the bound"
    dstate = state.shape[-1]
    out_allowed = 0.5 * _spacing(ref_out, out.dtype) + ((dstate + 8) * EPS32 + 4 * EXP_ERR) * out_scale
    assert bool(torch.isfinite(out).all()), "out has unwritten (NaN) entries"
    out_excess = (out.double() - ref_out).abs() - out_allowed
    assert float(out_excess.max()) <= 0, f"out off by {float(out_excess.max()):.3g} beyond the bound"


@st.composite
def _cases(draw):
    ngroups = draw(st.sampled_from([1, 2]))
    state_dtype = draw(st.sampled_from(DTYPES))
    return dict(
        seed=draw(st.integers(0, 2**31 - 1)),
        batch=draw(st.integers(1, 3)),
        ngroups=ngroups,
        nheads=ngroups * draw(st.integers(1, 3)),
        headdim=draw(st.sampled_from([1, 3, 8, 16])),
        dstate=draw(st.sampled_from([4, 16, 20, 32])),
        state_dtype=state_dtype,
        input_dtype=draw(st.sampled_from(DTYPES)),
        param_dtype=draw(st.sampled_from(DTYPES)),
        has_D=draw(st.booleans()),
        has_z=draw(st.booleans()),
        has_bias=draw(st.booleans()),
        softplus=draw(st.booleans()),
        tie_a=draw(st.booleans()),
        tie_dt=draw(st.booleans()),
        strided=draw(st.booleans()),
        rounding="nearest" if state_dtype == torch.float32 else draw(st.sampled_from(["nearest", "stochastic"])),
    )


@settings(max_examples=30, deadline=None)
@given(case=_cases())
def test_matches_float64_step(case):
    rounding = case.pop("rounding")
    seed = case["seed"]
    _check_step(Inputs(**case), rounding=rounding, seed=seed)


@pytest.mark.parametrize("state_dtype", DTYPES)
@pytest.mark.parametrize(("tie_a", "tie_dt"), [(False, False), (True, False), (False, True), (True, True)])
def test_every_dtype_and_tying(state_dtype, tie_a, tie_dt):
    for rounding in ("nearest",) if state_dtype == torch.float32 else ("nearest", "stochastic"):
        _check_step(Inputs(5, 2, 4, 2, 8, 16, state_dtype=state_dtype, input_dtype=state_dtype, tie_a=tie_a,
                           tie_dt=tie_dt), rounding=rounding, seed=9)


# How a test launches the state update: as the interpreter does (one program a head up to 64 channels), as the GPU
# does (blocks of 4 or 8 channels, one a program), or as the GPU does at large batches under software SR (a
# program takes several blocks in turn).
LAUNCHES = ("interpreter", "gpu-blocks", "gpu-blocks-in-turn")


def _launch_as(launch: str, monkeypatch) -> None:
    """Make selective_state_update launch as `launch` (one of LAUNCHES) names, here."""
    from ssmcheck.ops.state_update import fused_recurrent  # noqa: PLC0415

    if launch == "interpreter":
        return
    rule = fused_recurrent.launch_config
    monkeypatch.setattr(fused_recurrent, "launch_config", lambda h, n, dtype, interpreter: rule(h, n, dtype, False))
    # Blocks in turn at any size, or never.
    monkeypatch.setattr(fused_recurrent, "SR_MIN_PROGRAMS", 1 if launch == "gpu-blocks-in-turn" else 2**62)


@pytest.mark.parametrize("state_dtype", DTYPES)
@pytest.mark.parametrize("launch", LAUNCHES[1:])
def test_gpu_launch_configuration_in_the_interpreter(state_dtype, launch, monkeypatch):
    """The GPU's small channel blocks (4 channels for fp32, 8 for fp16/bf16 at dstate 128), run here:
    headdim 12 spreads a head over two blocks, the last one partly masked; a program takes both in turn
    under software SR at large batches."""
    from ssmcheck.ops.state_update import fused_recurrent  # noqa: PLC0415

    _launch_as(launch, monkeypatch)
    expected = 4 if state_dtype == torch.float32 else 8
    assert fused_recurrent.launch_config(64, 128, state_dtype, True).block_p == expected
    for rounding in ("nearest",) if state_dtype == torch.float32 else ("nearest", "stochastic"):
        _check_step(Inputs(11, 2, 2, 1, 12, 128, state_dtype=state_dtype, tie_a=True, tie_dt=True), rounding=rounding,
                    seed=3)


@pytest.mark.cpu
@settings(max_examples=20, deadline=None)
@given(case=_cases(), launch=st.sampled_from(LAUNCHES), pool=st.booleans())
def test_every_load_and_store_stays_inside_the_arguments(case, launch, pool):
    """Every access of every program, in each launch plan, lies inside one of the launch's tensors
    (core.accesses: on a GPU one past every allocation may fault and end the process's CUDA context);
    with `pool`, the rows' states taken from a pool of twice as many slots, in random order, the first row a pad."""
    rounding = case.pop("rounding")
    inp = Inputs(**case)
    with pytest.MonkeyPatch.context() as patch, checked_accesses() as seen:
        _launch_as(launch, patch)
        if pool:
            g = torch.Generator().manual_seed(case["seed"])
            states = torch.cat([inp.state, inp.state.flip(0)])
            slots = torch.randperm(len(states), generator=g)[:case["batch"]].to(DEVICE)
            slots[0] = PAD_SLOT_ID
            selective_state_update(states, *inp.args(inp.state)[1:], state_batch_indices=slots, rounding=rounding,
                                   seed=case["seed"])
        else:
            _check_step(inp, rounding=rounding, seed=case["seed"])
    assert seen.launches > 0 and seen.outside() is None


# --- refusals ---------------------------------------------------------------------------------------


def _small(state_dtype=torch.float16):
    return Inputs(1, 1, 2, 1, 4, 16, state_dtype=state_dtype)


@pytest.mark.parametrize(("state_dtype", "kwargs", "message"), [
    (torch.float32, {"rounding": "stochastic"}, "float32 state"),
    (torch.float16, {"rounding": "upward"}, "unknown rounding"),
    (torch.float16, {"rounding": "stochastic", "rounding_impl": "magic"}, "rounding_impl"),
    (torch.float16, {"rounding": "stochastic", "philox_rounds": 0}, "philox_rounds"),
])
def test_invalid_combinations_are_refused(state_dtype, kwargs, message):
    inp = _small(state_dtype)
    state = inp.state.clone()
    with pytest.raises(ValueError, match=message):
        selective_state_update(*inp.args(state), **kwargs)
    assert torch.equal(state, inp.state)  # refused before anything ran


def test_hardware_sr_is_refused_below_sm100():
    if not interpreting() and torch.cuda.get_device_capability() >= (10, 0):
        pytest.skip("this GPU has cvt.rs")
    inp = _small()
    with pytest.raises(ValueError, match="sm_100"):
        selective_state_update(*inp.args(inp.state.clone()), rounding="stochastic", rounding_impl="hardware")


@pytest.mark.parametrize("bad", ["x", "A", "B", "D"])
def test_mismatched_shapes_are_refused(bad):
    inp = _small()
    setattr(inp, bad, getattr(inp, bad)[..., :1])
    with pytest.raises(ValueError, match=f"^{bad} "):
        selective_state_update(*inp.args(inp.state.clone()))


# --- stochastic rounding --------------------------------------------------------------------------


def test_fixed_seed_is_deterministic_and_seeds_differ():
    inp = Inputs(3, 2, 2, 1, 8, 32, state_dtype=torch.bfloat16)
    runs = {}
    for seed in (1, 1, 2):
        state = inp.state.clone()
        selective_state_update(*inp.args(state), rounding="stochastic", seed=seed)
        runs.setdefault(seed, []).append(state)
    assert torch.equal(runs[1][0], runs[1][1])
    assert not torch.equal(runs[1][0], runs[2][0])


def test_a_seed_in_a_device_tensor_rounds_as_the_same_integer_seed():
    # drift's CUDA graphs pass the seed as a tensor that the graph advances between replays.
    inp = Inputs(5, 2, 4, 2, 8, 32, state_dtype=torch.float16)
    by_int, by_tensor = inp.state.clone(), inp.state.clone()
    out_int = selective_state_update(*inp.args(by_int), rounding="stochastic", seed=2**40 + 3)
    seed = torch.tensor([2**40 + 3], dtype=torch.int64, device=inp.state.device)
    out_tensor = selective_state_update(*inp.args(by_tensor), rounding="stochastic", seed=seed)
    assert torch.equal(by_int.view(torch.int16), by_tensor.view(torch.int16)) and torch.equal(out_int, out_tensor)
    assert not torch.equal(by_int, inp.state)


@pytest.mark.parametrize("seed", [torch.tensor([1, 2]), torch.tensor([1], dtype=torch.int32), torch.tensor([1.0])])
def test_a_seed_tensor_that_is_not_one_int64_is_refused(seed):
    inp = _small()
    state = inp.state.clone()
    with pytest.raises(ValueError, match="^a seed tensor must be one int64"):
        selective_state_update(*inp.args(state), rounding="stochastic", seed=seed.to(inp.state.device))
    assert torch.equal(state, inp.state)


# --- launch plans (a call signature's checks and launch, worked out once) -----------------------------


def test_calls_alike_but_for_strides_or_dtypes_each_get_their_own_launch():
    """A plan is keyed by what it was worked out from: x as a strided view after a contiguous x of the same
    shape, and then an fp16 state after an fp32 one, each launch with their own strides and dtypes (a plan
    reused across them would read x at the wrong strides, or the state as the wrong type)."""
    for strided in (False, True):
        _check_step(Inputs(21, 2, 2, 1, 8, 16, state_dtype=torch.float32, strided=strided))
    for state_dtype in (torch.float32, torch.float16):
        _check_step(Inputs(22, 2, 2, 1, 8, 16, state_dtype=state_dtype))


@pytest.mark.parametrize("bad_call", ["seed", "out", "philox_rounds", "rounding"])
def test_a_call_is_checked_after_a_good_call_of_the_same_shapes(bad_call):
    inp = _small()
    state = inp.state.clone()
    good = {"rounding": "stochastic", "seed": 1, "out": torch.empty_like(inp.x)}
    selective_state_update(*inp.args(state), **good)
    before = state.clone()
    bad, message = {
        "seed": ({"seed": -1}, "^seed must be an integer"),  # an int seed's value is in no signature
        "out": ({"out": torch.empty_like(inp.x, dtype=torch.float16)}, "^out must be"),
        "philox_rounds": ({"philox_rounds": [7]}, "^philox_rounds must be a positive integer"),  # unhashable
        "rounding": ({"rounding": "upward"}, "^unknown rounding"),
    }[bad_call]
    with pytest.raises(ValueError, match=message):
        selective_state_update(*inp.args(state), **{**good, **bad})
    assert torch.equal(state, before)  # refused before anything ran


def test_launch_plans_are_bounded(monkeypatch):
    from ssmcheck.ops.state_update import fused_recurrent  # noqa: PLC0415

    monkeypatch.setattr(fused_recurrent, "_PLANS", {})
    monkeypatch.setattr(fused_recurrent, "_MAX_PLANS", 2)
    for headdim in (4, 8, 12):
        _check_step(Inputs(23, 1, 2, 1, headdim, 16, state_dtype=torch.float32))
        assert 1 <= len(fused_recurrent._PLANS) <= 2


def _stagnating_decode(state_dtype, rounding, steps, shape):
    """Signed state errors, in spacings, after `steps` decode steps whose updates are below half a spacing.

    Every element has its own Philox counters, so under SR the elements' errors
    are independent draws. Returns (errors, how far the float64 state moved).
    """
    batch, nheads, headdim, dstate = shape
    g = torch.Generator().manual_seed(23)
    spacing = _spacing(torch.tensor(1.5, dtype=torch.float64), state_dtype).item()
    init = (1 + torch.rand(*shape, generator=g)).to(state_dtype).to(DEVICE)
    # dt * x * B between 0.04 and 0.45 spacings a step: round to nearest loses every one.
    x = (0.15 * spacing / 0.02 * (0.5 + torch.rand(batch, nheads, headdim, generator=g))).to(DEVICE)
    B = (0.5 + 1.5 * torch.rand(batch, 1, dstate, generator=g)).to(DEVICE)
    C = torch.randn(batch, 1, dstate, generator=g).to(DEVICE)
    dt = torch.full((batch, nheads, headdim), 0.02, device=DEVICE)
    A = torch.full((nheads, headdim, dstate), -1e-4, device=DEVICE)  # slow decay
    state = init.clone()
    ref = init.double()
    for step in range(steps):
        selective_state_update(state, x, dt, A, B, C, rounding=rounding, seed=1000 + step)
        ref, _ = state_update_step(ref, x.double(), dt.double(), A.double(), B.double(), C.double())
    return ((state.double() - ref) / spacing).flatten(), ((ref - init.double()) / spacing).mean().item()


def _bias_z(errors: torch.Tensor) -> float:
    return errors.mean().item() / (errors.std().item() / math.sqrt(errors.numel()))


def test_blocks_per_program():
    """Software SR's programs take sr_blocks blocks in turn only where enough programs remain, and a power of
    two of them (a program's pad rows are one tile)."""
    from ssmcheck.ops.state_update.fused_recurrent import SR_MIN_PROGRAMS, LaunchConfig, blocks_per_program  # noqa: PLC0415

    fp16 = LaunchConfig(block_p=8, num_warps=1, sr_blocks=4)
    assert blocks_per_program(fp16, 8, 256 * 80) == 4  # Mamba2-2.7B at batch 256: 40960 programs
    assert blocks_per_program(fp16, 8, SR_MIN_PROGRAMS // 2) == 4
    assert blocks_per_program(fp16, 8, SR_MIN_PROGRAMS // 2 - 1) == 1
    assert blocks_per_program(fp16, 8, 80) == 1  # batch 1
    assert [blocks_per_program(fp16, blocks, SR_MIN_PROGRAMS) for blocks in (1, 2, 3, 5, 16)] == [1, 2, 2, 4, 4]
    assert blocks_per_program(LaunchConfig(block_p=64, num_warps=1), 1, 10**6) == 1


@pytest.mark.parametrize("state_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("headdim", [24, 40])
def test_blocks_in_turn_give_the_same_bits(state_dtype, headdim, monkeypatch):
    """A software-SR step is the same function of its inputs whether a program takes one block of channels or
    several in turn (the last program's blocks partly or wholly past headdim): state and out bit for bit,
    through a pool with a pad row, on a state whose row groups take every path (fp16 subnormals, values
    below 2**-24 in some groups, normals in the others)."""
    g = torch.Generator().manual_seed(headdim)
    pool, batch, nheads, dstate = 5, 3, 2, 128
    # Channels 8k..8k+2 of every block hold tiny values (fp16's slow paths), the rest O(1).
    scale = torch.where(torch.arange(headdim) % 8 < 3, 2.0**-22, 1.0)[:, None]
    state = (torch.randn(pool, nheads, headdim, dstate, generator=g) * scale).to(state_dtype).to(DEVICE)
    x = torch.randn(batch, nheads, headdim, generator=g).to(DEVICE)
    dt = torch.rand(batch, nheads, headdim, generator=g).to(DEVICE)
    A = -torch.rand(nheads, headdim, dstate, generator=g).to(DEVICE)
    B, C = (torch.randn(batch, 1, dstate, generator=g).mul(2.0**-12).to(DEVICE) for _ in range(2))
    D = torch.randn(nheads, headdim, generator=g).to(DEVICE)
    slots = torch.tensor([3, -1, 0], device=DEVICE)
    results = []
    for launch in LAUNCHES[1:]:
        with monkeypatch.context() as patch:
            _launch_as(launch, patch)
            new = state.clone()
            out = torch.full((batch, nheads, headdim), float("nan"), device=DEVICE)
            selective_state_update(new, x, dt, A, B, C, D=D, state_batch_indices=slots, rounding="stochastic",
                                   seed=31, out=out)
            results.append((new.cpu(), out.cpu()))
    (one, one_out), (in_turn, in_turn_out) = results
    assert torch.equal(one_out[1], torch.zeros_like(one_out[1])) and torch.equal(one_out, in_turn_out)
    assert torch.equal(one.view(torch.int16), in_turn.view(torch.int16))
    assert not torch.equal(one.view(torch.int16), state.cpu().view(torch.int16))  # the step moved the state
    tiny = one.float().abs() < 2.0**-14
    assert tiny.any() and not tiny.all()


@pytest.mark.parametrize("state_dtype", [torch.float16, torch.bfloat16])
def test_stochastic_decode_is_unbiased_where_nearest_stagnates(state_dtype):
    steps, shape = 40, (1, 1, 16, 128)  # one program per step: the interpreter is slow
    sr, drift = _stagnating_decode(state_dtype, "stochastic", steps, shape)
    assert drift > 5  # the exact state moved by several spacings ...
    assert abs(_bias_z(sr)) < Z_LIMIT  # ... and SR follows it without bias,
    rn, _ = _stagnating_decode(state_dtype, "nearest", steps, shape)
    assert rn.mean().item() < -0.8 * drift  # while round to nearest lost (nearly) all of it.


@pytest.mark.parametrize("launch", LAUNCHES)
def test_stochastic_rounding_into_fp16_is_exact_where_16_bits_are_not_enough(launch, monkeypatch):
    """Values below 2**-17 drop more than the 16 random bits an element gets (below 2**-24, up to 128): a row
    group holding one is rounded again, from the old state, with whole words. Mixed here with row groups
    that hold none (their channels' x is 2**20 larger), in the interpreter's 64-channel programs and the
    GPU's 8-channel ones (one a program, or four in turn). Every value's rounded mean must be the value
    (z-test), only its two neighbours appear."""
    _launch_as(launch, monkeypatch)
    # fp16 subnormal range (19 and 22 dropped bits) and below 2**-24 (25 and 39 bits below the grid), with
    # fraction bits all the way down; times 2**24 (the other groups' x) they drop at most 15 bits.
    # Zeros beside them: a zero never sends its row group down the slow paths, the values beside it do.
    values = [2.0**-20 * 4 / 3, 2.0**-23 * 6 / 5, 2.0**-26 * 7 / 5, 2.0**-40 * 9 / 7, 0.0, 0.0, 0.0, 0.0]
    batch, nheads, headdim, dstate = 2, 4, 64, 128
    # The new state is dt * x * B exactly: dt = 1 (no softplus, no bias), the old state 0.
    B = torch.tensor(values, dtype=torch.float32).repeat(dstate // len(values))
    x = torch.where((torch.arange(headdim) // 16) % 2 == 1, 2.0**24, 1.0).expand(batch, nheads, headdim)
    state = torch.zeros(batch, nheads, headdim, dstate, dtype=torch.float16, device=DEVICE)
    selective_state_update(state, x.contiguous().to(DEVICE), torch.ones(batch, nheads, headdim, device=DEVICE),
                           -torch.ones(nheads, headdim, dstate, device=DEVICE),
                           B.expand(batch, 1, dstate).contiguous().to(DEVICE), B.expand(batch, 1, dstate).to(DEVICE),
                           rounding="stochastic", seed=2024)
    exact = x[..., None].double() * B.double()
    spacing = _spacing(exact, torch.float16)
    low = torch.floor(exact / spacing) * spacing
    got = state.cpu().double()
    assert torch.all((got == low) | (got == low + spacing)) and torch.all(got[exact == 0] == 0)
    for value in B.unique().double()[1:]:  # the zeros stay zeros (checked above: 0 is both neighbours)
        for scale in (1.0, 2.0**24):
            where = exact == value * scale
            p = ((exact[where] - low[where]) / spacing[where])[0].item()
            ups, n = int((got[where] > low[where]).sum()), int(where.sum())
            assert 0 < p < 1
            if n * min(p, 1 - p) >= 20:  # else too rare to count here (below 2**-24, p is 2**-16 * 9 / 7)
                assert abs((ups - n * p) / math.sqrt(n * p * (1 - p))) < Z_LIMIT, (value, scale, ups / n, p)


@pytest.mark.parametrize("launch", LAUNCHES)
def test_stochastic_rounding_follows_a_bitwise_model(launch, monkeypatch):
    """Each state element's SR is the documented function of its Philox bits (tests/sr_model.py: which word,
    which half, the continuation of ties, the 128-bit draw below 2**-24), bit for bit, whichever path the
    kernel takes: the new state is exactly x * B (old state 0, dt 1), and B's columns hold fp16 normals,
    subnormals, values below 2**-24, zeros, and ties made for one channel each."""
    from ssmcheck.ops.state_update import fused_recurrent  # noqa: PLC0415

    _launch_as(launch, monkeypatch)
    batch, nheads, headdim, dstate, seed = 2, 2, 16, 64, 99
    block_p = fused_recurrent.launch_config(headdim, dstate, torch.float16, interpreting()).block_p
    draws = sr_model.state_update_draws(seed, DEFAULT_PHILOX_ROUNDS, (batch, nheads, headdim, dstate), block_p)
    g = torch.Generator().manual_seed(seed)
    # Channels 0..7 scale B by 1, the others by 2**12: their products stay normal, and their row groups (with
    # 8-channel programs) take the common path.
    x = torch.where(torch.arange(headdim) < 8, 1.0, 2.0**12).expand(batch, nheads, headdim).contiguous()
    B = torch.empty(batch, 1, dstate)
    for b in range(batch):
        for n in range(dstate):
            kind = n % 8
            if kind == 0:
                B[b, 0, n] = 0.0
            elif kind == 1:  # below 2**-24
                B[b, 0, n] = float(torch.empty(1).uniform_(2.0**-40, 2.0**-24, generator=g))
            elif kind == 2:  # a tie for channel (n // 8) % 8 of head 0: 19 dropped bits, the draw's top 16 complement
                r16 = draws[b, 0, (n // 8) % 8, n][0]
                B[b, 0, n] = sr_model.float32((126 - 19) << 23 | 5 << 19 | (0xFFFF - r16) << 3 | n % 8)
            else:  # fp16 subnormals (x 1) and normals (x 2**12)
                B[b, 0, n] = float(torch.empty(1).uniform_(2.0**-17, 2.0**-13, generator=g)) * (-1) ** n
    state = torch.zeros(batch, nheads, headdim, dstate, dtype=torch.float16, device=DEVICE)
    selective_state_update(state, x.to(DEVICE), torch.ones(batch, nheads, headdim, device=DEVICE),
                           -torch.ones(nheads, headdim, dstate, device=DEVICE), B.to(DEVICE), B.to(DEVICE),
                           rounding="stochastic", seed=seed)
    paths = {}
    want = torch.tensor([[[[sr_model.round_element(float(x[b, h, p]) * float(B[b, 0, n]), *draws[b, h, p, n],
                                                    True, paths)
                            for n in range(dstate)] for p in range(headdim)] for h in range(nheads)]
                         for b in range(batch)], dtype=torch.float16)
    assert paths["tie"] >= 8 and paths["below 2**-24"] > 100, paths
    got = state.cpu()
    bad = (got.view(torch.int16) != want.view(torch.int16)).nonzero().tolist()
    assert not bad, f"{len(bad)} elements differ from the model, first {bad[:4]}"


# --- realistic sizes on the GPU -------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("state_dtype", DTYPES)
@pytest.mark.parametrize("tied", [False, True])
def test_mamba2_width_step(state_dtype, tied):
    # Mamba2-2.7B widths: 80 heads x 64 channels, dstate 128, one group. At batch 64 software SR's programs take
    # their blocks of channels in turn (fused_recurrent.blocks_per_program), as at any larger batch.
    inp = Inputs(11, 64, 80, 1, 64, 128, state_dtype=state_dtype, input_dtype=torch.bfloat16, tie_a=tied,
                 tie_dt=tied)
    for rounding in ("nearest",) if state_dtype == torch.float32 else ("nearest", "stochastic"):
        _check_step(inp, rounding=rounding, seed=4)


@pytest.mark.gpu
@pytest.mark.parametrize("state_dtype", [torch.float16, torch.bfloat16])
def test_stochastic_decode_is_unbiased_long(state_dtype):
    sr, drift = _stagnating_decode(state_dtype, "stochastic", 400, (2, 4, 64, 128))
    assert drift > 50
    assert abs(_bias_z(sr)) < Z_LIMIT
