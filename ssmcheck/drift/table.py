"""Rendering drift results for people: the header, the Rich table, the rounding comparisons and notes."""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ssmcheck.core.render import STYLES, format_error, sparkline
from ssmcheck.core.report import environment_line
from ssmcheck.core.runtime import Environment
from ssmcheck.core.status import Status
from ssmcheck.core.tolerance import tolerance_rule
from ssmcheck.drift.results import DriftResult
from ssmcheck.drift.spec import DriftSettings


def header(env: Environment, kernel: str, settings: DriftSettings) -> str:
    return (
        f"{environment_line('drift', env)}\n"
        f"kernel {kernel} | steps {settings.steps} | trials {settings.trials} | "
        f"tolerance {tolerance_rule(settings.tolerance)} | seed {settings.seed} | fail on {','.join(settings.fail_on)}"
    )


def _optional(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _crossing(result: DriftResult) -> str:
    v = result.verdict
    if result.run is None:
        return ""
    if v.crossing_step is None:
        return "never"
    return f"{v.crossing_step}" if v.crossing_observed else f"~{v.crossing_step:.1e}"


def results_table(results: list[DriftResult]) -> Table:
    table = Table(header_style="bold", pad_edge=False)
    for name, justify in (("regime", "left"), ("state", "left"), ("rounding", "left"), ("batch", "right"),
                          ("HxPxN/G", "left"), ("steps", "right"), ("status", "left"), ("drift", "right"),
                          ("baseline", "right"), ("ratio", "right"), ("α", "right"), ("bias z", "right"),
                          ("crosses tol", "right"), ("drift curve", "left"), ("time", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    for r in results:
        c, v, run = r.case, r.verdict, r.run
        widths = c.model or f"{c.nheads}x{c.headdim}x{c.dstate}/{c.ngroups}"
        table.add_row(
            c.regime, c.state_dtype, c.rounding, str(c.batch), widths, str(c.steps),
            Text(r.status.value, style=STYLES[r.status]),
            format_error(run.checkpoints[-1].state_rel) if run else "-",
            format_error(run.baseline[-1].state_rel) if run else "-",
            _optional(v.ratio, ".2f"), _optional(v.growth_exponent, ".2f"), _optional(v.bias_z, ".1f"),
            _crossing(r), sparkline([p.state_rel for p in run.checkpoints]) if run else "",
            f"{r.seconds:.1f}s" if r.status is not Status.SKIPPED else "",
        )
    return table


def rounding_comparisons(results: list[DriftResult]) -> list[str]:
    """Per configuration run in both rounding modes: how much less (or more) SR drifts at the last step."""
    by_config: dict[str, dict[str, DriftResult]] = {}
    for r in results:
        if r.run is not None and r.run.first_nonfinite is None:
            by_config.setdefault(r.case.configuration, {})[r.case.rounding] = r
    lines = []
    for config, modes in by_config.items():
        if set(modes) != {"nearest", "stochastic"}:
            continue
        nearest, stochastic = modes["nearest"].run.checkpoints[-1], modes["stochastic"].run.checkpoints[-1]
        if stochastic.state_rel > 0 and nearest.state_rel >= stochastic.state_rel:
            factor = f"{nearest.state_rel / stochastic.state_rel:.1f}× less drift"
        elif nearest.state_rel > 0:
            factor = f"{stochastic.state_rel / nearest.state_rel:.1f}× more drift"
        else:
            continue  # neither drifted at all
        lines.append(
            f"{config}: stochastic rounding: {factor} at step {stochastic.step} "
            f"({format_error(nearest.state_rel)} nearest, {format_error(stochastic.state_rel)} stochastic)"
        )
    return lines


def notes(results: list[DriftResult]) -> list[str]:
    """One line per failing, non-finite or erroring case, then skip reasons with their counts."""
    lines = [f"{r.status.value}: {r.case.id}: {r.verdict.message}" for r in results
             if r.status in (Status.FAIL, Status.NONFINITE, Status.ERROR)]
    skipped = Counter(r.verdict.message for r in results if r.status is Status.SKIPPED)
    lines += [f"skipped ({n}): {reason}" for reason, n in skipped.items()]
    return lines


def render(console: Console, results: list[DriftResult]) -> None:
    console.print(results_table(results))
    for line in rounding_comparisons(results) + notes(results):
        console.print(line, markup=False, highlight=False)
