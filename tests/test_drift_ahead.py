"""drift.ahead: the rehearsals a compiling helper runs for a drift sweep (the helpers themselves: test_precompile)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import pytest

from ssmcheck import api
from ssmcheck.core.precompile import Launches
from ssmcheck.drift import ahead


@pytest.fixture(scope="module")
def plan():
    return api.plan_drift("builtin", "smoke", device="cpu")


def _launching(monkeypatch, seconds: float | None):
    """drift.ahead's compile_only replaced by one whose launches the rehearsals report themselves: each
    rehearsal launches one kernel that takes `seconds` to compile (none where None)."""
    launches = Launches(supported=True)

    @contextmanager
    def compile_only(threads):
        yield launches

    monkeypatch.setattr(ahead, "compile_only", compile_only)
    rehearsed = []

    def run(case, advance):
        rehearsed.append(case)
        if seconds is not None:
            launches.count += 1
            launches.compilations.append(seconds)

    return rehearsed, run


def test_a_rehearsal_is_the_case_cut_to_two_steps_of_one_trial_without_a_prefill(plan):
    case = replace(plan.cases[1], from_prefill=64)
    short = ahead.rehearsal(case)
    assert (short.steps, short.trials, short.from_prefill) == (2, 1, 0) and case.trials == 2
    assert replace(short, steps=case.steps, trials=case.trials, from_prefill=64) == case


@pytest.mark.parametrize(("seconds", "rehearsed"), [(1.0, 8), (None, 8), (0.01, 4)])
def test_every_case_is_rehearsed_in_order_until_the_first_four_find_the_cache_warm(monkeypatch, plan, seconds,
                                                                                   rehearsed):
    cases = [*plan.cases, *plan.cases]  # 8
    made, run = _launching(monkeypatch, seconds)
    ahead.compile_ahead(run, cases, 2)
    assert made == [ahead.rehearsal(c) for c in cases[:rehearsed]]


def test_skipped_cases_are_not_rehearsed(monkeypatch, plan):
    cases = [replace(plan.cases[0], skip_reason="not offered"), *plan.cases[1:]]
    made, run = _launching(monkeypatch, 1.0)
    ahead.compile_ahead(run, cases, 2)
    assert made == [ahead.rehearsal(c) for c in cases[1:]]


def test_a_rehearsal_runs_the_case_short_and_the_cpu_compiles_nothing_ahead(plan):
    runner = plan.runner
    assert runner.precompile(plan.cases, 4) is None  # the interpreter compiles nothing
    case = next(c for c in plan.cases if c.rounding == "stochastic")
    result = runner(ahead.rehearsal(case), lambda: None)
    assert result.status.value == "pass" and result.run.trials == 1
    assert result.run.checkpoints[-1].step == ahead.REHEARSED_STEPS
