"""Drift statistics: checkpoints, ulps, the growth-exponent fit, the bias z-test, tolerance crossing."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ssmcheck.core.formats import subnormal_range, ulp
from ssmcheck.drift.stats import (
    BIAS_FLOOR_ULP,
    BIAS_Z_LIMIT,
    FLUSH_MIN_STORES,
    NEAREST_Z_LIMIT,
    SignedErrorMoments,
    crossing_step,
    error_sums,
    flushes_subnormals,
    growth_exponent,
    is_biased,
    leans_up_or_down,
    log_checkpoints,
    nearest_z,
    store_allowance,
    store_sums,
)
from ssmcheck.ops.rounding.naive import round_to


@given(st.integers(1, 100_000), st.integers(3, 32))
def test_log_checkpoints_span_the_run(nsteps, count):
    steps = log_checkpoints(nsteps, count)
    assert steps[0] == 1 and steps[-1] == nsteps
    assert steps == sorted(set(steps))
    assert len(steps) <= max(count, 2) + 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_ulp_is_the_spacing_above_each_value(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    # normals over many binades, subnormals, and zero
    magnitudes = torch.exp2(torch.empty(200, dtype=torch.float64).uniform_(-30, 14, generator=g))
    values = torch.cat([magnitudes, -magnitudes, torch.zeros(1, dtype=torch.float64)]).to(dtype)
    spacing = torch.nextafter(values.abs(), torch.tensor(math.inf, dtype=dtype)).double() - values.abs().double()
    assert torch.equal(ulp(values.double(), dtype), spacing)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_subnormal_range_is_the_formats_own(dtype):
    smallest, normal = subnormal_range(dtype)
    zero = torch.zeros((), dtype=dtype)
    assert smallest == torch.nextafter(zero, torch.ones((), dtype=dtype)).item()  # the least positive value
    assert normal == torch.finfo(dtype).smallest_normal


@settings(max_examples=25, deadline=None)
@given(
    alpha=st.sampled_from([0.5, 1.0]),
    scale=st.floats(1e-7, 1e-2),
    seed=st.integers(0, 2**31 - 1),
)
def test_growth_exponent_recovers_noisy_power_laws(alpha, scale, seed):
    g = torch.Generator().manual_seed(seed)
    steps = log_checkpoints(4096)
    noise = torch.exp(0.05 * torch.randn(len(steps), generator=g, dtype=torch.float64))
    errors = [scale * n**alpha * float(e) for n, e in zip(steps, noise)]
    assert growth_exponent(steps, errors) == pytest.approx(alpha, abs=0.03)


def test_growth_exponent_needs_three_usable_points():
    assert growth_exponent([1, 2, 4], [1e-3, math.nan, 0.0]) is None
    assert growth_exponent([1, 2, 4], [1e-3, 2e-3, 4e-3]) == pytest.approx(1.0)


def _added(moments: SignedErrorMoments, errors: torch.Tensor) -> SignedErrorMoments:
    """`moments` with signed `errors` (no subnormal counts) added to its running sums, as drift.follow adds a step's."""
    moments.running(errors.device)[:3].add_(error_sums(errors))
    return moments


def _moments(samples: torch.Tensor) -> SignedErrorMoments:
    moments = SignedErrorMoments()
    for chunk in samples.split(1000):  # a chunk at a time, as the steps add theirs
        _added(moments, chunk)
    return moments


