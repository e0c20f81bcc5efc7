"""Drawing the next drift case's first window of step inputs while a case runs (drift.prefetch)."""

from dataclasses import replace

import pytest
import torch

from ssmcheck import api
from ssmcheck.drift import lockstep, prefetch
from ssmcheck.drift.regimes import STEP_BLOCK, make_problem
from ssmcheck.drift.spec import build_cases, resolve


def _cases(**options):
    settings_ = resolve({"nheads": "2", "headdim": "8", "dstate": "16", "batch": "2", "rounding": "nearest",
                         "state_dtype": "fp16", **options}, {}, "test")
    return build_cases(settings_, "torch")


def _window(case, drawn=None):
    problem = make_problem(case.regime, case.shape(), case.dtype, case.steps, case.seed, "cpu")
    window = lockstep.StepWindow(problem, drawn)
    window.load(1)
    return window


@pytest.mark.parametrize("regime", ["normal", "untied", "strided", "dt-bias-none"])  # packed, fused, C apart
def test_a_window_of_blocks_drawn_ahead_holds_the_streams_values(regime):
    [case] = _cases(regime=regime, steps=3 * STEP_BLOCK + 5, seed=11)
    prefetch.start(case)
    drawn = prefetch.taken(case)
    assert sorted(drawn) == [0, 1, 2, 3]  # the whole run fits one window: every block drawn ahead
    ahead, fresh = _window(case, drawn), _window(case)
    assert (ahead.start, ahead.count) == (fresh.start, fresh.count) == (0, case.steps)
    for step in (1, 2, STEP_BLOCK + 1, case.steps):
        ahead.load(step)
        fresh.load(step)
        for (name, mine), (_, theirs) in zip(ahead.inputs().given(), fresh.inputs().given(), strict=True):
            assert torch.equal(mine, theirs), (name, step)
    assert prefetch.taken(case) == {}  # taken once


def test_cases_never_taken_are_dropped_past_the_pending_limit():
    cases = _cases(regime="normal", steps=8, seed=1, batch="1,2,3,4")
    for case in cases:
        prefetch.start(case)
    assert [prefetch.taken(case) == {} for case in cases] == [True] * (len(cases) - prefetch.PENDING) + [False] * 2


def test_a_skipped_case_or_one_from_a_prefill_draws_nothing_ahead():
    [case] = _cases(regime="normal", steps=8)
    for other in (replace(case, skip_reason="skipped"), replace(case, from_prefill=16)):
        prefetch.start(other)
        assert prefetch.taken(other) == {}


def test_the_sweep_prepares_each_next_case_before_it_runs_one(monkeypatch):
    plan = api.plan_drift("torch", device="cpu", regime="normal", steps=4, trials=1, batch="1", nheads="1",
                          headdim="8", dstate="16", state_dtype="fp16,bf16", rounding="nearest,stochastic")
    said = []
    monkeypatch.setattr(prefetch, "start", lambda case: said.append(("prepare", case.id)))
    runner = plan.runner

    class Told:
        prepare = staticmethod(type(runner).prepare)

        def __call__(self, case, advance):
            said.append(("run", case.id))
            return runner(case, advance)

    report = api.run(replace(plan, runner=Told()))
    ids = [case.id for case in plan.cases]
    assert len(ids) == 4 and report.data["summary"]["pass"] == 4
    expected = [event for i, case_id in enumerate(ids)
                for event in ([("prepare", ids[i + 1])] if i + 1 < len(ids) else []) + [("run", case_id)]]
    assert said == expected
