"""What `ssmcheck drift` runs: its table of axes and settings, the resolved settings, and the list of cases.

Options are read by core.spec like every command's: an option given on the
command line replaces the preset's value; anything neither names takes the
table's default; `[drift.overrides.REGIME]` tables (or arrays of them) replace
axes for one regime, as scan's do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace

import torch

from ssmcheck.core import models, spec, sweep
from ssmcheck.core.autotune import CONFIGS
from ssmcheck.core.formats import DTYPES, ROUNDINGS
from ssmcheck.core.models import WIDTHS
from ssmcheck.core.spec import Axis, CommandTable, Setting
from ssmcheck.core.status import FAIL_ON
from ssmcheck.core.tolerance import DEFAULT_TOL_FACTOR, Tolerance
from ssmcheck.drift.regimes import DRIFT_REGIMES, SUBNORMAL_DTYPES, DecodeShape, regime_steps

STATE_DTYPES = ("fp16", "bf16", "fp32")

TABLE = CommandTable(
    command="drift",
    # in the order cases are listed: the rounding modes of a configuration side by side
    axes={
        "regime": Axis(str, tuple(DRIFT_REGIMES), tuple(DRIFT_REGIMES)),
        "state_dtype": Axis(str, STATE_DTYPES, ("fp16", "bf16")),
        "batch": Axis(sweep.positive_int, None, (1,)),
        "nheads": Axis(sweep.positive_int, None, (1,)),
        "headdim": Axis(sweep.positive_int, None, (16,)),
        "dstate": Axis(sweep.positive_int, None, (128,)),
        "ngroups": Axis(sweep.positive_int, None, (1,)),
        "model": Axis(str.lower, tuple(models.MODELS), ()),
        "rounding": Axis(str, ROUNDINGS, ROUNDINGS),
    },
    settings={
        "steps": Setting(lambda label, value: sweep.parse_count(label, value, 1), 32),
        "trials": Setting(lambda label, value: sweep.parse_count(label, value, 1), 2),
        "seed": Setting(lambda label, value: sweep.parse_count(label, value, 0), 0),
        "tol_factor": Setting(sweep.parse_number, DEFAULT_TOL_FACTOR),
        "rtol": Setting(lambda label, value: None if value is None else sweep.parse_number(label, value), None),
        "fail_on": Setting(sweep.parse_fail_on, list(FAIL_ON)),
        "configs": Setting(sweep.parse_choice(CONFIGS), "auto"),
        "repeat": Setting(lambda label, value: sweep.parse_count(label, value, 1), 1),
        "allow_nondeterministic": Setting(sweep.parse_flag, False),
        "from_prefill": Setting(lambda label, value: sweep.parse_count(label, value, 0), 0),
    },
)


@dataclass(frozen=True)
class DriftSettings:
    spec: spec.Spec
    steps: int  # decode steps per case (the `long` regime runs more: drift.regimes.regime_steps)
    trials: int  # seeds per stochastic-rounding case
    seed: int
    tolerance: Tolerance
    fail_on: tuple[str, ...]
    configs: str = "auto"  # "all": every case once per autotune config of the kernel (plan.py expands them)
    repeat: int = 1  # runs of every decode step from the same state, compared bit for bit
    allow_nondeterministic: bool = False  # with repeat: differing runs do not fail the case
    from_prefill: int = 0  # tokens of chunk-scan prefill the decode starts from (0: the regime's initial state)

    @property
    def axes(self) -> dict[str, list]:
        return self.spec.axes


def resolve(cli: dict, preset: dict, preset_name: str) -> DriftSettings:
    """Merge command-line values (None where not given) over the preset's [drift] table."""
    resolved = spec.resolve(TABLE, cli, preset, preset_name)
    s = resolved.settings
    return DriftSettings(
        spec=resolved, steps=s["steps"], trials=s["trials"], seed=s["seed"],
        tolerance=Tolerance(tol_factor=s["tol_factor"], rtol=s["rtol"]), fail_on=s["fail_on"],
        configs=s["configs"], repeat=s["repeat"], allow_nondeterministic=s["allow_nondeterministic"],
        from_prefill=s["from_prefill"],
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
    # With --configs all: the autotune config this case pins (core.autotune.every_config's JSON text);
    # None: the autotuner's pick.
    config: str | None = None
    skip_reason: str | None = None
    from_prefill: int = 0  # the decode starts from a chunk-scan prefill of this many tokens (drift.prefill)

    @property
    def config_params(self) -> dict | None:
        return None if self.config is None else json.loads(self.config)

    @property
    def id(self) -> str:
        widths = self.model or f"h{self.nheads}x{self.headdim}n{self.dstate}g{self.ngroups}"
        prefill = f"-prefill{self.from_prefill}" if self.from_prefill else ""
        return f"{self.regime}-{self.state_dtype}-{self.rounding}-b{self.batch}-{widths}{prefill}{self._config_suffix}"

    @property
    def configuration(self) -> str:
        """The case without its rounding mode: cases that differ only in rounding share it."""
        widths = self.model or f"h{self.nheads}x{self.headdim}n{self.dstate}g{self.ngroups}"
        return f"{self.regime}-{self.state_dtype}-b{self.batch}-{widths}{self._config_suffix}"

    @property
    def _config_suffix(self) -> str:
        c = self.config_params
        return "" if c is None else f"-cfg-{c['function']}-{c['index']}"

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.state_dtype]

    def shape(self) -> DecodeShape:
        return DecodeShape(self.batch, self.nheads, self.headdim, self.dstate, self.ngroups)

    def params(self) -> dict:
        return {
            "kernel": self.kernel, "state_dtype": self.state_dtype, "rounding": self.rounding,
            "regime": self.regime, "steps": self.steps, "batch": self.batch, "nheads": self.nheads,
            "headdim": self.headdim, "dstate": self.dstate, "ngroups": self.ngroups, "model": self.model,
            "seed": self.seed, "trials": self.trials, "from_prefill": self.from_prefill, "config": self.config_params,
        }


