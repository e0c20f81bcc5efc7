"""drift.follow_kernel: the float64 side of a decode step in one Triton kernel, against the eager drift.follow."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_drift_follow import counted_calls

from ssmcheck.core import runtime
from ssmcheck.core.accesses import checked_accesses
from ssmcheck.core.fences import Fenced
from ssmcheck.core.tensors import moved
from ssmcheck.drift.follow import AGREEMENT_RTOL, MUTATED, follow, store_totals_agree, sums_agree, written_copies
from ssmcheck.drift.follow_kernel import follow_triton
from ssmcheck.drift.stats import STORE_SUMS, row_totals

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
DEVICE = runtime.environment().device  # compiled on a GPU, the interpreter on the CPU


def _arguments(seed, *, batch, nheads, ngroups, headdim, dstate, state_dtype, rounding, softplus, gate, strided,
               tied, input_dtype, poison):
    """A step's arguments as drift.lockstep passes them, drawn from `seed` (on the CPU, then moved to DEVICE): a state
    that has run a while (some rows in fp16's subnormal range, some large), the kernel's store of the next state and
    its output."""
    g = torch.Generator().manual_seed(seed)
    dtype = DTYPES[state_dtype]
    shape = (batch, nheads, headdim, dstate)
    ref = torch.randn(shape, generator=g, dtype=torch.float64) * torch.logspace(-7, 2, headdim,
                                                                                  dtype=torch.float64)[:, None]
    before = ref.to(dtype)
    baseline = before.double()
    if strided:  # x, dt, z as views into one buffer per row, as a serving engine's projections are
        wide = torch.randn((batch, nheads, 3 * headdim), generator=g).to(input_dtype)
        x, dt, z = wide[..., :headdim], wide[..., headdim:2 * headdim], wide[..., 2 * headdim:]
    else:
        x, dt, z = (torch.randn((batch, nheads, headdim), generator=g).to(input_dtype) for _ in range(3))
    if tied:  # Mamba2: dt, A, D, dt_bias one value per head
        dt = dt[..., :1].expand(x.shape)
        A = -torch.rand((nheads, 1, 1), generator=g, dtype=torch.float64).expand(nheads, headdim, dstate) * 4
        D = torch.randn((nheads, 1), generator=g, dtype=torch.float64).expand(nheads, headdim)
        dt_bias = torch.randn((nheads, 1), generator=g, dtype=torch.float64).expand(nheads, headdim)
    else:
        A = -torch.rand((nheads, headdim, dstate), generator=g, dtype=torch.float64) * 4
        D = torch.randn((nheads, headdim), generator=g, dtype=torch.float64)
        dt_bias = torch.randn((nheads, headdim), generator=g, dtype=torch.float64)
    if not softplus:
        dt = dt.abs()
    B, C = (torch.randn((batch, ngroups, dstate), generator=g).to(input_dtype) for _ in range(2))
    # The kernel's results: its state the exact update rounded, a third of it a little off (misrounded stores), its
    # output the reference's, a few poisoned.
    exact = before.double().clone()
    ref_out, _, _ = follow(ref=exact, baseline=before.double().clone(), before=before,
                          after=before.clone(), out=x.float(), x=x, dt=dt, z=z if gate else None, A=A, B=B, C=C, D=D,
                          dt_bias=dt_bias, sums=torch.zeros((len(STORE_SUMS), batch, nheads, headdim),
                                                            dtype=torch.float64),
                          tripped=torch.zeros((batch, nheads, headdim), dtype=torch.bool), uniform=None,
                          dt_softplus=softplus, dtype=dtype, rounding="nearest")
    after = torch.where(torch.rand(shape, generator=g, dtype=torch.float64) < 1 / 3, exact * 1.001, exact).to(dtype)
    out = ref_out.to(x.dtype)
    if poison:
        after.view(-1)[torch.randint(after.numel(), (3,), generator=g)] = float("nan")
        after.view(-1)[torch.randint(after.numel(), (2,), generator=g)] = float("inf")
        out.view(-1)[torch.randint(out.numel(), (2,), generator=g)] = float("nan")
        after[0, 0, 0, :] = 0.0  # a row flushed: fp16's subnormal stores counted
    sums = torch.rand((len(STORE_SUMS), batch, nheads, headdim), generator=g, dtype=torch.float64)
    tripped = torch.rand((batch, nheads, headdim), generator=g) < 0.1
    uniform = torch.rand(shape, generator=g, dtype=torch.float64) if rounding == "stochastic" else None
    tensors = dict(ref=ref, baseline=baseline, before=before, after=after, out=out, x=x, dt=dt,
                   z=z if gate else None, A=A, B=B, C=C, D=D, dt_bias=dt_bias, sums=sums, tripped=tripped,
                   uniform=uniform)
    # Views keep their layout: x, dt and z stay views of one buffer, A, D and dt_bias expanded.
    buffers: dict[tuple, torch.Tensor] = {}
    return dict(**{name: None if t is None else moved(t, DEVICE, buffers) for name, t in tensors.items()},
                dt_softplus=softplus, dtype=dtype, rounding=rounding)


def _both(arguments, fenced=None):
    """(the kernel's written arguments and results, the eager step's), each on copies of what it writes; the
    kernel's, with `fenced` (core.fences.Fenced of the arguments' tensors), on its copies between NaN fences."""
    mine, eager = written_copies(arguments), written_copies(arguments)
    if fenced is not None:
        mine = {**arguments, **fenced.tensors}
    return (mine, follow_triton(**mine)), (eager, follow(**eager))


def _assert_same_step(arguments, fenced=None):
    (mine, mine_outs), (eager, eager_outs) = _both(arguments, fenced)
    # The baseline bit for bit (its rounding is what drift compares stochastic rounding with), the flag exactly.
    assert torch.equal(mine["baseline"].view(torch.int64), eager["baseline"].view(torch.int64))
    assert torch.equal(mine["tripped"], eager["tripped"])
    torch.testing.assert_close(mine["ref"], eager["ref"], rtol=AGREEMENT_RTOL, atol=0.0, equal_nan=True)
    assert store_totals_agree(row_totals(mine["sums"]), row_totals(eager["sums"])), (row_totals(mine["sums"]),
                                                                                      row_totals(eager["sums"]))
    counts = [STORE_SUMS.index(name) for name in ("count", "subnormal", "flushed", "misrounded")]
    torch.testing.assert_close(mine["sums"][counts], eager["sums"][counts], rtol=0.0, atol=0.0)
    for value, expected in zip(mine_outs, eager_outs):
        assert sums_agree(value, expected)


@pytest.mark.parametrize("state_dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_the_kernels_step_is_the_eager_steps(state_dtype, rounding):
    _assert_same_step(_arguments(1, batch=2, nheads=4, ngroups=2, headdim=24, dstate=40, state_dtype=state_dtype,
                                 rounding=rounding, softplus=True, gate=False, strided=False, tied=True,
                                 input_dtype=torch.float32, poison=True))


def test_an_fp32_state_with_a_gate_and_untied_parameters():
    _assert_same_step(_arguments(2, batch=2, nheads=3, ngroups=1, headdim=72, dstate=16, state_dtype="fp32",
                                 rounding="nearest", softplus=True, gate=True, strided=True, tied=False,
                                 input_dtype=torch.float32, poison=True))


@settings(max_examples=12, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1), state_dtype=st.sampled_from(["fp16", "bf16"]),
       rounding=st.sampled_from(["nearest", "stochastic"]), heads=st.sampled_from([(1, 1), (4, 2), (6, 3)]),
       headdim=st.integers(1, 40), dstate=st.sampled_from([1, 5, 16, 40, 128]), softplus=st.booleans(),
       gate=st.booleans(), strided=st.booleans(), tied=st.booleans(),
       input_dtype=st.sampled_from([torch.float32, torch.bfloat16]), poison=st.booleans())
def test_any_layout_and_flags_step_as_the_eager_step(seed, state_dtype, rounding, heads, headdim, dstate, softplus,
                                                      gate, strided, tied, input_dtype, poison):
    nheads, ngroups = heads
    _assert_same_step(_arguments(seed, batch=2, nheads=nheads, ngroups=ngroups, headdim=headdim, dstate=dstate,
                                 state_dtype=state_dtype, rounding=rounding, softplus=softplus, gate=gate,
                                 strided=strided, tied=tied, input_dtype=input_dtype, poison=poison))


@pytest.mark.cpu
@settings(max_examples=16, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1), rounding=st.sampled_from(["nearest", "stochastic"]),
       headdim=st.integers(1, 40), dstate=st.sampled_from([1, 5, 16, 40, 128]), gate=st.booleans(),
       strided=st.booleans(), tied=st.booleans())
# Padded rows and columns in every tile (headdim 5 of 8, dstate 40 of 64), per-channel parameters, views.
@example(seed=1, rounding="stochastic", headdim=5, dstate=40, gate=True, strided=True, tied=False)
def test_every_read_and_write_stays_inside_its_argument(seed, rounding, headdim, dstate, gate, strided, tied):
    """On a GPU an access past every allocation may fault and end the sweep's CUDA context, which the Follower's check
    against the eager step cannot catch: ruled out here, in the interpreter, for every layout. Every access lies
    inside one of the launch's tensors (core.accesses), and every floating-point argument lies in a
    buffer of its own with NaN on both sides (core.fences): a read past one would bring NaN into what the step
    computes where the eager step's is finite, a write past one would be seen in the fences. (Values are compared
    elsewhere: here, on finite inputs, an untied decay's exp, numpy's in the interpreter and torch's in the eager
    step, may differ in a last bit that a cancelling state element shows beyond 1e-12 of itself.)"""
    arguments = _arguments(seed, batch=2, nheads=4, ngroups=2, headdim=headdim, dstate=dstate, state_dtype="fp16",
                           rounding=rounding, softplus=True, gate=gate, strided=strided, tied=tied,
                           input_dtype=torch.float32, poison=False)
    with checked_accesses() as seen:  # on the arguments as they are (a fenced one's storage holds its fences)
        _both(arguments)
    assert seen.launches == 1 and seen.outside() is None
    fenced = Fenced({name: value for name, value in arguments.items() if isinstance(value, torch.Tensor)})
    (mine, mine_outs), (eager, eager_outs) = _both(arguments, fenced)
    assert fenced.breached() is None
    for value, expected in [*((mine[name], eager[name]) for name in MUTATED), *zip(mine_outs, eager_outs)]:
        assert torch.equal(value.isnan(), expected.isnan())
    assert torch.equal(mine["tripped"], eager["tripped"])


def test_a_changed_rounding_is_seen():
    """The comparison above can fail: the baseline rounded to nearest where the step asked for stochastic."""
    arguments = _arguments(3, batch=1, nheads=2, ngroups=1, headdim=8, dstate=16, state_dtype="fp16",
                           rounding="stochastic", softplus=True, gate=False, strided=False, tied=True,
                           input_dtype=torch.float32, poison=False)
    mine, eager = written_copies(arguments), written_copies(arguments)
    follow_triton(**{**mine, "rounding": "nearest"})
    follow(**eager)
    assert not torch.equal(mine["baseline"], eager["baseline"])


@pytest.mark.gpu
def test_the_kernel_passes_the_followers_check_in_every_regimes_real_steps(monkeypatch):
    """As drift.lockstep runs it on CUDA: a Follower checks the kernel's first step against the eager one and keeps
    it only where they agree (to within 1e-12 of the store sums' totals, which cancel: only an exp and a log1p
    computed as the eager step's do that, so this holds on a GPU, where both are libdevice's, and not in the
    interpreter, whose exp is numpy's). In every regime's layouts (views, per-channel parameters and a gate, bf16
    inputs, fp16 subnormal states, no softplus, an fp32 state) it is kept, before torch.compile's step is tried,
    and every later step is its own."""
    from dataclasses import replace  # noqa: PLC0415

    from ssmcheck import api  # noqa: PLC0415
    from ssmcheck.drift import ahead  # noqa: PLC0415
    from ssmcheck.drift import follow as follow_module  # noqa: PLC0415

    calls = []
    monkeypatch.setattr(follow_module, "follow_triton", counted_calls(calls, follow_triton))
    monkeypatch.setattr(follow_module, "_compiled", lambda: 1 / 0)  # never made where the Triton step is kept
    plan = api.plan_drift("builtin", "default", device="cuda")
    seen = set()
    for case in plan.cases:  # one of each compile group: every layout, flag, dtype and rounding the preset has
        if ahead.compile_group(case) in seen:
            continue
        seen.add(ahead.compile_group(case))
        calls.clear()
        result = plan.runner(replace(case, steps=16, trials=1), lambda: None)
        assert result.status.value == "pass", (case.id, result.verdict.message)
        assert "float64 step" not in result.run.decode_loop, (case.id, result.run.decode_loop)
        assert len(calls) >= 3, case.id  # its check, the graph's capture, the eager step the replay is checked by
    assert len(seen) >= 20


def test_a_state_too_large_for_int32_offsets_is_refused_before_any_launch():
    """Past 2**31 elements the kernel's offsets (int32 products of strides) would wrap: it raises instead, so that a
    Follower goes on to its next fast step (nothing is allocated: the state is an expanded view)."""
    ref = torch.rand(1, dtype=torch.float64).expand(2**11, 2**10, 2**5, 2**5)
    with pytest.raises(ValueError, match="2\\*\\*31"):
        follow_triton(ref=ref, baseline=ref, before=ref, after=ref, out=None, x=None, dt=None, z=None, A=None,
                      B=None, C=None, D=None, dt_bias=None, sums=None, tripped=None, uniform=None, dt_softplus=True,
                      dtype=torch.float16, rounding="nearest")
