"""What the commands' tables share: status styles, error figures, sparklines, and a table that fits."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from rich.console import Console, JustifyMethod
from rich.table import Table
from rich.text import Text

from ssmcheck.core.status import Status

Row = TypeVar("Row")

SPARK_BARS = "▁▂▃▄▅▆▇█"
STYLES = {Status.PASS: "green", Status.FAIL: "red", Status.NONFINITE: "bold red", Status.ERROR: "magenta",
          Status.SKIPPED: "dim"}
# A case's own checks in a table cell (scan's invariance, drift's slots): the check's initial and one of these.
CHECK_MARKS = {Status.PASS: "✓", Status.FAIL: "✗", Status.NONFINITE: "NaN", Status.ERROR: "!", Status.SKIPPED: "–"}


def headline(message: str | None, limit: int = 300) -> str:
    """A case's message as one line, for logs and notes (JSON keeps it whole).

    A multi-line message keeps its first and its last line: a Triton CompilationError starts with
    the kernel's line number and ends with what went wrong ("... Mismatched type for
    prev_states_ptr ..."); the source lines between are left out."""
    lines = [line.strip() for line in str(message or "").strip().splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return line if len(line) <= limit else line[: limit - 3] + "..."


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


@dataclass(frozen=True)
class Column(Generic[Row]):
    """One column of a results table: its header, how a row fills it, and how much it matters.

    `rank` 0 is always shown; of the others, the highest rank is dropped first, and columns
    sharing a rank go together. A column with `stands_for` is shown only once the columns
    of that rank are dropped, summing them up (the case id for the parameter columns).
    """

    header: str
    cell: Callable[[Row], str | Text]
    rank: int
    justify: JustifyMethod = "left"
    stands_for: int | None = None


UNBOUNDED = 100_000  # a width to measure a table's natural (unsqueezed) width with


def fitted_table(console: Console, columns: Sequence[Column[Row]], rows: Sequence[Row]) -> Table:
    """The richest table that fits `console.width`, kept cells never abbreviated.

    Layouts are tried from all columns down to rank 0 alone, and the first whose natural width
    fits is taken: its cells get their full width. Only when even rank 0 is too wide (the last
    layout) does Rich narrow columns, widest first (the case id), and their cells then fold onto
    more lines: no cell is ever cut to "…".
    """
    cells = [[column.cell(row) for column in columns] for row in rows]
    for kept in _layouts(columns):
        table = _table([columns[i] for i in kept], [[line[i] for i in kept] for line in cells])
        if console.measure(table, options=console.options.update_width(UNBOUNDED)).maximum <= console.width:
            return table
    return table  # rank 0 alone, too wide: Rich folds its widest cells


def _layouts(columns: Sequence[Column]) -> Iterator[list[int]]:
    """The indices of the columns of each layout, richest first."""
    optional = sorted({c.rank for c in columns if c.rank > 0}, reverse=True)
    for n in range(len(optional) + 1):
        dropped = set(optional[:n])
        yield [i for i, c in enumerate(columns)
               if c.rank not in dropped and (c.stands_for is None or c.stands_for in dropped)]


def _table(columns: Sequence[Column], rows: Sequence[Sequence[str | Text]]) -> Table:
    table = Table(header_style="bold", pad_edge=False)
    for c in columns:
        table.add_column(c.header, justify=c.justify, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


def printed_lines(case_id: str, stdout: str) -> list[str]:
    """What a kernel printed during a case, shown under the table: a title line, then its lines indented."""
    if not stdout:
        return []
    return [f"stdout of {case_id}:"] + ["  " + line for line in stdout.rstrip("\n").splitlines()]