def _skip_reason(case: DriftCase) -> str | None:
    if case.nheads % case.ngroups:
        return f"nheads {case.nheads} is not a multiple of ngroups {case.ngroups}"
    if case.rounding == "stochastic" and case.state_dtype == "fp32":
        return "stochastic rounding needs an fp16 or bf16 state: an fp32 state is stored as computed"
    if case.regime == "subnormal" and case.state_dtype not in SUBNORMAL_DTYPES:
        return (f"the subnormal regime is for fp16 states: {case.state_dtype}'s subnormals lie below 1.2e-38, where "
                "a kernel's fp32 products may be flushed")
    if case.from_prefill and case.regime == "untied":
        return "a chunk-scan prefill takes one A and dt per head (Mamba2); the untied regime has one per channel"
    return None


def build_cases(settings: DriftSettings, kernel: str) -> list[DriftCase]:
    """The sweep's cases without repeats, each with its seed and skip reason.

    The seed depends only on the regime and the shape: every kernel, rounding mode
    and state dtype of a configuration sees the same inputs (stagnation and
    overflow scale them to the dtype), so the modes compare like for like.
    """
    cases = {}  # by id: two sub-sweeps may name the same case
    for params in spec.combinations(settings.spec):
        model = params.pop("model")
        shape_params = {k: params[k] for k in ("regime", "batch", *WIDTHS)}
        case = DriftCase(
            kernel=kernel,
            steps=regime_steps(params["regime"], settings.steps),
            model=None if model is None else model.name,
            seed=sweep.case_seed(settings.seed, shape_params),
            trials=settings.trials if params["rounding"] == "stochastic" else 1,
            from_prefill=settings.from_prefill,
            **params,
        )
        cases.setdefault(case.id, replace(case, skip_reason=_skip_reason(case)))
    return list(cases.values())


def case_from_params(params: dict, kernel: str) -> DriftCase:
    """The case a JSON report's `params` describe (seed included), to run again with `kernel`."""
    names = [f.name for f in fields(DriftCase) if f.name not in ("kernel", "skip_reason", "config", "from_prefill")]
    config = params.get("config")
    case = DriftCase(kernel=kernel, config=None if config is None else json.dumps(config, sort_keys=True),
                     from_prefill=params.get("from_prefill", 0), **{name: params[name] for name in names})
    return replace(case, skip_reason=_skip_reason(case))
