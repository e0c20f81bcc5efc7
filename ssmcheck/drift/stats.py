"""Statistics of decode drift: checkpoints, the growth exponent, the bias z-test, tolerance crossing.

Pure functions of numbers and tensors; they know nothing of kernels or the CLI.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ssmcheck.core.formats import own_subnormals, subnormal_range, ulp
from ssmcheck.core.output_bias import mean_and_error, signed_ulp_errors, z_statistic
from ssmcheck.core.tensors import finite

# Stochastic rounding is "biased" when the mean rounding error per store is both
# statistically nonzero (|z| above BIAS_Z_LIMIT: ~6e-5 two-sided under the null)
# and larger than BIAS_FLOOR_ULP. The floor is above what a kernel's own fp32
# arithmetic can shift the value it rounds (a few 2**-13 ulp of fp16, even with
# the GPU's approximate exp), and well below the 2**-4 ulp of a 3-bit SR.
BIAS_Z_LIMIT = 4.0
BIAS_FLOOR_ULP = 2.0**-10
# A kernel flushes subnormals where at least this many stores, and this share of those whose exact value is
# subnormal, came out zero. One such store alone may be the kernel's float32 arithmetic cancelling to below half
# the smallest subnormal where the float64 exact value did not; a flush takes them all.
FLUSH_MIN_STORES = 8
FLUSH_MIN_SHARE = 0.5
# How far a kernel's float32 arithmetic may put the value it rounds from the exact update of its own previous state
# (store_allowance): ARITHMETIC_REL of each term the update adds (a few float32 roundings, 2**-24 each, and the
# GPU's approximate exp, whose argument dt*A carries its own rounding), and an error of DT_ABS * (1 + dt) in dt
# itself times the update's derivative in dt, A * decayed + x * B: softplus as log(exp(v) + 1) in float32 (as vLLM
# and mamba_ssm compute it) errs by up to 2**-24 absolute where exp(v) vanishes beside 1, with an approximate log
# by 2**-22, and by about 2**-23 * dt where dt is large. Both bounds are 8-16x those errors; a store still farther
# from the exact value than its rounding can move it is no rounding of it (misrounded). Plus FLOAT32_TINY, float32's
# smallest normal: arithmetic that flushes float32 subnormals to zero (a compiler's mode, an approximate exp's .ftz)
# errs by that much absolute, which only a bf16 or fp32 state below it can show (fp16's smallest spacing is 2**-24).
ARITHMETIC_REL = 2.0**-15
DT_ABS = 2.0**-20
FLOAT32_TINY = 2.0**-126
# How far a rounding moves a value, in spacings of the storage dtype (reach): half of one to nearest, less than one
# stochastically.
ROUNDING_RADIUS = {"nearest": 0.5, "stochastic": 1.0}
# The layout of store_sums' rows and of SignedErrorMoments' sums.
STORE_SUMS = ("count", "total", "total of squares", "subnormal", "flushed", "misrounded", "total up")
_MISROUNDED, _UP = STORE_SUMS.index("misrounded"), STORE_SUMS.index("total up")


def log_checkpoints(nsteps: int, count: int = 16) -> list[int]:
    """About `count` log-spaced steps in [1, nsteps], always including 1 and nsteps."""
    if nsteps <= count:
        return list(range(1, nsteps + 1))
    ratio = nsteps ** (1.0 / (count - 1))
    steps = {1, nsteps}
    steps.update(min(nsteps, max(1, round(ratio**i))) for i in range(count))
    return sorted(steps)


def error_sums(errors: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """(count, total, total of squares) of the finite values of `errors`, as one float64 tensor: over every axis,
    or over axis `dim` alone (then each of the three has the other axes, stacked along a new first axis)."""
    errors = errors.double()
    counted = finite(errors)
    kept = torch.where(counted, errors, 0.0)
    axes = {} if dim is None else {"dim": dim}
    return torch.stack([counted.sum(**axes).double(), kept.sum(**axes), kept.square().sum(**axes)])


def store_allowance(decayed: torch.Tensor, drive: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                    xB: torch.Tensor) -> torch.Tensor:
    """How far a kernel's float32 arithmetic may put each new state element from the exact update, float64: from the
    exact terms of that update (ops.state_update.naive.state_update_parts: decayed = state * exp(dt * A) and
    drive = dt * x * B; dt per channel, A like the state's rows, xB = |x| * |B| like the state); ARITHMETIC_REL,
    DT_ABS and FLOAT32_TINY say what it covers."""
    decayed = decayed.abs()
    return (ARITHMETIC_REL * (decayed + drive.abs())
            + DT_ABS * (1 + dt.abs())[..., None] * (A.abs() * decayed + xB) + FLOAT32_TINY)


def reach(exact: torch.Tensor, stored: torch.Tensor, dtype: torch.dtype, rounding: str) -> torch.Tensor:
    """How far `rounding` may take an exact value to `stored`: ROUNDING_RADIUS times the spacing of `dtype`
    between `stored` and its neighbour on the exact value's side (where `stored` is a power of two above the exact
    value, half the spacing above it)."""
    side = torch.sign(stored - exact) * ulp(stored, dtype) / 4  # a quarter spacing: inside the gap either way
    return ROUNDING_RADIUS[rounding] * ulp(stored - side, dtype)


def store_sums(exact: torch.Tensor, stored: torch.Tensor, dtype: torch.dtype, allowance: torch.Tensor,
               rounding: str) -> torch.Tensor:
    """A step's stores summed up along each state row (the last axis) in SignedErrorMoments' layout (STORE_SUMS):
    error_sums of the signed rounding errors (ulps, along the exact value), then how many exact values lie in
    `dtype`'s subnormal range, how many of those were stored as zero, how many stores are misrounded, and the sum of
    the errors signed toward +inf (a rounding that leans toward -inf whatever the sign, a floor, cancels over mixed
    signs along the value); shape (7, *exact.shape[:-1]). Per row, not in all: a compiled drift step fuses sums along
    a row into the kernel that computes the row, where one sum over the whole state took a kernel of its own, a fifth
    of the step's device time on an H200.
    No rounding, to nearest or stochastic, takes a value at or above the smallest
    subnormal to zero: a store that does flushes subnormals. Counted only for a dtype with subnormals of its own
    (core.formats.own_subnormals: fp16), zeros for the others.
    A store is misrounded where it lies farther from the exact value than `rounding` takes a value there (`reach`)
    plus `allowance` (store_allowance: the kernel's float32 arithmetic); both finite."""
    along = signed_ulp_errors(stored, exact, dtype)
    errors = error_sums(along, dim=-1)
    up = torch.where(finite(along), along * torch.sign(exact), 0.0).sum(-1)
    stored = stored.double()
    misrounded = finite(stored) & finite(exact) & ((stored - exact).abs() > reach(exact, stored, dtype, rounding)
                                                   + allowance)
    if own_subnormals(dtype):
        smallest, normal = subnormal_range(dtype)
        magnitude = exact.abs()
        subnormal = (magnitude >= smallest) & (magnitude < normal)
        flushed = subnormal & (stored == 0)
        counts = [subnormal, flushed, misrounded]
    else:
        counts = [torch.zeros_like(misrounded), torch.zeros_like(misrounded), misrounded]
    return torch.cat([errors, torch.stack([*(c.sum(-1).double() for c in counts), up])])


def row_totals(sums: torch.Tensor) -> torch.Tensor:
    """Running sums kept per state row (store_sums' layout, (K, *rows)) as K totals over every row."""
    return sums.reshape(len(sums), -1).sum(1)


class SignedErrorMoments:
    """Running count, sum and sum of squares of signed errors, for the bias z-test, and the counts of stores
    whose exact value is subnormal and of those stored as zero (store_sums).

    Every decode step adds to them in place (`running`, drift.follow), so the sums stay on the device and are
    read back only when a statistic is asked for: no wait on the device per step.
    """

    def __init__(self):
        # float64 sums in STORE_SUMS' layout, each per state row where they come from store_sums (summed over the
        # rows when read)
        self._sums: torch.Tensor | None = None

    def running(self, device: torch.device, rows: tuple[int, ...] = ()) -> torch.Tensor:
        """The running sums themselves (store_sums' layout, shape (7, *rows)), zeros until something is added:
        add to them in place (a CUDA graph that captured the addition keeps adding to the same tensor)."""
        if self._sums is None:
            self._sums = torch.zeros((len(STORE_SUMS), *rows), dtype=torch.float64, device=device)
        return self._sums

    def saved(self) -> torch.Tensor | None:
        """The running sums as they are now, for `restore`."""
        return None if self._sums is None else self._sums.clone()

    def restore(self, saved: torch.Tensor | None) -> None:
        """Go back to the sums `saved` returned (in place, where there are sums already)."""
        if self._sums is None:
            self._sums = None if saved is None else saved.clone()
        elif saved is None:
            self._sums.zero_()
        else:
            self._sums.copy_(saved)

    def _totals(self) -> list[float]:
        """The sums over every row (zeros before anything was added)."""
        return [0.0] * len(STORE_SUMS) if self._sums is None else row_totals(self._sums).tolist()

    def _read(self) -> tuple[int, float, float]:
        count, total, total_sq = self._totals()[:3]
        return int(count), total, total_sq

    @property
    def count(self) -> int:
        return self._read()[0]

    @property
    def subnormal(self) -> int:
        """Stores whose exact value lies in the storage dtype's subnormal range."""
        return int(self._totals()[3])

    @property
    def flushed(self) -> int:
        """Of the `subnormal` stores, those stored as zero."""
        return int(self._totals()[4])

    @property
    def misrounded(self) -> int:
        """Stores that no rounding of the exact value gives (store_sums)."""
        return int(self._totals()[_MISROUNDED])

    def most_misrounded(self) -> tuple[int, ...] | None:
        """The index of the state row (batch, head, channel) holding the most misrounded stores; None where none is,
        or the sums are not kept per row."""
        if self._sums is None or self._sums.dim() == 1 or not self.misrounded:
            return None
        rows = self._sums[_MISROUNDED]
        return tuple(int(i) for i in torch.unravel_index(rows.flatten().argmax(), rows.shape))

    @property
    def mean(self) -> float | None:
        count, total, _ = self._read()
        return total / count if count else None

    @property
    def rms(self) -> float | None:
        """The root mean square error per store, in ulps: at most 1 for any rounding of the exact value."""
        count, _, total_sq = self._read()
        return math.sqrt(total_sq / count) if count else None

    def _mean_and_error(self) -> tuple[float, float] | None:
        """The mean and its standard error (core.output_bias.mean_and_error), None with fewer than 2."""
        return mean_and_error(*self._read())

    @property
    def resolution(self) -> float | None:
        """The smallest mean error per store (ulps) these stores could show as a bias: the one whose z would reach
        BIAS_Z_LIMIT at their count and spread (None with fewer than 2). Above BIAS_FLOOR_ULP, a bias between the
        two passes unseen: decode longer, or more trials."""
        found = self._mean_and_error()
        return None if found is None else BIAS_Z_LIMIT * found[1]

    @property
    def z(self) -> float | None:
        """The one-sample z statistic of the mean against zero (None with fewer than 2 samples)."""
        found = self._mean_and_error()
        return None if found is None else z_statistic(*found)

    @property
    def mean_up(self) -> float | None:
        """The mean error per store signed toward +inf, in ulps."""
        totals = self._totals()
        return totals[_UP] / totals[0] if totals[0] else None

    @property
    def z_up(self) -> float | None:
        """The z statistic of `mean_up` against zero (the same spread: an error's square is its square either way)."""
        totals = self._totals()
        found = mean_and_error(totals[0], totals[_UP], totals[2])
        return None if found is None else z_statistic(*found)


def flushes_subnormals(subnormal: int, flushed: int) -> bool:
    """Whether the stores took subnormal values to zero: of `subnormal` stores whose exact value is subnormal,
    `flushed` came out zero (SignedErrorMoments)."""
    return flushed >= FLUSH_MIN_STORES and flushed >= FLUSH_MIN_SHARE * subnormal


def is_biased(moments: SignedErrorMoments) -> bool:
    """Whether the mean signed rounding error (in ulps) is statistically and materially nonzero, along the exact
    values (toward or away from zero)."""
    return _beyond(moments.z, moments.mean)


def leans_up_or_down(moments: SignedErrorMoments) -> bool:
    """Whether the mean rounding error signed toward +inf (in ulps) is statistically and materially nonzero: a
    rounding toward -inf or +inf whatever the sign, whose errors along the values cancel over mixed signs."""
    return _beyond(moments.z_up, moments.mean_up)


def _beyond(z: float | None, mean: float | None) -> bool:
    return z is not None and abs(z) > BIAS_Z_LIMIT and abs(mean) > BIAS_FLOOR_ULP


def nearest_z(exact: torch.Tensor, stored: torch.Tensor, dtype: torch.dtype) -> float | None:
    """How far below stochastic rounding's expectation the stores' squared rounding errors lie, in standard
    deviations (None where no exact value lies between two neighbours of `dtype`).

    A value a fraction f of its gap past the neighbour nearer zero is stored f spacings low, or (with probability f)
    1 - f high: its squared error averages f (1 - f), with variance f (1 - f) (1 - 2f)^2; a rounding to nearest's is
    min(f, 1 - f)^2, about half of it. So a kernel that rounds to nearest where it was asked to round stochastically
    lies NEAREST_Z_LIMIT or more below (at a few thousand stores, tens), where its stores' signed errors alone, mean
    about 0, show nothing. Values past the format's range and non-finite ones are left out."""
    exact, stored = exact.double(), stored.double()
    spacing = ulp(exact, dtype)
    place = exact.abs() / spacing
    f = place - place.floor()
    inside = finite(stored) & finite(exact) & (exact.abs() <= torch.finfo(dtype).max) & (f > 0)
    errors = ((stored - exact) * torch.sign(exact) / spacing)[inside]
    f = f[inside]
    if not f.numel():
        return None
    expected = f * (1 - f)
    spread = (expected * (1 - 2 * f).square()).sum()
    if not spread > 0:
        return None
    return float((errors.square().sum() - expected.sum()) / spread.sqrt())


# nearest_z's bound: one-sided, ~1e-9 under stochastic rounding.
NEAREST_Z_LIMIT = 6.0


@dataclass(frozen=True)
class PowerLaw:
    """log(value) = log_c + alpha * log(step), fitted by least squares."""

    alpha: float
    log_c: float
    alpha_se: float  # standard error of alpha (inf with only two points)


def fit_power_law(steps: Sequence[float], values: Sequence[float]) -> PowerLaw | None:
    """Fit over the finite positive points; None with fewer than 3 of them."""
    points = [(math.log(s), math.log(v)) for s, v in zip(steps, values) if s > 0 and math.isfinite(v) and v > 0]
    if len(points) < 3:
        return None
    n = len(points)
    mean_x = sum(p[0] for p in points) / n
    mean_y = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mean_x) ** 2 for p in points)
    if sxx == 0:
        return None
    alpha = sum((p[0] - mean_x) * (p[1] - mean_y) for p in points) / sxx
    log_c = mean_y - alpha * mean_x
    residual = sum((p[1] - log_c - alpha * p[0]) ** 2 for p in points)
    return PowerLaw(alpha, log_c, math.sqrt(residual / (n - 2) / sxx))


