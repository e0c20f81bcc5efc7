"""Merging shard reports (`--shard K/N`) into the report of the whole sweep.

The merged report is the unsharded run's: its cases in the sweep's order (core.shard's rule read
backwards), its summary and exit code recomputed from them under the run's --fail-on, and no `shard`
field. Only the timings differ: `seconds` is the sum of the shards' (the sweep's time run serially), and so are
`compiled_ahead`'s.

Shards merge only when they belong together: the same command, version, environment and settings,
the same sweep (its size and digest), every slice once. An interrupted shard still merges: its
finished cases take their places, and the merged report is interrupted as that shard was.
"""

from __future__ import annotations

from ssmcheck.core.precompile import combined
from ssmcheck.core.shard import Shard, sweep_digest
from ssmcheck.core.status import FAIL_ON, exit_code, summarize

# What every shard of one sweep shares, as the report records it.
_SHARED = ("command", "version", "environment", "settings")
_SHARED_SHARD = ("count", "sweep_cases", "sweep_digest")


class MergeError(ValueError):
    """Reports that do not make one sweep; the message is one line that names the report."""


def merge_reports(reports: list[tuple[str, dict]]) -> dict:
    """The whole sweep's report from its shards' reports, each given as (label, report)."""
    if not reports:
        raise MergeError("no reports to merge")
    for label, report in reports:
        _check_is_shard(label, report)
    first_label, first = reports[0]
    for label, report in reports[1:]:
        for key in _SHARED:
            _check_same(f"{label} and {first_label}", key, report.get(key), first.get(key))
        for key in _SHARED_SHARD:
            _check_same(f"{label} and {first_label}", f"shard.{key}", report["shard"][key], first["shard"][key])
    by_index = _one_per_index(reports)
    total, count = first["shard"]["sweep_cases"], first["shard"]["count"]
    placed: dict[int, dict] = {}
    for index, (label, report) in sorted(by_index.items()):
        positions = Shard(index, count).positions(total)
        cases = report.get("cases", [])
        complete = not report.get("interrupted")
        if len(cases) > len(positions) or (complete and len(cases) != len(positions)):
            raise MergeError(f"{label}: holds {len(cases)} cases where shard {index}/{count} of a sweep of "
                             f"{total} has {len(positions)}")
        placed.update(zip(positions, cases, strict=False))  # an interrupted shard fills the first places
    merged_cases = [placed[i] for i in sorted(placed)]
    interrupted = [report for _, (_, report) in sorted(by_index.items()) if report.get("interrupted")]
    if not interrupted and sweep_digest([c["id"] for c in merged_cases]) != first["shard"]["sweep_digest"]:
        raise MergeError(f"{first_label}: the shards' cases are not the sweep their reports name "
                         "(sweep digest differs)")
    statuses = [c["status"] for c in merged_cases]
    fail_on = first.get("settings", {}).get("fail_on", list(FAIL_ON))
    merged = {key: value for key, value in first.items() if key != "shard"}
    merged.update(
        cases=merged_cases,
        summary=summarize(statuses),
        exit_code=interrupted[0]["exit_code"] if interrupted else int(exit_code(statuses, fail_on)),
        interrupted=bool(interrupted),
        interrupted_by=interrupted[0]["interrupted_by"] if interrupted else None,
    )
    if all("seconds" in report for _, report in reports):
        merged["seconds"] = sum(report["seconds"] for _, report in reports)
    if any("compiled_ahead" in report for _, report in reports):  # summed as `seconds` are
        merged["compiled_ahead"] = combined([report.get("compiled_ahead") for _, report in reports], sum)
    return merged


def _check_is_shard(label: str, report) -> None:
    if not isinstance(report, dict) or report.get("tool") != "ssmcheck":
        raise MergeError(f"{label}: not an ssmcheck report")
    if not isinstance(report.get("shard"), dict):
        raise MergeError(f"{label}: not a shard's report (written without --shard K/N)")


def _check_same(labels: str, key: str, value, expected) -> None:
    if value != expected:
        where = _first_difference(key, value, expected)
        raise MergeError(f"{labels} are not shards of one sweep: they differ in {where}")


def _first_difference(key: str, value, expected) -> str:
    """`key`, or the path to the first entry within it that differs, with both values."""
    if isinstance(value, dict) and isinstance(expected, dict):
        for sub in [*expected, *(k for k in value if k not in expected)]:
            if value.get(sub) != expected.get(sub):
                return _first_difference(f"{key}.{sub}", value.get(sub), expected.get(sub))
    return f"{key} ({value!r} vs {expected!r})"


def _one_per_index(reports: list[tuple[str, dict]]) -> dict[int, tuple[str, dict]]:
    """Shard index -> (label, report); overlapping or missing shards are a MergeError."""
    by_index: dict[int, tuple[str, dict]] = {}
    count = reports[0][1]["shard"]["count"]
    for label, report in reports:
        index = report["shard"]["index"]
        if index in by_index:
            raise MergeError(f"{label} and {by_index[index][0]} are both shard {index}/{count} (overlapping shards)")
        by_index[index] = (label, report)
    missing = [i for i in range(1, count + 1) if i not in by_index]
    if missing:
        given = ", ".join(f"{i}/{count}" for i in sorted(by_index))
        raise MergeError(f"missing shard{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(f'{i}/{count}' for i in missing)} (given: {given})")
    return by_index
