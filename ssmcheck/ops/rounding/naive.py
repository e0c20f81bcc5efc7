"""Reference rounding into fp16/bf16/fp32: exact round-to-nearest-even and ideal stochastic rounding.

Everything is computed in float64 with exponent arithmetic, never through torch's
own conversion of an inexact value: torch converts float64 to fp16/bf16 through
float32, which rounds twice (1 + 2**-11 + 2**-40 comes out as 1.0, not 1 + 2**-10).
Only values already representable in the target are handed to `.to(dtype)`.

Overflow convention (shared with the Triton kernels): above the largest finite
value the upper neighbour is 2**(emax+1), which maps to inf; magnitudes at or
above 2**(emax+1) are inf. NaN and inf pass through. Subnormals are exact.
"""

from __future__ import annotations

import torch

from ssmcheck.core.formats import FORMATS, ROUNDINGS
from ssmcheck.core.tensors import finite


def round_to(
    x: torch.Tensor, dtype: torch.dtype, mode: str, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Round float32/float64 `x` into `dtype` ("nearest": RNE; "stochastic": ideal SR).

    Stochastic: with neighbours a < x < b in `dtype`, returns b with probability
    (x - a) / (b - a), the fraction computed exactly in float64 and compared with
    a float64 uniform draw from `generator` (on x's device).
    """
    if mode not in ROUNDINGS:
        raise ValueError(f"unknown rounding mode {mode!r}: choose one of {', '.join(ROUNDINGS)}")
    if x.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"round_to takes float32 or float64 input, got {x.dtype}")
    if dtype not in FORMATS:
        raise ValueError(f"round_to rounds into float16, bfloat16 or float32, got {dtype}")
    if x.dtype == dtype:
        return x.clone()
    if mode == "nearest" and x.dtype == torch.float32:
        # From float32 the native conversion rounds once, to nearest even, with the overflow convention
        # above: what rounded_by_exponents computes (tests/test_reference_rounding.py compares the two),
        # in one operation instead of some thirty (the baseline stores a state per chunk).
        return x.to(dtype)
    return rounded_by_exponents(x, dtype, mode, generator)


def rounded_by_exponents(x: torch.Tensor, dtype: torch.dtype, mode: str,
                         generator: torch.Generator | None = None) -> torch.Tensor:
    """round_to's rounding computed exactly in float64 with exponent arithmetic (any float32/float64 `x`)."""
    fmt = FORMATS[dtype]
    xd = x.to(torch.float64)
    mag = xd.abs()
    ok = finite(xd)  # (drift rounds its baseline every decode step: few operations, each a launch)
    # Exponent of |x| (frexp's mantissa is in [0.5, 1)), floored at emin: below it
    # the spacing is the subnormal one. Zero, inf and NaN are dealt with below.
    _, e = torch.frexp(torch.where(ok, mag, 0.0))
    e = torch.clamp(e.to(torch.int64) - 1, min=fmt.emin)
    ulp = torch.ldexp(torch.ones_like(mag), e - fmt.mantissa_bits)
    scaled = mag / ulp  # exact: division by a power of two
    lower = torch.floor(scaled)
    frac = scaled - lower  # exact, in [0, 1): the position of |x| between its neighbours
    if mode == "nearest":
        odd = torch.remainder(lower, 2) == 1
        up = (frac > 0.5) | ((frac == 0.5) & odd)
    else:
        u = torch.rand(x.shape, generator=generator, dtype=torch.float64, device=x.device)
        up = u < frac
    rounded = (lower + up.to(torch.float64)) * ulp
    overflow = 2.0 ** (fmt.emax + 1)
    rounded = torch.where(rounded >= overflow, float("inf"), rounded)
    rounded = torch.copysign(rounded, xd)  # keeps -0.0 and the sign of overflow
    rounded = torch.where(ok, rounded, xd)
    return rounded.to(dtype)  # exact: every finite value here is representable in dtype
