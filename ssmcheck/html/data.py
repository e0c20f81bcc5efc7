"""The JSON report read back as the page needs it.

JSON has no NaN or Inf, so the report writes them as strings ("nan", "inf", "-inf"):
`number` turns them back into floats. Scan cases that failed or were non-finite carry an
error map; drift cases that differ only in their rounding mode form one configuration,
drawn side by side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ssmcheck.core.report import figure

COMMANDS = ("scan", "drift")
MAPPED = ("fail", "nonfinite")  # the statuses whose scan cases carry an "error_map"
# Most severe first, as the exit code ranks them (3 nonfinite, 4 error, 1 fail).
SEVERITY = ("nonfinite", "error", "fail", "pass", "skipped")
ROUNDINGS = ("nearest", "stochastic")
# One palette for the page's status colours and the figures' lines.
STATUS_COLOURS = {"pass": "#2e7d32", "fail": "#e65100", "nonfinite": "#c2185b", "error": "#6a1b9a",
                  "skipped": "#757575"}
# Drift params that differ between the rounding modes of one configuration.
_PER_ROUNDING = ("rounding", "seed", "trials")


class NotAReport(ValueError):
    """The data is not an ssmcheck JSON report; the message says what is missing."""


def check_report(report) -> None:
    """Raise NotAReport unless `report` (parsed JSON) is a scan or drift report."""
    if not isinstance(report, dict) or report.get("tool") != "ssmcheck":
        raise NotAReport('not an ssmcheck report (no "tool": "ssmcheck")')
    if report.get("command") not in COMMANDS:
        raise NotAReport(f"not a scan or drift report (command {report.get('command')!r})")
    if not isinstance(report.get("cases"), list) or not isinstance(report.get("summary"), dict):
        raise NotAReport("not an ssmcheck report (no cases or no summary)")


def severity(status: str) -> int:
    return SEVERITY.index(status) if status in SEVERITY else len(SEVERITY)


def mapped_cases(report: dict) -> list[dict]:
    """The scan cases that get an error map, in report order."""
    return [c for c in report["cases"] if c["status"] in MAPPED] if report["command"] == "scan" else []


@dataclass(frozen=True)
class DriftConfiguration:
    name: str  # the case id without its rounding mode
    cases: list[dict]  # one per rounding mode, nearest first


def drift_configurations(cases: list[dict]) -> list[DriftConfiguration]:
    """The drift cases that have checkpoints, grouped by everything but the rounding mode."""
    groups: dict[tuple, list[dict]] = {}
    for case in cases:
        if case.get("checkpoints"):
            key = tuple(sorted((k, str(v)) for k, v in case["params"].items() if k not in _PER_ROUNDING))
            groups.setdefault(key, []).append(case)
    configurations = []
    for members in groups.values():
        members.sort(key=lambda c: _rounding_rank(c["params"]["rounding"]))
        first = members[0]
        name = first["id"].replace(f"-{first['params']['rounding']}", "", 1)
        configurations.append(DriftConfiguration(name, members))
    return configurations


def _rounding_rank(rounding: str) -> int:
    return ROUNDINGS.index(rounding) if rounding in ROUNDINGS else len(ROUNDINGS)


def rounding_gain(configuration: DriftConfiguration) -> tuple[int, float, float] | None:
    """(step, nearest's state error, stochastic's) at the last step both reached, when both are
    finite and positive: how much less stochastic rounding drifts."""
    last = {c["params"]["rounding"]: c["checkpoints"][-1] for c in configuration.cases}
    if set(ROUNDINGS) - set(last):
        return None
    rn, sr = (last[r] for r in ROUNDINGS)
    errors = figure(rn["state_rel"]), figure(sr["state_rel"])
    if rn["step"] != sr["step"] or not all(math.isfinite(e) and e > 0 for e in errors):
        return None
    return rn["step"], *errors
