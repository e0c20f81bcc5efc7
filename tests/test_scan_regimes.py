"""Scan input regimes (DESIGN §4): shapes, determinism, and the extremes each one promises."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ssmcheck.ops.chunk_scan.naive import scan_recurrent
from ssmcheck.ops.naive import process_dt
from ssmcheck.scan.inputs import ScanShape
from ssmcheck.scan.regimes import LONG_DT_LIMIT, REGIMES

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _shape(batch=2, seqlen=100, nheads=4, headdim=8, dstate=8, ngroups=2, chunk_size=32):
    return ScanShape(batch, seqlen, nheads, headdim, dstate, ngroups, chunk_size)


@pytest.mark.parametrize("name", list(REGIMES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_regime_builds_valid_deterministic_inputs(name, dtype):
    shape = _shape()
    a = REGIMES[name].generate(shape, dtype, seed=7)
    b = REGIMES[name].generate(shape, dtype, seed=7)
    c = REGIMES[name].generate(shape, dtype, seed=8)
    rows, tokens = (1, shape.batch * shape.seqlen) if a.varlen else (shape.batch, shape.seqlen)
    assert a.x.shape == (rows, tokens, 4, 8) and a.x.dtype == dtype
    assert a.dt.shape == (rows, tokens, 4) and a.B.shape == a.C.shape == (rows, tokens, 2, 8)
    assert a.A.shape == (4,) and a.A.dtype == torch.float32 and bool((a.A < 0).all())
    assert torch.equal(a.x, b.x) and torch.equal(a.dt, b.dt) and not torch.equal(a.x, c.x)
    for t in (a.x, a.dt, a.B, a.C, a.A):
        assert bool(torch.isfinite(t).all())
    assert REGIMES[name].explanation and "\n" not in REGIMES[name].explanation


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 9), st.integers(1, 60), st.sampled_from([16, 32, 64]), st.integers(0, 2**31 - 1))
def test_ragged_packs_sequences_with_mid_chunk_boundaries_and_length_one_ones(nseq, seqlen, chunk, seed):
    inputs = REGIMES["ragged"].generate(_shape(batch=nseq, seqlen=seqlen, chunk_size=chunk), torch.float32, seed)
    cu = inputs.cu_seqlens.tolist()
    lengths = [b - a for a, b in zip(cu, cu[1:])]
    assert len(lengths) == nseq and cu[0] == 0 and cu[-1] == nseq * seqlen and min(lengths) >= 1
    assert lengths[0] == 1 and (nseq == 2 or lengths[-1] == 1 or lengths[1] == 1)
    inner = cu[1:-1]
    if len([c for c in range(1, cu[-1]) if c % chunk]) >= len(inner) + 2:
        assert all(c % chunk for c in inner)  # every boundary mid-chunk where there is room
    assert inputs.seq_idx.shape == (1, cu[-1]) and inputs.seq_idx.dtype == inputs.cu_seqlens.dtype == torch.int64


@pytest.mark.parametrize("regime", sorted(set(REGIMES) - {"ragged"}))
def test_every_other_regime_passes_its_indices_as_int32_as_engines_do(regime):
    inputs = REGIMES[regime].generate(_shape(batch=3, seqlen=40, chunk_size=16), torch.bfloat16, 1)
    assert inputs.cu_seqlens is None or inputs.cu_seqlens.dtype == inputs.seq_idx.dtype == torch.int32


def test_narrowed_inputs_take_int32_indices_with_the_same_values_and_say_why():
    wide = REGIMES["ragged"].generate(_shape(batch=3, seqlen=40, chunk_size=16), torch.bfloat16, 1)
    narrowed = wide.narrowed("why")
    assert narrowed.cu_seqlens.dtype == narrowed.seq_idx.dtype == torch.int32 and narrowed.note == wide.note + "; why"
    assert narrowed.cu_seqlens.tolist() == wide.cu_seqlens.tolist() and wide.wide_indices and not narrowed.wide_indices


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 9), st.integers(1, 300), st.sampled_from([16, 32, 64, 256]), st.integers(0, 2**31 - 1))
def test_aligned_puts_every_boundary_it_can_on_a_chunk_boundary(nseq, seqlen, chunk, seed):
    inputs = REGIMES["aligned"].generate(_shape(batch=nseq, seqlen=seqlen, chunk_size=chunk), torch.float32, seed)
    cu = inputs.cu_seqlens.tolist()
    total = nseq * seqlen
    assert len(cu) == nseq + 1 and cu[0] == 0 and cu[-1] == total and all(a < b for a, b in zip(cu, cu[1:]))
    on_chunks = [c for c in cu[1:-1] if c % chunk == 0]
    assert len(on_chunks) == min(nseq - 1, (total - 1) // chunk)  # all, or every chunk boundary there is
    assert inputs.seq_idx.shape == (1, total) and inputs.initial_states is None


def test_ragged_and_initial_state_with_one_sequence_are_a_lone_varlen_sequence():
    for name in ("ragged", "aligned", "initial-state"):
        inputs = REGIMES[name].generate(_shape(batch=1, seqlen=77), torch.float32, 3)
        assert inputs.cu_seqlens.tolist() == [0, 77]
    lone = REGIMES["initial-state"].generate(_shape(batch=1, seqlen=77), torch.float32, 3)
    assert lone.initial_states.shape == (1, 4, 8, 8) and bool(lone.initial_states.abs().sum() > 0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk", [64, 256])
def test_decay_extreme_reaches_huge_exact_cumulative_decays_with_zero_dt_padding(dtype, chunk):
    inputs = REGIMES["decay-extreme"].generate(_shape(batch=3, seqlen=300, chunk_size=chunk), dtype, 5)
    assert inputs.dt_bias is not None and not inputs.dt_softplus and inputs.dt_limit == (0.0, float("inf"))
    dt = process_dt(inputs.dt, inputs.dt_bias, False, inputs.dt_limit, torch.float32)  # dt + 1, exact
    assert bool((dt == 0).any()) and bool((dt[:, -1] == 0).any())  # scattered zeros and trailing padding
    dA = dt * inputs.A  # what a kernel computes in fp32
    chunks = torch.nn.functional.pad(dA, (0, 0, 0, -300 % chunk)).unflatten(1, (-1, chunk))
    cum32 = chunks.cumsum(2)
    peak = float(cum32.abs().amax())
    assert 1e4 <= peak <= 1e9
    # Every partial sum is exact in fp32: it equals the float64 sum, in any order of addition.
    assert torch.equal(cum32.double(), chunks.double().cumsum(2))
    assert torch.equal(chunks.flip(2).cumsum(2).double(), chunks.double().flip(2).cumsum(2))
    nonzero = dA[dA != 0].abs()
    assert float(nonzero.min()) >= 256  # no moderate decay rides on the huge cumsum


def test_dt_extreme_lies_past_the_softplus_threshold_or_far_below_zero():
    inputs = REGIMES["dt-extreme"].generate(_shape(seqlen=256, chunk_size=256), torch.bfloat16, 2)
    raw = inputs.dt.float()
    even, odd = raw[..., 0::2], raw[..., 1::2]
    assert bool(((even >= 21) | (even <= -23)).all()) and bool((even >= 21).any()) and bool((even <= -23).any())
    dA = process_dt(inputs.dt, inputs.dt_bias, True, inputs.dt_limit, torch.float32) * inputs.A
    cum = dA[..., 0::2].cumsum(1)
    assert torch.equal(cum.round(), torch.where(cum.abs() < 1, 0.0, cum))  # integer partial sums
    # The odd heads: under the threshold, past fp16's exp overflow, with moderate decays and small cumulative sums.
    assert bool(((odd >= 12) & (odd <= 20) | (odd <= -23)).all()) and bool((odd >= 12).any())
    assert bool(torch.isinf(odd.half().exp()).any())
    assert set(inputs.A[1::2].tolist()) <= {-2.0**-5, -2.0**-6}
    assert 0.18 < float(dA[..., 1::2].abs().max()) < 0.63 and float(dA[..., 1::2].cumsum(1).abs().max()) < 100


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_magnitude_reaches_a_64th_of_the_format_without_overflow(dtype):
    inputs = REGIMES["large-magnitude"].generate(_shape(seqlen=150), dtype, 4)
    ref = scan_recurrent(inputs.x, inputs.dt, inputs.A, inputs.B, inputs.C, **inputs.kwargs())
    peak = max(float(ref.y.abs().max()), float(ref.final_states.abs().max()))
    assert peak == pytest.approx(torch.finfo(dtype).max / 64, rel=0.05)
    assert bool(torch.isfinite(inputs.x).all())


def test_large_magnitude_respects_a_narrower_state_dtype():
    inputs = REGIMES["large-magnitude"].generate(_shape(seqlen=150), torch.bfloat16, 4, state_dtype=torch.float16)
    ref = scan_recurrent(inputs.x, inputs.dt, inputs.A, inputs.B, inputs.C, **inputs.kwargs())
    assert float(ref.final_states.abs().max()) <= torch.finfo(torch.float16).max / 60


def test_long_needs_many_chunks():
    long = REGIMES["long"]
    assert long.skip_reason(_shape(seqlen=7 * 32, chunk_size=32)) is not None
    assert long.skip_reason(_shape(seqlen=7 * 32 + 1, chunk_size=32)) is None
    assert REGIMES["normal"].skip_reason(_shape(seqlen=5, chunk_size=256)) is None
    inputs = long.generate(_shape(seqlen=300, chunk_size=32), torch.float32, 1)
    assert inputs.initial_states is not None and inputs.dt_limit == LONG_DT_LIMIT


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), nheads=st.integers(1, 8),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
def test_both_ends_of_longs_dt_limit_clamp_tokens_of_every_head(seed, nheads, dtype):
    """A kernel that ignores dt_limit, or one of its ends, computes another dt in every head of every long case."""
    inputs = REGIMES["long"].generate(_shape(nheads=nheads, ngroups=1, seqlen=2100, chunk_size=256, batch=1), dtype,
                                     seed)
    dt = process_dt(inputs.dt, inputs.dt_bias, True, (0.0, math.inf), torch.float64)  # unclamped
    lo, hi = inputs.dt_limit
    assert (dt < lo).flatten(0, 1).any(0).all() and (dt > hi).flatten(0, 1).any(0).all()


def test_normal_dt_lies_in_the_trained_range_through_dt_bias():
    inputs = REGIMES["normal"].generate(_shape(batch=4, seqlen=500), torch.float32, 9)
    dt = process_dt(inputs.dt, inputs.dt_bias, True, inputs.dt_limit, torch.float64)
    assert float(dt.median()) > 1e-3 / 3 and float(dt.median()) < 0.1 * 3
    assert -16 <= float(inputs.A.min()) and float(inputs.A.max()) <= -1
    assert math.isclose(float(inputs.x.std()), 1.0, rel_tol=0.1)
