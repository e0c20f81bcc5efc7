"""Rendering scan results for people: the header, the Rich table and notes (the summary line is report's)."""

from __future__ import annotations

import math
from collections import Counter

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ssmcheck.core.render import STYLES, format_error, sparkline
from ssmcheck.core.report import environment_line
from ssmcheck.core.runtime import Environment
from ssmcheck.core.status import Status
from ssmcheck.core.tolerance import tolerance_rule
from ssmcheck.scan.results import ScanResult
from ssmcheck.scan.spec import ScanSettings


def header(env: Environment, kernel: str, settings: ScanSettings) -> str:
    return (
        f"{environment_line('scan', env)}\n"
        f"kernel {kernel} | reference {settings.reference} | tolerance {tolerance_rule(settings.tolerance)} | "
        f"seed {settings.seed} | fail on {','.join(settings.fail_on)}"
    )


def _location(result: ScanResult) -> str:
    where = result.first_nonfinite
    if where is None:
        return ""
    if where.output == "y":
        text = f"s{where.sequence} t{where.token} c{where.chunk} h{where.head} p{where.channel}"
    else:
        text = f"state s{where.sequence} h{where.head} p{where.channel} n{where.state_index}"
    return text + ("" if where.inputs_finite else " (inputs!)")


ROUNDING_TAGS = {"nearest": "RN", "stochastic": "SR"}
SPARK_WIDTH = 16  # longer drift curves are shown as the max over bins


def _binned(values: list[float], width: int = SPARK_WIDTH) -> list[float]:
    if len(values) <= width:
        return values
    edges = [round(i * len(values) / width) for i in range(width + 1)]
    # max() would drop a NaN (NaN compares false), so a bin with a non-finite value shows it.
    return [next((v for v in values[a:b] if not math.isfinite(v)), None) or max(values[a:b])
            for a, b in zip(edges, edges[1:])]


def _drift(result: ScanResult) -> str:
    if not result.per_chunk:
        return ""
    growth = "" if result.growth is None else f" x{result.growth:.2g}"
    return sparkline(_binned(result.per_chunk)) + growth


def results_table(results: list[ScanResult]) -> Table:
    table = Table(show_lines=False, header_style="bold", pad_edge=False)
    for name, justify in (("regime", "left"), ("dtype", "left"), ("chunk", "right"), ("seqlen", "right"),
                          ("batch", "right"), ("HxPxN/G", "left"), ("state", "left"), ("status", "left"),
                          ("y err", "right"), ("state err", "right"), ("ratio", "right"),
                          ("first non-finite", "left"), ("drift per chunk", "left"), ("time", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    for r in results:
        c = r.case
        widths = c.model or f"{c.nheads}x{c.headdim}x{c.dstate}/{c.ngroups}"
        state = "" if (c.state_dtype, c.rounding) == ("fp32", "nearest") else f"{c.state_dtype} {ROUNDING_TAGS[c.rounding]}"
        ratio = "" if r.ratio is None else f"{max(r.ratio, r.state_ratio):.2f}"
        table.add_row(
            c.regime, c.dtype, str(c.chunk_size), str(c.seqlen), str(c.batch), widths, state,
            Text(r.status.value, style=STYLES[r.status]),
            format_error(r.kernel.y.rel) if r.kernel else "-",
            format_error(r.kernel.states.rel) if r.kernel else "-",
            ratio, _location(r), _drift(r), f"{r.seconds:.2f}s" if r.status is not Status.SKIPPED else "",
        )
    return table


def _first_line(text: str, limit: int = 300) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def notes(results: list[ScanResult]) -> list[str]:
    """One line per failing, non-finite or erroring case, then skip reasons with their counts."""
    lines = [f"{r.status.value}: {r.case.id}: {_first_line(r.message)}" for r in results
             if r.status in (Status.FAIL, Status.NONFINITE, Status.ERROR)]
    skipped = Counter(r.message for r in results if r.status is Status.SKIPPED)
    lines += [f"skipped ({n}): {reason}" for reason, n in skipped.items()]
    return lines


def render(console: Console, results: list[ScanResult]) -> None:
    console.print(results_table(results))
    for line in notes(results):
        console.print(line, markup=False, highlight=False)
