"""The Triton rounding conversions (ssmcheck/ops/rounding/stochastic.py), DESIGN §3.

Two software SR paths are checked alike: the elementwise `stochastic_round`
(through `round_to_storage`, as the chunk scan uses it) and `stochastic_round_pairs`, 16 bits an element,
a Philox call per eight (through the `stochastic_round_tensor` launcher, as the state update shares them).
Many draws of one value are many elements holding it:
each element has its own Philox counter. Philox is deterministic, so every
statistical test here has a fixed outcome for its recorded seed.
"""

import math

import pytest
import sr_model
import torch
import triton
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st

from ssmcheck.core import runtime
from ssmcheck.ops import interpreting
from ssmcheck.ops.rounding.naive import round_to
from ssmcheck.ops.rounding.stochastic import (
    DEFAULT_PHILOX_ROUNDS,
    _fp16_below_normal,
    _fp16_continued,
    _fp16_normal,
    _round_with_words,
    round_to_storage,
    stochastic_round_tensor,
    triton_dtype,
)

LOW = (torch.float16, torch.bfloat16)
PATHS = ("elementwise", "shared")
Z_LIMIT = 4.5  # two-sided; a false alarm about once in 150 000 tests
DEVICE = runtime.environment().device
FP16_MAX = 65504.0
BF16_MAX = (2 - 2**-7) * 2.0**127


