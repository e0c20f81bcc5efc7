"""What `ssmcheck drift` runs: its settings (CLI options over a preset) and the list of cases.

A preset's `[drift]` table holds sweep axes and settings under the CLI option
names (dashes as underscores). An option given on the command line replaces
the preset's value; anything neither names falls back to AXIS_DEFAULTS /
SETTING_DEFAULTS.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ssmcheck import models, sweep
from ssmcheck.drift_regimes import DRIFT_REGIMES, DecodeShape, regime_steps
from ssmcheck.models import WIDTHS
from ssmcheck.ops.rounding.naive import MODES as ROUNDINGS
from ssmcheck.sweep import SweepError, option_name
from ssmcheck.verdict import DEFAULT_TOL_FACTOR, FAIL_ON, Tolerance

STATE_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}

# axis -> (converter, allowed values or None)
# (in the order cases are listed: the rounding modes of a configuration side by side)
AXES = {
    "regime": (str, tuple(DRIFT_REGIMES)),
    "state_dtype": (str, tuple(STATE_DTYPES)),
    "batch": (sweep.positive_int, None),
    **{w: (sweep.positive_int, None) for w in WIDTHS},
    "model": (str.lower, tuple(models.MODELS)),
    "rounding": (str, ROUNDINGS),
}
# Used when neither the command line nor the preset names an axis or setting.
AXIS_DEFAULTS = {
    "state_dtype": ["fp16", "bf16"], "rounding": list(ROUNDINGS), "regime": list(DRIFT_REGIMES), "batch": [1],
    "nheads": [1], "headdim": [16], "dstate": [128], "ngroups": [1], "model": [],
}
SETTING_DEFAULTS = {"steps": 32, "trials": 2, "seed": 0, "tol_factor": DEFAULT_TOL_FACTOR, "rtol": None,
                    "fail_on": list(FAIL_ON)}


@dataclass(frozen=True)
class DriftSettings:
    axes: dict[str, list]  # every axis in AXES
    steps: int  # decode steps per case (the `long` regime runs more: drift_regimes.regime_steps)
    trials: int  # seeds per stochastic-rounding case
    seed: int
    tolerance: Tolerance
    fail_on: tuple[str, ...]


def resolve(cli: dict, preset: dict, preset_name: str) -> DriftSettings:
    """Merge command-line values (None where not given) over the preset's [drift] table."""
    where = f"--preset {preset_name}"
    unknown = set(preset) - set(AXES) - set(SETTING_DEFAULTS)
    if unknown:
        raise SweepError(f"{where}: unknown key {min(unknown)!r} in [drift]")

    def pick(key, default):
        """(label for messages, value) from the command line, else the preset, else the default."""
        if cli.get(key) is not None:
            return option_name(key), cli[key]
        if key in preset:
            return f"{where}: {key}", preset[key]
        return option_name(key), default

    axes = {}
    for key, (convert, allowed) in AXES.items():
        label, value = pick(key, AXIS_DEFAULTS[key])
        axes[key] = sweep.parse_axis(label, value, convert, allowed) if value != [] else []
    if axes["model"]:
        given = [option_name(w) for w in WIDTHS if cli.get(w) is not None]
        if given:
            raise SweepError(f"--model sets the widths: drop {given[0]}")

    label, steps = pick("steps", SETTING_DEFAULTS["steps"])
    label_t, trials = pick("trials", SETTING_DEFAULTS["trials"])
    label_s, seed = pick("seed", SETTING_DEFAULTS["seed"])
    label_f, tol_factor = pick("tol_factor", SETTING_DEFAULTS["tol_factor"])
    label_r, rtol = pick("rtol", None)
    label_o, fail_on = pick("fail_on", SETTING_DEFAULTS["fail_on"])
    return DriftSettings(
        axes=axes,
        steps=sweep.parse_count(label, steps, 1),
        trials=sweep.parse_count(label_t, trials, 1),
        seed=sweep.parse_count(label_s, seed, 0),
        tolerance=Tolerance(
            tol_factor=sweep.parse_number(label_f, tol_factor),
            rtol=None if rtol is None else sweep.parse_number(label_r, rtol),
        ),
        fail_on=sweep.parse_fail_on(label_o, fail_on),
    )


@dataclass(frozen=True)
class DriftCase:
    kernel: str
    state_dtype: str
    rounding: str
    regime: str
    steps: int  # decode steps this case runs
    batch: int
    nheads: int
    headdim: int
    dstate: int
    ngroups: int
    model: str | None
    seed: int  # of the inputs; trial seeds derive from it
    trials: int  # runs with different rounding seeds (1 for round-to-nearest: it is deterministic)
    skip_reason: str | None = None

    @property
    def id(self) -> str:
        widths = self.model or f"h{self.nheads}x{self.headdim}n{self.dstate}g{self.ngroups}"
        return f"{self.regime}-{self.state_dtype}-{self.rounding}-b{self.batch}-{widths}"

    @property
    def configuration(self) -> str:
        """The case without its rounding mode: cases that differ only in rounding share it."""
        widths = self.model or f"h{self.nheads}x{self.headdim}n{self.dstate}g{self.ngroups}"
        return f"{self.regime}-{self.state_dtype}-b{self.batch}-{widths}"

    @property
    def dtype(self) -> torch.dtype:
        return STATE_DTYPES[self.state_dtype]

    def shape(self) -> DecodeShape:
        return DecodeShape(self.batch, self.nheads, self.headdim, self.dstate, self.ngroups)

    def params(self) -> dict:
        return {
            "kernel": self.kernel, "state_dtype": self.state_dtype, "rounding": self.rounding,
            "regime": self.regime, "steps": self.steps, "batch": self.batch, "nheads": self.nheads,
            "headdim": self.headdim, "dstate": self.dstate, "ngroups": self.ngroups, "model": self.model,
            "seed": self.seed, "trials": self.trials,
        }


def _skip_reason(case: DriftCase) -> str | None:
    if case.nheads % case.ngroups:
        return f"nheads {case.nheads} is not a multiple of ngroups {case.ngroups}"
    if case.rounding == "stochastic" and case.state_dtype == "fp32":
        return "stochastic rounding needs an fp16 or bf16 state: an fp32 state is stored as computed"
    return None


def build_cases(settings: DriftSettings, kernel: str) -> list[DriftCase]:
    """The cartesian product of the axes, each case with its seed and skip reason.

    The seed depends only on the regime and the shape: every kernel, rounding mode
    and state dtype of a configuration sees the same inputs (stagnation and
    overflow scale them to the dtype), so the modes compare like for like.
    """
    axes = dict(settings.axes)
    axes["model"] = [models.MODELS[name] for name in axes["model"]] or [None]
    if axes["model"] != [None]:
        for w in WIDTHS:
            axes.pop(w)
    cases = []
    for params in sweep.product(axes):
        model = params.pop("model")
        if model is not None:
            params.update({w: getattr(model, w) for w in WIDTHS})
        shape_params = {k: params[k] for k in ("regime", "batch", *WIDTHS)}
        case = DriftCase(
            kernel=kernel,
            steps=regime_steps(params["regime"], settings.steps),
            model=None if model is None else model.name,
            seed=sweep.case_seed(settings.seed, shape_params),
            trials=settings.trials if params["rounding"] == "stochastic" else 1,
            **params,
        )
        cases.append(replace(case, skip_reason=_skip_reason(case)))
    return cases
