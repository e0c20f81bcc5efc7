"""Reduced-precision baselines (TF32 operands, fp16 accumulation) and the classification of a failing
kernel's error by the precision it matches (scan.precision, DESIGN §3)."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ssmcheck.ops.chunk_scan.baseline import matmul_accumulating, scan_baseline, truncate_mantissa
from ssmcheck.ops.chunk_scan.naive import Arithmetic, scan_ssd
from ssmcheck.ops.rounding.naive import round_to
from ssmcheck.scan import precision as P
from ssmcheck.scan.inputs import ScanShape
from ssmcheck.scan.measure import error_stats
from ssmcheck.scan.regimes import REGIMES
from ssmcheck.scan.run import reference, reference_stream
from ssmcheck.scan.spec import ScanCase
from ssmcheck.scan.streamed import relative_errors

# ------------------------------------------------------------------------------------ operand rounding


def as_bits(t: torch.Tensor) -> list[int]:
    return t.contiguous().view(torch.int32).tolist()


def from_bits(patterns: list[int]) -> torch.Tensor:
    return torch.tensor(patterns, dtype=torch.int32).view(torch.float32)


def reference_truncate(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Float32 x cut to `bits` fraction bits with fp32's exponent range (emin -126), toward zero, by
    float64 exponent arithmetic (no bit patterns): the reference for truncate_mantissa."""
    xd = x.double()
    mag = xd.abs()
    _, e = torch.frexp(mag)
    e = torch.clamp(e.to(torch.int64) - 1, min=-126)
    ulp = torch.ldexp(torch.ones_like(mag), e - bits)
    return torch.copysign(torch.floor(mag / ulp) * ulp, xd).float()


def assert_same_bits(got: torch.Tensor, want: torch.Tensor):
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert as_bits(got[~nan]) == as_bits(want[~nan])


patterns = st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=64)


@settings(max_examples=200, deadline=None)
@given(patterns, st.integers(0, 23))
def test_truncate_mantissa_matches_the_exponent_arithmetic_reference(bits_list, bits):
    x = from_bits(bits_list)  # every float32: subnormals, NaN payloads, infinities, both zeros
    got = truncate_mantissa(x, bits)
    finite = torch.isfinite(x)
    assert_same_bits(got[finite], reference_truncate(x[finite], bits))
    # NaN and inf pass through bit for bit
    assert as_bits(got[~finite]) == as_bits(x[~finite])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 2**11 - 1), min_size=1, max_size=32), st.integers(-126, 127))
def test_ten_bit_values_are_unchanged_and_others_move_toward_zero(mantissas, exponent):
    m = torch.tensor(mantissas, dtype=torch.float64)
    values = torch.ldexp(m, torch.tensor(exponent - 10))  # at most 11 significant bits, fp32's range
    values = values[values.abs() < 2.0**128].float()
    assert as_bits(truncate_mantissa(values, 10)) == as_bits(values)
    assert as_bits(truncate_mantissa(-values, 10)) == as_bits(-values)
    # Anything else loses its low 13 bits: it moves toward zero, by less than one 10-bit ulp.
    x = torch.randn(256, dtype=torch.float32) * 2.0 ** (exponent % 60 - 30)
    t = truncate_mantissa(x, 10)
    assert all(p & 0x1FFF == 0 for p in as_bits(t))
    assert (t.abs() <= x.abs()).all() and (torch.sign(t) * torch.sign(x) >= 0).all()
    _, e = torch.frexp(x.double())
    assert ((t.double() - x.double()).abs() < torch.ldexp(torch.ones_like(x, dtype=torch.float64), e - 11)).all()


def test_truncation_is_toward_zero_and_keeps_signs():
    ulp = 2.0**-10  # a 10-bit ulp at 1
    x = torch.tensor([1 + ulp / 2, 1 + ulp * 0.999, 1 + ulp * 1.5, -(1 + ulp / 2), -(1 + ulp * 1.5), -0.0, 0.0])
    want = [1.0, 1.0, 1 + ulp, -1.0, -(1 + ulp), -0.0, 0.0]
    assert as_bits(truncate_mantissa(x.float(), 10)) == as_bits(torch.tensor(want, dtype=torch.float32))


