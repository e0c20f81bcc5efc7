"""What a scan case produced, as plain data: the figures measured and the verdict reached.

Kept apart from the runner (as pytest keeps its reports apart from its runner),
so the verdict, the table, the JSON and any later consumer read results without
importing what produced them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from ssmcheck.core.output_bias import OutputBias
from ssmcheck.core.status import Status
from ssmcheck.scan.spec import ScanCase


@dataclass(frozen=True)
class ErrorStats:
    rel: float  # norm-wise relative error ||out - ref||_2 / ||ref||_2 (nan if out has NaN)
    max_abs: float  # max |out - ref|
    worst: tuple[int, ...]  # index (in out's shape) of the element with the max abs error


@dataclass(frozen=True)
class WorstGroup:
    """The kernel's largest norm-wise relative error of y over (sequence, chunk, head) groups, and where."""

    rel: float
    baseline_rel: float  # the baseline's largest group error (in whichever group it is)
    sequence: int
    chunk: int
    head: int


@dataclass(frozen=True)
class RepeatSpread:
    """How the outputs of repeated runs on identical inputs compare with the first run's, bit for bit."""

    runs: int
    identical: bool
    run: int | None = None  # the first run whose outputs differ from run 1's
    output: str | None = None  # "y" or "states"
    sequence: int | None = None  # where that run first differs, in token order (y) or index order (states)
    token: int | None = None
    head: int | None = None
    max_abs: float = 0.0  # the largest |difference| from run 1 over every run and output
    spread_rel: float = 0.0  # the largest norm-wise relative difference of y from run 1's


@dataclass(frozen=True)
class Comparison:
    """Errors of one implementation (kernel or baseline) against the reference."""

    y: ErrorStats
    states: ErrorStats
    ssm: ErrorStats | None = None  # the SSM part C·h alone (y without D·x and the z gate), when those exist
    y_bias: OutputBias | None = None  # the rounding bias of y stored in fp16/bf16 (core.output_bias); None for fp32
    states_bias: OutputBias | None = None  # the final states' likewise, where they are stored in fp16/bf16


# The kernel call whose y is judged as the SSM part C·h alone (scan.adapter.ScanAdapter.call_y), as messages name it.
SSM_PART_CALL = "the call without D, z and the return flags"


@dataclass(frozen=True)
class NonfiniteToken:
    """The first non-finite element of a scan output where the reference is finite, and its spread."""

    output: str  # "y", "final_states" or "ssm_y" (y of the call without D, z and the return flags: the SSM part C·h)
    sequence: int
    token: int | None  # within its sequence (y only)
    chunk: int | None  # token // chunk_size: the sequence's own chunking (y only)
    head: int
    channel: int
    state_index: int | None  # (final states only)
    count: int  # non-finite elements in the whole output
    tokens: int | None  # distinct non-finite tokens (y only)
    chunks: int | None  # distinct non-finite (sequence, chunk) pairs (y only)
    inputs_finite: bool  # whether the inputs it depends on are all finite

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ErrorMap:
    """The relative error of y per (chunk, head), each sequence chunked on its own."""

    chunk_size: int
    tokens: int  # the longest sequence's length: where the token axis ends (its last chunk may be partial)
    per_chunk_head: list[list[float]]  # [chunk][head]; nan or inf where the output was non-finite


@dataclass(frozen=True)
class StageFigure:
    """One SSD stage of a kernel against the float64 reference's same stage (scan.stages)."""

    stage: str  # cumsum, chunk_states, passed_states, cb, output
    label: str  # in words: cumulative decay, chunk states, state passing, C·Bᵀ, output
    status: str  # ok, nonfinite, out of tolerance
    rel: float  # norm-wise relative error of the whole stage
    baseline_rel: float  # the same-precision baseline's
    limit: float  # the largest accepted `rel`
    group_rel: float  # the error of the (chunk, head) group below
    worst_group_rel: float  # the largest (chunk, head) group error
    baseline_worst_group_rel: float
    group_limit: float  # the largest accepted group error
    sequence: int  # the first wrong group (chunk order) when the stage is wrong, else the worst group
    chunk: int  # within its sequence
    head: int  # a group of B and C for the cb stage


