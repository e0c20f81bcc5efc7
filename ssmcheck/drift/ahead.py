"""Compiling a drift sweep's kernels ahead, in a compiling helper process (core.isolation.CompilingHelpers).

A first default drift on a fresh H200 spent most of its 229 s compiling (thirty-ninth session): 27 variants of the
compiled float64 step (drift.follow: 57 s of torch.compile), and the state update's Triton variants, 4-10 s a
stochastic-rounding case. A helper rehearses each case of its slice: the case itself, cut to REHEARSED_STEPS steps
and one trial, with every Triton launch made compile-only (core.precompile), so that the kernel's variants and those
of the float64 step's Triton kernel (drift.follow_kernel, launched once by drift.follow.Follower, which then goes on
eagerly: nothing a compile-only launch returns can be checked) go to Triton's disk cache, where the sweep's process
loads them at the case's first step instead of compiling them. torch.compile's float64 step, the fallback where the
Triton one disagrees, is not compiled ahead. Verdicts of a rehearsal, of nothing computed, are thrown away:
its kernel leaves its output as the NaN it was filled with, so its first step is found non-finite, and the
localisation, the slot check and the independence check that follow (drift.run.run_case) call the kernel as the
case will; NaN fences keep the alignment Triton specialises on, so the fenced calls compile what the graph's
calls launch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace

import torch

from ssmcheck.core.precompile import Launches, compile_only
from ssmcheck.drift.regimes import make_problem
from ssmcheck.drift.spec import DriftCase

# Batch rows of the problem `compile_group` draws: its layouts are those of the case's, but for the batch (which
# joins the group as the case's number); a problem drawn whole for a `--model mamba2-2.7b --batch 256` case holds
# 168M elements of initial state.
GROUP_BATCH = 2
# Steps of a rehearsal: the first step is checked (its inputs fenced), the second is a graph's step.
REHEARSED_STEPS = 2


def rehearsal(case: DriftCase) -> DriftCase:
    """`case` cut short for compiling ahead: its shapes, dtypes, regime and rounding, no prefill (it sets the
    initial state's values only), one trial of REHEARSED_STEPS steps."""
    return replace(case, steps=min(case.steps, REHEARSED_STEPS), trials=1, from_prefill=0)


def compile_ahead(run: Callable, cases: list[DriftCase], threads: int) -> Launches:
    """Rehearse `cases` (run(case, advance) runs one: a DriftRunner) inside compile_only with `threads` compiling
    threads, until the first calls find every Triton variant, the kernel's and the float64 step's, in the cache
    (Launches.cache_warm). In a helper process only (core.precompile says why)."""
    with compile_only(threads) as launches:
        for case in cases:
            if not launches.supported or (launches.count and launches.cache_warm()):
                break
            if case.skip_reason is None:
                run(rehearsal(case), lambda: None)  # a kernel or check that raises is the case's to report
            launches.call_done()
    return launches


# A sweep on a GPU asks for each case's group two or three times as it starts (api._left_to_helpers,
# core.isolation._shares, api.interleaved), each a problem drawn: ~0.1 s a pass over the default drift.
@functools.lru_cache(maxsize=4096)
def compile_group(case: DriftCase) -> tuple:
    """What picks the variants a case compiles: the float64 step's (drift.follow: its Triton kernel specialises on
    its flags and its arguments' dtypes and strides; torch.compile's step, its fallback, on their dtypes, shapes and
    strides too) and the state update's Triton variants (dtypes, strides divisible by 16 or not, constexprs). That
    is the kernel, its pinned config, the rounding mode, the batch and the regime's flags (the parameters it leaves
    out among them), and the (dtype, shape, stride) of the state, A, D, dt_bias and each step input, read off the
    case's problem drawn for one step on the CPU (at most GROUP_BATCH batch rows). Cases of one group compile the
    same variants: a compiling helper takes a group whole, so that no two compile them, and the sweep's front, which
    the helpers race, is spread among them (core.isolation.CompilingHelpers). The default drift on a GPU has 27
    groups, as torch.compile compiled 27 graphs of its float64 step (benchmarks/RESULTS.md, fortieth session).
    Skipped cases compile nothing: one group, their problems not drawn (a skip may be for a problem that cannot be
    drawn)."""
    if case.skip_reason is not None:
        return ("skipped",)
    shape = replace(case.shape(), batch=min(case.batch, GROUP_BATCH))
    problem = make_problem(case.regime, shape, case.dtype, 1, case.seed, "cpu")
    step = problem.host_inputs(0, 1)
    tensors = [problem.initial_state, problem.A, problem.D, problem.dt_bias]
    return (case.kernel, case.config, case.rounding, case.batch, problem.dt_softplus, problem.fused, problem.absent,
            *map(_layout, tensors), *((name, _layout(value[0])) for name, value in step.given()))


def _layout(tensor: torch.Tensor) -> tuple:
    return tensor.dtype, tuple(tensor.shape), tensor.stride()
