"""Statuses and exit codes: the contract CI scripts rely on.

Shared by every command (`scan`, `drift`), so a status means the same thing
everywhere and the exit code is computed in one place.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Status(str, enum.Enum):
    PASS = "pass"  # within the tolerance rule
    FAIL = "fail"  # outside the tolerance rule (or biased, for stochastic rounding)
    NONFINITE = "nonfinite"  # NaN/Inf where the reference is finite
    ERROR = "error"  # the kernel raised
    SKIPPED = "skipped"  # not run; the message says why


# The statuses of the cases a report names one by one (its notes, --quiet's lines): those that did not pass.
LISTED = (Status.FAIL, Status.NONFINITE, Status.ERROR)


class ExitCode(enum.IntEnum):
    OK = 0  # every case that ran passed
    TOLERANCE = 1  # a case failed tolerance
    USAGE = 2  # bad option or value (Click's convention)
    NONFINITE = 3  # a case was non-finite
    ERROR = 4  # a case raised
    NOTHING_RAN = 5  # every case was skipped, or there were none


# --fail-on categories, and the status each one gates.
FAIL_ON = {"nonfinite": Status.NONFINITE, "tolerance": Status.FAIL, "error": Status.ERROR}

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
