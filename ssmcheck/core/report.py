"""The machine-readable report (JSON) and small text helpers shared by every command.

The JSON envelope is a stable contract:
    {"tool": "ssmcheck", "version", "command", "environment", "cases", "summary", "exit_code"}
Each command fills "cases" with plain dicts of its own (documented in README.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from ssmcheck import __version__
from ssmcheck.runtime import Environment
from ssmcheck.verdict import Status, Tolerance

SPARK_BARS = "▁▂▃▄▅▆▇█"
STYLES = {Status.PASS: "green", Status.FAIL: "red", Status.NONFINITE: "bold red", Status.ERROR: "magenta",
          Status.SKIPPED: "dim"}


def build_report(
    command: str,
    environment: Environment,
    cases: list[dict],
    summary: dict[str, int],
    exit_code: int,
) -> dict:
    return {
        "tool": "ssmcheck",
        "version": __version__,
        "command": command,
        "environment": environment.as_dict(),
        "cases": cases,
        "summary": summary,
        "exit_code": int(exit_code),
    }


def _json_safe(value):
    """JSON has no NaN/Inf: write them as the strings "nan", "inf", "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_json(path: Path | str, report: dict) -> None:
    Path(path).write_text(json.dumps(_json_safe(report), indent=2) + "\n")


def sparkline(values: Sequence[float], log: bool = True) -> str:
    """A unicode sparkline; log-scaled by default since errors span decades.

    Non-finite values show as '!', and zeros (or negatives, when log-scaled) as ' '.
    """
    if not values:
        return ""
    finite = [v for v in values if math.isfinite(v) and (v > 0 or not log)]
    if not finite:
        return "".join("!" if not math.isfinite(v) else " " for v in values)
    scale = (lambda v: math.log10(v)) if log else (lambda v: v)
    lo, hi = min(map(scale, finite)), max(map(scale, finite))
    out = []
    for v in values:
        if not math.isfinite(v):
            out.append("!")
        elif log and v <= 0:
            out.append(" ")
        else:
            level = 0 if hi == lo else round((scale(v) - lo) / (hi - lo) * (len(SPARK_BARS) - 1))
            out.append(SPARK_BARS[level])
    return "".join(out)


def format_error(value: float | None) -> str:
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.2e}"


def environment_line(command: str, env: Environment) -> str:
    """The first header line: version, command, device and library versions."""
    where = f"{env.device} ({'Triton interpreter' if env.interpreter else 'compiled'})"
    if env.gpu:
        where += f", {env.gpu}"
    return (
        f"ssmcheck {__version__} {command} | device {where} | torch {env.torch} | triton {env.triton} | "
        f"python {env.python}"
    )


def tolerance_rule(tolerance: Tolerance) -> str:
    if tolerance.rtol is not None:
        return f"rtol {tolerance.rtol:g}"
    return f"{tolerance.tol_factor:g} x baseline + {tolerance.floor:g}"


def summary_line(counts: dict[str, int], seconds: float, exit_code: int, prefix: str = "") -> str:
    parts = ", ".join(f"{n} {status}" for status, n in counts.items())
    return f"{prefix}{sum(counts.values())} cases: {parts} in {seconds:.1f}s; exit code {exit_code}"