def growth_exponent(steps: Sequence[float], errors: Sequence[float]) -> float | None:
    """alpha in error ~ step**alpha: about 1 for bias or stagnation, 1/2 for unbiased noise, 0 when saturated."""
    fit = fit_power_law(steps, errors)
    return None if fit is None else fit.alpha


def crossing_step(
    steps: Sequence[int], errors: Sequence[float], limits: Sequence[float], horizon: float = 1e12
) -> tuple[int | None, bool]:
    """The step at which the error reaches its tolerance limit: (step, observed).

    Observed: the first checkpoint already beyond its limit. Otherwise the error
    and the limit are fitted as power laws over all checkpoints and extrapolated
    to where they meet, but only when the error's exponent exceeds the limit's
    by more than twice their combined standard error: a correct kernel's drift
    wanders around its baseline's, and extrapolating that noise would predict
    crossings that never come. (None, False) when the error does not grow
    faster, or would cross only beyond `horizon`.
    """
    for step, error, limit in zip(steps, errors, limits):
        if not (error <= limit):  # NaN counts as beyond
            return step, True
    error_fit, limit_fit = fit_power_law(steps, errors), fit_power_law(steps, limits)
    if error_fit is None or limit_fit is None:
        return None, False
    faster = error_fit.alpha - limit_fit.alpha
    if faster <= 2 * math.hypot(error_fit.alpha_se, limit_fit.alpha_se):
        return None, False
    log_step = (limit_fit.log_c - error_fit.log_c) / faster
    if log_step > math.log(horizon):
        return None, False
    return max(math.ceil(math.exp(log_step)), steps[-1] + 1), False
