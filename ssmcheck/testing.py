"""Assertions for a kernel author's own tests, in the manner of `torch.testing.assert_close`.

    from ssmcheck.testing import assert_stable

    def test_my_kernel_is_stable():
        assert_stable("my_kernels:chunk_scan", preset="smoke", regime=["normal", "ragged"])
"""

from __future__ import annotations

from collections.abc import Callable

from ssmcheck import api
from ssmcheck.core.report import environment_line
from ssmcheck.core.runtime import Environment
from ssmcheck.core.status import FAIL_ON

# The statuses that make a case unstable, most severe first (the exit code's order), for the headline.
UNSTABLE = ("nonfinite", "error", "fail")


def assert_stable(kernel: str | Callable, preset: str | None = "smoke", command: str = "scan", **options) -> api.Report:
    """Run the `command` ("scan" or "drift") sweep of `kernel` and return its Report when no case is
    unstable; else raise AssertionError listing the unstable cases:

        ssmcheck scan: 1 of 7 cases are not stable (1 nonfinite)
          ragged-bf16-c16-L40-b2-h2x8n8g1: nonfinite: y non-finite from sequence 0 token 0 (chunk 0) ...
        ssmcheck 0.1.0 scan | device cpu (Triton interpreter) | torch ... | triton ... | python ...

    A case is unstable when its status is one the sweep's `fail_on` gates (default: nonfinite,
    error, fail). A sweep in which no case ran (all skipped) fails too: it showed nothing.
    `options` are `ssmcheck.api.scan`'s / `drift`'s keywords (`device`, `regime`, `tol_factor`, ...);
    a bad one raises `ssmcheck.UsageError`.
    """
    __tracebackhide__ = True  # pytest shows the caller's line, as for a failed assert
    runs = {"scan": api.scan, "drift": api.drift}
    if command not in runs:
        raise api.UsageError(f"command: invalid value {command!r} (choose from {', '.join(runs)})")
    report = runs[command](kernel, preset, **options)
    gated = {FAIL_ON[category].value for category in report.data["settings"]["fail_on"]}
    unstable = [c for c in report.cases if c.status in gated]
    if unstable:
        raise AssertionError(_message(report, unstable, _headline(report, unstable)))
    if all(c.status == "skipped" for c in report.cases):
        raise AssertionError(_message(report, report.cases, f"ssmcheck {command}: no case ran"))
    return report


def _headline(report: api.Report, unstable: list) -> str:
    counts = ", ".join(f"{n} {status}" for status in UNSTABLE if (n := sum(c.status == status for c in unstable)))
    return f"ssmcheck {report.command}: {len(unstable)} of {len(report.cases)} cases are not stable ({counts})"


def _message(report: api.Report, cases: list, headline: str) -> str:
    lines = [f"  {c.id}: {c.status}: {c.message}" for c in cases]
    return "\n".join([headline, *lines, environment_line(report.command, Environment(**report.data["environment"]))])
