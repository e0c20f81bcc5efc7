"""The machine-readable report (JSON envelope) and the lines every command prints around its table.

The JSON envelope is a stable contract:
    {"tool": "ssmcheck", "version", "command", "environment", "cases", "summary", "exit_code",
     "interrupted", "interrupted_by"}
Each command fills "cases" with plain dicts of its own (its `json` module; documented in README.md).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ssmcheck import __version__
from ssmcheck.core.runtime import Environment


def build_report(
    command: str,
    environment: Environment,
    cases: list[dict],
    summary: dict[str, int],
    exit_code: int,
    interrupted: str | None = None,
) -> dict:
    """The envelope. `interrupted` names what stopped the sweep (SIGINT, SIGTERM, SIGPIPE): the
    report then holds only the cases that finished, and `exit_code` is the interruption's."""
    return {
        "tool": "ssmcheck",
        "version": __version__,
        "command": command,
        "environment": environment.as_dict(),
        "cases": cases,
        "summary": summary,
        "exit_code": int(exit_code),
        "interrupted": interrupted is not None,
        "interrupted_by": interrupted,
    }


def json_safe(value):
    """JSON has no NaN/Inf: write them as the strings "nan", "inf", "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write_json(path: Path | str, report: dict) -> None:
    Path(path).write_text(json.dumps(json_safe(report), indent=2) + "\n")


def environment_line(command: str, env: Environment) -> str:
    """The first header line: version, command, device and library versions."""
    where = f"{env.device} ({'Triton interpreter' if env.interpreter else 'compiled'})"
    if env.gpu:
        where += f", {env.gpu}"
    return (
        f"ssmcheck {__version__} {command} | device {where} | torch {env.torch} | triton {env.triton} | "
        f"python {env.python}"
    )


def summary_line(counts: dict[str, int], seconds: float, exit_code: int, prefix: str = "") -> str:
    parts = ", ".join(f"{n} {status}" for status, n in counts.items())
    return f"{prefix}{sum(counts.values())} cases: {parts} in {seconds:.1f}s; exit code {exit_code}"


def figure(value) -> float | None:
    """A figure read back from a JSON report, as a float: the strings "nan", "inf", "-inf" are how JSON
    carries those; None (not measured), and anything that is no number, is None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def worst_ratio(case: dict) -> float | None:
    """A JSON case's largest kernel/baseline error ratio: scan's `error.worst_ratio` (or, in reports
    written before it, the larger of `error.ratio` and `error.state_ratio`), drift's `ratio`. NaN when
    one is NaN, None when the case has none."""
    error = case.get("error")
    if isinstance(error, dict):
        keys = ("worst_ratio",) if error.get("worst_ratio") is not None else ("ratio", "state_ratio")
        values = [error.get(k) for k in keys]
    else:
        values = [case.get("ratio")]
    figures = [f for f in map(figure, values) if f is not None]
    if not figures:
        return None
    return math.nan if any(map(math.isnan, figures)) else max(figures)