def test_largest_values_subnormals_nan_and_inf():
    biggest = (2 - 2.0**-10) * 2.0**127  # the largest finite value with 10 fraction bits
    f32max = torch.finfo(torch.float32).max
    x = torch.tensor([biggest, f32max, -f32max, 2.0**-149, 2.0**-137, 3 * 2.0**-137, 2.0**-136,
                      math.inf, -math.inf, math.nan], dtype=torch.float32)
    got = truncate_mantissa(x, 10)
    # truncation never overflows: fp32's largest value goes down to the largest 10-bit value
    want = [biggest, biggest, -biggest, 0.0, 0.0, 2.0**-136, 2.0**-136, math.inf, -math.inf]
    assert got[:-1].tolist() == want
    assert math.isnan(got[-1])
    assert as_bits(got[-1:]) == as_bits(x[-1:])  # the payload too


def test_truncate_mantissa_rejects_what_it_cannot_cut():
    with pytest.raises(ValueError):
        truncate_mantissa(torch.ones(2, dtype=torch.float64), 10)
    with pytest.raises(ValueError):
        truncate_mantissa(torch.ones(2), 24)


def test_fp16_accumulation_is_rounded_at_every_step():
    ones = torch.ones(1, 4096), torch.ones(4096, 1)
    # One product at a time, an fp16 sum of ones stops at 2048 (2049 rounds back to 2048, ties to even);
    # sums of 16 exact products keep landing on multiples of 16, all representable below 4096.
    assert matmul_accumulating(*ones, torch.float16, step=1).item() == 2048.0
    assert matmul_accumulating(*ones, torch.float16, step=16).item() == 4096.0
    a, b = torch.randn(3, 5, 40), torch.randn(40, 7)
    assert torch.equal(matmul_accumulating(a, b, torch.float32, step=40), torch.matmul(a, b))


# ------------------------------------------------------------------------------- the baseline's options


def call(inputs, chunk_size, **kw):
    out = scan_baseline(inputs.x, inputs.dt, inputs.A, inputs.B, inputs.C, chunk_size, **inputs.kwargs(), **kw)
    return out.y, (out.varlen_states if inputs.varlen else out.final_states)


def todays_baseline(inputs, chunk_size, state_dtype=torch.float32):
    """scan_baseline as it was before the reduced-precision options (nearest rounding)."""
    x = inputs.x
    generator = torch.Generator(device=x.device).manual_seed(0)
    arith = Arithmetic(torch.float32, x.dtype, exact_segments=False,
                       store_state=lambda s: round_to(s.to(torch.float32), state_dtype, "nearest", generator))
    kw = inputs.kwargs()
    out = scan_ssd(x, inputs.dt, inputs.A, inputs.B, inputs.C, chunk_size, kw["D"], kw["z"], kw["dt_bias"],
                   kw["initial_states"], kw["cu_seqlens"], kw["dt_softplus"], kw["dt_limit"], arith)
    return out.y.to(x.dtype), (out.varlen_states if inputs.varlen else out.final_states)


SHAPE = ScanShape(batch=2, seqlen=96, nheads=4, headdim=16, dstate=16, ngroups=2, chunk_size=32)
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def assert_bitwise(a, b):
    for u, v in zip(a, b):
        assert u.dtype == v.dtype and torch.equal(u.view(torch.uint8), v.view(torch.uint8))


