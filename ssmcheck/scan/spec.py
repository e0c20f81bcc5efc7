"""What `ssmcheck scan` runs: its settings (CLI options over a preset) and the list of cases.

A preset's `[scan]` table holds sweep axes and settings under the CLI option
names (dashes as underscores), plus optional per-regime overrides: a table
`[scan.overrides.REGIME]` replaces axes for that regime only (e.g. longer seqlens
for `long`), and an array of tables `[[scan.overrides.REGIME]]` runs the union of
several such sub-sweeps. An axis given on the command line replaces the preset's
axis and removes it from the overrides; the second and later sub-sweeps of a
regime add variety to a preset run and are dropped as soon as any sweep axis is
given on the command line, so that an explicit sweep runs what it names.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ssmcheck import models, sweep
from ssmcheck.models import WIDTHS
from ssmcheck.ops.rounding.naive import MODES as ROUNDINGS
from ssmcheck.regimes import REGIMES, ScanShape
from ssmcheck.sweep import SweepError, option_name
from ssmcheck.verdict import DEFAULT_FLOOR, DEFAULT_TOL_FACTOR, FAIL_ON, Tolerance

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
REFERENCES = ("fp64", "fp32")

# axis -> (converter, allowed values or None)
AXES = {
    "regime": (str, tuple(REGIMES)),
    "dtype": (str, tuple(DTYPES)),
    "chunk_size": (sweep.positive_int, None),
    "seqlen": (sweep.positive_int, None),
    "batch": (sweep.positive_int, None),
    **{w: (sweep.positive_int, None) for w in WIDTHS},
    "state_dtype": (str, tuple(DTYPES)),
    "rounding": (str, ROUNDINGS),
    "model": (str.lower, tuple(models.MODELS)),
}
# Used when neither the command line nor the preset names an axis.
AXIS_DEFAULTS = {
    "regime": list(REGIMES), "dtype": list(DTYPES), "chunk_size": [64], "seqlen": [200], "batch": [2],
    "nheads": [4], "headdim": [16], "dstate": [16], "ngroups": [1], "state_dtype": ["fp32"],
    "rounding": ["nearest"], "model": [],
}
SETTINGS = ("reference", "tol_factor", "floor", "rtol", "seed", "fail_on")
BUILTIN_CHUNK_SIZES = tuple(2**k for k in range(4, 9))  # what the built-in kernel supports


@dataclass(frozen=True)
class ScanSettings:
    axes: dict[str, list]  # every axis in AXES; "chunk_size" may be [None]: each model's own
    overrides: dict[str, list[dict[str, list]]]  # regime -> sub-sweeps, each the axes it replaces
    reference: str
    tolerance: Tolerance
    seed: int
    fail_on: tuple[str, ...]


def resolve(cli: dict, preset: dict, preset_name: str) -> ScanSettings:
    """Merge command-line values (None where not given) over the preset's [scan] table."""
    where = f"--preset {preset_name}"
    unknown = set(preset) - set(AXES) - set(SETTINGS) - {"overrides"}
    if unknown:
        raise SweepError(f"{where}: unknown key {sorted(unknown)[0]!r} in [scan]")

    axes = {}
    for key in AXES:
        if cli.get(key) is not None:
            axes[key] = sweep.parse_axis(option_name(key), cli[key], *AXES[key])
        elif key in preset:
            axes[key] = sweep.parse_axis(f"{where}: {key}", preset[key], *AXES[key])
        else:
            axes[key] = list(AXIS_DEFAULTS[key])

    overrides = {}
    for regime, tables in preset.get("overrides", {}).items():
        if regime not in REGIMES:
            raise SweepError(f"{where}: [scan.overrides.{regime}] names no regime (choose from {', '.join(REGIMES)})")
        for table in tables if isinstance(tables, list) else [tables]:
            parsed = {}
            for key, value in table.items():
                if key not in AXES or key in ("regime", "model"):
                    raise SweepError(f"{where}: [scan.overrides.{regime}] cannot set {key!r}")
                if cli.get(key) is None:  # the command line wins
                    parsed[key] = sweep.parse_axis(f"{where}: overrides.{regime}.{key}", value, *AXES[key])
            overrides.setdefault(regime, []).append(parsed)
    if any(cli.get(key) is not None for key in AXES):
        overrides = {regime: tables[:1] for regime, tables in overrides.items()}

    if axes["model"]:
        given = [option_name(w) for w in WIDTHS if cli.get(w) is not None]
        if given:
            raise SweepError(f"--model sets the widths: drop {given[0]}")
        if cli.get("chunk_size") is None:
            axes["chunk_size"] = [None]  # each model's own chunk size
        for tables in overrides.values():
            for table in tables:
                for key in (*WIDTHS, "chunk_size"):
                    table.pop(key, None)

    def setting(key, default):
        if cli.get(key) is not None:
            return option_name(key), cli[key]
        return (f"{where}: {key}", preset[key]) if key in preset else (None, default)

    label, reference = setting("reference", "fp64")
    if reference not in REFERENCES:
        raise SweepError(f"{label}: invalid value {reference!r} (choose from {', '.join(REFERENCES)})")
    label, tol_factor = setting("tol_factor", DEFAULT_TOL_FACTOR)
    tol_factor = sweep.parse_number(label, tol_factor)
    label, floor = setting("floor", DEFAULT_FLOOR)
    floor = sweep.parse_number(label, floor, strict=False)
    label, rtol = setting("rtol", None)
    rtol = None if rtol is None else sweep.parse_number(label, rtol)
    label, seed = setting("seed", 0)
    seed = sweep.parse_count(label, seed, 0)
    label, fail_on = setting("fail_on", list(FAIL_ON))
    return ScanSettings(
        axes=axes, overrides=overrides, reference=reference, tolerance=Tolerance(tol_factor, floor, rtol),
        seed=seed, fail_on=sweep.parse_fail_on(label, fail_on),
    )


