"""The reference rounding: exact round-to-nearest-even (no double rounding) and ideal stochastic rounding."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ssmcheck.core.tensors import bits
from ssmcheck.ops.rounding.naive import round_to, rounded_by_exponents

TARGETS = [torch.float16, torch.bfloat16]
SOURCES = [torch.float32, torch.float64]
MAX = {dtype: torch.finfo(dtype).max for dtype in (torch.float16, torch.bfloat16, torch.float32)}
OVERFLOW = {torch.float16: 2.0**16, torch.bfloat16: 2.0**128, torch.float32: 2.0**128}
TINY = {torch.float16: 2.0**-24, torch.bfloat16: 2.0**-133, torch.float32: 2.0**-149}  # smallest subnormal


def gen(seed):
    return torch.Generator().manual_seed(seed)


def neighbours(x: torch.Tensor, dtype):
    """a <= x <= b, adjacent in dtype, found with torch.nextafter from the nearest value (independent of round_to)."""
    r = x.to(torch.float32).to(dtype).to(torch.float64)  # a neighbour of x, even when rounded twice
    r = torch.where(r > x, torch.nextafter(r.to(dtype), torch.full_like(r, -math.inf).to(dtype)).double(), r)
    up = torch.nextafter(r.to(dtype), torch.full_like(r, math.inf).to(dtype)).double()
    return r, torch.where(r == x, r, up)


def spread_values(seed, n, dtype, source):
    """Values across the whole range of `dtype`, subnormals and both signs included."""
    g = gen(seed)
    lo, hi = math.log2(TINY[dtype]), math.log2(MAX[dtype])
    e = torch.empty(n, dtype=torch.float64).uniform_(lo - 2, hi, generator=g)
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
    return (sign * torch.exp2(e)).to(source)


@pytest.mark.parametrize("dtype", TARGETS)
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("mode", ["nearest", "stochastic"])
def test_representable_values_are_unchanged(dtype, source, mode):
    v = spread_values(1, 20000, dtype, torch.float64).to(dtype)
    v = torch.cat([v, torch.tensor([0.0, -0.0, MAX[dtype], -MAX[dtype], TINY[dtype]]).to(dtype)])
    out = round_to(v.to(source), dtype, mode, gen(2))
    assert out.dtype == dtype
    assert torch.equal(out, v)
    assert torch.equal(torch.signbit(out), torch.signbit(v))


def _float32_edges(dtype) -> torch.Tensor:
    """Ties, neighbours of the overflow threshold and of the subnormal range, signed zeros, inf and NaN."""
    fmt_max, tiny = MAX[dtype], TINY[dtype]
    ulp_at_max = fmt_max - torch.nextafter(torch.tensor(fmt_max, dtype=dtype), torch.tensor(0.0, dtype=dtype)).item()
    values = [0.0, -0.0, math.inf, -math.inf, math.nan, fmt_max, fmt_max + ulp_at_max / 2, fmt_max + ulp_at_max / 4,
              tiny / 2, tiny * 1.5, tiny * 2.5, tiny / 4, 1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-8, 1 + 3 * 2**-8]
    v = torch.tensor(values + [-v for v in values], dtype=torch.float32)
    up, down = (torch.nextafter(v, torch.full_like(v, direction)) for direction in (math.inf, -math.inf))
    return torch.cat([v, up, down])


@pytest.mark.parametrize("dtype", TARGETS)
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_nearest_from_float32_is_the_native_conversion(dtype, device):
    """round_to takes the native float32 conversion for nearest: it must round as the exponent arithmetic does,
    everywhere, ties to even, overflow and subnormals included (on the GPU as well: its conversion is its own)."""
    x = torch.cat([spread_values(3, 200000, dtype, torch.float32), _float32_edges(dtype)]).to(device)
    native, exact = round_to(x, dtype, "nearest"), rounded_by_exponents(x, dtype, "nearest")
    assert torch.equal(native.isnan(), exact.isnan())
    same = native.isnan() | (bits(native) == bits(exact))
    assert bool(same.all()), x[~same][:8].tolist()


def _float64_edges(dtype) -> torch.Tensor:
    """float64 values where rounding through float32 goes wrong: ties of `dtype` and their float64
    neighbours (a float32 in between would land on the tie), and magnitudes beyond float32's range."""
    ties = torch.tensor([1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-8, 1 + 3 * 2**-8, 2**-25, 3 * 2**-25, 2**-134,
                         3 * 2**-134, 2**-150, 3 * 2**-151], dtype=torch.float64)
    ties = torch.cat([ties * 2.0**k for k in (0, 7, 14)])
    up, down = (torch.nextafter(ties, torch.full_like(ties, d)) for d in (math.inf, -math.inf))
    wide = torch.tensor([1e300, 3.5e38, 3.4028234663852886e38, 1e-300, 1e-46, 2**-1074], dtype=torch.float64)
    values = torch.cat([ties, up, down, up + (up - ties) * 2**20, wide, _float32_edges(dtype).double()])
    return torch.cat([values, -values])


