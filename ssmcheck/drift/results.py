"""What a drift case produced, as plain data: checkpoints, the first non-finite value, the verdict.

Kept apart from the runner, so the verdict, the table, the JSON and the plot
read results without importing what produced them. Everything here is plain
Python numbers, never tensors: a result may cross a process boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ssmcheck.core.output_bias import OutputBias
from ssmcheck.core.status import Status
from ssmcheck.drift.spec import DriftCase


@dataclass(frozen=True)
class Checkpoint:
    step: int
    state_rel: float  # ||state - ref|| / ||ref||, mean over trials
    out_rel: float  # ||out - ref_out|| / ||ref_out||, mean over trials
    bias: float  # mean of sign(ref) * (state - ref), over elements and trials, / rms(ref)
    # ||out - exact|| / ||exact||, exact the float64 output of the step from the kernel's own previous state: the
    # output's own arithmetic and rounding, free of the state's drift before the step; mean over trials
    step_out_rel: float


@dataclass(frozen=True)
class NonfiniteStep:
    output: str  # "state" or "out"
    step: int
    trial: int
    batch: int
    head: int
    channel: int
    state_index: int | None  # None for out
    # At a step whose inputs were fenced: the inputs (by storage) whose NaN fences the non-finite values came
    # from (core.outside); None when the values are the kernel's own, or the step was not fenced.
    reads_outside: list[tuple[str, ...]] | None = None
    # The element of out still holds the NaN ssmcheck filled the out it passed with (drift.adapter's given_out):
    # the kernel left it unwritten.
    unwritten: bool = False


@dataclass(frozen=True)
class StoreErrors:
    """The kernel's per-store rounding errors (ulps, along the exact value), summed up when the run
    ends: plain numbers, where stats.SignedErrorMoments keeps running sums on the device."""

    count: int
    mean: float | None
    z: float | None  # of the mean against zero (None with fewer than 2 stores)
    rms: float | None = None  # root mean square error per store: at most 1 for any rounding of the exact value
    subnormal: int = 0  # stores whose exact value lies in the storage dtype's subnormal range
    flushed: int = 0  # of those, stored as zero (no rounding does that: stats.store_sums)
    resolution: float | None = None  # the smallest mean the bias test could see (stats.SignedErrorMoments)
    # Stores farther from the exact value than their rounding moves a value plus what float32 arithmetic explains
    # (stats.store_sums), and the state row (batch, head, channel) holding the most of them
    misrounded: int = 0
    misrounded_at: tuple[int, ...] | None = None
    # The mean error signed toward +inf (ulps) and its z: a lean whatever the sign, which `mean` cancels
    mean_up: float | None = None
    z_up: float | None = None


@dataclass(frozen=True)
class RepeatDifference:
    """With --repeat K: each decode step run K times from the same state with the same inputs and
    seed, compared bit for bit with the first run; where runs first differed (None fields: never)."""

    runs: int  # K
    identical: bool
    max_abs: float = 0.0  # the largest |difference| over every step compared
    run: int | None = None  # the first run that differed from run 1
    output: str | None = None  # "state" or "out"
    trial: int | None = None
    step: int | None = None
    batch: int | None = None
    head: int | None = None
    channel: int | None = None


@dataclass(frozen=True)
class DriftRun:
    checkpoints: list[Checkpoint]  # the kernel against the reference
    baseline: list[Checkpoint]  # the baseline against the reference
    store_errors: StoreErrors
    first_nonfinite: NonfiniteStep | None
    trials: int  # trials run
    repeat: RepeatDifference | None = None  # with --repeat K > 1
    # How the steps ran: "graph" (CUDA graph replays), "eager", or "eager: " and why no graph (drift.lockstep).
    decode_loop: str = "eager"
    # The output's rounding bias at the checkpoints, against the exact output of the kernel's own previous state,
    # and the baseline's against its own (core.output_bias); None for an fp32 output.
    output_bias: OutputBias | None = None
    baseline_output_bias: OutputBias | None = None
    # The trials that decoded through state_batch_indices, the state's rows on slots of a pool (drift.lockstep).
    slotted_trials: tuple[int, ...] = ()


@dataclass(frozen=True)
class DriftVerdict:
    status: Status
    message: str
    ratio: float | None = None  # worst kernel / baseline state drift over the checkpoints
    growth_exponent: float | None = None  # of the kernel's state drift
    baseline_growth_exponent: float | None = None
    bias_z: float | None = None  # z of the mean per-store rounding error
    store_bias_ulp: float | None = None  # that mean, in ulps (negative: toward zero)
    bias_resolution_ulp: float | None = None  # the smallest such mean the test could see (stochastic cases)
    crossing_step: int | None = None  # where the drift reaches the tolerance (None: not within 1e12 steps)
    crossing_observed: bool = False  # already reached at a checkpoint, not extrapolated


@dataclass(frozen=True)
class SlotCheck:
    """One verdict of a check run beside the decode (drift.slots, drift.speculative, drift.independence): its own
    status, message and figures."""

    name: str  # "live", "untouched", "pad_out", "far_slot", "drafts", "kept", "far_drafts", "independence"
    status: Status
    message: str = ""
    figures: dict = field(default_factory=dict)  # what it measured, as the JSON report holds it


@dataclass(frozen=True)
class DriftResult:
    case: DriftCase
    verdict: DriftVerdict
    seconds: float
    run: DriftRun | None  # None when skipped or the kernel raised
    stdout: str = ""  # what the kernel printed over the case's steps (core.capture: the start, the rest counted)
    slots: tuple[SlotCheck, ...] = ()  # for a kernel that takes slot indices (drift.slots)
    slot_layout: dict | None = None  # the pool, slots and pad rows the slot check ran
    independence: SlotCheck | None = None  # for a stochastic-rounding case (drift.independence)

    @property
    def status(self) -> Status:
        return self.verdict.status