@dataclass(frozen=True)
class ScanCase:
    kernel: str
    regime: str
    dtype: str
    chunk_size: int
    seqlen: int
    batch: int
    nheads: int
    headdim: int
    dstate: int
    ngroups: int
    state_dtype: str
    rounding: str
    model: str | None
    seed: int
    skip_reason: str | None = None

    @property
    def id(self) -> str:
        widths = self.model or f"h{self.nheads}x{self.headdim}n{self.dstate}g{self.ngroups}"
        text = f"{self.regime}-{self.dtype}-c{self.chunk_size}-L{self.seqlen}-b{self.batch}-{widths}"
        if (self.state_dtype, self.rounding) != ("fp32", "nearest"):
            text += f"-state-{self.state_dtype}-{self.rounding}"
        return text

    def params(self) -> dict:
        return {
            "kernel": self.kernel, "dtype": self.dtype, "chunk_size": self.chunk_size, "seqlen": self.seqlen,
            "batch": self.batch, "nheads": self.nheads, "headdim": self.headdim, "dstate": self.dstate,
            "ngroups": self.ngroups, "regime": self.regime, "seed": self.seed, "state_dtype": self.state_dtype,
            "rounding": self.rounding, "model": self.model,
        }

    def shape(self) -> ScanShape:
        return ScanShape(self.batch, self.seqlen, self.nheads, self.headdim, self.dstate, self.ngroups, self.chunk_size)


def _skip_reason(case: ScanCase) -> str | None:
    if case.nheads % case.ngroups:
        return f"nheads {case.nheads} is not a multiple of ngroups {case.ngroups}"
    if case.rounding == "stochastic" and case.state_dtype == "fp32":
        return "stochastic rounding needs an fp16 or bf16 state (--state-dtype): fp32 states are not rounded"
    if case.kernel == "builtin" and case.chunk_size not in BUILTIN_CHUNK_SIZES:
        return f"the built-in kernel takes power-of-two chunk sizes 16..256, not {case.chunk_size}"
    return REGIMES[case.regime].skip_reason(case.shape())


def build_cases(settings: ScanSettings, kernel: str) -> list[ScanCase]:
    """The cartesian product of the axes, regime by regime (and sub-sweep by sub-sweep), without
    repeats, each case with its own seed and skip reason.

    The seed depends on every parameter but the kernel, so different kernels see the same inputs.
    """
    cases = {}
    for regime in settings.axes["regime"]:
        for override in settings.overrides.get(regime) or [{}]:
            for params in _combinations({**settings.axes, **override, "regime": [regime]}):
                seed = sweep.case_seed(settings.seed, params)
                case = ScanCase(kernel=kernel, seed=seed, **params)
                cases.setdefault(case.id, replace(case, skip_reason=_skip_reason(case)))
    return list(cases.values())


def _combinations(axes: dict[str, list]) -> list[dict]:
    """The product of the axes, with a model's widths (and its chunk size, where None) filled in."""
    names = axes.pop("model")
    if not names:
        return [{**combo, "model": None} for combo in sweep.product(axes)]
    for w in WIDTHS:
        axes.pop(w)
    combos = []
    for combo in sweep.product(axes):
        for model in (models.MODELS[name] for name in names):
            params = {**combo, **{w: getattr(model, w) for w in WIDTHS}, "model": model.name}
            if params["chunk_size"] is None:
                params["chunk_size"] = model.chunk_size
            combos.append(params)
    return combos