def _sr_errors(g, n, random_bits=None):
    """Rounding errors (in ulps) of stochastic rounding of values with uniform fractions.

    With `random_bits`, the round-up decision uses only that many random bits, as
    `tests/broken_state_update_kernels.py:sr_3bit` does: up iff fraction + r / 2**bits >= 1.
    """
    fraction = torch.rand(n, generator=g, dtype=torch.float64)
    if random_bits is None:
        up = torch.rand(n, generator=g, dtype=torch.float64) < fraction
    else:
        r = torch.randint(0, 2**random_bits, (n,), generator=g).double() / 2**random_bits
        up = fraction + r >= 1
    return up.double() - fraction


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_bias_z_test_accepts_ideal_stochastic_rounding(seed):
    g = torch.Generator().manual_seed(seed)
    moments = _moments(_sr_errors(g, 100_000))
    assert abs(moments.z) < 4.5
    assert not is_biased(moments)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_bias_z_test_catches_three_random_bits_in_a_few_thousand_stores(seed):
    # 3 random bits round up with probability floor(8 f) / 8: a bias of -1/16 ulp, against a
    # per-store spread of ~0.38 ulp, so over 4000 stores z ~ -10 +- 1 (bounds at ~4.5 sigma).
    g = torch.Generator().manual_seed(seed)
    moments = _moments(_sr_errors(g, 4000, random_bits=3))
    assert moments.mean == pytest.approx(-1 / 16, abs=0.03)
    assert moments.z < -6
    assert is_biased(moments)


def _offset_errors(g, n, mean):
    """Errors (in ulps) of a constant offset `mean` plus noise 1/16 its size: z ~ 16 sqrt(n), whatever `mean`."""
    return mean + (mean / 16) * torch.randn(n, generator=g, dtype=torch.float64)


def test_bias_needs_material_size_as_well_as_significance():
    # A deterministic offset below BIAS_FLOOR_ULP (what fp32 arithmetic can do) is overwhelmingly
    # significant over many stores, yet not "biased": only the floor keeps it from being so.
    g = torch.Generator().manual_seed(7)
    below = _moments(_offset_errors(g, 100_000, 2.0**-12))
    assert below.mean == pytest.approx(2.0**-12, rel=1e-2) and below.mean < BIAS_FLOOR_ULP
    assert below.z > 100 * BIAS_Z_LIMIT
    assert not is_biased(below)
    assert not is_biased(_moments(-_offset_errors(g, 100_000, 2.0**-12)))  # toward zero alike


def test_bias_above_the_floor_and_significant_is_biased():
    # The converse: the same z with the mean 4x above the floor is biased, of either sign.
    g = torch.Generator().manual_seed(7)
    above = _moments(_offset_errors(g, 100_000, 4 * BIAS_FLOOR_ULP))
    below = _moments(_offset_errors(torch.Generator().manual_seed(7), 100_000, 2.0**-12))
    assert above.mean > BIAS_FLOOR_ULP
    assert above.z == pytest.approx(below.z, rel=1e-6)  # the noise scales with the mean: same z
    assert is_biased(above)
    assert is_biased(_moments(-_offset_errors(g, 100_000, 4 * BIAS_FLOOR_ULP)))


def test_bias_above_the_floor_needs_significance():
    # A mean well above the floor but lost in noise (|z| below the limit) is not biased.
    g = torch.Generator().manual_seed(7)
    noise = torch.randn(1000, generator=g, dtype=torch.float64)
    noisy = _moments(4 * BIAS_FLOOR_ULP + (noise - noise.mean()))  # mean exactly 2**-8 ulp, z ~ 0.1
    assert abs(noisy.mean) > BIAS_FLOOR_ULP and abs(noisy.z) < BIAS_Z_LIMIT
    assert not is_biased(noisy)


def test_moments_ignore_nonfinite_samples_and_need_two():
    moments = SignedErrorMoments()
    _added(moments, torch.tensor([math.nan, math.inf, 0.25]))
    assert moments.count == 1 and moments.z is None
    _added(moments, torch.tensor([0.25]))
    assert moments.z == math.inf  # constant nonzero errors: certain


def test_crossing_observed_at_the_first_checkpoint_beyond_the_limit():
    steps = [1, 2, 4, 8]
    assert crossing_step(steps, [1, 1, 3, 1], [2, 2, 2, 2]) == (4, True)
    assert crossing_step(steps, [1, math.nan, 1, 1], [2, 2, 2, 2]) == (2, True)