@dataclass(frozen=True)
class StageReport:
    """Every stage's figures, and the first stage (pipeline order) that is non-finite or out of tolerance."""

    figures: tuple[StageFigure, ...] = ()
    first_wrong: StageFigure | None = None
    note: str = ""  # why the stages were not compared (figures then empty)


@dataclass(frozen=True)
class ScanVerdict:
    status: Status
    message: str = ""
    limits: tuple[float, float] | None = None  # the largest accepted (y, states) errors
    over_limit: bool = False  # a figure over its tolerance (not y's rounding bias alone): a question of precision


@dataclass(frozen=True)
class InvarianceCheck:
    """One serving-shaped check of a case (scan.invariance): its own verdict and figures."""

    name: str  # "batch", "split", "prefill_decode", "cache_write"
    status: Status  # skipped (with the reason as message) when it cannot run for this case or kernel
    message: str = ""
    figures: dict = field(default_factory=dict)  # what it measured, as the JSON report holds it


@dataclass
class ScanResult:
    case: ScanCase
    status: Status
    message: str = ""
    seconds: float = 0.0  # the whole case: inputs, kernel, reference, baseline, measurements
    kernel_seconds: float | None = None
    warmup_seconds: float | None = None  # the kernel's first call for this shape (compile, autotune), apart
    # What the kernel's autotuners picked at that first call (core.autotune.recorded_picks); None where none tuned.
    autotune_picks: dict | None = None
    inputs_note: str = ""
    state_storage: str | None = None  # the format the states were judged as stored in (fp32, fp16, bf16)
    kernel: Comparison | None = None
    baseline: Comparison | None = None
    worst_group: WorstGroup | None = None
    repeat: RepeatSpread | None = None  # with --repeat K: how the K runs compare
    precision: dict | None = None  # for a failing case: the reduced precision its errors match (scan.precision)
    limits: tuple[float, float] | None = None  # the largest accepted (y, states) errors
    first_nonfinite: NonfiniteToken | None = None  # in y, else in the final states
    first_nonfinite_state: NonfiniteToken | None = None
    # For a non-finite case: the inputs (by storage) whose NaN fences its non-finite values came from
    # (core.outside), [] when no single one's, None when they are the kernel's own or not asked.
    reads_outside: list[tuple[str, ...]] | None = None
    per_chunk: list[float] = field(default_factory=list)
    growth: float | None = None
    # Only for the cases that failed or were non-finite: the report's error maps, without bloating
    # the passing cases.
    error_map: ErrorMap | None = None
    stages: StageReport | None = None  # with --stages, and for cases that failed or were non-finite
    repro: str | None = None  # with --repro: the folder of this case's reproducer
    stdout: str = ""  # what the kernel printed (core.capture: the start, the rest counted)
    invariance: list[InvarianceCheck] = field(default_factory=list)  # with --invariance (scan.invariance)

    @property
    def ratio(self) -> float | None:
        """Kernel error over baseline error, for y."""
        return _ratio(self.kernel.y.rel, self.baseline.y.rel) if self.kernel and self.baseline else None

    @property
    def state_ratio(self) -> float | None:
        return _ratio(self.kernel.states.rel, self.baseline.states.rel) if self.kernel and self.baseline else None

    @property
    def ssm_ratio(self) -> float | None:
        if not (self.kernel and self.baseline and self.kernel.ssm):
            return None
        return _ratio(self.kernel.ssm.rel, self.baseline.ssm.rel)

    @property
    def group_ratio(self) -> float | None:
        return _ratio(self.worst_group.rel, self.worst_group.baseline_rel) if self.worst_group else None

    @property
    def worst_ratio(self) -> float | None:
        """The largest of the judged ratios: y, the states, y's worst group, the SSM part."""
        ratios = [r for r in (self.ratio, self.state_ratio, self.group_ratio, self.ssm_ratio) if r is not None]
        return max(ratios, key=lambda r: math.inf if math.isnan(r) else r) if ratios else None


def _ratio(error: float, baseline: float) -> float:
    if baseline > 0:
        return error / baseline
    return 0.0 if error == 0 else float("inf")
