"""Long sequences in bounded memory (issue #13): the references and the figures computed a segment at a
time are the whole computation's, inputs do not depend on segmentation, and the memory check refuses."""

import dataclasses
import math

import pytest
import torch

from ssmcheck.core.tolerance import Tolerance
from ssmcheck.scan import memory, run, segments
from ssmcheck.scan.adapter import resolve
from ssmcheck.scan.inputs import ScanShape
from ssmcheck.scan.regimes import GENERATION_BLOCK, REGIMES
from ssmcheck.scan.spec import ScanCase


def test_cuts_fall_on_each_sequences_chunk_grid_and_cover_every_token():
    starts, total = [0, 5, 5, 50, 61], 100  # an empty sequence at 5; sequences of 5, 45, 11 and 39 tokens
    got = segments.cuts(starts, total, grid=8, tokens=20)
    assert got[0][0] == 0 and got[-1][1] == total and all(a[1] == b[0] for a, b in zip(got, got[1:]))
    for f0, f1 in got:
        assert f1 > f0
        begin = max(s for s in starts if s <= f1)
        assert f1 == total or (f1 - begin) % 8 == 0
    assert segments.cuts([0], 7, grid=4, tokens=100) == [(0, 7)]  # a short case is one segment


CASES = [  # regime, batch, seqlen, chunk, dtype, state, rounding
    ("normal", 2, 300, 32, "fp32", "fp32", "nearest"),
    ("long", 1, 520, 64, "bf16", "fp32", "nearest"),
    ("ragged", 3, 90, 16, "fp16", "fp16", "stochastic"),
    ("initial-state", 2, 70, 16, "fp32", "bf16", "nearest"),
    ("decay-extreme", 2, 100, 32, "fp32", "fp32", "nearest"),
]


