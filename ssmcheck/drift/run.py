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

`DriftRunner` is the same as a picklable value, so a worker process (core.isolation)
can rebuild the kernel's adapter and run cases itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ssmcheck.core import autotune, sweep
from ssmcheck.core.capture import Transcript
from ssmcheck.core.formats import ulp
from ssmcheck.core.tolerance import Tolerance
from ssmcheck.drift import slots
from ssmcheck.drift.adapter import DriftAdapter, KernelRaised, resolve
from ssmcheck.drift.measure import CheckpointSums, figures, first_difference, first_nonfinite
from ssmcheck.drift.regimes import make_problem
from ssmcheck.drift.results import DriftResult, DriftRun, RepeatDifference, StoreErrors
from ssmcheck.drift.spec import DriftCase
from ssmcheck.drift.stats import SignedErrorMoments, log_checkpoints
from ssmcheck.drift.verdict import error_verdict, judge, skipped_verdict
from ssmcheck.ops.rounding.naive import round_to
from ssmcheck.ops.state_update.naive import state_update_step


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
    takes slot indices, the padded-slot check (drift.slots) runs too and is folded into the verdict."""
    if case.skip_reason is not None:
        return DriftResult(case, skipped_verdict(case.skip_reason), 0.0, None)
    start = time.perf_counter()
    transcript = Transcript()
    try:
        run = decode(case, kernel, device, on_step, transcript, repeat, prefill)
    except KernelRaised as exc:
        return DriftResult(case, error_verdict(str(exc)), time.perf_counter() - start, None, transcript.text)
    verdict = judge(case, run, tolerance, allow_nondeterministic)
    checks, layout = [], None
    if kernel.pad_slot_id is not None:  # a kernel that takes slot indices: the padded-slot check
        checks, layout = slots.run_check(case, kernel, tolerance, device, transcript)
        verdict = slots.combine(verdict, checks)
    return DriftResult(case, verdict, time.perf_counter() - start, run, transcript.text, tuple(checks), layout)


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
           transcript: Transcript, repeat: int = 1, prefill=None) -> DriftRun:
    """Run the case's trials, adding what the kernel prints to `transcript`; raises KernelRaised
    when the kernel (or the prefill) does."""
    problem = make_problem(case.regime, case.shape(), case.dtype, case.steps, case.seed, device)
    if case.from_prefill:
        from ssmcheck.drift.prefill import prefilled  # noqa: PLC0415 (imports the chunk scan's stages)

        problem = prefilled(problem, case, prefill, transcript)
    with _one_cpu_thread(device):
        return _decode(case, problem, kernel, device, on_step, transcript, repeat)


def _decode(case: DriftCase, problem, kernel: DriftAdapter, device: str, on_step: Callable[[], None],
            transcript: Transcript, repeat: int) -> DriftRun:
    fixed = {"D": problem.D.double(), "dt_bias": problem.dt_bias.double(), "dt_softplus": problem.dt_softplus}
    A64 = problem.A.double()
    checkpoint_steps = set(log_checkpoints(problem.nsteps))
    kernel_sums, baseline_sums = CheckpointSums(), CheckpointSums()
    store_errors = SignedErrorMoments()
    found = None
    differs, max_abs = None, 0.0  # with repeat > 1: where runs first differed, and by how much at most
    trials = 0
    for trial in range(case.trials):
        trials += 1
        trial_seed = sweep.case_seed(case.seed, {"trial": trial})
        torch.manual_seed(trial_seed)  # for callables that draw their random bits from torch
        baseline_bits = torch.Generator(device=device).manual_seed(trial_seed)
        state = problem.initial_state.clone()
        ref = state.double()
        baseline = ref.clone()
        for n, step in enumerate(problem.steps(), start=1):
            inputs64 = (step.x.double(), step.dt.double(), A64, step.B.double(), step.C.double())
            ref, ref_out = state_update_step(ref, *inputs64, **fixed)
            baseline_exact, baseline_out = state_update_step(baseline, *inputs64, **fixed)
            baseline = round_to(baseline_exact, case.dtype, case.rounding, baseline_bits).double()

            before = state.double()
            seed = sweep.case_seed(trial_seed, {"step": n})
            saved = state.clone() if repeat > 1 else None
            out = kernel.call(state, problem, step, case.rounding, seed, f"trial {trial}, step {n}",
                              check_inputs=n == 1 or n in checkpoint_steps, transcript=transcript)
            for run in range(2, repeat + 1):  # the same step again, from the same state, inputs and seed
                again = saved.clone()
                again_out = kernel.call(again, problem, step, case.rounding, seed,
                                        f"trial {trial}, step {n}, run {run}", transcript=transcript)
                difference = first_difference((state, out), (again, again_out))
                if difference is not None:
                    output, index, largest = difference
                    max_abs = max(max_abs, largest)
                    if differs is None:
                        differs = dict(run=run, output=output, trial=trial, step=n, batch=index[0], head=index[1],
                                       channel=index[2])
            after = state.double()
            exact, _ = state_update_step(before, *inputs64, **fixed)
            store_errors.add(torch.sign(exact) * (after - exact) / ulp(exact, case.dtype))
            on_step()

            found = first_nonfinite(after, out, ref, ref_out, n, trial)
            if found is not None or n in checkpoint_steps:
                kernel_sums.add(n, figures(after, out, ref, ref_out))
                baseline_sums.add(n, figures(baseline, baseline_out, ref, ref_out))
            if found is not None:
                break
        if found is not None:
            break
    summary = StoreErrors(store_errors.count, store_errors.mean, store_errors.z)
    repeated = None
    if repeat > 1:
        repeated = RepeatDifference(repeat, differs is None, max_abs, **(differs or {}))
    return DriftRun(kernel_sums.means(), baseline_sums.means(), summary, found, trials, repeated)


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

    def __call__(self, case: DriftCase, advance: Callable[[], None]) -> DriftResult:
        """Run one case, calling `advance` once per decode step, its autotune config pinned
        (core.autotune.pins)."""
        with autotune.pinned(autotune.pins(self.autotuned(), case.config, self.interpreter)):
            return run_case(case, self.adapter(), self.tolerance, self.device, on_step=advance, repeat=self.repeat,
                            allow_nondeterministic=self.allow_nondeterministic, prefill=self.prefill())

    def failed(self, case: DriftCase, message: str, seconds: float) -> DriftResult:
        """The result of a case that ended without one of its own (its worker crashed or timed out)."""
        return DriftResult(case, error_verdict(message), seconds, None)


# Per process: a worker resolves its runner's adapter (importing the kernel) at its first case.
_ADAPTERS: dict[DriftRunner, DriftAdapter] = {}
_PREFILLS: dict[DriftRunner, object] = {}