def test_crossing_extrapolates_faster_growth_only():
    steps = log_checkpoints(50)
    limits = [1e-3 * n**0.5 for n in steps]
    linear = [1e-4 * n for n in steps]  # meets 1e-3 sqrt(n) at n = 100
    assert crossing_step(steps, linear, limits) == (100, False)
    same_growth = [0.5e-3 * n**0.5 for n in steps]
    assert crossing_step(steps, same_growth, limits) == (None, False)
    beyond_horizon = [1e-9 * n**0.6 for n in steps]
    assert crossing_step(steps, beyond_horizon, limits, horizon=1e9) == (None, False)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rounding=st.sampled_from(["nearest", "stochastic"]))
def test_no_rounding_stores_a_subnormal_as_zero_and_a_flush_is_counted(seed, rounding):
    """Exact values across fp16's subnormal range (and some normals, zeros and values below the smallest
    subnormal), rounded either way: store_sums counts the subnormal ones and finds none stored as zero; flushed
    to zero instead, every one of them is counted."""
    gen = torch.Generator().manual_seed(seed)
    dtype = torch.float16
    info = torch.finfo(dtype)
    smallest = info.smallest_normal * info.eps
    # log-uniform from a quarter of the smallest subnormal to four times the smallest normal, random signs, zeros
    exponents = torch.empty(4096, dtype=torch.float64).uniform_(math.log2(smallest) - 2,
                                                                math.log2(info.smallest_normal) + 2, generator=gen)
    signs = torch.randint(0, 2, (4096,), generator=gen).double() * 2 - 1
    exact = torch.where(torch.rand(4096, generator=gen) < 0.05, 0.0, signs * torch.exp2(exponents))
    subnormal = int(((exact.abs() >= smallest) & (exact.abs() < info.smallest_normal)).sum())
    assert subnormal > 1000
    stored = round_to(exact, dtype, rounding, generator=gen).double()
    sums = store_sums(exact, stored, dtype, torch.zeros_like(exact), rounding)
    assert sums[3].item() == subnormal and sums[4].item() == 0
    flushed = torch.where(exact.abs() < info.smallest_normal, 0.0, stored)
    assert store_sums(exact, flushed, dtype, torch.zeros_like(exact), rounding)[3:5].tolist() == [subnormal, subnormal]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_subnormals_are_counted_for_fp16_alone(dtype):
    """bf16's and fp32's subnormals are float32's own, which a kernel's float32 arithmetic may flush: not counted."""
    info = torch.finfo(dtype)
    exact = torch.full((64,), info.smallest_normal / 4, dtype=torch.float64)
    sums = store_sums(exact, torch.zeros_like(exact), dtype, torch.zeros_like(exact), "nearest")
    assert sums[0] == 64 and sums[3:5].tolist() == [0.0, 0.0]


def test_a_flush_is_named_from_a_few_stores_that_are_most_of_the_subnormal_ones():
    """One float32 cancellation may take a store to zero where its exact value was subnormal; a flush takes most."""
    assert not flushes_subnormals(FLUSH_MIN_STORES - 1, FLUSH_MIN_STORES - 1)
    assert flushes_subnormals(FLUSH_MIN_STORES, FLUSH_MIN_STORES)
    assert flushes_subnormals(1000, 500) and not flushes_subnormals(1000, 499)
    assert not flushes_subnormals(0, 0)
    moments = SignedErrorMoments()
    moments.running(torch.device("cpu")).add_(torch.tensor([2.0, 0.0, 0.0, 10.0, 9.0, 0.0, 0.0], dtype=torch.float64))
    assert (moments.count, moments.subnormal, moments.flushed) == (2, 10, 9)


