"""The regression gate: what changed between two JSON reports of the same command.

Cases are matched by `id`. Findings, for cases in both reports unless said otherwise:

- new failure: failing (fail, nonfinite, error) in the new report and not in the old one:
  passing or skipped before, or a case only the new report has;
- fixed: failing in the old report, passing in the new one;
- ratio growth: passing in both, and the worst ratio (scan: `error.ratio` and
  `error.state_ratio`; drift: `ratio`) grew by more than `max_growth` (see `_growth`);
- no longer run: run in the old report (any status but skipped), skipped in the new one;
- removed, added: cases only one of the reports has.

A new failure or a ratio growth is a regression (exit code 1); the rest are information.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ssmcheck.core.render import headline
from ssmcheck.core.report import worst_ratio

FAILING = ("fail", "nonfinite", "error")
COMMANDS = ("scan", "drift")


@dataclass(frozen=True)
class StatusChange:
    id: str
    old: str | None  # the old report's status; None when the case is only in the new report
    new: str
    message: str  # the new report's message for the case (its first line)


@dataclass(frozen=True)
class Growth:
    id: str
    old: float
    new: float
    factor: float  # new / old; inf when old is 0 and new is not


@dataclass(frozen=True)
class Comparison:
    command: str
    max_growth: float
    compared: int  # cases in both reports
    new_failures: list[StatusChange]
    fixed: list[StatusChange]
    growth: list[Growth]
    not_run: list[StatusChange]  # run in the old report, skipped in the new one
    still_failing: list[str]
    removed: list[str]
    added: list[str]

    @property
    def regression(self) -> bool:
        return bool(self.new_failures or self.growth)

    @property
    def exit_code(self) -> int:
        return 1 if self.regression else 0


def compare_reports(old: dict, new: dict, max_growth: float = 1.5) -> Comparison:
    """Compare two `ssmcheck scan|drift --json` reports (parsed JSON).

    Raises ValueError (one line) for a dict that is not an ssmcheck report, reports of
    different commands, a case id repeated within a report, or `max_growth` below 1
    or NaN (inf turns the growth check off).
    """
    if not max_growth >= 1:
        raise ValueError(f"max growth must be a number >= 1, not {max_growth!r}")
    old_cases, new_cases = _cases("old", old), _cases("new", new)
    if old["command"] != new["command"]:
        raise ValueError(f"cannot compare a {old['command']} report with a {new['command']} report")
    command = new["command"]

    new_failures, fixed, growth, not_run, still_failing = [], [], [], [], []
    for case_id, case in new_cases.items():
        before = old_cases.get(case_id)
        was, now = before["status"] if before else None, case["status"]
        change = StatusChange(case_id, was, now, headline(case.get("message")))
        if now in FAILING and was in FAILING:
            still_failing.append(case_id)
        elif now in FAILING:
            new_failures.append(change)
        elif was in FAILING and now == "pass":
            fixed.append(change)
        elif was not in (None, "skipped") and now == "skipped":
            not_run.append(change)
        elif was == now == "pass":
            ratios = worst_ratio(before), worst_ratio(case)
            factor = _growth(*ratios)
            if factor is not None and factor > max_growth:
                growth.append(Growth(case_id, *ratios, factor))
    return Comparison(
        command=command, max_growth=max_growth, compared=len(old_cases.keys() & new_cases.keys()),
        new_failures=new_failures, fixed=fixed, growth=growth, not_run=not_run, still_failing=still_failing,
        removed=[i for i in old_cases if i not in new_cases], added=[i for i in new_cases if i not in old_cases],
    )


def _cases(which: str, report) -> dict[str, dict]:
    """The report's cases by id, after checking that it is an ssmcheck report."""
    if not isinstance(report, dict) or report.get("tool") != "ssmcheck":
        raise ValueError(f"the {which} report is not an ssmcheck report (no \"tool\": \"ssmcheck\")")
    if report.get("command") not in COMMANDS:
        raise ValueError(f"the {which} report's command is {report.get('command')!r}, not scan or drift")
    cases = report.get("cases")
    if not isinstance(cases, list) or not all(isinstance(c, dict) and "id" in c and "status" in c for c in cases):
        raise ValueError(f"the {which} report's cases are not a list of cases with an id and a status")
    by_id = {}
    for case in cases:
        if case["id"] in by_id:
            raise ValueError(f"the {which} report has case {case['id']!r} twice")
        by_id[case["id"]] = case
    return by_id


def _growth(old: float | None, new: float | None) -> float | None:
    """How many times the ratio grew, or None when it cannot be compared (either is missing or NaN).

    Equal ratios (0 and 0, inf and inf) did not grow; from 0 to anything above is unbounded
    growth (a case that was exact no longer is); from inf anything finite shrank.
    """
    if old is None or new is None or math.isnan(old) or math.isnan(new):
        return None
    if old == new:
        return 1.0
    if old == 0:
        return math.inf
    return new / old  # 0 when old is inf; inf when new is


def text_lines(comparison: Comparison) -> list[str]:
    """One line per finding, regressions first, then a summary line."""
    c = comparison
    lines = [f"new failure: {x.id}: {x.old or 'new case'} -> {x.new}" + _message(x) for x in c.new_failures]
    lines += [
        f"ratio growth: {g.id}: {_figure(g.old)} -> {_figure(g.new)} ({_figure(g.factor)}x > {_figure(c.max_growth)}x)"
        for g in c.growth
    ]
    lines += [f"fixed: {x.id}: {x.old} -> {x.new}" for x in c.fixed]
    lines += [f"no longer run: {x.id}: {x.old} -> skipped" + _message(x) for x in c.not_run]
    lines += [f"removed: {i}" for i in c.removed]
    lines += [f"added: {i}" for i in c.added]
    verdict = "regression, exit code 1" if c.regression else "no regression, exit code 0"
    lines.append(
        f"compared {c.compared} {c.command} cases: new failures {len(c.new_failures)}, "
        f"ratio growths > {_figure(c.max_growth)}x {len(c.growth)}, fixed {len(c.fixed)}, "
        f"still failing {len(c.still_failing)}, no longer run {len(c.not_run)}, removed {len(c.removed)}, "
        f"added {len(c.added)}; {verdict}"
    )
    return lines


def _message(change: StatusChange) -> str:
    return f" ({change.message})" if change.message else ""


def _figure(value: float) -> str:
    return f"{value:.3g}"
