"""Running and judging one drift case (the measurement is drift_measure's, the verdict drift_verdict's)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ssmcheck.drift_kernels import StateUpdateKernel
from ssmcheck.drift_measure import DriftRun, KernelRaised, measure
from ssmcheck.drift_spec import DriftCase
from ssmcheck.drift_verdict import DriftVerdict, error_verdict, judge, skipped_verdict
from ssmcheck.verdict import Status, Tolerance


@dataclass(frozen=True)
class DriftResult:
    case: DriftCase
    verdict: DriftVerdict
    seconds: float
    run: DriftRun | None  # None when skipped or the kernel raised

    @property
    def status(self) -> Status:
        return self.verdict.status


def run_case(
    case: DriftCase,
    kernel: StateUpdateKernel,
    tolerance: Tolerance,
    device: str,
    on_step: Callable[[], None] = lambda: None,
) -> DriftResult:
    """Measure and judge one case (a skipped case only gets its reason)."""
    if case.skip_reason is not None:
        return DriftResult(case, skipped_verdict(case.skip_reason), 0.0, None)
    start = time.perf_counter()
    try:
        run = measure(case, kernel, device, on_step)
    except KernelRaised as exc:
        return DriftResult(case, error_verdict(str(exc)), time.perf_counter() - start, None)
    return DriftResult(case, judge(case, run, tolerance), time.perf_counter() - start, run)
