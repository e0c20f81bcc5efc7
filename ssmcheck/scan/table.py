"""Rendering scan results for people: the header, the Rich table and notes (the summary line is report's)."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ssmcheck.core import autotune
from ssmcheck.core.render import (
    CHECK_MARKS,
    STYLES,
    Column,
    fitted_table,
    format_error,
    headline,
    printed_lines,
    sparkline,
)
from ssmcheck.core.report import environment_line
from ssmcheck.core.runtime import Environment
from ssmcheck.core.status import LISTED, Status
from ssmcheck.core.tolerance import tolerance_rule
from ssmcheck.scan.inputs import REFUSED_INT64
from ssmcheck.scan.results import ScanResult
from ssmcheck.scan.spec import ScanSettings


def header(env: Environment, kernel: str, settings: ScanSettings, autotuned: list[str] = ()) -> str:
    """The environment and settings; with autotuned functions, which configs run."""
    text = (
        f"{environment_line('scan', env)}\n"
        f"kernel {kernel} | reference {settings.reference} | tolerance {tolerance_rule(settings.tolerance)} | "
        f"seed {settings.seed} | fail on {','.join(settings.fail_on)}"
        + (" | fp32 judged against TF32 matmuls (--allow-tf32)" if settings.allow_tf32 else "")
    )
    configs = autotune.header_line(settings.configs, list(autotuned), env.interpreter)
    if configs:
        text += f"\n{configs}"
    return text


def _location(result: ScanResult) -> str:
    where = result.first_nonfinite
    if where is None:
        return ""
    if where.output in ("y", "ssm_y"):
        text = f"s{where.sequence} t{where.token} c{where.chunk} h{where.head} p{where.channel}"
        text = text if where.output == "y" else f"C·h {text}"
    else:
        text = f"state s{where.sequence} h{where.head} p{where.channel} n{where.state_index}"
    if result.reads_outside:  # read from the fence past these inputs (core.outside)
        text += f" (past {', '.join(names[0] for names in result.reads_outside)})"
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


def _widths(result: ScanResult) -> str:
    c = result.case
    return c.model or f"{c.nheads}x{c.headdim}x{c.dstate}/{c.ngroups}"


def _state(result: ScanResult) -> str:
    """How the states were judged as stored: the case's format, or the one the kernel returned them in."""
    c = result.case
    storage = result.state_storage or c.state_dtype
    return "" if (storage, c.rounding) == ("fp32", "nearest") else f"{storage} {ROUNDING_TAGS[c.rounding]}"


def _ratio(result: ScanResult) -> str:
    return "" if result.worst_ratio is None else f"{result.worst_ratio:.2f}"


def _time(result: ScanResult) -> str:
    if result.status is Status.SKIPPED:
        return ""
    warm = f" +{result.warmup_seconds:.1f}s warm-up" if result.warmup_seconds else ""
    return f"{result.seconds:.2f}s{warm}"


def _invariance(result: ScanResult) -> str:
    """Each invariance check's initial and outcome: `b✓ s✗ p– c✓` (batch, split, prefill_decode, cache_write)."""
    return " ".join(f"{c.name[0]}{CHECK_MARKS[c.status]}" for c in result.invariance)


PARAMS = 6  # the rank of the parameter columns: dropped first, the case id then shows them
# In display order; rank is importance (0: always shown; the highest rank is dropped first).
COLUMNS: tuple[Column[ScanResult], ...] = (
    Column("id", lambda r: r.case.id, 0, stands_for=PARAMS),
    Column("regime", lambda r: r.case.regime, PARAMS),
    Column("dtype", lambda r: r.case.dtype, PARAMS),
    Column("chunk", lambda r: str(r.case.chunk_size), PARAMS, "right"),
    Column("seqlen", lambda r: str(r.case.seqlen), PARAMS, "right"),
    Column("batch", lambda r: str(r.case.batch), PARAMS, "right"),
    Column("HxPxN/G", _widths, PARAMS),
    Column("state", _state, PARAMS),
    Column("config", lambda r: autotune.config_label(r.case.config), PARAMS),
    Column("status", lambda r: Text(r.status.value, style=STYLES[r.status]), 0),
    Column("y err", lambda r: format_error(r.kernel.y.rel) if r.kernel else "-", 1, "right"),
    Column("state err", lambda r: format_error(r.kernel.states.rel) if r.kernel else "-", 2, "right"),
    Column("ratio", _ratio, 0, "right"),
    Column("invariance", _invariance, 3),
    Column("first non-finite", _location, 3),
    Column("drift per chunk", _drift, 5),
    Column("time", _time, 4, "right"),
)


def results_table(console: Console, results: list[ScanResult]) -> Table:
    """The table for `console.width`: the least important columns dropped until it fits."""
    shown = {"config": any(r.case.config is not None for r in results),
             "invariance": any(r.invariance for r in results)}
    return fitted_table(console, [c for c in COLUMNS if shown.get(c.header, True)], results)


def case_line(result: ScanResult) -> str:
    """One finished case as a line, for a log to show progress in (a terminal has the progress bar)."""
    line = f"{result.status.value} {result.case.id}"
    if result.ratio is not None:
        line += f" ratio {_ratio(result)}"
    if result.status is not Status.SKIPPED:
        line += f" {_time(result)}"
    return line + (f": {headline(result.message)}" if result.status is not Status.PASS and result.message else "")


def notes(results: list[ScanResult]) -> list[str]:
    """One line per failing, non-finite or erroring case (and one naming its reproducer, where --repro wrote one),
    skip reasons with their counts, the cases run on int32 indices after a refusal of int64, then what kernels
    printed, case by case."""
    lines = []
    for r in results:
        if r.status in LISTED:
            lines.append(f"{r.status.value}: {r.case.id}: {headline(r.message)}")
            if r.repro is not None:  # --repro: where the script that reproduces it lies
                lines.append(f"reproducer: {r.case.id}: {Path(r.repro) / 'repro.py'}")
    skipped = Counter(r.message for r in results if r.status is Status.SKIPPED)
    lines += [f"skipped ({n}): {reason}" for reason, n in skipped.items()]
    # Cases run on int32 indices after the kernel refused int64 (scan.run): counted, with the first one's refusal.
    narrowed = [r.inputs_note for r in results if REFUSED_INT64 in r.inputs_note]
    if narrowed:
        lines.append(f"int32 indices ({len(narrowed)}): {narrowed[0][narrowed[0].index(REFUSED_INT64):]}")
    lines += autotune.config_failures(results)
    for r in results:
        lines += printed_lines(r.case.id, r.stdout)
    return lines


def render(console: Console, results: list[ScanResult]) -> None:
    console.print(results_table(console, results))
    for line in notes(results):
        # One line each, whatever the width: the terminal wraps it, a log keeps it whole for grep.
        console.print(line, markup=False, highlight=False, soft_wrap=True)
