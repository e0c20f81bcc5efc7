"""drift.ahead: the rehearsals a compiling helper runs for a drift sweep (the helpers themselves: test_precompile)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import replace

import pytest
import torch

from ssmcheck import api
from ssmcheck.core.precompile import Launches
from ssmcheck.drift import ahead, lockstep
from ssmcheck.drift import follow as follow_module


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


def _cases(plan, *ids):
    by_id = {c.id: c for c in plan.cases}
    return [by_id[i] for i in ids]


@pytest.fixture(scope="module")
def default_plan():
    return api.plan_drift("builtin", "default", device="cpu")


def test_cases_that_differ_only_in_their_values_share_a_group_and_any_layout_or_flag_parts_them(default_plan):
    same = _cases(default_plan, "normal-fp16-nearest-b1-h1x16n128g1", "stagnation-fp16-nearest-b1-h1x16n128g1",
                  "long-fp16-nearest-b1-h1x16n128g1", "dt-extreme-fp16-nearest-b1-h1x16n128g1",
                  "subnormal-fp16-nearest-b1-h1x16n128g1")
    assert len({ahead.compile_group(c) for c in same}) == 1
    first = same[0]
    others = [
        replace(first, rounding="stochastic"),
        replace(first, state_dtype="bf16"),
        replace(first, batch=2),
        replace(first, headdim=24),
        replace(first, config='{"function": "f", "index": 1}'),
        replace(first, kernel="other:kernel"),
        *_cases(default_plan, "no-softplus-fp16-nearest-b1-h1x16n128g1",  # dt_softplus off
                "bf16-inputs-fp16-nearest-b1-h1x16n128g1",  # the step inputs' dtype
                "strided-fp16-nearest-b2-h2x16n128g1",  # views into one buffer per step
                "untied-fp16-nearest-b2-h1x16n128g1"),  # per-channel parameters and a gate
    ]
    groups = [ahead.compile_group(c) for c in [first, *others]]
    assert len(set(groups)) == len(groups)
    assert ahead.compile_group(replace(others[-2], batch=3)) != groups[-2]  # the batch, though drawn at 2 rows


def test_skipped_cases_share_one_group_and_draw_no_problem(monkeypatch, default_plan):
    def refuses(*args):
        raise AssertionError("drawn")

    ahead.compile_group.cache_clear()
    monkeypatch.setattr(ahead, "make_problem", refuses)
    skipped = [replace(c, skip_reason="not offered") for c in default_plan.cases[:3]]
    assert len({ahead.compile_group(c) for c in skipped}) == 1
    with pytest.raises(AssertionError, match="drawn"):
        ahead.compile_group(default_plan.cases[0])


def test_a_cases_group_is_drawn_once_per_process(monkeypatch, default_plan):
    """A GPU sweep's start asks for every case's group two or three times over: the problem is drawn once."""
    ahead.compile_group.cache_clear()
    case = default_plan.cases[0]
    group = ahead.compile_group(case)
    monkeypatch.setattr(ahead, "make_problem", lambda *args: pytest.fail("drawn again"))
    assert ahead.compile_group(case) == group
    assert ahead.compile_group(replace(case)) == group  # an equal case, as a worker unpickles it


def test_a_large_cases_group_is_drawn_at_two_batch_rows(default_plan):
    case = replace(default_plan.cases[0], model="mamba2-2.7b", batch=256, nheads=80, headdim=64, dstate=128)
    start = time.perf_counter()
    group = ahead.compile_group(case)
    assert time.perf_counter() - start < 5.0  # the whole state: 168M elements
    assert group[3] == 256 and group[7][1] == (ahead.GROUP_BATCH, 80, 64, 128)
    assert group != ahead.compile_group(replace(case, batch=255))


def test_a_case_traces_a_new_float64_step_exactly_where_its_group_is_new(monkeypatch, default_plan):
    """The group is what the float64 step compiles on: run on the CPU with the step traced by dynamo (its eager
    backend: no code generated), a case adds a graph where its group is new, and only there."""
    graphs = []

    def counting(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    torch._dynamo.reset()
    traced = follow_module.unlimited(torch.compile(follow_module.follow, fullgraph=True, dynamic=False,
                                                   backend=counting))
    monkeypatch.setattr(follow_module, "_fast_steps", lambda: [("torch.compile", lambda: traced)])
    monkeypatch.setattr(lockstep, "Follower", lambda device: follow_module.Follower("cuda"))  # compiled anywhere
    cases = _cases(default_plan, "normal-fp16-nearest-b1-h1x16n128g1", "stagnation-fp16-nearest-b1-h1x16n128g1",
                   "normal-fp16-stochastic-b1-h1x16n128g1", "overflow-fp16-stochastic-b1-h1x16n128g1",
                   "normal-bf16-nearest-b1-h1x16n128g1", "bf16-inputs-fp16-nearest-b1-h1x16n128g1",
                   "no-softplus-fp16-nearest-b1-h1x16n128g1", "dt-extreme-fp16-nearest-b1-h1x16n128g1",
                   "strided-fp16-nearest-b2-h2x16n128g1", "subnormal-fp16-nearest-b1-h1x16n128g1")
    seen, traced_where, new_where = set(), [], []
    try:
        for case in cases:
            before = len(graphs)
            result = default_plan.runner(replace(case, steps=3, trials=1), lambda: None)
            assert result.status.value == "pass", result.verdict.message
            group = ahead.compile_group(case)
            traced_where.append(len(graphs) > before)
            new_where.append(group not in seen)
            seen.add(group)
    finally:
        torch._dynamo.reset()
    assert traced_where == new_where == [True, False, True, False, True, True, True, False, True, False]