def _values_across(dtype: torch.dtype, gen: torch.Generator, n: int = 4096) -> torch.Tensor:
    """float64 values of random sign across `dtype`'s range below 2**8: log-uniform from a quarter of its smallest
    subnormal up (normals, subnormals and the binade edges between), a tenth of them just below a power of two."""
    info = torch.finfo(dtype)
    smallest = info.smallest_normal * info.eps
    exponents = torch.empty(n, dtype=torch.float64).uniform_(math.log2(smallest) - 2, 8, generator=gen)
    values = torch.exp2(exponents)
    edge = torch.rand(n, generator=gen) < 0.1
    values = torch.where(edge, torch.exp2(exponents.ceil()) * (1 - torch.rand(n, generator=gen, dtype=torch.float64)
                                                                  * info.eps / 2), values)
    return values * (torch.randint(0, 2, (n,), generator=gen).double() * 2 - 1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rounding=st.sampled_from(["nearest", "stochastic"]))
def test_a_rounding_of_the_exact_value_is_never_misrounded(dtype, seed, rounding):
    """Every rounding of the exact value, to nearest or stochastic, near binade edges and in the subnormal range
    included, lies within its reach (no allowance needed); so does a stochastic rounding's other neighbour."""
    gen = torch.Generator().manual_seed(seed)
    exact = _values_across(dtype, gen)
    none = torch.zeros_like(exact)
    assert store_sums(exact, round_to(exact, dtype, rounding, generator=gen).double(), dtype, none, rounding)[5] == 0
    below = round_to(exact.abs(), dtype, "stochastic", uniform=torch.full_like(exact, 1 - 2**-53)).double()
    above = round_to(exact.abs(), dtype, "stochastic", uniform=torch.zeros_like(exact)).double()
    for neighbour in (below, above):
        assert store_sums(exact, neighbour * exact.sign(), dtype, none, "stochastic")[5] == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_a_store_past_the_neighbours_is_misrounded(dtype, seed):
    """A store one spacing beyond the upper neighbour (or below the lower one) is counted, whatever the rounding; to
    nearest, so is the farther neighbour where the exact value is not within half a spacing of it."""
    gen = torch.Generator().manual_seed(seed)
    exact = _values_across(dtype, gen).abs()
    exact = exact[round_to(exact, dtype, "nearest").double() != exact]  # strictly between two neighbours
    none = torch.zeros_like(exact)
    above = round_to(exact, dtype, "stochastic", uniform=torch.zeros_like(exact)).double()
    below = round_to(exact, dtype, "stochastic", uniform=torch.full_like(exact, 1 - 2**-53)).double()
    beyond = above + ulp(above, dtype)
    # (a value just below a power of two has its lower neighbour one spacing of the binade below away)
    under = below - ulp(below - ulp(below, dtype) / 2, dtype)
    for rounding in ("nearest", "stochastic"):
        assert store_sums(exact, beyond, dtype, none, rounding)[5] == len(exact)
        kept = below > 0
        assert store_sums(exact[kept], under[kept], dtype, none[kept], rounding)[5] == int(kept.sum())
    farther = torch.where(exact - below > above - exact, below, above)
    strictly = (exact - farther).abs() > (above - below) / 2  # (not a tie)
    assert store_sums(exact[strictly], farther[strictly], dtype, none[strictly], "nearest")[5] == int(strictly.sum())


def test_the_allowance_is_what_float32_arithmetic_may_add():
    """A store whose value is the exact one moved by less than the allowance and then rounded passes; moved by more
    than the allowance plus a spacing, it is counted. The allowance grows with the terms (a cancelling update's error
    is its terms' roundings) and with dt's derivative."""
    decayed = torch.tensor([1.0, 1.0, 1e-3])
    drive = torch.tensor([-0.999, 0.5, 1e-3])
    dt, A, xB = torch.tensor(0.1), torch.tensor([-2.0, -2.0, -2.0]), torch.tensor([1.0, 1.0, 1.0])
    allowance = store_allowance(decayed, drive, dt, A, xB)
    assert allowance[0] > allowance[2] and allowance[0] > 1.99 * 2.0**-15
    exact = decayed + drive
    moved = exact + 0.9 * allowance
    stored = round_to(moved, torch.float16, "nearest").double()
    assert store_sums(exact, stored, torch.float16, allowance, "nearest")[5] == 0
    far = round_to(exact + allowance + 2 * ulp(exact, torch.float16), torch.float16, "nearest").double()
    assert store_sums(exact, far, torch.float16, allowance, "nearest")[5] == 3


