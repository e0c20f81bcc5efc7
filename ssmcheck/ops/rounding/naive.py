"""Reference rounding into fp16/bf16/fp32: exact round-to-nearest-even and ideal stochastic rounding.

Stochastic rounding is computed in float64 with exponent arithmetic. Never through
torch's own conversion of an inexact float64 value: torch converts float64 to
fp16/bf16 through float32, which rounds twice (1 + 2**-11 + 2**-40 comes out as
1.0, not 1 + 2**-10). Round to nearest from float64 goes through float32 rounded
to odd instead, which is exact; from float32, or into float32, one native
conversion rounds once.

Overflow convention (shared with the Triton kernels): above the largest finite
value the upper neighbour is 2**(emax+1), which maps to inf; magnitudes at or
above 2**(emax+1) are inf. NaN and inf pass through. Subnormals are exact.
"""

from __future__ import annotations

import torch

from ssmcheck.core.formats import FORMATS, ROUNDINGS
from ssmcheck.core.tensors import finite


def round_to(
    x: torch.Tensor, dtype: torch.dtype, mode: str, generator: torch.Generator | None = None,
    uniform: torch.Tensor | None = None,
) -> torch.Tensor:
    """Round float32/float64 `x` into `dtype` ("nearest": RNE; "stochastic": ideal SR).

    Stochastic: with neighbours a < x < b in `dtype`, returns b with probability
    (x - a) / (b - a), the fraction computed exactly in float64 and compared with
    a float64 uniform draw from `generator` (on x's device), or with `uniform` when given
    (float64 in [0, 1), x's shape: drawn by the caller, as torch.compile needs).
    """
    if mode not in ROUNDINGS:
        raise ValueError(f"unknown rounding mode {mode!r}: choose one of {', '.join(ROUNDINGS)}")
    if x.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"round_to takes float32 or float64 input, got {x.dtype}")
    if dtype not in FORMATS:
        raise ValueError(f"round_to rounds into float16, bfloat16 or float32, got {dtype}")
    if x.dtype == dtype:
        return x.clone()
    if mode == "nearest":
        # What rounded_by_exponents computes, in one to eleven operations instead of some thirty (drift
        # rounds its baseline every decode step; the scan's baseline stores a state per chunk):
        # tests/test_reference_rounding.py compares them everywhere, ties, overflow and subnormals included.
        if x.dtype == torch.float32 or dtype == torch.float32:
            return x.to(dtype)  # one native conversion: rounds once, to nearest even
        return _nearest_through_float32_to_odd(x, dtype)
    return rounded_by_exponents(x, dtype, mode, generator, uniform)


def _nearest_through_float32_to_odd(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 -> float16/bfloat16 rounded to nearest even, exactly: first to float32 rounded to odd
    (truncated toward zero, its last bit set when anything was dropped), then natively to `dtype`.
    With at least two more bits than the target, rounding to odd keeps which side of every tie the
    value lies on, so the second rounding is the correct one (Boldo & Melquiond, "Emulation of FMA and
    correctly rounded sums: proved algorithms using rounding to odd", IEEE TC 2008); float32 has 13
    more than float16 and 16 more than bfloat16, subnormal ranges included."""
    y = x.to(torch.float32)  # to nearest: at most one float32 ulp beyond x
    back = y.to(torch.float64)
    # Where y lies beyond x, step its magnitude down one ulp (the integer view orders magnitudes
    # alike for both signs): truncated. Past float32's range y is inf, and steps down to its largest value.
    truncated = y.view(torch.int32) - (back.abs() > x.abs()).to(torch.int32)
    odd = truncated | (back != x).to(torch.int32)  # NaN != NaN: a NaN's payload gains a bit, stays NaN
    return odd.view(torch.float32).to(dtype)


def fraction_between_neighbours(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Where |x| lies between its two neighbours in `dtype`, exactly, in [0, 1) (0: x is representable, and so
    for a non-finite x): the probability that ideal stochastic rounding stores the upper one."""
    xd = x.to(torch.float64)
    ok = finite(xd)
    return torch.where(ok, _between_neighbours(xd, ok, dtype)[1], 0.0)


def _between_neighbours(xd: torch.Tensor, ok: torch.Tensor, dtype: torch.dtype):
    """(lower, frac, ulp) of float64 `xd` in `dtype`: |xd| = (lower + frac) * ulp, lower an integer, frac in
    [0, 1), ulp the spacing of `dtype` there (at `ok` elements; the others' figures are meaningless)."""
    fmt = FORMATS[dtype]
    mag = xd.abs()
    # Exponent of |x| (frexp's mantissa is in [0.5, 1)), floored at emin: below it
    # the spacing is the subnormal one. Zero, inf and NaN are dealt with by the caller.
    _, e = torch.frexp(torch.where(ok, mag, 0.0))
    e = torch.clamp(e.to(torch.int64) - 1, min=fmt.emin)
    ulp = torch.ldexp(torch.ones_like(mag), e - fmt.mantissa_bits)
    scaled = mag / ulp  # exact: division by a power of two
    lower = torch.floor(scaled)
    return lower, scaled - lower, ulp  # frac exact


def stochastic_draws(shape: torch.Size, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """The uniform draws (float64 in [0, 1), one per element) that stochastic rounding of a tensor of `shape` on
    `device` takes from `generator`: what round_to draws where it is given no `uniform`."""
    return torch.rand(shape, generator=generator, dtype=torch.float64, device=device)


def rounded_by_exponents(x: torch.Tensor, dtype: torch.dtype, mode: str,
                         generator: torch.Generator | None = None, uniform: torch.Tensor | None = None) -> torch.Tensor:
    """round_to's rounding computed exactly in float64 with exponent arithmetic (any float32/float64 `x`)."""
    fmt = FORMATS[dtype]
    xd = x.to(torch.float64)
    ok = finite(xd)  # (drift rounds its baseline every decode step: few operations, each a launch)
    lower, frac, ulp = _between_neighbours(xd, ok, dtype)
    if mode == "nearest":
        odd = torch.remainder(lower, 2) == 1
        up = (frac > 0.5) | ((frac == 0.5) & odd)
    else:
        if uniform is None:
            uniform = stochastic_draws(x.shape, generator, x.device)
        up = uniform < frac
    rounded = (lower + up.to(torch.float64)) * ulp
    overflow = 2.0 ** (fmt.emax + 1)
    rounded = torch.where(rounded >= overflow, float("inf"), rounded)
    rounded = torch.copysign(rounded, xd)  # keeps -0.0 and the sign of overflow
    rounded = torch.where(ok, rounded, xd)
    return rounded.to(dtype)  # exact: every finite value here is representable in dtype
