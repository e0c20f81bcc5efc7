"""Small text helpers the commands' tables share: status styles, error figures, sparklines."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ssmcheck.core.status import Status

SPARK_BARS = "▁▂▃▄▅▆▇█"
STYLES = {Status.PASS: "green", Status.FAIL: "red", Status.NONFINITE: "bold red", Status.ERROR: "magenta",
          Status.SKIPPED: "dim"}


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
