"""The rounding bias of an output stored in fp16 or bf16: its mean signed error, in ulps of the output's dtype.

An output computed in float32 and stored to nearest errs, element by element, by up to half an ulp either way,
as much up as down (stored stochastically, as a scan's states may be, by up to an ulp, unbiased too): its mean
signed error (signed along the exact value, so that a store toward zero counts negative whatever the value's sign)
is zero to within its standard error. A store toward zero (a truncating conversion, a hand-written bf16 pack that
drops the low half) averages -1/2 ulp, one away from zero +1/2, at an error per element no larger than twice the
nearest store's: the norm-wise tolerance rule (2 x the baseline) sees it only by chance, and not at all where the
baseline's own error is larger than a store's (a scan's final states from bf16 inputs: a store toward zero left
their norm-wise error within 1.02x the baseline's). Its mean is a test of its own.

Errors come from the output's own arithmetic too (a kernel's bf16 operands in the chunk scan, float32 sums that
cancel), unbiased for any rounding to nearest: each element's error is clipped to CLIP_ULPS, so that a few
large ones do not swamp the mean's standard error, and the elements past it are counted: where many more err by
over an ulp than the baseline's do, the bias is the computation's (a scale off by a few ulps), not a store's, and
the message says so. Pure functions of tensors and numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ssmcheck.core.formats import dtype_name, ulp
from ssmcheck.core.tensors import finite

# Only the stores into these are rounded from a wider computation (an fp32 output's error is its arithmetic's).
NARROW_OUTPUTS = (torch.float16, torch.bfloat16)
# Each element's signed error is clipped to this many ulps: a store errs by at most one.
CLIP_ULPS = 1.0
# An output is biased when its mean signed error differs from its baseline's by more than BIAS_FLOOR_ULP (no
# rounding to nearest of a value computed in float32 comes near: a quarter ulp of bf16 is 2**-10 of the value)
# with |z| above BIAS_Z_LIMIT; a store toward zero averages -1/2 ulp.
BIAS_FLOOR_ULP = 0.25
BIAS_Z_LIMIT = 8.0
# No rounding of a value computed right averages more than 1/2 ulp one way (a directed one averages 1/2; the clip and
# the arithmetic's noise only pull that toward 0), nor takes many more elements past an ulp than the baseline's noise
# does (a store toward zero on the baseline's noise: about a tenth more): a mean further than ROUNDING_MEAN_ULP from the
# baseline's, or a share of elements past an ulp BEYOND_SHARE above the baseline's, is the computation erring one way
# (a scale off by a few ulps in some of the output), not its store, and the message says so.
ROUNDING_MEAN_ULP = 0.6
BEYOND_SHARE = 0.25


def signed_ulp_errors(stored: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(stored - exact) in ulps of `dtype` at each exact value, signed along it (negative: toward zero); float64,
    NaN where either is non-finite (moment_sums leaves those out: a non-finite output is judged as such, not as a
    rounding)."""
    exact = exact.double()
    errors = torch.sign(exact) * (stored.double() - exact) / ulp(exact, dtype)
    return torch.where(finite(errors), errors, math.nan)


def moment_sums(errors: torch.Tensor) -> torch.Tensor:
    """(count, total, total of squares, count past CLIP_ULPS) of the finite values of `errors`, each clipped to
    +-CLIP_ULPS, as one float64 tensor of 4."""
    errors = errors.double()
    counted = finite(errors)
    kept = torch.where(counted, errors, 0.0)
    beyond = kept.abs() > CLIP_ULPS
    kept = kept.clamp(-CLIP_ULPS, CLIP_ULPS)
    return torch.stack([counted.sum().double(), kept.sum(), kept.square().sum(), beyond.sum().double()])


