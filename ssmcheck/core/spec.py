"""One spec resolver and one case builder for every command, driven by the command's table of axes.

A command describes what it sweeps (`Axis`: how a value parses, which values
are allowed, the default list) and what it merely sets (`Setting`: how a value
parses, its default). `resolve` reads the command line (None where not given)
over the preset's table the same way for every command:

- an axis or setting given on the command line replaces the preset's;
- anything neither names takes its default;
- `[CMD.overrides.REGIME]` tables replace axes for one regime; an array of
  such tables runs the union of several sub-sweeps. An axis given on the
  command line wins over every override, and the second and later sub-sweeps
  of a regime are dropped as soon as a shape axis (any but SELECTING) is given
  on the command line, so that an explicit shape runs what it names. The
  selecting axes pick among values without naming a shape: --regime picks
  regimes (`--regime a` and `--regime b` run what `--regime a,b` does), and
  --dtype, --state-dtype and --rounding set their value in every sub-sweep,
  which all still run (`drift --rounding stochastic`, the declaration a kernel
  without a rounding keyword needs, keeps the preset's coverage of widths);
- `--model` replaces the width axes (naming both is a usage error).

`combinations` then lists the sweep's parameter dicts in a fixed order: regime
by regime, sub-sweep by sub-sweep, then the cartesian product of the other axes
in the table's order, a model's widths filled in where its axis stands.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ssmcheck.core import models, sweep
from ssmcheck.core.models import WIDTHS, ModelWidths
from ssmcheck.core.sweep import SweepError, option_name

# Axes that choose among values the preset's cases take, not the shape of a case (see the module's docstring).
SELECTING = frozenset({"regime", "dtype", "state_dtype", "rounding"})


@dataclass(frozen=True)
class Axis:
    convert: Callable[[str], object]  # one comma-separated item -> value (ValueError when invalid)
    allowed: tuple | None  # the values it may take (None: any the converter accepts)
    default: tuple  # used when neither the command line nor the preset names the axis


@dataclass(frozen=True)
class Setting:
    parse: Callable[[str, object], object]  # (label for messages, raw value) -> value; SweepError when invalid
    default: object


@dataclass(frozen=True)
class CommandTable:
    command: str  # the preset table's name: "scan", "drift"
    axes: dict[str, Axis]  # in the order cases are listed (the last varies fastest)
    settings: dict[str, Setting]


@dataclass(frozen=True)
class Spec:
    axes: dict[str, list]  # every axis of the table
    overrides: dict[str, list[dict[str, list]]]  # regime -> sub-sweeps, each the axes it replaces
    settings: dict[str, object]  # every setting of the table, parsed
    cli_axes: frozenset[str]  # the axes the command line named


def resolve(table: CommandTable, cli: dict, preset: dict, preset_name: str) -> Spec:
    """Merge command-line values (None where not given) over the preset's table. Raises SweepError."""
    where = f"--preset {preset_name}"
    unknown = set(preset) - set(table.axes) - set(table.settings) - {"overrides"}
    if unknown:
        raise SweepError(f"{where}: unknown key {min(unknown)!r} in [{table.command}]")

    def pick(key, default):
        """(label for messages, value) from the command line, else the preset, else the default."""
        if cli.get(key) is not None:
            return option_name(key), cli[key]
        if key in preset:
            return f"{where}: {key}", preset[key]
        return option_name(key), default

    axes = {}
    for key, axis in table.axes.items():
        label, value = pick(key, list(axis.default))
        axes[key] = sweep.parse_axis(label, value, axis.convert, axis.allowed) if value != [] else []
    cli_axes = frozenset(key for key in table.axes if cli.get(key) is not None)

    overrides = _overrides(table, preset.get("overrides", {}), cli, where)
    if cli_axes - SELECTING:
        overrides = {regime: tables[:1] for regime, tables in overrides.items()}

    if axes.get("model"):
        given = [option_name(w) for w in WIDTHS if cli.get(w) is not None]
        if given:
            raise SweepError(f"--model sets the widths: drop {given[0]}")
        for tables in overrides.values():
            for override in tables:
                for key in WIDTHS:
                    override.pop(key, None)

    settings = {key: setting.parse(*pick(key, setting.default)) for key, setting in table.settings.items()}
    return Spec(axes=axes, overrides=overrides, settings=settings, cli_axes=cli_axes)


def _overrides(table: CommandTable, raw: dict, cli: dict, where: str) -> dict[str, list[dict[str, list]]]:
    regimes = table.axes["regime"].allowed
    overrides = {}
    for regime, tables in raw.items():
        if regime not in regimes:
            raise SweepError(
                f"{where}: [{table.command}.overrides.{regime}] names no regime (choose from {', '.join(regimes)})"
            )
        for override in tables if isinstance(tables, list) else [tables]:
            parsed = {}
            for key, value in override.items():
                if key not in table.axes or key in ("regime", "model"):
                    raise SweepError(f"{where}: [{table.command}.overrides.{regime}] cannot set {key!r}")
                if cli.get(key) is None:  # the command line wins
                    axis = table.axes[key]
                    label = f"{where}: overrides.{regime}.{key}"
                    parsed[key] = sweep.parse_axis(label, value, axis.convert, axis.allowed)
            overrides.setdefault(regime, []).append(parsed)
    return overrides


def combinations(spec: Spec) -> list[dict]:
    """Every parameter dict of the sweep, regime by regime and sub-sweep by sub-sweep.

    With models, "model" holds the ModelWidths and the width axes its widths; without, "model" is None.
    Repeats (two sub-sweeps naming the same case) are the command's to drop.
    """
    combos = []
    for regime in spec.axes["regime"]:
        for override in spec.overrides.get(regime) or [{}]:
            combos += _product({**spec.axes, **override, "regime": [regime]})
    return combos


def _product(axes: dict[str, list]) -> list[dict]:
    chosen = [models.MODELS[name] for name in axes.get("model") or []]
    if not chosen:
        return [{**combo, "model": None} for combo in sweep.product({k: v for k, v in axes.items() if k != "model"})]
    combos = []
    for combo in sweep.product({k: (chosen if k == "model" else v) for k, v in axes.items() if k not in WIDTHS}):
        model: ModelWidths = combo["model"]
        combos.append({**combo, **{w: getattr(model, w) for w in WIDTHS}})
    return combos
