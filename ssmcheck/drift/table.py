"""Rendering drift results for people: the header, the Rich table, the rounding comparisons and notes."""

from __future__ import annotations

from collections import Counter

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
from ssmcheck.drift.results import DriftResult
from ssmcheck.drift.spec import DriftSettings
from ssmcheck.drift.stats import BIAS_FLOOR_ULP, BIAS_Z_LIMIT


def header(env: Environment, kernel: str, settings: DriftSettings, autotuned: list[str] = ()) -> str:
    """The environment and settings; with autotuned functions, which configs run."""
    text = (
        f"{environment_line('drift', env)}\n"
        f"kernel {kernel} | steps {settings.steps} | trials {settings.trials} | "
        f"tolerance {tolerance_rule(settings.tolerance)} | seed {settings.seed} | fail on {','.join(settings.fail_on)}"
    )
    configs = autotune.header_line(settings.configs, list(autotuned), env.interpreter)
    return text + (f"\n{configs}" if configs else "")


def _optional(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _crossing(result: DriftResult) -> str:
    v = result.verdict
    if result.run is None:
        return ""
    if v.crossing_step is None:
        return "never"
    return f"{v.crossing_step}" if v.crossing_observed else f"~{v.crossing_step:.1e}"


def _widths(result: DriftResult) -> str:
    c = result.case
    return c.model or f"{c.nheads}x{c.headdim}x{c.dstate}/{c.ngroups}"


def _drift(result: DriftResult) -> str:
    return format_error(result.run.checkpoints[-1].state_rel) if result.run else "-"


def _baseline(result: DriftResult) -> str:
    return format_error(result.run.baseline[-1].state_rel) if result.run else "-"


def _curve(result: DriftResult) -> str:
    return sparkline([p.state_rel for p in result.run.checkpoints]) if result.run else ""


# A slot check shows as its name's initial, but the far twin of drafts, whose initial far_slot has, and the trial
# without slot indices, whose initial untouched has.
INITIALS = {"far_drafts": "F", "unslotted": "U"}


def _slots(result: DriftResult) -> str:
    """Each slot check's initial and outcome: `l✓ u✗ p✓` (live, untouched, pad_out; drift.slots), `d`, `k` (drafts,
    kept; drift.speculative), `f`, `F` (far_slot, far_drafts, on a GPU; drift.far_slots), `U` (unslotted: the short
    trial without slot indices of a case whose trials all decoded through them; drift.run)."""
    return " ".join(f"{INITIALS.get(c.name, c.name[0])}{CHECK_MARKS[c.status]}" for c in result.slots)


def _time(result: DriftResult) -> str:
    return f"{result.seconds:.1f}s" if result.status is not Status.SKIPPED else ""


PARAMS = 8  # the rank of the parameter columns: dropped first, the case id then shows them
# In display order; rank is importance (0: always shown; the highest rank is dropped first).
COLUMNS: tuple[Column[DriftResult], ...] = (
    Column("id", lambda r: r.case.id, 0, stands_for=PARAMS),
    Column("regime", lambda r: r.case.regime, PARAMS),
    Column("state", lambda r: r.case.state_dtype, PARAMS),
    Column("rounding", lambda r: r.case.rounding, PARAMS),
    Column("batch", lambda r: str(r.case.batch), PARAMS, "right"),
    Column("HxPxN/G", _widths, PARAMS),
    Column("steps", lambda r: str(r.case.steps), PARAMS, "right"),
    Column("config", lambda r: autotune.config_label(r.case.config), PARAMS),
    Column("status", lambda r: Text(r.status.value, style=STYLES[r.status]), 0),
    Column("drift", _drift, 1, "right"),
    Column("baseline", _baseline, 2, "right"),
    Column("ratio", lambda r: _optional(r.verdict.ratio, ".2f"), 0, "right"),
    Column("α", lambda r: _optional(r.verdict.growth_exponent, ".2f"), 4, "right"),
    Column("bias z", lambda r: _optional(r.verdict.bias_z, ".1f"), 3, "right"),  # a verdict input (biased SR)
    Column("slots", _slots, 3),
    Column("crosses tol", _crossing, 5, "right"),
    Column("drift curve", _curve, 7),
    Column("time", _time, 6, "right"),
)


def results_table(console: Console, results: list[DriftResult]) -> Table:
    """The table for `console.width`: the least important columns dropped until it fits."""
    shown = {"config": any(r.case.config is not None for r in results), "slots": any(r.slots for r in results)}
    return fitted_table(console, [c for c in COLUMNS if shown.get(c.header, True)], results)


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


def case_line(result: DriftResult) -> str:
    """One finished case as a line, for a log to show progress in (a terminal has the progress bar)."""
    line = f"{result.status.value} {result.case.id}"
    if result.verdict.ratio is not None:
        line += f" ratio {result.verdict.ratio:.2f}"
    if result.status is not Status.SKIPPED:
        line += f" {_time(result)}"
    return line + (f": {headline(result.verdict.message)}" if result.status is not Status.PASS and result.verdict.message else "")


def notes(results: list[DriftResult]) -> list[str]:
    """One line per failing, non-finite or erroring case, skip reasons with their counts, the slot checks run on
    int32 slot indices after a refusal of int64, then what kernels printed, case by case."""
    lines = [f"{r.status.value}: {r.case.id}: {headline(r.verdict.message)}" for r in results
             if r.status in LISTED]
    skipped = Counter(r.verdict.message for r in results if r.status is Status.SKIPPED)
    lines += [f"skipped ({n}): {reason}" for reason, n in skipped.items()]
    lines += _coarse_bias_tests(results)
    # Slot checks whose ends layout ran on int32 slot indices after the kernel refused int64 (drift.slots).
    refused = [r.slot_layout["ends"]["refused"] for r in results
               if r.slot_layout and "refused" in r.slot_layout.get("ends", {})]
    if refused:
        lines.append(f"int32 slot indices ({len(refused)}): the slot check's ends layout ran on int32, the kernel "
                     f"having refused int64: {refused[0]}")
    lines += autotune.config_failures(results)
    for r in results:
        lines += printed_lines(r.case.id, r.stdout)
    return lines


def _coarse_bias_tests(results: list[DriftResult]) -> list[str]:
    """A line where passing stochastic cases could not see a bias as small as the floor the test fails."""
    coarse = [r.verdict.bias_resolution_ulp for r in results if r.status is Status.PASS
              and r.verdict.bias_resolution_ulp is not None and r.verdict.bias_resolution_ulp > BIAS_FLOOR_ULP]
    if not coarse:
        return []
    return [f"bias resolution: {len(coarse)} passing stochastic case{'s' if len(coarse) > 1 else ''} could show a "
            f"mean rounding error only from {min(coarse):.2g}-{max(coarse):.2g} ulp per store (|z| > {BIAS_Z_LIMIT:g} "
            f"at their stores), above the {BIAS_FLOOR_ULP:.2g} ulp the test fails: a smaller bias passes there "
            "unseen (more --steps or --trials see finer)"]


def render(console: Console, results: list[DriftResult], compare_rounding: bool = True) -> None:
    """The table and its notes; with `compare_rounding` (a kernel that implements both modes), how
    much less stochastic rounding drifts than rounding to nearest, per configuration."""
    console.print(results_table(console, results))
    for line in (rounding_comparisons(results) if compare_rounding else []) + notes(results):
        # One line each, whatever the width: the terminal wraps it, a log keeps it whole for grep.
        console.print(line, markup=False, highlight=False, soft_wrap=True)