@dataclass(frozen=True)
class OutputBias:
    """An output's mean signed error in ulps of its dtype over `count` elements, and the mean's z statistic."""

    dtype: str  # fp16 or bf16
    count: int
    mean: float
    z: float
    beyond: int = 0  # elements that err by more than CLIP_ULPS (no store does)

    def as_dict(self) -> dict:
        return {"dtype": self.dtype, "count": self.count, "mean_ulp": self.mean, "z": self.z, "beyond": self.beyond}

    @property
    def beyond_share(self) -> float:
        return self.beyond / self.count


def mean_and_error(count: float, total: float, total_sq: float) -> tuple[float, float] | None:
    """The mean of signed errors from their (count, total, total of squares) and its standard error (the sample
    variance's, over the count); None with fewer than 2. Shared with the drift's store-bias test (drift.stats)."""
    if count < 2:
        return None
    mean = total / count
    variance = max(total_sq / count - mean * mean, 0.0) * count / (count - 1)
    return mean, math.sqrt(variance / count)


def z_statistic(mean: float, error: float) -> float:
    """The one-sample z of `mean` against zero at standard error `error` (a zero error: 0, or +-inf)."""
    if error == 0.0:
        return 0.0 if mean == 0.0 else math.copysign(math.inf, mean)
    return mean / error


def output_bias(sums, dtype: torch.dtype) -> OutputBias | None:
    """The OutputBias of moment_sums' (count, total, total of squares, count past an ulp) (added up over parts), None
    with fewer than two elements or for an output dtype that is not narrow."""
    count, total, total_sq, beyond = (float(v) for v in sums)
    found = mean_and_error(count, total, total_sq)
    if dtype not in NARROW_OUTPUTS or found is None:
        return None
    mean, error = found
    return OutputBias(dtype_name(dtype), int(count), mean, z_statistic(mean, error), int(beyond))


def is_biased(bias: OutputBias | None, baseline_mean: float = 0.0) -> bool:
    """Whether the output's stores are biased: its mean signed error BIAS_FLOOR_ULP or more away from the
    baseline's (a correct computation of the same precision: 0 where none is measured), at |z| > BIAS_Z_LIMIT."""
    return bias is not None and abs(bias.mean - baseline_mean) > BIAS_FLOOR_ULP and abs(bias.z) > BIAS_Z_LIMIT


def bias_clause(output: str, bias: OutputBias | None, baseline: OutputBias | None,
                rounding: str = "nearest") -> str | None:
    """The verdict's clause on `output`'s bias against its baseline's (bias_message), where it is biased; else None."""
    if not is_biased(bias, baseline.mean if baseline is not None else 0.0):
        return None
    return bias_message(output, bias, baseline, rounding)


def bias_message(output: str, bias: OutputBias, baseline: OutputBias | None = None, rounding: str = "nearest") -> str:
    """One clause naming the bias and what rounds that way (not as `rounding`, "nearest" or "stochastic", declares);
    or, where no rounding explains it (ROUNDING_MEAN_ULP, BEYOND_SHARE against the baseline's), the computation that
    errs one way."""
    direction = "toward zero" if bias.mean < 0 else "away from zero"
    base_mean, base_share = (0.0, 0.0) if baseline is None else (baseline.mean, baseline.beyond_share)
    beside = "" if baseline is None else f"; the same-precision baseline's {base_mean:+.3f}"
    figures = (f"mean signed error {bias.mean:+.3f} ulp of {bias.dtype} over {bias.count} elements "
               f"(z {bias.z:.1f}{beside})")
    if abs(bias.mean - base_mean) > ROUNDING_MEAN_ULP or bias.beyond_share - base_share > BEYOND_SHARE:
        return (f"{output} errs one way: {figures}, {bias.beyond_share:.0%} of them by more than an ulp (the "
                f"baseline's {base_share:.0%}): no rounding does that, the computation errs {direction}")
    declared = "to nearest" if rounding == "nearest" else "stochastically"
    return f"{output} stored with a bias: {figures}: rounded {direction}, not {declared}"