@triton.jit
def _elementwise_kernel(x_ptr, out_ptr, n, seed, DTYPE: tl.constexpr, STOCHASTIC: tl.constexpr,
                        N_ROUNDS: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    x = tl.load(x_ptr + offsets, mask=inside, other=0.0)
    tl.store(out_ptr + offsets, round_to_storage(x, seed, offsets, DTYPE, STOCHASTIC, N_ROUNDS),
             mask=inside)


@triton.jit
def _words_kernel(x_ptr, w_ptr, out_ptr, DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    # SR with caller-chosen random words, to check the comparison bit by bit.
    i = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i)
    y = _round_with_words(x, tl.load(w_ptr + 4 * i).to(tl.uint32, bitcast=True),
                          tl.load(w_ptr + 4 * i + 1).to(tl.uint32, bitcast=True),
                          tl.load(w_ptr + 4 * i + 2).to(tl.uint32, bitcast=True),
                          tl.load(w_ptr + 4 * i + 3).to(tl.uint32, bitcast=True), DTYPE)
    tl.store(out_ptr + i, y)


@triton.jit
def _harmonic_kernel(out_ptr, steps, seed, DTYPE: tl.constexpr, STOCHASTIC: tl.constexpr, TRIALS: tl.constexpr):
    # TRIALS independent running sums s = round(s + 1/k), s held in DTYPE.
    trial = tl.arange(0, TRIALS)
    s = tl.zeros((TRIALS,), DTYPE)
    for k in range(1, steps + 1):
        s = round_to_storage(s.to(tl.float32) + 1.0 / k, seed, k * TRIALS + trial, DTYPE, STOCHASTIC, 10)
    tl.store(out_ptr + trial, s)


def _elementwise(x: torch.Tensor, dtype, seed: int = 0, stochastic: bool = True, philox_rounds: int = 10):
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    # The interpreter's cost is per program, not per element: big blocks there make 2**20 draws cheap.
    block = min(2**16, max(1024, triton.next_power_of_2(x.numel()))) if interpreting() else 1024
    _elementwise_kernel[(triton.cdiv(x.numel(), block),)](
        x, out, x.numel(), seed, DTYPE=triton_dtype(dtype), STOCHASTIC=stochastic, N_ROUNDS=philox_rounds,
        BLOCK=block)
    return out


def _sr(path: str, x: torch.Tensor, dtype, seed: int) -> torch.Tensor:
    if path == "elementwise":
        return _elementwise(x, dtype, seed)
    return stochastic_round_tensor(x, dtype, seed)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, except that any NaN matches any NaN."""
    nan = torch.isnan(a.float())
    return bool(torch.equal(nan, torch.isnan(b.float())) and torch.equal(_bits(a)[~nan], _bits(b)[~nan]))


def _neighbours(x: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The dtype values toward zero and away from zero around finite fp32 x (equal when x is representable).

    Beyond the largest finite value the outer neighbour is inf (the shared overflow convention).
    """
    mag = x.abs()
    near = mag.to(dtype)  # torch rounds fp32 once, to nearest even
    bits = near.view(torch.int16).to(torch.int32)
    below = near.double() < mag.double()
    above = near.double() > mag.double()
    inner = torch.where(above, bits - 1, bits).to(torch.int16).view(dtype)
    outer = torch.where(below, bits + 1, bits).to(torch.int16).view(dtype)
    sign = torch.sign(x.double()).where(x != 0, torch.ones_like(x, dtype=torch.float64))
    return sign * inner.double(), sign * outer.double()


def _up_fraction(x: torch.Tensor, dtype) -> torch.Tensor:
    """P(away from zero) under ideal SR, in float64 (inf stands for 2**(emax+1))."""
    inner, outer = _neighbours(x, dtype)
    limit = 2.0**16 if dtype == torch.float16 else 2.0**128
    outer = torch.where(torch.isinf(outer), torch.copysign(torch.full_like(outer, limit), outer), outer)
    gap = (outer - inner).abs()
    return torch.where(gap > 0, (x.double() - inner).abs() / gap, torch.zeros_like(gap))


def _z(successes: int, trials: int, p: float) -> float:
    """z statistic of a binomial count against probability p (0 < p < 1)."""
    return (successes - trials * p) / math.sqrt(trials * p * (1 - p))


def _draws(path, values: list[float], dtype, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n SR draws of each value: (x (len, n) fp32, rounded (len, n))."""
    x = torch.tensor(values, dtype=torch.float32, device=DEVICE)[:, None].expand(-1, n).contiguous()
    return x, _sr(path, x, dtype, seed)


def _random_fp32(seed: int, n: int) -> torch.Tensor:
    """fp32 values spread over every binade of fp16 and bf16 (incl. subnormals, overflow), both signs."""
    g = torch.Generator().manual_seed(seed)
    exponent = torch.randint(-150, 130, (n,), generator=g).double()
    x = torch.copysign(torch.rand(n, generator=g, dtype=torch.float64) + 1, torch.randn(n, generator=g))
    return (x * torch.exp2(exponent)).float().to(DEVICE)


# --- round to nearest ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", LOW)
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_nearest_matches_reference_bitwise(dtype, seed):
    x = _random_fp32(seed, 4096)
    # Exact ties between neighbours (the even rule), and non-finite values.
    near = x.abs().to(dtype)
    following = (near.view(torch.int16) + 1).view(dtype)
    tie = torch.copysign((near.double() + following.double()) / 2, x.double()).float()
    specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan")], device=DEVICE)
    x = torch.cat([x, tie[torch.isfinite(tie)], specials])
    assert _same(_elementwise(x, dtype, stochastic=False), round_to(x, dtype, "nearest"))


# --- stochastic rounding: fixed points, neighbours, exactness -------------------------------------


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", LOW)
@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_representable_values_are_unchanged(path, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randint(-(2**15), 2**15, (4096,), generator=g, dtype=torch.int32).to(torch.int16)
    values = patterns.view(dtype)
    values = values[~torch.isnan(values.float())].to(DEVICE)
    assert _same(_sr(path, values.float(), dtype, seed), values)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", LOW)
@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_only_the_two_neighbours_appear(path, dtype, seed):
    x = _random_fp32(seed, 512).repeat(16)
    y = _sr(path, x, dtype, seed).double()
    inner, outer = _neighbours(x, dtype)
    assert bool(((y == inner) | (y == outer)).all())
    # Both neighbours do appear where the fraction allows (in aggregate).
    p = _up_fraction(x, dtype)
    assert bool((y == outer)[(p > 0.25) & (p < 0.75)].any()) and bool((y == inner)[(p > 0.25) & (p < 0.75)].any())


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", LOW)
def test_sign_symmetry(path, dtype):
    # SR rounds the magnitude: with the same bits, -x rounds to exactly -(SR(x)).
    x = _random_fp32(7, 8192)
    assert _same(_sr(path, -x, dtype, 11), -_sr(path, x, dtype, 11))


def test_tiny_fp16_values_compare_all_128_bits():
    # |x| = 2**-124 sits 2**-100 of the way from 0 to 2**-24: it rounds up iff
    # the 128-bit draw is below 2**-100, i.e. below words (0, 0, 0, 2**28).
    x = torch.full((4,), 2.0**-124, device=DEVICE)
    words = torch.tensor([[0, 0, 0, 2**28 - 1], [0, 0, 0, 2**28], [0, 0, 1, 0], [1, 0, 0, 0]],
                         dtype=torch.int64).to(torch.int32).to(DEVICE)
    out = torch.empty(4, dtype=torch.float16, device=DEVICE)
    _words_kernel[(1,)](x, words, out, DTYPE=tl.float16, BLOCK=4)
    assert out.float().tolist() == [2.0**-24, 0.0, 0.0, 0.0]


@triton.jit
def _sixteen_bits_kernel(x_ptr, r16_ptr, w_ptr, out_ptr, redo_ptr, BLOCK: tl.constexpr):
    # fp16 SR from 16 chosen bits (the common path's result and its redo flag), then continued by a chosen
    # word (the redo's result).
    i = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i)
    r16 = tl.load(r16_ptr + i).to(tl.uint32, bitcast=True)
    w0 = tl.load(w_ptr + i).to(tl.uint32, bitcast=True)
    bits = x.to(tl.uint32, bitcast=True)
    rounded, redo = _fp16_below_normal(x, bits, _fp16_normal(bits, r16), r16)
    tl.store(out_ptr + 2 * i, rounded)
    tl.store(out_ptr + 2 * i + 1, _fp16_continued(x, r16, w0, w0, w0, w0))
    tl.store(redo_ptr + i, redo.to(tl.int32))


def test_fp16_draws_of_16_bits_continue_exactly_where_they_tie():
    # x in [2**-20, 2**-19), fp16's subnormal range (grid 2**-24): 19 dropped bits, here the fraction
    # 0x1234 * 8 + 5 (over 2**19), whose top 16 bits are f16 = 0x1234 and low 3 bits 5. Up iff the 19-bit
    # draw plus the fraction carries: with the draw's top 16 bits r, certainly if r + f16 >= 2**16, never if
    # r + f16 < 2**16 - 1, and at r + f16 = 2**16 - 1 (a tie) iff the draw's low 3 bits + 5 >= 8.
    below = 25 * 2.0**-24  # the lower fp16 neighbour
    x = below + (0x1234 * 8 + 5) * 2.0**-43
    f16 = 0x1234
    cases = [  # (r16, low bits of w0, up, redo)
        (2**16 - f16, 0, True, False), (2**16 - 2 - f16, 7, False, False),
        (2**16 - 1 - f16, 2, False, True), (2**16 - 1 - f16, 3, True, True),
    ]
    xs = torch.full((4,), x, dtype=torch.float32, device=DEVICE)
    r16 = torch.tensor([c[0] for c in cases], dtype=torch.int32, device=DEVICE)
    w = torch.tensor([c[1] for c in cases], dtype=torch.int32, device=DEVICE)
    out = torch.empty(8, dtype=torch.float16, device=DEVICE)
    redo = torch.empty(4, dtype=torch.int32, device=DEVICE)
    _sixteen_bits_kernel[(1,)](xs, r16, w, out, redo, BLOCK=4)
    above = below + 2.0**-24
    assert redo.tolist() == [int(c[3]) for c in cases]
    assert out[1::2].double().tolist() == [above if c[2] else below for c in cases]
    # Where there is no tie the 16 bits decide alone.
    assert out[0:4:2].double().tolist() == [above, below]


# --- stochastic rounding: unbiased means (z-tests) --------------------------------------------------


def _unbiased_cases(dtype) -> list[float]:
    if dtype == torch.float16:
        return [
            1 + 2**-23,  # one fp32 ulp: 1/8192 of an fp16 ulp (the lowest of the 13 dropped bits)
            1 + 2**-11 + 2**-21,  # just over half an ulp
            -3 * (1 + 2**-20),  # negative, 3/2048 of an ulp
            0.3,  # an arbitrary fraction
            2.5 * 2**-24,  # fp16 subnormal range: half way between 2 and 3 * 2**-24
            (1 + 2**-10) * 2**-20,  # subnormal range, 19 dropped bits, 1/64 of the 2**-24 grid
            2**-30,  # below the smallest subnormal: rounds to 2**-24 with probability 2**-6
            3 * 2**-35,  # below 2**-33: takes the extra-words branch; probability 3 * 2**-11
            FP16_MAX + 8,  # overflow: inf (65536) with probability 1/4
        ]
    return [
        # 1/8192 of a bf16 ulp, exact in the 16 dropped bits. The lowest dropped bit (1 + 2**-23,
        # 1/65536 of an ulp) would need 2**23 draws to see ~128 round-ups: too slow in the interpreter.
        1 + 2**-20,
        1 + 2**-8 + 2**-20,  # just over half an ulp
        -5 * (1 + 2**-18),  # negative, 5/8192 of an ulp
        0.3,
        1.5 * 2**-133,  # bf16 subnormal (an fp32 subnormal): half way
        BF16_MAX + 2.0**119,  # overflow: inf (2**128) with probability 1/4
    ]


MIN_EXPECTED_UPS = 128  # "never round up" then has z <= -sqrt(128) ~ -11, far beyond Z_LIMIT


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", LOW)
def test_mean_is_unbiased(path, dtype):
    base = 2**16 if interpreting() else 2**22
    for i, value in enumerate(_unbiased_cases(dtype)):
        expected = _up_fraction(torch.tensor([value]), dtype).item()
        assert 0 < expected < 1, value
        # Enough draws that the rare round-ups of a sub-ulp fraction are counted, not guessed at.
        n = max(base, triton.next_power_of_2(math.ceil(MIN_EXPECTED_UPS / expected)))
        x, y = _draws(path, [value], dtype, n, seed=2024 + i)
        up = int((y.double().abs() > x.double().abs()).sum())
        assert expected * n >= MIN_EXPECTED_UPS, value
        assert up > 0, (value, n, expected)  # a kernel that never rounds these up fails here outright
        assert abs(_z(up, n, expected)) < Z_LIMIT, (value, up / n, expected)


@pytest.mark.parametrize("dtype", LOW)
def test_elements_sharing_a_philox_word_round_independently(dtype):
    """Elements 2j and 2j + 1 of a part take the two halves of one Philox word: a value half an ulp above a
    representable one must round up in both with probability 1/4, as independent draws do (the same half
    twice would make it 1/2, complementary bits 0)."""
    half_ulp = 2.0**-11 if dtype == torch.float16 else 2.0**-8
    n = 2**15 if interpreting() else 2**21
    x = torch.full((n,), 1 + half_ulp, device=DEVICE)
    up = (stochastic_round_tensor(x, dtype, 12).double() > 1 + half_ulp).view(-1, 2)
    assert abs(_z(int((up[:, 0] & up[:, 1]).sum()), n // 2, 0.25)) < Z_LIMIT


def _model_inputs(seed: int, rounds: int, fp16: bool, n: int) -> list[float]:
    """fp32 values of every kind SR meets, placed so that each fp16 path decides whole parts (the tiles that
    share Philox calls): part 0 of a block holds normals, zeros and overflow (the fixed field); part 1 adds
    values in [2**-17, 2**-14) (the subnormal branch); part 2 adds ties (values below 2**-17 whose dropped
    bits' top 16 plus the element's 16 random bits, from the model's Philox, are all ones), values below
    2**-24 and NaN (the redo); part 3 mixes all. Some values of parts 0 and 1 sit where their draw carries
    into the kept bits by exactly nothing or one unit short."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.ldexp(torch.ones(n), torch.randint(-13 if fp16 else -140, 17 if fp16 else 128, (n,), generator=g))
    values = (torch.randn(n, generator=g) * scale).tolist()
    kind = torch.randint(0, 64, (n,), generator=g).tolist()
    common = {0: 0.0, 1: -0.0, 2: math.inf, 3: -math.inf, 4: 65519.0, 5: -65520.5, 6: 2.0**-14, 7: 1e38 * 3.3}
    redone = {8: math.nan, 9: 3 * 2.0**-30, 10: -(2.0**-140), 11: 2.0**-25}
    for i, k in enumerate(kind):
        part = (i // 1024) % 4
        r16 = sr_model.tensor_draw(seed, rounds, i)[0]
        if fp16 and part < 2 and 48 <= k < 56:
            # On the edge: dropped bits that the draw (its top `dropped` bits) carries by exactly 0 or -1.
            dropped = 13 if part == 0 else 14 + k % 3
            draw = r16 >> (16 - dropped)
            fraction = ((1 << dropped) - draw - k % 2) % (1 << dropped)
            exponent = 127 + k % 4 if part == 0 else 126 - dropped  # normal, or fp16 subnormal with `dropped`
            kept = int(torch.randint(0, 1 << (23 - dropped), (1,), generator=g))
            values[i] = sr_model.float32(exponent << 23 | kept << dropped | fraction) * (-1 if k % 2 else 1)
        elif k in common:
            values[i] = common[k]
        elif part == 1 and k < 24 or part == 3 and k < 16:  # 2**-17 <= |x| < 2**-14: 14..16 dropped bits
            values[i] = math.copysign(float(torch.empty(1).uniform_(2.0**-17, 2.0**-14, generator=g)), k % 2 - 0.5)
        elif part >= 2 and k in redone:
            values[i] = redone[k]
        elif fp16 and part >= 2 and k < 32:  # a tie in fp16's subnormal range below 2**-17: 17..23 dropped bits
            dropped = 17 + k % 7
            low = int(torch.randint(0, 1 << (dropped - 16), (1,), generator=g))
            fraction = ((0xFFFF - r16) << (dropped - 16)) | low
            kept = int(torch.randint(0, 1 << (23 - dropped), (1,), generator=g))  # the fraction's bits fp16 keeps
            # Biased exponent 126 - dropped: |x| in [2**(-1 - dropped), 2**-dropped), where fp16 drops `dropped`.
            values[i] = sr_model.float32((126 - dropped) << 23 | kept << dropped | fraction) * (-1 if k % 2 else 1)
    return values


@pytest.mark.parametrize("dtype", LOW)
def test_stochastic_round_tensor_matches_a_bitwise_model(dtype):
    """Every element, every path (fp16: normals' fixed field, the subnormal branch, ties continued from the
    second stream, values below 2**-24, NaN, overflow) is the documented function of its Philox bits:
    tests/sr_model.py, an independent model in Python integers."""
    fp16 = dtype == torch.float16
    for seed in (5, 2**40 + 77):
        values = _model_inputs(seed, DEFAULT_PHILOX_ROUNDS, fp16, 8192)
        got = stochastic_round_tensor(torch.tensor(values, device=DEVICE), dtype, seed).cpu()
        paths = {}
        want = torch.tensor(sr_model.stochastic_round_list(values, seed, DEFAULT_PHILOX_ROUNDS, fp16, paths=paths),
                            dtype=dtype)
        if fp16:  # the inputs reach the rare paths
            assert paths["tie"] > 100 and paths["below 2**-24"] > 100 and paths["subnormal"] > 1000, paths
        if not _same(got, want):
            bad = [i for i in range(len(values)) if not _same(got[i:i + 1], want[i:i + 1])]
            raise AssertionError(f"{len(bad)} of {len(values)} differ from the model, e.g. "
                                 + ", ".join(f"x={values[i]!r}: got {got[i].item()!r}, model {want[i].item()!r}"
                                             for i in bad[:4]))


# fp32 bit patterns that fp16 SR must not round with the normals' fixed field, and some it may. The first:
# 0 < |x| < 2**-14 between points of the 2**-24 grid in each binade, (700.3, -300.7, 5.25, 1.3, 0.3) * 2**-24,
# and at the ends; NaN (the GPU's arithmetic makes it 0x7FFFFFFF, whose fraction carries into the sign there).
# The others: 2**-14, zeros, infinities, 65504 (fp16's largest finite value) and the overflow range above it,
# where SR gives 65504 or inf (65536 and beyond: inf).
UNUSUAL_FP16_BITS = (0x382F1333, 0xB796599A, 0x34A80000, 0x33A66666, 0x3299999A, 0x387FFFFF, 0x00000001, 0x80000001,
                     0x7FFFFFFF, 0xFFFFFFFF, 0x7F800001, 0x7FC00000)
USUAL_FP16_BITS = (0x38800000, 0xB8800000, 0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x477FE000, 0x477FEFFF,
                   0xC77FF001, 0x47800000, 0x4F000000)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("pattern", UNUSUAL_FP16_BITS + USUAL_FP16_BITS, ids=hex)
def test_one_unusual_value_among_normals_is_rounded_exactly(dtype, pattern):
    """A part of normals holding values of one kind (as a row group of the state update can): the
    classification that sends a part down fp16's subnormal path or redo must see them alone. Sixteen of
    them, each with its own random bits: a wrong path agrees with the exact one for some draws."""
    generator = torch.Generator().manual_seed(pattern % 1009)
    x = (1 + torch.rand(1024, generator=generator)) * torch.where(torch.rand(1024, generator=generator) < 0.5, -1, 1)
    bits = x.view(torch.int32).clone()
    probes = torch.arange(5, 1024, 64)
    bits[probes] = pattern - 2**32 if pattern >= 2**31 else pattern
    x = bits.view(torch.float32)
    got = stochastic_round_tensor(x.to(DEVICE), dtype, 11).cpu()
    want = torch.tensor(sr_model.stochastic_round_list(x.tolist(), 11, DEFAULT_PHILOX_ROUNDS,
                                                       dtype == torch.float16), dtype=dtype)
    assert _same(got, want), f"x={x[5].item()!r}: got {got[probes].tolist()}, model {want[probes].tolist()}"


@pytest.mark.parametrize("pattern", (0x7F800001, 0xFF800001, 0x7FFFFFFF, 0x7FC00000, 0x7F800000, 0x477FF001),
                         ids=hex)
def test_special_values_beside_fp16_subnormals_above_the_ties_are_rounded_exactly(pattern):
    """A part whose smallest nonzero magnitude lies in [2**-17, 2**-14) takes fp16's subnormal branch with nothing to
    redo: a NaN there (one whose fraction the random bits could carry into inf, among them), inf or an overflowing
    value must come out as the model's, each with its own random bits."""
    generator = torch.Generator().manual_seed(pattern % 1013)
    x = (1 + torch.rand(1024, generator=generator)) * torch.where(torch.rand(1024, generator=generator) < 0.5, -1, 1)
    x[torch.arange(9, 1024, 32)] = torch.empty(32).uniform_(2.0**-17, 2.0**-14, generator=generator)
    bits = x.view(torch.int32).clone()
    probes = torch.arange(5, 1024, 64)
    bits[probes] = pattern - 2**32 if pattern >= 2**31 else pattern
    x = bits.view(torch.float32)
    got = stochastic_round_tensor(x.to(DEVICE), torch.float16, 13).cpu()
    want = torch.tensor(sr_model.stochastic_round_list(x.tolist(), 13, DEFAULT_PHILOX_ROUNDS, True),
                        dtype=torch.float16)
    assert _same(got, want), f"got {got[probes].tolist()}, model {want[probes].tolist()}"


def _truncated_bits_sr(x: torch.Tensor, dtype, bits: int, generator) -> torch.Tensor:
    """A biased SR for the power test: only `bits` random bits at the top of the dropped 13/16 bits."""
    dropped = 13 if dtype == torch.float16 else 16
    mag = x.abs().view(torch.int32)
    r = torch.randint(0, 2**bits, x.shape, generator=generator, dtype=torch.int32) << (dropped - bits)
    rounded = ((mag + r) >> dropped) << dropped
    return torch.copysign(rounded.view(torch.float32), x).to(dtype)


@pytest.mark.parametrize("dtype", LOW)
def test_z_test_detects_three_bit_sr(dtype):
    # The same z-test has power: SR with 3 random bits never rounds up a fraction below 1/8 ulp.
    n = 2**16
    x = torch.full((n,), 1 + 2**-23 * 2 ** (13 if dtype == torch.float16 else 16) / 32)  # 1/32 of an ulp
    p = _up_fraction(x[:1], dtype).item()
    assert p == pytest.approx(1 / 32)
    biased = _truncated_bits_sr(x, dtype, 3, torch.Generator().manual_seed(5))
    assert abs(_z(int((biased.double() > x.double()).sum()), n, p)) > Z_LIMIT
    y = stochastic_round_tensor(x.to(DEVICE), dtype, 5).cpu()
    assert abs(_z(int((y.double() > x.double()).sum()), n, p)) < Z_LIMIT


@pytest.mark.parametrize("dtype", LOW)
def test_same_distribution_as_reference_sr(dtype):
    # Two-proportion z-test against the torch reference, per value, and the same neighbours.
    values = _random_fp32(99, 8)
    values = values[torch.isfinite(values.to(dtype).float())].tolist()
    n = 2**14
    x, y = _draws("shared", values, dtype, n, seed=31)
    ref = round_to(x, dtype, "stochastic", generator=torch.Generator(device=DEVICE).manual_seed(31))
    inner, outer = _neighbours(x, dtype)
    for got in (y.double(), ref.double()):
        assert bool(((got == inner) | (got == outer)).all())
    ours = (y.double() == outer).double().mean(dim=1)
    theirs = (ref.double() == outer).double().mean(dim=1)
    pooled = (ours + theirs) / 2
    spread = torch.sqrt(pooled * (1 - pooled) * 2 / n)
    z = torch.where(spread > 0, (ours - theirs) / spread, torch.zeros_like(spread))
    assert float(z.abs().max()) < Z_LIMIT, (values, ours.tolist(), theirs.tolist())


# --- edges ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", LOW)
def test_nan_inf_zero_and_overflow(path, dtype):
    big = 1e6 if dtype == torch.float16 else 3.4e38
    x = torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0, big, -big],
                     device=DEVICE).repeat(64)
    y = _sr(path, x, dtype, 3).float().view(-1, 8)
    assert bool(torch.isnan(y[:, :2]).all())
    assert bool((y[:, 2] == float("inf")).all()) and bool((y[:, 3] == -float("inf")).all())
    assert bool((y[:, 4:6] == 0).all())
    assert bool(torch.signbit(y[:, 5]).all()) and not bool(torch.signbit(y[:, 4]).any())  # zeros keep their sign
    if dtype == torch.float16:  # far beyond 65536: always inf
        assert bool((y[:, 6] == float("inf")).all()) and bool((y[:, 7] == -float("inf")).all())
    else:  # 3.4e38 lies between bf16's largest finite value and 2**128 (inf)
        assert bool(((y[:, 6:].abs() == BF16_MAX) | torch.isinf(y[:, 6:])).all())


# --- the harmonic series --------------------------------------------------------------------------


def _harmonic(dtype, steps: int, stochastic: bool, trials: int, DEVICE) -> torch.Tensor:
    out = torch.empty(trials, dtype=dtype, device=DEVICE)
    _harmonic_kernel[(1,)](out, steps, 17, DTYPE=triton_dtype(dtype), STOCHASTIC=stochastic, TRIALS=trials)
    return out.double()


@pytest.mark.parametrize(("dtype", "stagnation", "steps"),
                         [(torch.float16, 7.0859375, 768), (torch.bfloat16, 5.0625, 256)])
def test_harmonic_series(dtype, stagnation, steps):
    exact = math.fsum(1.0 / k for k in range(1, steps + 1))
    nearest = _harmonic(dtype, steps, False, 16, DEVICE)
    assert bool((nearest == stagnation).all())  # round to nearest stops growing
    trials = 64
    sr = _harmonic(dtype, steps, True, trials, DEVICE)
    standard_error = sr.std().item() / math.sqrt(trials)
    assert abs(sr.mean().item() - exact) < Z_LIMIT * standard_error, (sr.mean().item(), exact, standard_error)
    assert sr.mean().item() > stagnation + 0.1


# --- options and refusals -------------------------------------------------------------------------


def test_seed_and_rounds_select_the_bits():
    x = _random_fp32(1, 4096)
    a = stochastic_round_tensor(x, torch.float16, 1)
    assert _same(a, stochastic_round_tensor(x, torch.float16, 1))
    assert not _same(a, stochastic_round_tensor(x, torch.float16, 2))
    assert not _same(a, stochastic_round_tensor(x, torch.float16, 1, philox_rounds=10))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"dtype": torch.float32}, "float32"),
    ({"philox_rounds": 0}, "philox_rounds"),
    ({"seed": -1}, "seed"),
    ({"rounding_impl": "magic"}, "rounding_impl"),
])
def test_invalid_options_are_refused(kwargs, message):
    args = {"dtype": torch.float16, "seed": 0, **kwargs}
    with pytest.raises(ValueError, match=message):
        stochastic_round_tensor(torch.ones(4, device=DEVICE), **args)


