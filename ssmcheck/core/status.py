"""Statuses, the tolerance rule and the exit codes: the contract CI scripts rely on.

Shared by every command (`scan`, `drift`), so a status means the same thing
everywhere and the exit code is computed in one place.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass


class Status(str, enum.Enum):
    PASS = "pass"  # within the tolerance rule
    FAIL = "fail"  # outside the tolerance rule (or biased, for stochastic rounding)
    NONFINITE = "nonfinite"  # NaN/Inf where the reference is finite
    ERROR = "error"  # the kernel raised
    SKIPPED = "skipped"  # not run; the message says why


class ExitCode(enum.IntEnum):
    OK = 0  # every case that ran passed
    TOLERANCE = 1  # a case failed tolerance
    USAGE = 2  # bad option or value (Click's convention)
    NONFINITE = 3  # a case was non-finite
    ERROR = 4  # a case raised
    NOTHING_RAN = 5  # every case was skipped, or there were none


# --fail-on categories, and the status each one gates.
FAIL_ON = {"nonfinite": Status.NONFINITE, "tolerance": Status.FAIL, "error": Status.ERROR}

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


def summarize(statuses: Iterable[Status]) -> dict[str, int]:
    counts = {s.value: 0 for s in Status}
    for s in statuses:
        counts[Status(s).value] += 1
    return counts


def exit_code(statuses: Iterable[Status], fail_on: Iterable[str] = tuple(FAIL_ON)) -> ExitCode:
    """The most severe applicable code: nonfinite (3), then error (4), then tolerance (1).

    Only categories named in `fail_on` can make the code nonzero; if no case
    ran (all skipped, or none), the code is 5.
    """
    statuses = [Status(s) for s in statuses]
    gated = {FAIL_ON[c] for c in fail_on}
    if not any(s is not Status.SKIPPED for s in statuses):
        return ExitCode.NOTHING_RAN
    for status, code in (
        (Status.NONFINITE, ExitCode.NONFINITE),
        (Status.ERROR, ExitCode.ERROR),
        (Status.FAIL, ExitCode.TOLERANCE),
    ):
        if status in gated and status in statuses:
            return code
    return ExitCode.OK