@pytest.mark.parametrize("regime", ["normal", "ragged", "initial-state", "decay-extreme", "large-magnitude"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_defaults_are_bitwise_unchanged(regime, dtype):
    inputs = REGIMES[regime].generate(SHAPE, DTYPES[dtype], 3)
    for storage in (torch.float32, torch.bfloat16):
        today = todays_baseline(inputs, 32, storage)
        assert_bitwise(call(inputs, 32, state_dtype=storage), today)
        assert_bitwise(call(inputs, 32, state_dtype=storage, matmul_operand_bits=None,
                            accumulate=torch.float32), today)
        # Through the reduced arithmetic, 23 bits round nothing.
        assert_bitwise(call(inputs, 32, state_dtype=storage, matmul_operand_bits=23), today)
        if dtype != "fp32":  # fp16 and bf16 operands have 10 fraction bits or fewer: TF32 changes nothing
            assert_bitwise(call(inputs, 32, state_dtype=storage, matmul_operand_bits=10), today)


def test_accumulate_must_be_a_float_format():
    inputs = REGIMES["normal"].generate(SHAPE, torch.float32, 0)
    with pytest.raises(ValueError, match="accumulate"):
        call(inputs, 32, accumulate=torch.float64)


def test_fp16_accumulation_errs_more_than_fp32_accumulation_on_fp16_inputs():
    inputs = REGIMES["normal"].generate(ScanShape(1, 256, 4, 32, 32, 1, 128), torch.float16, 1)
    ref = reference(inputs, "fp64")
    fp32_acc = call(inputs, 128)
    fp16_acc = call(inputs, 128, accumulate=torch.float16)
    assert fp16_acc[0].dtype == torch.float16 and fp16_acc[1].dtype == torch.float32
    assert all(torch.isfinite(t).all() for t in fp16_acc)
    for k in (0, 1):
        assert error_stats(fp16_acc[k], ref[k]).rel > 2 * error_stats(fp32_acc[k], ref[k]).rel


# ------------------------------------------------------------------------------------ the classification


def case_of(regime="normal", dtype="fp32", chunk_size=32, storage="fp32", seed=0) -> ScanCase:
    return ScanCase(kernel="k", regime=regime, dtype=dtype, chunk_size=chunk_size, seqlen=SHAPE.seqlen,
                    batch=SHAPE.batch, nheads=SHAPE.nheads, headdim=SHAPE.headdim, dstate=SHAPE.dstate,
                    ngroups=SHAPE.ngroups, state_dtype=storage, rounding="nearest", model=None, seed=seed)


def rel(out, ref) -> tuple[float, float]:
    return error_stats(out[0], ref[0]).rel, error_stats(out[1], ref[1]).rel


@pytest.fixture(scope="module")
def fp32_case():
    """A normal fp32 case: inputs, the float64 reference, and the candidate precisions."""
    shape = ScanShape(2, 256, 4, 32, 32, 1, 64)
    inputs = REGIMES["normal"].generate(shape, torch.float32, 0)
    ref = reference(inputs, "fp64")
    case = case_of(chunk_size=64)
    own = rel(call(inputs, 64), ref)
    measured = lambda streams: relative_errors(inputs, [(0, 512)], reference_stream(inputs, "fp64"), streams)  # noqa: E731
    return inputs, ref, own, P.candidate_precisions(inputs, case, torch.float32, measured, *own)


def test_candidates_differ_from_the_cases_own_baseline(fp32_case):
    inputs, _, _, precisions = fp32_case
    assert [p.name for p in precisions] == [P.BASELINE, P.TF32, P.FP16_STORAGE, P.BF16_STORAGE,
                                            P.FP16_ACCUMULATION]
    small = REGIMES["normal"].generate(SHAPE, torch.float32, 0)
    names = lambda inputs, storage, **kw: set(P.candidate_baselines(inputs, case_of(), storage, **kw))  # noqa: E731
    assert names(small, torch.float16) == {P.TF32, P.BF16_STORAGE, P.FP16_ACCUMULATION}
    assert names(small, torch.bfloat16) == {P.TF32, P.FP16_ACCUMULATION}
    assert names(small, torch.float32, allow_tf32=True) == {P.FP16_STORAGE, P.BF16_STORAGE, P.FP16_ACCUMULATION}
    fp16 = REGIMES["normal"].generate(SHAPE, torch.float16, 0)
    assert names(fp16, torch.float32) == {P.FP16_STORAGE, P.BF16_STORAGE, P.FP16_ACCUMULATION}
    bf16 = REGIMES["normal"].generate(SHAPE, torch.bfloat16, 0)
    assert names(bf16, torch.float32) == {P.FP16_STORAGE, P.BF16_STORAGE}


def test_allow_tf32_candidates_keep_tf32_operands():
    inputs = REGIMES["normal"].generate(SHAPE, torch.float32, 0)
    stream = P.candidate_baselines(inputs, case_of(), torch.float32, allow_tf32=True)[P.BF16_STORAGE]
    got = (stream.segment(0, SHAPE.batch * SHAPE.seqlen)[0].reshape(inputs.x.shape), stream.states()[0])
    assert_bitwise(got, call(inputs, 32, matmul_operand_bits=10, state_dtype=torch.bfloat16))
    assert P.judged_baseline_options(inputs, True) == {"matmul_operand_bits": 10}
    assert P.judged_baseline_options(inputs, False) == {}
    fp16 = REGIMES["normal"].generate(SHAPE, torch.float16, 0)
    assert P.judged_baseline_options(fp16, True) == {}


def test_a_tf32_kernel_is_named_tf32(fp32_case):
    inputs, ref, own, precisions = fp32_case
    # The "kernel": TF32 matmuls, chunked differently from the candidate so it is not the same computation.
    ky, ks = rel(call(inputs, 32, matmul_operand_bits=10), ref)
    assert 1e-5 < ky < 3e-3 and 1e-5 < ks < 3e-3
    assert ky > 100 * own[0] and own[0] < 1e-6  # the fp32 baseline errs at ~1e-7
    found = P.closest(ky, ks, precisions)
    assert found is not None and found[0].name == P.TF32
    assert 0.5 < found[1] < 2
    text = P.describe(found)
    assert re.fullmatch(r"consistent with TF32 matmuls \(ratio \d\.?\d* to a TF32 baseline\)", text), text


def test_a_kernel_storing_bf16_states_is_named_so(fp32_case):
    inputs, ref, _, precisions = fp32_case
    ky, ks = rel(call(inputs, 32, state_dtype=torch.bfloat16), ref)
    found = P.closest(ky, ks, precisions)
    assert found is not None and found[0].name == P.BF16_STORAGE
    assert P.describe(found).startswith("consistent with bf16 state storage (ratio ")


def test_a_kernel_accumulating_in_fp16_is_named_so(fp32_case):
    inputs, ref, _, precisions = fp32_case
    found = P.closest(*rel(call(inputs, 64, accumulate=torch.float16), ref), precisions)
    assert found is not None and found[0].name == P.FP16_ACCUMULATION and found[1] == 1.0


def test_a_broken_kernel_is_unexplained(fp32_case):
    inputs, ref, _, precisions = fp32_case
    y, states = call(inputs, 64)
    y = y.clone()
    y[:, 64:128] *= 1.01  # 1% too large in one chunk
    ky, ks = rel((y, states), ref)
    assert ky > 1e-3
    assert P.closest(ky, ks, precisions) is None
    assert P.describe(None).startswith("unexplained by reduced precision")
    record = P.as_json(None, precisions)
    assert record["closest_precision"] is None and record["ratio"] is None
    assert set(record["candidates"]) == {p.name for p in precisions}


def test_a_kernel_slightly_worse_than_its_baseline_is_closest_to_it(fp32_case):
    _, _, own, precisions = fp32_case
    found = P.closest(3 * own[0], 2 * own[1], precisions)
    assert found is not None and found[0].name == P.BASELINE and found[1] == pytest.approx(3)
    assert "same-precision baseline itself (ratio 3)" in P.describe(found)


# ------------------------------------------------------------------------------------ closest, purely

errors = st.floats(min_value=1e-9, max_value=1e-1)


@settings(max_examples=200, deadline=None)
@given(errors, errors, st.floats(min_value=0.3, max_value=3.0), st.floats(min_value=0.3, max_value=3.0))
def test_closest_finds_a_candidate_within_the_factor_and_reports_the_y_ratio(cy, cs, fy, fs):
    candidate = P.Precision(P.TF32, cy, cs)
    far = P.Precision(P.BF16_STORAGE, cy * 1e3, cs * 1e3)
    found = P.closest(cy * fy, cs * fs, [far, candidate])
    assert found is not None and found[0] is candidate
    assert found[1] == pytest.approx(fy)


@settings(max_examples=200, deadline=None)
@given(errors, errors, st.floats(min_value=4.5, max_value=1e3), st.sampled_from([0, 1]))
def test_closest_rejects_an_error_beyond_the_factor_in_either_output(cy, cs, factor, which):
    candidate = P.Precision(P.TF32, cy, cs)
    ky, ks = (cy * factor, cs) if which == 0 else (cy, cs / factor)
    assert P.closest(ky, ks, [candidate]) is None


def test_closest_skips_non_finite_candidates_and_kernels():
    good = P.Precision(P.TF32, 1e-4, 1e-4)
    nan = P.Precision(P.FP16_ACCUMULATION, math.nan, math.inf)
    assert P.closest(1e-4, 1e-4, [nan, good])[0] is good
    assert P.closest(math.inf, 1e-4, [good]) is None
    assert P.closest(math.nan, 1e-4, [good]) is None
    assert P.closest(1e-4, 1e-4, [nan]) is None


def test_closest_drops_candidates_that_err_like_the_cases_own_baseline():
    own = P.Precision(P.BASELINE, 2e-3, 1.6e-3)
    alike = P.Precision(P.FP16_STORAGE, 2e-3, 1.6e-3 * 1.4)  # bf16 inputs storing fp16 states
    found = P.closest(5e-3, 2.3e-3, [own, alike])
    assert found[0] is own
    assert P.closest(5e-3, 2.3e-3, [alike])[0] is alike  # without the baseline in the list, nothing is dropped


def test_exact_outputs_count_as_the_floor():
    own = P.Precision(P.BASELINE, 1e-7, 0.0)
    assert P.closest(2e-7, 0.0, [own])[0] is own
    assert P.closest(2e-7, 1e-6, [own]) is None


def test_as_json_of_a_match():
    found = (P.Precision(P.TF32, 2e-4, 3e-4), 1.1)
    record = P.as_json(found, [found[0]])
    assert record == {
        "closest_precision": "tf32 matmuls", "ratio": 1.1, "in_place": None,
        "description": "consistent with TF32 matmuls (ratio 1.1 to a TF32 baseline)",
        "candidates": {"tf32 matmuls": {"y_rel": 2e-4, "states_rel": 3e-4, "y_apart": None, "states_apart": None}},
    }
    placed = (P.Precision(P.TF32, 2e-4, 3e-4, 0.1, 0.2), 1.1)
    assert P.as_json(placed, [placed[0]])["in_place"] is True
    assert P.as_json(placed, [placed[0]])["candidates"]["tf32 matmuls"] == {
        "y_rel": 2e-4, "states_rel": 3e-4, "y_apart": 0.1, "states_apart": 0.2}


# ------------------------------------------------------------------------------------ size and place

def measured_against(inputs, kernel_out):
    """The fp32 fixture's candidates, their aparts measured from `kernel_out` (y, states)."""
    def measured(streams):
        return relative_errors(inputs, [(0, 512)], reference_stream(inputs, "fp64"), streams, kernel_out)
    return measured


def candidates_for(fp32_case, kernel_out):
    inputs, _, own, _ = fp32_case
    return P.candidate_precisions(inputs, case_of(chunk_size=64), torch.float32,
                                  measured_against(inputs, kernel_out), *own)


@pytest.mark.parametrize("options, name", [(dict(matmul_operand_bits=10), P.TF32),
                                           (dict(state_dtype=torch.bfloat16), P.BF16_STORAGE)])
def test_a_kernel_rounding_where_the_candidate_rounds_is_in_place(fp32_case, options, name):
    # Chunked at 32 where the candidates chunk at 64: another computation that rounds the same operands
    # (TF32) or a superset of the same states (bf16 storage).
    inputs, ref, _, _ = fp32_case
    out = call(inputs, 32, **options)
    precisions = candidates_for(fp32_case, out)
    found = P.closest(*rel(out, ref), precisions)
    assert found is not None and found[0].name == name
    assert P.in_place(found[0]) is True and max(found[0].y_apart, found[0].states_apart) < 0.9
    assert P.describe(found).startswith("consistent with ")
    assert P.as_json(found, precisions)["in_place"] is True


def test_a_bug_erring_as_much_as_a_precision_is_a_match_in_size_only(fp32_case):
    # The float64 reference plus random noise scaled to bf16 state storage's errors in y and in the states:
    # the same size, rounded nowhere that baseline rounds.
    inputs, ref, _, _ = fp32_case
    bf16 = call(inputs, 64, state_dtype=torch.bfloat16)
    generator = torch.Generator().manual_seed(5)
    out = []
    for want, truth in zip(bf16, ref[:2]):
        truth = truth.double()
        noise = torch.randn(truth.shape, generator=generator, dtype=torch.float64)
        out.append((truth + noise * (want.double() - truth).norm() / noise.norm()).float())
    precisions = candidates_for(fp32_case, tuple(out))
    found = P.closest(*rel(out, ref), precisions)
    assert found is not None and found[0].name == P.BF16_STORAGE and 0.8 < found[1] < 1.25
    # Independent errors of one size lie sqrt 2 apart.
    assert 1.2 < found[0].y_apart < 1.7 and 1.2 < found[0].states_apart < 1.7
    assert P.in_place(found[0]) is False
    text = P.describe(found)
    assert re.fullmatch(r"errs as much as bf16 state storage \(ratio [\d.]+ to a baseline storing bf16 states\) "
                        r"but not where it rounds: the kernel's (y lies|states lie) 1\.[2-6]x as far from that "
                        r"baseline's as from the reference \(a bug that errs as much, or that precision at other "
                        r"points or in another order\)", text), text


def test_a_candidate_in_place_comes_before_one_nearer_in_size():
    near = P.Precision(P.TF32, 1e-4, 1e-4, 1.4, 1.4)
    placed = P.Precision(P.FP16_ACCUMULATION, 2e-4, 2e-4, 0.3, 0.5)
    assert P.closest(1e-4, 1e-4, [near, placed])[0] is placed
    half = P.Precision(P.FP16_ACCUMULATION, 2e-4, 2e-4, 0.3, 1.0)  # one output not nearer: not in place
    assert P.closest(1e-4, 1e-4, [near, half])[0] is near
    unmeasured = P.Precision(P.FP16_ACCUMULATION, 2e-4, 2e-4)
    assert P.closest(1e-4, 1e-4, [near, unmeasured])[0] is near
    assert P.in_place(unmeasured) is None and P.in_place(P.Precision(P.BASELINE, 1e-4, 1e-4, 0.1, 0.1)) is None


class Fixed:
    """A stream of given outputs: y flattened over tokens, and the states."""

    def __init__(self, y, states):
        self.y, self.final = y.flatten(0, 1), states

    def segment(self, f0, f1):
        return self.y[f0:f1], self.y[f0:f1]

    def states(self):
        return self.final, None


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**31 - 1), st.floats(min_value=1e-6, max_value=1.0), st.integers(1, 4))
def test_aparts_measure_distance_from_the_kernel_over_the_kernels_error(seed, scale, pieces):
    inputs = REGIMES["normal"].generate(SHAPE, torch.float32, seed % 1000)
    generator = torch.Generator().manual_seed(seed)
    rows, seqlen = inputs.x.shape[:2]
    ref_y = torch.randn(inputs.x.shape, generator=generator, dtype=torch.float64)
    ref_states = torch.randn(rows, SHAPE.nheads, SHAPE.headdim, SHAPE.dstate, generator=generator, dtype=torch.float64)
    kernel = tuple(t + scale * torch.randn(t.shape, generator=generator, dtype=torch.float64)
                   for t in (ref_y, ref_states))
    streams = {"reference": Fixed(ref_y, ref_states), "kernel": Fixed(*kernel),
               "double": Fixed(*(2 * k - r for k, r in zip(kernel, (ref_y, ref_states))))}
    cuts = torch.linspace(0, rows * seqlen, pieces + 1).round().int().tolist()
    found = relative_errors(inputs, list(zip(cuts, cuts[1:])), Fixed(ref_y, ref_states), streams, kernel)
    assert found["reference"][2:] == pytest.approx((1.0, 1.0), rel=1e-12)
    assert found["kernel"][2:] == (0.0, 0.0)
    assert found["double"][2:] == pytest.approx((1.0, 1.0), rel=1e-12)  # as far on the other side
    exact = relative_errors(inputs, [(0, rows * seqlen)], Fixed(ref_y, ref_states), streams, (ref_y, ref_states))
    assert exact["kernel"][2:] == (None, None)  # a kernel without error has no apart
    assert len(relative_errors(inputs, [(0, rows * seqlen)], Fixed(ref_y, ref_states), streams)["kernel"]) == 2