@pytest.mark.parametrize("dtype", TARGETS + [torch.float32])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_nearest_from_float64_equals_the_exponent_arithmetic(dtype, device):
    """round_to's nearest from float64 (float32 rounded to odd, then the native conversion; into float32 the
    native conversion alone) rounds as the exponent arithmetic does, bit for bit, ties and overflow included."""
    x = torch.cat([spread_values(4, 200000, dtype, torch.float64), _float64_edges(dtype)]).to(device)
    fast, exact = round_to(x, dtype, "nearest"), rounded_by_exponents(x, dtype, "nearest")
    assert torch.equal(fast.isnan(), exact.isnan())
    same = fast.isnan() | (bits(fast) == bits(exact))
    assert bool(same.all()), x[~same][:8].tolist()


@settings(max_examples=300, deadline=None)
@given(x=st.floats(allow_nan=False, width=64), dtype=st.sampled_from(TARGETS))
def test_nearest_from_float64_equals_the_exponent_arithmetic_anywhere(x, dtype):
    t = torch.tensor([x], dtype=torch.float64)
    assert bits(round_to(t, dtype, "nearest")).item() == bits(rounded_by_exponents(t, dtype, "nearest")).item()


def test_nearest_from_float64_does_not_round_twice():
    x = torch.tensor([1 + 2**-11 + 2**-40, 1 + 2**-11, 1 + 3 * 2**-11, -(1 + 2**-11 + 2**-40)], dtype=torch.float64)
    assert round_to(x, torch.float16, "nearest").tolist() == [1 + 2**-10, 1.0, 1 + 2**-9, -(1 + 2**-10)]
    # torch itself goes through float32 here and lands on the wrong side of the tie.
    assert x[:1].to(torch.float16).item() == 1.0
    xb = torch.tensor([1 + 2**-8 + 2**-40, 2**-134 + 2**-160], dtype=torch.float64)
    assert round_to(xb, torch.bfloat16, "nearest").tolist() == [1 + 2**-7, 2**-133]


@settings(max_examples=200, deadline=None)
@given(x=st.floats(allow_nan=False, allow_infinity=False, width=64), dtype=st.sampled_from(TARGETS + [torch.float32]))
def test_nearest_is_nearest_and_ties_go_to_even(x, dtype):
    out = round_to(torch.tensor([x], dtype=torch.float64), dtype, "nearest")
    r = out.double().item()
    if abs(x) >= OVERFLOW[dtype] - (OVERFLOW[dtype] - MAX[dtype]) / 2:
        assert math.isinf(r) and math.copysign(1, r) == math.copysign(1, x)
        return
    lower = torch.nextafter(out, torch.tensor([-math.inf], dtype=dtype)).double().item()
    upper = torch.nextafter(out, torch.tensor([math.inf], dtype=dtype)).double().item()
    err = abs(x - r)  # exact in float64 for these magnitudes, up to the subnormal corner
    assert err <= abs(x - lower) and (math.isinf(upper) or err <= abs(x - upper))
    if err in (abs(x - lower), abs(x - upper)) and err > 0:  # a tie: the even one wins
        bits = out.view(torch.int16 if dtype != torch.float32 else torch.int32).item()
        assert bits % 2 == 0


@pytest.mark.parametrize("dtype", TARGETS)
@pytest.mark.parametrize("source", SOURCES)
def test_stochastic_returns_only_the_two_neighbours(dtype, source):
    x = spread_values(4, 2000, dtype, source).repeat(20)
    a, b = neighbours(x.double(), dtype)
    out = round_to(x, dtype, "stochastic", gen(5)).double()
    assert torch.all((out == a) | (out == b))
    assert torch.any(out != out[:2000].repeat(20))  # draws differ between repeats


@pytest.mark.parametrize(
    "x, dtype",
    [
        (1 + 2**-20, torch.float16),  # 1/1024 of an ulp
        (1 + 2**-22, torch.bfloat16),  # 2**-15 of an ulp
        (1.0 + 0.3 * 2**-10, torch.float16),
        (-(2.0 + 0.7 * 2**-6), torch.bfloat16),
        (0.37 * 2**-24, torch.float16),  # below the smallest subnormal
        (5.5 * 2**-24, torch.float16),  # among the subnormals
        (1 + 2**-36, torch.float32),  # float64 into float32, 2**-13 of an ulp
    ],
)
def test_stochastic_mean_is_x(x, dtype):
    n = 2**20
    xs = torch.full((n,), x, dtype=torch.float64)
    a, b = (v.item() for v in neighbours(xs[:1], dtype))
    out = round_to(xs, dtype, "stochastic", gen(6)).double()
    assert torch.all((out == a) | (out == b))
    p = (x - a) / (b - a)
    ups = (out == b).sum().item()
    z = (ups - n * p) / math.sqrt(n * p * (1 - p))
    assert abs(z) < 5, f"{ups} rounded up, expected {n * p:.1f}"


