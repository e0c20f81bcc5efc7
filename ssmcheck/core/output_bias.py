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
the message says so.

The same errors are also pooled signed toward +inf (`mean_up`, `z_up`): a store that rounds down whatever the sign
(`cvt.rm` where `cvt.rn` belongs) is toward zero for positive values and away from it for negative ones, so along
the values it cancels over an output of mixed signs, where toward +inf it averages -1/2 ulp. Pure functions of
tensors and numbers.
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


# moment_sums' sums, in order (output_bias unpacks them so; drift.measure sizes its running sums by them).
MOMENT_SUMS = ("count", "total", "total of squares", "beyond", "total up")


def signed_ulp_errors(stored: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(stored - exact) in ulps of `dtype` at each exact value, signed along it (negative: toward zero); float64,
    NaN where either is non-finite (moment_sums leaves those out: a non-finite output is judged as such, not as a
    rounding)."""
    exact = exact.double()
    errors = torch.sign(exact) * (stored.double() - exact) / ulp(exact, dtype)
    return torch.where(finite(errors), errors, math.nan)


def moment_sums(errors: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """MOMENT_SUMS of the finite values of `errors` (signed_ulp_errors' at `exact`), each clipped to +-CLIP_ULPS:
    count, total, total of squares, count past CLIP_ULPS, and the total signed toward +inf (each error times the
    sign of its exact value), as one float64 tensor."""
    errors = errors.double()
    counted = finite(errors)
    kept = torch.where(counted, errors, 0.0)
    beyond = kept.abs() > CLIP_ULPS
    kept = kept.clamp(-CLIP_ULPS, CLIP_ULPS)
    up = kept * torch.sign(exact.double())
    return torch.stack([counted.sum().double(), kept.sum(), kept.square().sum(), beyond.sum().double(), up.sum()])


@dataclass(frozen=True)
class OutputBias:
    """An output's mean signed error in ulps of its dtype over `count` elements (signed along each value, and toward
    +inf), and each mean's z statistic."""

    dtype: str  # fp16 or bf16
    count: int
    mean: float
    z: float
    beyond: int = 0  # elements that err by more than CLIP_ULPS (no store does)
    mean_up: float = 0.0
    z_up: float = 0.0

    def as_dict(self) -> dict:
        return {"dtype": self.dtype, "count": self.count, "mean_ulp": self.mean, "z": self.z, "beyond": self.beyond,
                "mean_up_ulp": self.mean_up, "z_up": self.z_up}

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
    """The OutputBias of moment_sums' MOMENT_SUMS (added up over parts), None with fewer than two elements or for an
    output dtype that is not narrow."""
    count, total, total_sq, beyond, total_up = (float(v) for v in sums)
    found = mean_and_error(count, total, total_sq)
    if dtype not in NARROW_OUTPUTS or found is None:
        return None
    mean, error = found
    mean_up, error_up = mean_and_error(count, total_up, total_sq)
    return OutputBias(dtype_name(dtype), int(count), mean, z_statistic(mean, error), int(beyond), mean_up,
                      z_statistic(mean_up, error_up))


def _past(mean: float, z: float, baseline_mean: float) -> bool:
    return abs(mean - baseline_mean) > BIAS_FLOOR_ULP and abs(z) > BIAS_Z_LIMIT


def is_biased(bias: OutputBias | None, baseline: OutputBias | None = None) -> bool:
    """Whether the output's stores are biased: its mean signed error, along the values or toward +inf,
    BIAS_FLOOR_ULP or more away from the baseline's (a correct computation of the same precision: 0 where none is
    measured), at |z| > BIAS_Z_LIMIT."""
    if bias is None:
        return False
    base_mean, base_up = (0.0, 0.0) if baseline is None else (baseline.mean, baseline.mean_up)
    return _past(bias.mean, bias.z, base_mean) or _past(bias.mean_up, bias.z_up, base_up)


def bias_clause(output: str, bias: OutputBias | None, baseline: OutputBias | None,
                rounding: str = "nearest") -> str | None:
    """The verdict's clause on `output`'s bias against its baseline's (bias_message), where it is biased; else None."""
    if not is_biased(bias, baseline):
        return None
    return bias_message(output, bias, baseline, rounding)


def bias_message(output: str, bias: OutputBias, baseline: OutputBias | None = None, rounding: str = "nearest") -> str:
    """One clause naming the bias and what rounds that way (not as `rounding`, "nearest" or "stochastic", declares);
    or, where no rounding explains it (ROUNDING_MEAN_ULP, BEYOND_SHARE against the baseline's), the computation that
    errs one way. Along the values where that mean is past the floor, else toward +inf."""
    base_mean, base_up, base_share = (0.0, 0.0, 0.0) if baseline is None else (
        baseline.mean, baseline.mean_up, baseline.beyond_share)
    if _past(bias.mean, bias.z, base_mean):
        direction = "toward zero" if bias.mean < 0 else "away from zero"
        mean, z, base, signed = bias.mean, bias.z, base_mean, "signed error"
    else:
        direction = "toward -inf" if bias.mean_up < 0 else "toward +inf"
        mean, z, base, signed = bias.mean_up, bias.z_up, base_up, "error signed toward +inf"
    beside = "" if baseline is None else f"; the same-precision baseline's {base:+.3f}"
    figures = f"mean {signed} {mean:+.3f} ulp of {bias.dtype} over {bias.count} elements (z {z:.1f}{beside})"
    if abs(mean - base) > ROUNDING_MEAN_ULP or bias.beyond_share - base_share > BEYOND_SHARE:
        return (f"{output} errs one way: {figures}, {bias.beyond_share:.0%} of them by more than an ulp (the "
                f"baseline's {base_share:.0%}): no rounding does that, the computation errs {direction}")
    declared = "to nearest" if rounding == "nearest" else "stochastically"
    return f"{output} stored with a bias: {figures}: rounded {direction}, not {declared}"