@pytest.mark.gpu
def test_tf32_emulation_agrees_across_devices_and_flags():
    """On the GPU the TF32 baseline rounds its operands itself: torch's allow_tf32 flag changes nothing
    beyond summation order, and the CPU computes the same figures."""
    inputs = REGIMES["normal"].generate(ScanShape(1, 512, 8, 64, 64, 1, 128), torch.float32, 0)
    ref = reference(inputs, "fp64")
    cpu = rel(call(inputs, 128, matmul_operand_bits=10), ref)
    cuda_inputs, cuda_ref = inputs.to("cuda"), tuple(t.to("cuda") for t in ref[:2])
    x = torch.randn(4096, dtype=torch.float32)
    assert as_bits(truncate_mantissa(x.cuda(), 10).cpu()) == as_bits(truncate_mantissa(x, 10))
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        for flag in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = flag
            gpu = rel(call(cuda_inputs, 128, matmul_operand_bits=10), cuda_ref)
            assert gpu == pytest.approx(cpu, rel=0.05)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k, num_warps", [(16, 16, 16, 1), (64, 64, 64, 4), (128, 64, 64, 4)])
def test_the_tf32_model_is_what_tritons_fp32_dot_computes(m, n, k, num_warps):
    """The TF32 baseline truncates operands because the GPU does: Triton's fp32 tl.dot (TF32 by
    default) agrees with truncated operands to float32 summation noise and not with operands
    rounded to nearest (whose products differ by ~1e-3)."""
    import triton
    import triton.language as tl

    @triton.jit
    def dot(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
        rm, rn, rk = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
        a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
        b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], tl.dot(a, b))

    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda", generator=g)
    b = torch.randn(k, n, device="cuda", generator=g)
    c = torch.full((m, n), math.nan, device="cuda")
    dot[(1,)](a, b, c, m, n, k, num_warps=num_warps)
    exact = a.double() @ b.double()
    truncated = truncate_mantissa(a, 10).double() @ truncate_mantissa(b, 10).double()
    assert ((c.double() - truncated).norm() / exact.norm()).item() < 1e-6
    assert ((c.double() - exact).norm() / exact.norm()).item() > 1e-4
