"""Reporting drift results: the header, the Rich table, the rounding comparisons, notes, and the JSON cases.

JSON case keys (always present; figures a case did not produce are null):
    id, status, message, seconds,
    params {kernel, state_dtype, rounding, regime, steps, batch, nheads, headdim, dstate, ngroups, model, seed, trials},
    checkpoints [{step, state_rel, out_rel, bias}]   kernel vs float64 reference, mean over trials,
    growth_exponent                                  alpha in state_rel ~ step**alpha,
    bias_z, store_bias_ulp                           z and mean of the per-store rounding error (ulps),
    baseline {checkpoints, growth_exponent}          the rounded float64 recurrence vs the reference,
    ratio                                            worst kernel / baseline state drift over checkpoints,
    crossing_step, crossing_observed                 where state_rel reaches the tolerance,
    first_nonfinite {output, step, trial, batch, head, channel, state_index}.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ssmcheck import report
from ssmcheck.drift import DriftResult
from ssmcheck.drift_spec import DriftSettings
from ssmcheck.report import STYLES, format_error, sparkline
from ssmcheck.runtime import Environment
from ssmcheck.verdict import Status


def header(env: Environment, kernel: str, settings: DriftSettings) -> str:
    return (
        f"{report.environment_line('drift', env)}\n"
        f"kernel {kernel} | steps {settings.steps} | trials {settings.trials} | "
        f"tolerance {report.tolerance_rule(settings.tolerance)} | seed {settings.seed} | fail on {','.join(settings.fail_on)}"
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


def case_json(result: DriftResult) -> dict:
    run, v = result.run, result.verdict
    return {
        "id": result.case.id,
        "status": result.status.value,
        "message": v.message,
        "seconds": round(result.seconds, 4),
        "params": result.case.params(),
        "checkpoints": [asdict(c) for c in run.checkpoints] if run else [],
        "growth_exponent": v.growth_exponent,
        "bias_z": v.bias_z,
        "store_bias_ulp": v.store_bias_ulp,
        "baseline": {
            "checkpoints": [asdict(c) for c in run.baseline],
            "growth_exponent": v.baseline_growth_exponent,
        } if run else None,
        "ratio": v.ratio,
        "crossing_step": v.crossing_step,
        "crossing_observed": v.crossing_observed,
        "first_nonfinite": asdict(run.first_nonfinite) if run and run.first_nonfinite else None,
    }
