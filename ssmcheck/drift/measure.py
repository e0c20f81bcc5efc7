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
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ssmcheck import sweep
from ssmcheck.drift_kernels import StateUpdateKernel
from ssmcheck.drift_regimes import make_problem
from ssmcheck.drift_spec import DriftCase
from ssmcheck.drift_stats import SignedErrorMoments, log_checkpoints, ulp
from ssmcheck.ops.rounding.naive import round_to
from ssmcheck.ops.state_update.naive import state_update_step


@dataclass(frozen=True)
class Checkpoint:
    step: int
    state_rel: float  # ||state - ref|| / ||ref||, mean over trials
    out_rel: float  # ||out - ref_out|| / ||ref_out||, mean over trials
    bias: float  # mean of sign(ref) * (state - ref), over elements and trials, / rms(ref)


@dataclass(frozen=True)
class NonfiniteLocation:
    output: str  # "state" or "out"
    step: int
    trial: int
    batch: int
    head: int
    channel: int
    state_index: int | None  # None for out


@dataclass(frozen=True)
class DriftRun:
    checkpoints: list[Checkpoint]  # the kernel against the reference
    baseline: list[Checkpoint]  # the baseline against the reference
    store_errors: SignedErrorMoments  # per-store rounding error of the kernel, ulps, along the exact value
    first_nonfinite: NonfiniteLocation | None
    trials: int  # trials run


class KernelRaised(Exception):
    """The kernel under test raised (or returned something that is not its output)."""


class _CheckpointSums:
    """Per-step sums of (state_rel, out_rel, bias) over trials."""

    def __init__(self):
        self.sums: dict[int, list[float]] = {}

    def add(self, step: int, figures: list[float]) -> None:
        entry = self.sums.setdefault(step, [0.0, 0.0, 0.0, 0])
        for i, value in enumerate(figures):
            entry[i] += value
        entry[3] += 1

    def means(self) -> list[Checkpoint]:
        return [Checkpoint(step, s / n, o / n, b / n) for step, (s, o, b, n) in sorted(self.sums.items())]


def _relative(diff: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    num, den = torch.linalg.vector_norm(diff), torch.linalg.vector_norm(ref)
    return torch.where(den > 0, num / den, torch.where(num == 0, 0.0, torch.inf).to(num))


def _figures(state64, out, ref, ref_out) -> list[float]:
    """(state_rel, out_rel, bias) of a state and output against the reference, one transfer."""
    diff = state64 - ref
    bias = (torch.sign(ref) * diff).mean() / ref.square().mean().sqrt().clamp_min(torch.finfo(torch.float64).tiny)
    return torch.stack([_relative(diff, ref), _relative(out.double() - ref_out, ref_out), bias]).tolist()


def _first_nonfinite(state, out, ref, ref_out, step: int, trial: int) -> NonfiniteLocation | None:
    masks = [(name, ~torch.isfinite(value) & torch.isfinite(truth))
             for name, value, truth in (("state", state, ref), ("out", out, ref_out))]
    # Runs every decode step: one read-back decides; locating is only for the step that went bad.
    if not torch.stack([bad.any() for _, bad in masks]).any().item():
        return None
    for name, bad in masks:
        flat = bad.flatten().nonzero()
        if flat.numel():
            coords = [int(i) for i in torch.unravel_index(flat[0, 0], bad.shape)]
            return NonfiniteLocation(name, step, trial, *coords[:3], coords[3] if name == "state" else None)
    return None


def _call_kernel(kernel: StateUpdateKernel, state, problem, step, rounding, seed, where: str) -> torch.Tensor:
    try:
        out = kernel(state, problem, step, rounding, seed)
    except Exception as exc:  # any failure of the kernel under test is its verdict, not ours
        raise KernelRaised(f"{type(exc).__name__}: {exc} ({where})") from exc
    if not isinstance(out, torch.Tensor) or out.shape != step.x.shape:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise KernelRaised(f"the kernel returned {got}, expected out of shape {tuple(step.x.shape)} ({where})")
    return out


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


def measure(case: DriftCase, kernel: StateUpdateKernel, device: str, on_step: Callable[[], None]) -> DriftRun:
    """Run the case's trials; raises KernelRaised when the kernel does."""
    with _one_cpu_thread(device):
        return _measure(case, kernel, device, on_step)


def _measure(case: DriftCase, kernel: StateUpdateKernel, device: str, on_step: Callable[[], None]) -> DriftRun:
    problem = make_problem(case.regime, case.shape(), case.dtype, case.steps, case.seed, device)
    fixed = {"D": problem.D.double(), "dt_bias": problem.dt_bias.double(), "dt_softplus": problem.dt_softplus}
    A64 = problem.A.double()
    checkpoint_steps = set(log_checkpoints(problem.nsteps))
    kernel_sums, baseline_sums = _CheckpointSums(), _CheckpointSums()
    store_errors = SignedErrorMoments()
    first_nonfinite = None
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
            out = _call_kernel(kernel, state, problem, step, case.rounding, seed, f"trial {trial}, step {n}")
            after = state.double()
            exact, _ = state_update_step(before, *inputs64, **fixed)
            store_errors.add(torch.sign(exact) * (after - exact) / ulp(exact, case.dtype))
            on_step()

            first_nonfinite = _first_nonfinite(after, out, ref, ref_out, n, trial)
            if first_nonfinite is not None or n in checkpoint_steps:
                kernel_sums.add(n, _figures(after, out, ref, ref_out))
                baseline_sums.add(n, _figures(baseline, baseline_out, ref, ref_out))
            if first_nonfinite is not None:
                break
        if first_nonfinite is not None:
            break
    return DriftRun(kernel_sums.means(), baseline_sums.means(), store_errors, first_nonfinite, trials)
