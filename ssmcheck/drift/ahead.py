"""Compiling a drift sweep's kernels ahead, in a compiling helper process (core.isolation.CompilingHelpers).

A first default drift on a fresh H200 spent most of its 229 s compiling (thirty-ninth session): 27 variants of the
compiled float64 step (drift.follow: 57 s of torch.compile), and the state update's Triton variants, 4-10 s a
stochastic-rounding case. A helper rehearses each case of its slice: the case itself, cut to REHEARSED_STEPS steps
and one trial, with every Triton launch made compile-only (core.precompile), so that the kernel's variants go to
Triton's disk cache, and the float64 step compiled for real on what it is given, so that its variants go to
torch.compile's caches on disk (inductor's FX graph and AOT autograd caches), where the sweep's process loads them
at the case's first step instead of compiling them. Verdicts of a rehearsal, of nothing computed, are thrown away:
its kernel leaves its output as the NaN it was filled with, so its first step is found non-finite, and the
localisation, the slot check and the independence check that follow (drift.run.run_case) call the kernel as the
case will; NaN fences keep the alignment Triton specialises on, so the fenced calls compile what the graph's
calls launch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ssmcheck.core.precompile import Launches, compile_only
from ssmcheck.drift.spec import DriftCase

# Steps of a rehearsal: the first step is checked (its inputs fenced), the second is a graph's step.
REHEARSED_STEPS = 2


def rehearsal(case: DriftCase) -> DriftCase:
    """`case` cut short for compiling ahead: its shapes, dtypes, regime and rounding, no prefill (it sets the
    initial state's values only), one trial of REHEARSED_STEPS steps."""
    return replace(case, steps=min(case.steps, REHEARSED_STEPS), trials=1, from_prefill=0)


def compile_ahead(run: Callable, cases: list[DriftCase], threads: int) -> Launches:
    """Rehearse `cases` (run(case, advance) runs one: a DriftRunner) inside compile_only with `threads` compiling
    threads, until the first calls find every Triton variant in the cache (Launches.cache_warm; a kernel that
    launches nothing through Triton is rehearsed to the end, for the float64 steps). In a helper process only
    (core.precompile says why)."""
    with compile_only(threads) as launches:
        for case in cases:
            if not launches.supported or (launches.count and launches.cache_warm()):
                break
            if case.skip_reason is None:
                run(rehearsal(case), lambda: None)  # a kernel or check that raises is the case's to report
            launches.call_done()
    return launches