@pytest.mark.parametrize("dtype", TARGETS)
def test_stochastic_is_sign_symmetric(dtype):
    x = spread_values(7, 5000, dtype, torch.float64)
    assert torch.equal(round_to(-x, dtype, "stochastic", gen(8)), -round_to(x, dtype, "stochastic", gen(8)))


@pytest.mark.parametrize("dtype", TARGETS + [torch.float32])
@pytest.mark.parametrize("mode", ["nearest", "stochastic"])
def test_overflow_nan_and_inf(dtype, mode):
    big = OVERFLOW[dtype]
    special = torch.tensor([big, 2 * big, -big, 1e300, math.inf, -math.inf, math.nan], dtype=torch.float64)
    out = round_to(special, dtype, mode, gen(9)).double()
    assert out[:-1].tolist() == [math.inf, math.inf, -math.inf, math.inf, math.inf, -math.inf]
    assert math.isnan(out[-1].item())
    # Between the largest finite value and 2**(emax+1): the upper neighbour is inf.
    mid = (MAX[dtype] + big) / 2
    between = torch.full((100000,), mid, dtype=torch.float64)
    out = round_to(between, dtype, mode, gen(10)).double()
    if mode == "nearest":
        assert torch.all(out == math.inf)  # the tie goes to the even neighbour, 2**(emax+1)
        below = torch.tensor([MAX[dtype] + (big - MAX[dtype]) * 0.49], dtype=torch.float64)
        assert round_to(below, dtype, mode).item() == MAX[dtype]
    else:
        assert set(out.unique().tolist()) == {MAX[dtype], math.inf}
        frac = (out == math.inf).double().mean().item()
        assert abs(frac - 0.5) < 5 * math.sqrt(0.25 / 100000)


def test_subnormals_are_exact():
    x = torch.tensor([2**-25, 3 * 2**-26, 2**-24 + 2**-26, 2**-150, 3 * 2**-151], dtype=torch.float64)
    assert round_to(x[:3], torch.float16, "nearest").double().tolist() == [0.0, 2**-24, 2**-24]
    assert round_to(x[3:], torch.float32, "nearest").double().tolist() == [0.0, 2**-149]
    # fp16's 2**-24 spacing holds right up to the smallest normal 2**-14.
    edge = torch.tensor([2**-14 - 2**-25, 2**-14 - 3 * 2**-26], dtype=torch.float64)
    assert round_to(edge, torch.float16, "nearest").double().tolist() == [2**-14, 2**-14 - 2**-24]


def harmonic_sum(dtype, mode, terms, chains=1, seed=0):
    """sum_{k<=terms} 1/k with the running sum held in `dtype`, each addition rounded in `mode`."""
    g = gen(seed)
    s = torch.zeros(chains, dtype=dtype)
    for k in range(1, terms + 1):
        s = round_to(s.double() + 1.0 / k, dtype, mode, g)
    return s.double()


@pytest.mark.parametrize("dtype, stagnates_at", [(torch.float16, 7.0859375), (torch.bfloat16, 5.0625)])
def test_harmonic_series(dtype, stagnates_at):
    terms = 2048
    assert harmonic_sum(dtype, "nearest", terms).item() == stagnates_at
    true = math.fsum(1.0 / k for k in range(1, terms + 1))
    sr = harmonic_sum(dtype, "stochastic", terms, chains=64, seed=11)
    assert abs(sr.mean().item() - true) / true < 0.02
    assert torch.all((sr - true).abs() / true < 0.2)


def test_generator_decides_the_draws_and_bad_arguments_raise():
    x = spread_values(12, 1000, torch.float16, torch.float32)
    draws = [round_to(x, torch.float16, "stochastic", gen(3)) for _ in range(2)]
    assert torch.equal(*draws)
    with pytest.raises(ValueError, match="mode"):
        round_to(x, torch.float16, "truncate")
    with pytest.raises(ValueError, match="input"):
        round_to(x.half(), torch.bfloat16, "nearest")
    assert torch.equal(round_to(x, torch.float32, "stochastic", gen(3)), x)  # already float32: nothing to round
