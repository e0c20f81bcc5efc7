"""Running one drift case: the kernel's decode loop beside the float64 reference and the baseline.

Per trial, three states advance in lockstep over the same inputs:
- the kernel's, in the storage dtype, updated in place by the kernel;
- the reference: the float64 recurrence, never rounded;
- the baseline: the float64 recurrence with the state rounded to the storage
  dtype after every step in the declared mode (DESIGN §3), the drift that the
  storage format itself explains.

At log-spaced checkpoints the kernel and the baseline are measured against the
reference. At every step the kernel's store is also measured on its own: the
float64 update of the kernel's previous state is what an ideal kernel would
round, so (stored - exact) in ulps, signed along the exact value, is the
rounding error of that store, free of the drift accumulated before it. Its
mean over all stores and trials is the bias the SR z-test judges.

A step is device work only (drift.lockstep); on a GPU it runs as a CUDA graph replay where that
reproduces the eager step, and the device is then read at the checkpoints only.

`DriftRunner` is the same as a picklable value, so a worker process (core.isolation)
can rebuild the kernel's adapter and run cases itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch

from ssmcheck.core import autotune, sweep
from ssmcheck.core.capture import Transcript
from ssmcheck.core.guard import describe
from ssmcheck.core.precompile import COMPILE_THREADS, Launches
from ssmcheck.core.status import Status
from ssmcheck.core.tolerance import Tolerance
from ssmcheck.drift import ahead, far_slots, independence, prefetch, slots, speculative
from ssmcheck.drift.adapter import DriftAdapter, KernelRaised, resolve
from ssmcheck.drift.follow import output_rounded
from ssmcheck.drift.lockstep import RUN_STEPS, Lockstep, StepWindow, slotted_from
from ssmcheck.drift.measure import CheckpointSums, figures, first_nonfinite
from ssmcheck.drift.regimes import make_problem
from ssmcheck.drift.results import DriftResult, DriftRun, NonfiniteStep, RepeatDifference, SlotCheck, StoreErrors
from ssmcheck.drift.spec import DriftCase
from ssmcheck.drift.stats import SignedErrorMoments, log_checkpoints
from ssmcheck.drift.verdict import error_verdict, judge, skipped_verdict


def run_case(
    case: DriftCase,
    kernel: DriftAdapter,
    tolerance: Tolerance,
    device: str,
    on_step: Callable[[], None] = lambda: None,
    repeat: int = 1,
    allow_nondeterministic: bool = False,
    prefill=None,
) -> DriftResult:
    """Measure and judge one case (a skipped case only gets its reason). With `repeat` K > 1 every step
    runs K times from the same state (a race shows as runs that differ). `prefill`: the chunk scan's
    scan.adapter.ScanAdapter, for a case that starts from a prefill (--from-prefill). For a kernel that
    takes slot indices, the padded-slot check (drift.slots) runs too, on a GPU the far-slot check (drift.far_slots),
    for one that takes draft tokens the speculative-decoding check (drift.speculative) and on a GPU its far twin,
    where every trial decoded through slot indices a short trial without them (`_without_slots`), and for a
    stochastic-rounding case the independence check (drift.independence); all are folded into the
    verdict. A decode that raised (KernelRaised) makes the case an error, and its slot checks still run and add
    what they find, unless every one of them errs too (a kernel that raises on every call)."""
    if case.skip_reason is not None:
        return DriftResult(case, skipped_verdict(case.skip_reason), 0.0, None)
    start = time.perf_counter()
    transcript = Transcript()
    try:
        run = decode(case, kernel, device, on_step, transcript, repeat, prefill)
        verdict = judge(case, run, tolerance, allow_nondeterministic)
    except KernelRaised as exc:  # the case errs; its slot checks still run (below): each calls the kernel afresh
        run, verdict = None, error_verdict(str(exc))
    except Exception as exc:  # noqa: BLE001 (a bug on our side is still one case's outcome, not the sweep's end)
        return DriftResult(case, error_verdict(f"measuring the case raised {describe(exc)}"),
                           time.perf_counter() - start, None, transcript.text)
    checks, layout = [], None
    if kernel.pad_slot_id is not None:  # a kernel that takes slot indices: the padded-slot check
        try:
            checks, layout = slots.run_check(case, kernel, tolerance, device, transcript)
            if run is not None and len(run.slotted_trials) == run.trials:  # no trial called the path without indices
                checks.append(_without_slots(case, kernel, tolerance, device, transcript, allow_nondeterministic,
                                             prefill))
            far = far_slots.run_check(case, kernel, tolerance, device, transcript)  # None on the CPU
            checks += [far] if far is not None else []
            if kernel.takes_draft_tokens:  # and the speculative-decoding check
                drafts, layout["speculative"] = speculative.run_check(case, kernel, tolerance, device, transcript)
                far = far_slots.run_draft_check(case, kernel, tolerance, device, transcript)  # None on the CPU
                checks += drafts + ([far] if far is not None else [])
        except Exception as exc:  # noqa: BLE001 (as above)
            if run is None:  # the decode's error stands alone
                return DriftResult(case, verdict, time.perf_counter() - start, None, transcript.text)
            return DriftResult(case, error_verdict(f"the slot check raised {describe(exc)}"),
                               time.perf_counter() - start, run, transcript.text)
        if run is None and all(c.status is Status.ERROR for c in checks):  # a kernel that raises on every call:
            checks, layout = [], None  # its checks would repeat the decode's error
        # After a decode error the checks that ran show what else the kernel does wrong (a store outside the
        # state's slots in the decode beside, say, the far-slot check's diagnosis of its offsets).
        verdict = slots.combine(verdict, checks)
    if run is None:
        return DriftResult(case, verdict, time.perf_counter() - start, None, transcript.text, tuple(checks), layout)
    twins = None
    if case.rounding == "stochastic":  # twin elements rounding with bits of their own: the independence check
        try:
            twins = independence.run_check(case, kernel, device, transcript)
        except Exception as exc:  # noqa: BLE001 (as above)
            return DriftResult(case, error_verdict(f"the independence check raised {describe(exc)}"),
                               time.perf_counter() - start, run, transcript.text)
        verdict = slots.combine(verdict, [twins])
    return DriftResult(case, verdict, time.perf_counter() - start, run, transcript.text, tuple(checks), layout, twins)


# The steps of the trial without slot indices that a case whose every trial decoded through them runs beside
# (`_without_slots`): a path of a kernel's own for calls without state_batch_indices errs from its first step.
UNSLOTTED_STEPS = 2


def _without_slots(case: DriftCase, kernel: DriftAdapter, tolerance: Tolerance, device: str, transcript: Transcript,
                   allow_nondeterministic: bool, prefill) -> SlotCheck:
    """A trial of UNSLOTTED_STEPS steps called without state_batch_indices, judged as a case is: for a case whose
    every trial decoded through slot indices (a round-to-nearest case's one trial, where the coin of
    lockstep.slotted_from fell so), which would otherwise never call the kernel's path for a plain batch. Its trial
    is the case's first whose coin falls the other way, so its rounding seed is that trial's."""
    trial = next(t for t in range(2) if slotted_from(case, kernel, t, case.batch) is None)
    short = replace(case, steps=min(case.steps, UNSLOTTED_STEPS))
    said = f"without slot indices (trial {trial}, {short.steps} steps called without state_batch_indices)"
    figures = {"trial": trial, "steps": short.steps}
    try:
        run = decode(short, kernel, device, lambda: None, transcript, prefill=prefill, trials=[trial])
    except KernelRaised as exc:
        return SlotCheck("unslotted", Status.ERROR, f"{said}: {exc}", figures)
    verdict = judge(short, run, tolerance, allow_nondeterministic)
    message = f"{said}: {verdict.message}" if verdict.status is not Status.PASS else ""
    return SlotCheck("unslotted", verdict.status, message, figures)


@contextmanager
def _one_cpu_thread(device: str) -> Iterator[None]:
    """Decode-step tensors are small: on the CPU, torch's intra-op threads cost more in
    synchronisation than they save (milliseconds per op once another process holds a core)."""
    if device != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def decode(case: DriftCase, kernel: DriftAdapter, device: str, on_step: Callable[[], None],
           transcript: Transcript, repeat: int = 1, prefill=None, trials: list[int] | None = None) -> DriftRun:
    """Run the case's trials (or those numbered in `trials`), adding what the kernel prints to `transcript`; raises
    KernelRaised when the kernel (or the prefill) does."""
    problem = make_problem(case.regime, case.shape(), case.dtype, case.steps, case.seed, device)
    if case.from_prefill:
        from ssmcheck.drift.prefill import prefilled  # noqa: PLC0415 (imports the chunk scan's stages)

        problem = prefilled(problem, case, prefill, transcript)
    with _one_cpu_thread(device):
        return _decode(case, problem, kernel, device, on_step, transcript, repeat,
                       range(case.trials) if trials is None else trials)


def _decode(case: DriftCase, problem, kernel: DriftAdapter, device: str, on_step: Callable[[], None],
            transcript: Transcript, repeat: int, numbered) -> DriftRun:
    checkpoints = log_checkpoints(problem.nsteps)
    kernel_sums, baseline_sums = CheckpointSums(), CheckpointSums()
    store_errors = SignedErrorMoments()
    window = StepWindow(problem, prefetch.taken(case))
    graph, eager_note = _graph_plan(device, repeat, kernel)
    found, differs, max_abs, trials, loop, slotted = None, None, 0.0, 0, None, []
    for trial in numbered:
        trials += 1
        trial_seed = sweep.case_seed(case.seed, {"trial": trial})
        torch.manual_seed(trial_seed)  # for callables that draw their random bits from torch
        lock = Lockstep(case, problem, window, kernel, trial, trial_seed, transcript, store_errors, repeat)
        lock.graph_note = eager_note
        found = _trial(lock, checkpoints, kernel_sums, baseline_sums, on_step, graph)
        differs = differs or lock.differs
        loop = loop or lock.decode_loop
        if lock.slots is not None:
            slotted.append(trial)
        max_abs = max(max_abs, lock.max_abs)
        if found is not None:
            break
    summary = StoreErrors(store_errors.count, store_errors.mean, store_errors.z, store_errors.rms,
                          store_errors.subnormal, store_errors.flushed, store_errors.resolution,
                          store_errors.misrounded, store_errors.most_misrounded(), store_errors.mean_up,
                          store_errors.z_up)
    repeated = None
    if repeat > 1:
        repeated = RepeatDifference(repeat, differs is None, max_abs, **(differs or {}))
    return DriftRun(kernel_sums.means(), baseline_sums.means(), summary, found, trials, repeated, loop,
                    kernel_sums.output_bias(), baseline_sums.output_bias(), tuple(slotted))


def _graph_plan(device: str, repeat: int, kernel: DriftAdapter) -> tuple[bool, str]:
    """(whether a trial tries to run its steps as CUDA graph replays, its decode_loop until it does)."""
    if device != "cuda":
        return False, "eager"
    if repeat > 1:
        return False, "eager: --repeat compares every step's runs"
    if not kernel.graphable:
        return False, "eager: a MODULE:FUNCTION kernel may keep state between calls, which a graph would freeze"
    return True, "eager"


def _trial(lock: Lockstep, checkpoints: list[int], kernel_sums: CheckpointSums, baseline_sums: CheckpointSums,
           on_step: Callable[[], None], graph: bool) -> NonfiniteStep | None:
    """Run one trial to the end, or to the first non-finite value it finds (returned). The inputs are
    checked at the first step and the checkpoints (eager steps). Without a graph every step is read
    back; with one, the device is read at the checkpoints only, between them the steps run RUN_STEPS to a replay
    where they can (Lockstep.advance_run), and a non-finite value is found by running the steps since the last
    checkpoint again (a graph replays exactly what it did; an eager
    call of a kernel that keeps state of its own between calls need not)."""
    saved = lock.saved()
    for checkpoint in checkpoints:
        while lock.step < checkpoint:
            if graph and lock.step == 1 and lock.graph is None:
                graph = False  # tried once per trial
                lock.try_graph()
            elif lock.step + RUN_STEPS < checkpoint and lock.run_fits():  # (the step before a checkpoint is fenced)
                for _ in range(lock.advance_run()):  # none where the run was not captured: eager from here
                    on_step()
                continue
            else:
                lock.advance(check_inputs=lock.step == 0 or lock.step + 1 == checkpoint)
            on_step()
            if lock.graph is None and lock.went_nonfinite():  # every step so far eager: this one went bad
                return _located(lock, kernel_sums, baseline_sums)
        if not lock.went_nonfinite():
            _measure(lock, kernel_sums, baseline_sums)
        elif (found := _localise(lock, saved, checkpoint, kernel_sums, baseline_sums)) is not None:
            return found
        else:  # not again (a kernel whose output changes between identical runs): carry on from here
            lock.tripped.zero_()
        saved = lock.saved()
    return None


def _localise(lock: Lockstep, saved, checkpoint: int, kernel_sums: CheckpointSums,
              baseline_sums: CheckpointSums) -> NonfiniteStep | None:
    """The first non-finite step after `saved`: the steps to `checkpoint` again, read back one by one (None,
    the checkpoint measured, when none goes non-finite this time)."""
    lock.restore(saved)
    while lock.step < checkpoint:
        lock.advance(check_inputs=lock.step + 1 == checkpoint)  # fenced where _trial fenced it
        if lock.went_nonfinite():
            return _located(lock, kernel_sums, baseline_sums)
    _measure(lock, kernel_sums, baseline_sums)
    return None


def _located(lock: Lockstep, kernel_sums: CheckpointSums, baseline_sums: CheckpointSums) -> NonfiniteStep | None:
    """Where the step just run went non-finite, measured like a checkpoint."""
    out, ref_out = lock.outputs[:2]
    _measure(lock, kernel_sums, baseline_sums)
    found = first_nonfinite(lock.state.double(), out, lock.ref, ref_out, lock.step, lock.trial)
    return found and replace(found, reads_outside=lock.reads_outside())


def _measure(lock: Lockstep, kernel_sums: CheckpointSums, baseline_sums: CheckpointSums) -> None:
    out, ref_out, baseline_out, exact_out = lock.outputs
    kernel_sums.add(lock.step, figures(lock.state.double(), out, lock.ref, ref_out, exact_out, out.dtype), out.dtype)
    baseline_sums.add(lock.step, figures(lock.baseline, output_rounded(baseline_out, out.dtype), lock.ref, ref_out,
                                         baseline_out, out.dtype), out.dtype)


@dataclass(frozen=True)
class DriftRunner:
    """What running drift cases takes, as plain values: picklable, so a worker process can run them."""

    kernel: str  # the --kernel value
    tolerance: Tolerance
    device: str  # "cpu" or "cuda"
    interpreter: bool
    philox_rounds: int
    rounding_impl: str
    repeat: int = 1  # runs of every decode step from the same state, compared bit for bit
    allow_nondeterministic: bool = False  # the kernel declares itself nondeterministic: differences pass
    prefill_kernel: str | Callable | None = None  # the chunk scan of --from-prefill

    def adapter(self) -> DriftAdapter:
        """The kernel's adapter, resolved once per process. Raises core.callables.KernelSpecError."""
        if self not in _ADAPTERS:
            _ADAPTERS[self] = resolve(self.kernel, self.philox_rounds, self.rounding_impl, self.interpreter)
        return _ADAPTERS[self]

    def autotuned(self) -> list:
        """The kernel's autotuned functions (core.autotune)."""
        return autotune.find(self.adapter().fn)

    def prefill(self):
        """The chunk scan's adapter for --from-prefill (None without), resolved once per process. Raises
        core.callables.KernelSpecError."""
        if self.prefill_kernel is None:
            return None
        if self not in _PREFILLS:
            from ssmcheck.scan.adapter import resolve as resolve_scan  # noqa: PLC0415

            _PREFILLS[self] = resolve_scan(self.prefill_kernel, self.interpreter)
        return _PREFILLS[self]

    @staticmethod
    def prepare(case: DriftCase) -> None:
        """Start drawing the inputs of `case`, the next to run in this process, while this one runs
        (drift.prefetch)."""
        prefetch.start(case)

    def __call__(self, case: DriftCase, advance: Callable[[], None]) -> DriftResult:
        """Run one case, calling `advance` once per decode step, its autotune config pinned
        (core.autotune.pins)."""
        with autotune.pinned(autotune.pins(self.autotuned(), case.config, self.interpreter)) as bypassed:
            result = run_case(case, self.adapter(), self.tolerance, self.device, on_step=advance, repeat=self.repeat,
                              allow_nondeterministic=self.allow_nondeterministic, prefill=self.prefill())
        if bypassed and result.status is not Status.SKIPPED:
            return replace(result, verdict=replace(result.verdict, status=Status.ERROR,
                                                   message=autotune.bypassed_message(bypassed, result.verdict.message)))
        return result

    def failed(self, case: DriftCase, message: str, seconds: float) -> DriftResult:
        """The result of a case that ended without one of its own (its worker crashed or timed out)."""
        return DriftResult(case, error_verdict(message), seconds, None)

    # A case compiles nothing its compile group's first case did not (tests/test_drift_ahead.py traces it): the
    # helpers leave out the groups the sweep's processes keep (api.start_compiling_ahead).
    groups_exact = True

    @staticmethod
    def compile_group(case: DriftCase) -> tuple:
        """What picks the variants a case compiles (drift.ahead.compile_group): a compiling helper takes such a
        group whole (core.isolation.CompilingHelpers), and workers take the groups in turn."""
        return ahead.compile_group(case)

    def precompile(self, cases: list[DriftCase], threads: int) -> Launches | None:
        """On a GPU, compile the Triton kernels and the float64 steps the cases will run before they run, Triton's
        in `threads` threads at once (COMPILE_THREADS at most) (drift.ahead; in a helper process only); None where
        nothing is compiled ahead (the CPU's interpreter compiles nothing)."""
        if self.device != "cuda" or self.interpreter:
            return None
        return ahead.compile_ahead(self, cases, min(threads, COMPILE_THREADS))


# Per process: a worker resolves its runner's adapter (importing the kernel) at its first case.
_ADAPTERS: dict[DriftRunner, DriftAdapter] = {}
_PREFILLS: dict[DriftRunner, object] = {}