def _sr_toward_minus_inf(exact: torch.Tensor, dtype: torch.dtype, g: torch.Generator, bits: int | None):
    """exact rounded on `dtype`'s grid to the point below it (toward -inf, whatever the sign) plus one spacing with
    probability its fraction, drawn with `bits` random bits (None: a float64 uniform, exact SR)."""
    spacing = ulp(exact, dtype)
    lower = torch.floor(exact / spacing) * spacing
    fraction = (exact - lower) / spacing
    if bits is None:
        r = torch.rand(exact.shape, generator=g, dtype=torch.float64)
    else:
        r = torch.randint(0, 2**bits, exact.shape, generator=g).double() / 2**bits
    return lower + (fraction + r >= 1).double() * spacing


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_a_rounding_that_leans_toward_minus_inf_is_caught_where_the_errors_along_the_values_cancel(seed):
    """8 random bits added before a floor: up with probability floor(256 f) / 256, 1/512 ulp toward -inf on average
    for either sign, so that along the values (positive and negative alike) the mean cancels. Signed toward +inf it
    shows; exact SR on the same values shows in neither."""
    g = torch.Generator().manual_seed(seed)
    n = 4_000_000  # the lean's z ~ (1/512) / (0.41 / sqrt(n)): about 9.5
    exact = (torch.rand(n, generator=g, dtype=torch.float64) + 0.5) * (torch.randint(0, 2, (n,), generator=g) * 2 - 1)
    none = torch.zeros_like(exact)
    for bits, leans in ((8, True), (None, False)):
        moments = SignedErrorMoments()
        stored = _sr_toward_minus_inf(exact, torch.float16, g, bits)
        moments.running(exact.device).add_(store_sums(exact, stored, torch.float16, none, "stochastic"))
        assert not is_biased(moments) and moments.misrounded == 0
        assert leans_up_or_down(moments) == leans, (bits, moments.mean_up, moments.z_up)
        if leans:
            assert moments.mean_up == pytest.approx(-1 / 512, rel=0.3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_float32_subnormal_flushed_to_zero_is_not_misrounded(dtype):
    """A bf16 or fp32 state's exact value below float32's smallest normal, stored as 0 by arithmetic that flushes
    float32 subnormals (an approximate exp's .ftz), is within the allowance; the same value stored as 2**-120 is
    not."""
    exact = torch.full((16,), 2.0**-130, dtype=torch.float64)
    terms = torch.zeros_like(exact)
    allowance = store_allowance(terms, terms, torch.tensor(0.0), terms, terms)
    assert store_sums(exact, torch.zeros_like(exact), dtype, allowance, "nearest")[5] == 0
    assert store_sums(exact, torch.full_like(exact, 2.0**-120), dtype, allowance, "nearest")[5] == 16


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([torch.float16, torch.bfloat16]), st.integers(0, 2**31 - 1), st.floats(1e-3, 1e3),
       st.integers(512, 4096))
def test_nearest_z_tells_rounding_to_nearest_from_stochastic_rounding(dtype, seed, scale, count):
    """Fresh values at any scale, both signs: their stochastic roundings (ops.rounding.naive) lie within a few standard
    deviations of the squared errors' expectation, their roundings to nearest below -NEAREST_Z_LIMIT, and a value the
    format holds exactly counts for nothing."""
    g = torch.Generator().manual_seed(seed)
    exact = torch.randn(count, generator=g, dtype=torch.float64) * scale
    stochastic = round_to(exact, dtype, "stochastic", g).double()
    assert abs(nearest_z(exact, stochastic, dtype)) < 5.0
    # to nearest about -0.47 sqrt(count): -10.6 at 512
    assert nearest_z(exact, round_to(exact, dtype, "nearest").double(), dtype) < -NEAREST_Z_LIMIT
    held = exact.to(dtype).double()
    assert nearest_z(held, held, dtype) is None
