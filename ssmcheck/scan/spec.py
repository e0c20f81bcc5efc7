"""What `ssmcheck scan` runs: its table of axes and settings, the resolved settings, and the list of cases.

Options are read by core.spec like every command's: CLI over preset over the
defaults below, with per-regime overrides (`[scan.overrides.REGIME]`, or an
array of such tables for several sub-sweeps). Scan adds one rule: with
`--model` and no `--chunk-size`, each model runs at its own chunk size.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace

from ssmcheck.core import models, spec, sweep
from ssmcheck.core.autotune import CONFIGS
from ssmcheck.core.formats import DTYPES, ROUNDINGS
from ssmcheck.core.spec import Axis, CommandTable, Setting
from ssmcheck.core.status import FAIL_ON
from ssmcheck.core.tolerance import DEFAULT_FLOOR, DEFAULT_TOL_FACTOR, Tolerance
from ssmcheck.scan.inputs import ScanShape
from ssmcheck.scan.regimes import REGIMES

REFERENCES = ("fp64", "fp32")
# --batch-invariance: a sequence alone and packed give the same bits, or agree within the tolerance rule.
BATCH_INVARIANCE = ("exact", "tolerance")


TABLE = CommandTable(
    command="scan",
    axes={
        "regime": Axis(str, tuple(REGIMES), tuple(REGIMES)),
        "dtype": Axis(str, tuple(DTYPES), tuple(DTYPES)),
        "chunk_size": Axis(sweep.positive_int, None, (64,)),
        "seqlen": Axis(sweep.positive_int, None, (200,)),
        "batch": Axis(sweep.positive_int, None, (2,)),
        "nheads": Axis(sweep.positive_int, None, (4,)),
        "headdim": Axis(sweep.positive_int, None, (16,)),
        "dstate": Axis(sweep.positive_int, None, (16,)),
        "ngroups": Axis(sweep.positive_int, None, (1,)),
        "state_dtype": Axis(str, tuple(DTYPES), ("fp32",)),
        "rounding": Axis(str, ROUNDINGS, ("nearest",)),
        "model": Axis(str.lower, tuple(models.MODELS), ()),
    },
    settings={
        "reference": Setting(sweep.parse_choice(REFERENCES), "fp64"),
        "tol_factor": Setting(sweep.parse_number, DEFAULT_TOL_FACTOR),
        "floor": Setting(lambda label, value: sweep.parse_number(label, value, strict=False), DEFAULT_FLOOR),
        "rtol": Setting(lambda label, value: None if value is None else sweep.parse_number(label, value), None),
        "seed": Setting(lambda label, value: sweep.parse_count(label, value, 0), 0),
        "fail_on": Setting(sweep.parse_fail_on, list(FAIL_ON)),
        "allow_tf32": Setting(sweep.parse_flag, False),
        "repeat": Setting(lambda label, value: sweep.parse_count(label, value, 1), 1),
        "configs": Setting(sweep.parse_choice(CONFIGS), "auto"),
        "allow_nondeterministic": Setting(sweep.parse_flag, False),
        "stages": Setting(sweep.parse_flag, False),
        "repro": Setting(sweep.parse_folder, None),
        "invariance": Setting(sweep.parse_flag, False),
        "batch_invariance": Setting(sweep.parse_choice(BATCH_INVARIANCE), "exact"),
        "decode_kernel": Setting(lambda label, value: value, None),
    },
)


@dataclass(frozen=True)
class ScanSettings:
    spec: spec.Spec  # axes ("chunk_size" may be [None]: each model's own) and per-regime overrides
    reference: str
    tolerance: Tolerance
    seed: int
    fail_on: tuple[str, ...]
    allow_tf32: bool = False  # fp32 cases judged against the TF32 baseline
    repeat: int = 1  # runs per case, compared bit for bit
    configs: str = "auto"  # "all": every case once per autotune config of the kernel (plan.py expands them)
    allow_nondeterministic: bool = False
    stages: bool = False  # compare every case's SSD stages with the reference's (scan.stages)
    repro: str | None = None  # the folder --repro writes each failing case's reproducer into (scan.repro)
    invariance: bool = False  # the serving-shaped checks (scan.invariance)
    batch_invariance: str = "exact"
    decode_kernel: str | None = None  # the state update of the prefill→decode check (None: the kernel's partner)

    @property
    def axes(self) -> dict[str, list]:
        return self.spec.axes

    @property
    def overrides(self) -> dict[str, list[dict[str, list]]]:
        return self.spec.overrides


def resolve(cli: dict, preset: dict, preset_name: str) -> ScanSettings:
    """Merge command-line values (None where not given) over the preset's [scan] table."""
    resolved = spec.resolve(TABLE, cli, preset, preset_name)
    if resolved.axes["model"]:
        if cli.get("chunk_size") is None:
            resolved.axes["chunk_size"] = [None]  # each model's own chunk size
        for tables in resolved.overrides.values():
            for override in tables:
                override.pop("chunk_size", None)
    s = resolved.settings
    return ScanSettings(
        spec=resolved, reference=s["reference"], tolerance=Tolerance(s["tol_factor"], s["floor"], s["rtol"]),
        seed=s["seed"], fail_on=s["fail_on"], allow_tf32=s["allow_tf32"], repeat=s["repeat"],
        allow_nondeterministic=s["allow_nondeterministic"], configs=s["configs"], stages=s["stages"],
        repro=s["repro"], invariance=s["invariance"], batch_invariance=s["batch_invariance"],
        decode_kernel=s["decode_kernel"],
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
    # With --configs all: the autotune config this case pins, as JSON {"function", "index", "kwargs",
    # "num_warps", "num_stages", ...} (a string, so the case stays hashable); None: the autotuner's pick.
    config: str | None = None
    skip_reason: str | None = None

    @property
    def config_params(self) -> dict | None:
        return None if self.config is None else json.loads(self.config)

    @property
    def id(self) -> str:
        widths = self.model or f"h{self.nheads}x{self.headdim}n{self.dstate}g{self.ngroups}"
        text = f"{self.regime}-{self.dtype}-c{self.chunk_size}-L{self.seqlen}-b{self.batch}-{widths}"
        if (self.state_dtype, self.rounding) != ("fp32", "nearest"):
            text += f"-state-{self.state_dtype}-{self.rounding}"
        if self.config is not None:
            text += f"-cfg-{self.config_params['function']}-{self.config_params['index']}"
        return text

    def params(self) -> dict:
        return {
            "kernel": self.kernel, "dtype": self.dtype, "chunk_size": self.chunk_size, "seqlen": self.seqlen,
            "batch": self.batch, "nheads": self.nheads, "headdim": self.headdim, "dstate": self.dstate,
            "ngroups": self.ngroups, "regime": self.regime, "seed": self.seed, "state_dtype": self.state_dtype,
            "rounding": self.rounding, "model": self.model, "config": self.config_params,
        }

    def shape(self) -> ScanShape:
        return ScanShape(self.batch, self.seqlen, self.nheads, self.headdim, self.dstate, self.ngroups, self.chunk_size)


def _skip_reason(case: ScanCase) -> str | None:
    if case.nheads % case.ngroups:
        return f"nheads {case.nheads} is not a multiple of ngroups {case.ngroups}"
    if case.rounding == "stochastic" and case.state_dtype == "fp32":
        return "stochastic rounding needs an fp16 or bf16 state (--state-dtype): fp32 states are not rounded"
    return REGIMES[case.regime].skip_reason(case.shape())


def build_cases(settings: ScanSettings, kernel: str) -> list[ScanCase]:
    """The sweep's cases without repeats, each with its own seed and skip reason.

    The seed depends on every parameter but the kernel, so different kernels see the same inputs.
    """
    cases = {}
    for params in spec.combinations(settings.spec):
        model = params["model"]
        if model is not None:
            params["model"] = model.name
            if params["chunk_size"] is None:
                params["chunk_size"] = model.chunk_size
        case = ScanCase(kernel=kernel, seed=sweep.case_seed(settings.seed, params), **params)
        cases.setdefault(case.id, replace(case, skip_reason=_skip_reason(case)))
    return list(cases.values())


def case_from_params(params: dict, kernel: str) -> ScanCase:
    """The case a JSON report's `params` describe (seed included), to run again with `kernel`."""
    names = [f.name for f in fields(ScanCase) if f.name not in ("kernel", "skip_reason", "config")]
    config = params.get("config")
    case = ScanCase(kernel=kernel, config=None if config is None else json.dumps(config, sort_keys=True),
                    **{name: params[name] for name in names})
    return replace(case, skip_reason=_skip_reason(case))