def test_hardware_sr_is_refused_below_sm100():
    if not interpreting() and torch.cuda.get_device_capability() >= (10, 0):
        pytest.skip("this GPU has cvt.rs")
    with pytest.raises(ValueError, match="sm_100"):
        stochastic_round_tensor(torch.ones(4, device=DEVICE), torch.float16, 0, rounding_impl="hardware")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", LOW)
def test_hardware_sr_is_unbiased_on_sm100(dtype):
    if torch.cuda.get_device_capability() < (10, 0):
        pytest.skip("needs sm_100+ (cvt.rs)")
    values = _unbiased_cases(dtype)[:4]
    n = 2**20
    x = torch.tensor(values, device=DEVICE)[:, None].expand(-1, n).contiguous()
    y = stochastic_round_tensor(x, dtype, 8, rounding_impl="hardware")
    p = _up_fraction(x[:, :1], dtype)[:, 0]
    up = (y.double().abs() > x.double().abs()).sum(dim=1)
    for i in range(len(values)):
        assert abs(_z(up[i].item(), n, p[i].item())) < Z_LIMIT


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", LOW)
def test_large_tensor_neighbours_and_sign_symmetry(dtype):
    x = _random_fp32(3, 2**24)
    y = stochastic_round_tensor(x, dtype, 77)
    inner, outer = _neighbours(x, dtype)
    assert bool(((y.double() == inner) | (y.double() == outer)).all())
    assert _same(stochastic_round_tensor(-x, dtype, 77), -y)
