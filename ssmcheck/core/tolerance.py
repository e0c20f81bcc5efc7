"""The tolerance rule (FlashAttention's): kernel error <= factor x the same-precision baseline's error + floor.

Shared by every command; `--rtol` replaces the rule by an absolute bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Kernel error may be at most TOL_FACTOR x the same-precision baseline's error
# plus FLOOR (both norm-wise relative). The floor keeps fp32 cases, whose
# errors are a few ulps and vary with summation order, from flickering.
DEFAULT_TOL_FACTOR = 2.0
DEFAULT_FLOOR = 1e-5


@dataclass(frozen=True)
class Tolerance:
    """The parameters of the tolerance rule below, as a command's settings carry them."""

    tol_factor: float = DEFAULT_TOL_FACTOR
    floor: float = DEFAULT_FLOOR
    rtol: float | None = None


def within_tolerance(
    error: float,
    baseline_error: float,
    tol_factor: float = DEFAULT_TOL_FACTOR,
    floor: float = DEFAULT_FLOOR,
    rtol: float | None = None,
) -> bool:
    """FlashAttention's rule: error <= tol_factor * baseline_error + floor.

    With `rtol`, the rule is replaced by the absolute bound error <= rtol.
    A NaN error never passes.
    """
    if math.isnan(error):
        return False
    if rtol is not None:
        return error <= rtol
    return error <= tol_factor * baseline_error + floor


def tolerance_limit(
    baseline_error: float,
    tol_factor: float = DEFAULT_TOL_FACTOR,
    floor: float = DEFAULT_FLOOR,
    rtol: float | None = None,
) -> float:
    """The largest error `within_tolerance` accepts, for messages and reports."""
    return rtol if rtol is not None else tol_factor * baseline_error + floor


def tolerance_rule(tolerance: Tolerance) -> str:
    """The rule in words, for headers and messages."""
    if tolerance.rtol is not None:
        return f"rtol {tolerance.rtol:g}"
    return f"{tolerance.tol_factor:g} x baseline + {tolerance.floor:g}"
