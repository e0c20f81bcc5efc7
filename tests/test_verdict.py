"""The tolerance rule and the exit codes CI relies on."""

import math

import pytest

from ssmcheck.core.status import ExitCode, Status, exit_code, summarize
from ssmcheck.core.tolerance import tolerance_limit, within_tolerance

P, F, N, E, S = Status.PASS, Status.FAIL, Status.NONFINITE, Status.ERROR, Status.SKIPPED


def test_tolerance_rule_is_factor_times_baseline_plus_floor_or_rtol():
    assert within_tolerance(2.0e-3, 1.0e-3, tol_factor=2.0, floor=1e-5)
    assert not within_tolerance(2.1e-3, 1.0e-3, tol_factor=2.0, floor=1e-5)
    assert within_tolerance(1e-5, 0.0)  # the floor keeps exact baselines from demanding exactness
    assert within_tolerance(5e-3, 1e-6, rtol=1e-2) and not within_tolerance(5e-3, 1.0, rtol=1e-3)
    assert not within_tolerance(math.nan, 1.0)
    assert tolerance_limit(1e-3, 3.0, 1e-5) == pytest.approx(3.01e-3)
    assert tolerance_limit(1e-3, rtol=0.5) == 0.5


@pytest.mark.parametrize("statuses, code", [
    ([P, P, S], ExitCode.OK),
    ([P, F], ExitCode.TOLERANCE),
    ([E, F, P], ExitCode.ERROR),
    ([F, E, N], ExitCode.NONFINITE),
    ([S, S], ExitCode.NOTHING_RAN),
    ([], ExitCode.NOTHING_RAN),
])
def test_the_most_severe_code_wins(statuses, code):
    assert exit_code(statuses) == code


def test_fail_on_chooses_what_may_fail():
    mixed = [N, E, F, P]
    assert exit_code(mixed, ["tolerance"]) == ExitCode.TOLERANCE
    assert exit_code(mixed, ["error", "tolerance"]) == ExitCode.ERROR
    assert exit_code([F], ["nonfinite", "error"]) == ExitCode.OK
    assert exit_code([S], ["nonfinite"]) == ExitCode.NOTHING_RAN


def test_summary_counts_every_status():
    assert summarize([P, P, S]) == {"pass": 2, "fail": 0, "nonfinite": 0, "error": 0, "skipped": 1}