@pytest.mark.parametrize("regime, batch, seqlen, chunk, dtype, state, rounding", CASES)
def test_streamed_figures_are_the_whole_computations(monkeypatch, regime, batch, seqlen, chunk, dtype, state, rounding):
    """Segments of ~100 tokens (not a multiple of the chunk size, dividing no sequence) give the one-segment
    figures; a broken kernel keeps the comparison meaningful (errors, non-finite location, groups)."""
    case = ScanCase(kernel="torch", regime=regime, dtype=dtype, chunk_size=chunk, seqlen=seqlen, batch=batch,
                    nheads=4, headdim=8, dstate=8, ngroups=2, state_dtype=state, rounding=rounding, model=None,
                    seed=4321)
    kernel = resolve("torch", interpreter=True)
    real_call = kernel.call

    def poisoned(inputs, case, transcript=None, nan_fences=None):  # a token mid-sequence NaN, another 1% off
        y, states = real_call(inputs, case, transcript, nan_fences)
        y = y.clone()
        y[0, y.shape[1] // 2, 1, 3] = float("nan")
        y[-1, 7] *= 1.01
        return y, states

    monkeypatch.setattr(type(kernel), "call", lambda self, *a, **k: poisoned(*a, **k))
    whole = run.run_case(case, kernel, Tolerance(), "fp64", "cpu")
    monkeypatch.setattr(segments, "SEGMENT_ELEMENTS", 100 * 4 * 8)
    cuts = segments.case_cuts(REGIMES[regime].generate(case.shape(), torch.float32, 1), chunk, None)
    assert len(cuts) > 1
    streamed = run.run_case(case, kernel, Tolerance(), "fp64", "cpu")
    assert whole.status.value == streamed.status.value == "nonfinite"
    assert dataclasses.asdict(streamed.first_nonfinite) == dataclasses.asdict(whole.first_nonfinite)
    for a, b in ((whole.kernel, streamed.kernel), (whole.baseline, streamed.baseline)):
        for x, y in ((a.y, b.y), (a.states, b.states), (a.ssm, b.ssm)):
            if x is None:
                assert y is None
                continue
            assert x.worst == y.worst and _same(x.max_abs, y.max_abs) and _same(x.rel, y.rel)
    assert whole.baseline.y.rel > 0  # a real baseline error, not zeros
    w, s = whole.worst_group, streamed.worst_group
    assert (w.sequence, w.chunk, w.head) == (s.sequence, s.chunk, s.head)
    assert _same(w.rel, s.rel) and _same(w.baseline_rel, s.baseline_rel)
    assert all(_same(a, b) for a, b in zip(whole.per_chunk, streamed.per_chunk))
    assert len(whole.per_chunk) == len(streamed.per_chunk)


def _same(a: float, b: float) -> bool:
    """Equal up to the order of a sum of squares (1e-12), or both the same non-finite value."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return a == pytest.approx(b, rel=1e-12, abs=0)


def test_the_chunked_reference_streams_bit_for_bit():
    from ssmcheck.ops.chunk_scan import naive

    inputs = REGIMES["initial-state"].generate(ScanShape(3, 150, 4, 8, 8, 2, 16), torch.float32, 9)
    args = (inputs.x, inputs.dt, inputs.A, inputs.B, inputs.C, 16)
    whole = naive.scan_chunked(*args, **inputs.kwargs())
    stream = naive.SSDStream(*args, **inputs.kwargs(), arith=naive.chunked_arithmetic())
    cuts = segments.cuts(segments.sequence_starts(inputs), 450, 16, 70)
    y = torch.cat([stream.segment(f0, f1)[0] for f0, f1 in cuts])
    assert torch.equal(y, whole.y.flatten(0, 1)) and torch.equal(stream.states()[1], whole.varlen_states)
    with pytest.raises(ValueError, match="cuts a chunk"):
        naive.SSDStream(*args, **inputs.kwargs(), arith=naive.chunked_arithmetic()).segment(0, 5 + cuts[0][1])


@pytest.mark.parametrize("regime", ["normal", "long"])
def test_token_inputs_depend_on_position_not_length(regime):
    """Blocks of token-wise inputs are drawn from (seed, block): a longer case starts with a shorter one's."""
    short = REGIMES[regime].generate(ScanShape(1, GENERATION_BLOCK + 10, 2, 4, 4, 1, 64), torch.bfloat16, 5)
    longer = REGIMES[regime].generate(ScanShape(1, 2 * GENERATION_BLOCK + 3, 2, 4, 4, 1, 64), torch.bfloat16, 5)
    for name in ("x", "dt", "B", "C", "z"):
        a, b = getattr(short, name), getattr(longer, name)
        assert torch.equal(a, b[:, : a.shape[1]]) and a.abs().sum() > 0
    assert not torch.equal(longer.x[:, :GENERATION_BLOCK], longer.x[:, GENERATION_BLOCK : 2 * GENERATION_BLOCK])
    assert torch.equal(short.A, longer.A) and torch.equal(short.dt_bias, longer.dt_bias)


def test_the_memory_estimate_and_the_refusal(monkeypatch):
    from ssmcheck import api

    case = api.plan_scan(model="Mamba2-2.7B", dtype="bf16", regime="normal", chunk_size="256",
                         seqlen="1048576").cases[0]
    need = memory.estimate(case)
    assert 20 * 2**30 < need.total < 139 * 2**30  # 1M tokens at Mamba2-2.7B widths fit in an H200
    assert need.segment < 16 * 2**30 and need.calls > 3 * 10 * 2**30  # bf16 x, z and y are 10 GiB each
    monkeypatch.setattr(memory, "free_bytes", lambda device: 2**30)
    with pytest.raises(api.UsageError, match=r"needs about .* GiB of GPU memory, more than the 1.0 GiB free"):
        api.plan_scan(model="Mamba2-2.7B", dtype="bf16", regime="normal", seqlen="262144")
    assert "1.0 GiB free" in api.plan_scan(seqlen="64").memory  # a small sweep fits


def test_conv_output_is_counted_with_x_b_and_c_twice():
    # Its x, B and C are views into the conv's output, and the in_proj buffer holds their columns too.
    from ssmcheck import api

    options = dict(model="Mamba2-2.7B", dtype="bf16", chunk_size="256", seqlen="65536", batch="1")
    plain = memory.estimate(api.plan_scan(regime="normal", **options).cases[0])
    conv = memory.estimate(api.plan_scan(regime="conv-output", **options).cases[0])
    twice = 65536 * (80 * 64 + 2 * 1 * 128) * 2  # x, B and C in bf16 (one group)
    assert conv.calls - plain.calls == conv.comparison - plain.comparison == twice


@pytest.mark.cpu
def test_the_cpu_has_no_free_memory_to_check():
    from ssmcheck import api

    assert "not checked on the CPU" in api.plan_scan(seqlen="64", device="cpu").memory


def test_invariance_checks_are_counted_in_the_memory_estimate(monkeypatch):
    # They hold the whole float64 reference (not a segment of it): a sweep that fits without them may not.
    from ssmcheck import api

    options = dict(model="Mamba2-2.7B", dtype="bf16", regime="normal", chunk_size="256", seqlen="262144",
                   batch="1")
    case = api.plan_scan(**options).cases[0]
    plain, checked = memory.estimate(case), memory.estimate(case, invariance=True)
    elements = 262144 * 80 * 64
    assert plain.invariance == 0 and checked.invariance > elements * memory.INVARIANCE_BYTES_PER_ELEMENT
    assert checked.total == checked.invariance > plain.total
    assert "invariance checks" in api.plan_scan(**options, invariance=True).memory
    between = (plain.total + checked.total) // 2
    monkeypatch.setattr(memory, "free_bytes", lambda device: between)
    assert "free on the GPU" in api.plan_scan(**options).memory
    with pytest.raises(api.UsageError, match=r"needs about .* GiB of GPU memory"):
        api.plan_scan(**options, invariance=True)
