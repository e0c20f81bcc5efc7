"""The row-independence check of a stochastic-rounding drift case: two batch rows given the same state and the
same inputs must round with random bits of their own.

Ideal stochastic rounding draws a fresh uniform for every element of every row. A kernel whose random offsets
leave the batch row out (Philox counters from the head, channel and state index only, or a seed per program
that repeats across rows) rounds every row with the same bits: each row on its own is exact stochastic
rounding, so the bias test and the drift see nothing, but the rows' rounding errors are one and the same, and
a batch of sequences decoding alike drifts alike.

One step, the case's regime, state dtype and kernel call, on a batch of 2 whose row 1 is a copy of row 0
(state and every step input). An element whose float64 update lies a fraction p of the way from its lower to
its upper neighbour in the state dtype is stored differently by two independent draws with probability
q = 2p(1 - p): over the row's elements the number that differ has mean E = Σq and variance V = Σq(1 - q).
Fewer than E - SIGMAS·√V differing elements fails (`rows 0 and 1, given the same state and inputs, stored the
same bits in 2043 of 2048 elements where independent draws differ in 683 ± 21`). Where E < MIN_EXPECTED
(states the step leaves representable: stagnation, extreme decays) the check cannot tell and passes with its
figures. The rows' values themselves are the decode's to judge, not this check's.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from ssmcheck.core import sweep
from ssmcheck.core.capture import Transcript
from ssmcheck.core.status import Status
from ssmcheck.core.tensors import bits
from ssmcheck.drift.adapter import DriftAdapter, KernelRaised
from ssmcheck.drift.regimes import make_problem
from ssmcheck.drift.results import SlotCheck
from ssmcheck.drift.spec import DriftCase
from ssmcheck.ops.rounding.naive import fraction_between_neighbours
from ssmcheck.ops.state_update.naive import state_update_step

NAME, TITLE = "independence", "rows' random bits"
# Independent rows differ in fewer than E - 6 sigma elements with probability below 1e-9 (normal tail; E is a
# sum of hundreds of independent Bernoulli variables at the smallest widths that reach MIN_EXPECTED).
SIGMAS = 6.0
MIN_EXPECTED = 36.0


def run_check(case: DriftCase, kernel: DriftAdapter, device: str, transcript: Transcript) -> SlotCheck:
    """The verdict of `case` (a stochastic-rounding one) for `kernel`."""
    seed = sweep.case_seed(case.seed, {"check": NAME})
    problem = make_problem(case.regime, replace(case.shape(), batch=2), case.dtype, 1, seed, device)
    step = next(problem.steps())
    arguments = {"z": None, **dict(step.map(lambda _, t: _row_0_twice(t)).given()), "A": problem.A,
                 "D": problem.D, "dt_bias": problem.dt_bias, "dt_softplus": problem.dt_softplus}
    state = _row_0_twice(problem.initial_state)
    before = state.double()
    try:
        kernel.update(state, arguments, case.rounding, sweep.case_seed(seed, {"step": 1}), "row-independence check",
                      transcript)
    except KernelRaised as exc:
        return SlotCheck(NAME, Status.ERROR, f"{TITLE}: {exc}")
    exact, _ = state_update_step(before[:1], *(arguments[k][:1].double() for k in ("x", "dt")),
                                 problem.A.double(), arguments["B"][:1].double(), arguments["C"][:1].double(),
                                 D=problem.D.double(), z=None if arguments["z"] is None else arguments["z"][:1].double(),
                                 dt_bias=problem.dt_bias.double(), dt_softplus=problem.dt_softplus)
    p = fraction_between_neighbours(exact[0], case.dtype)
    q = 2 * p * (1 - p)
    expected, spread = q.sum().item(), math.sqrt((q * (1 - q)).sum().item())
    differ = int((bits(state[0]) != bits(state[1])).sum())
    figures = {"elements": state[0].numel(), "differ": differ, "expected": round(expected, 1),
               "sigma": round(spread, 2)}
    if expected < MIN_EXPECTED or differ >= expected - SIGMAS * spread:
        return SlotCheck(NAME, Status.PASS, "", figures)
    same = figures["elements"] - differ
    return SlotCheck(NAME, Status.FAIL, f"{TITLE}: rows 0 and 1, given the same state and inputs, stored the same "
                     f"bits in {same} of {figures['elements']} elements where independent draws differ in "
                     f"{figures['expected']:.0f} ± {figures['sigma']:.0f} (the stochastic rounding's random bits do not depend on the "
                     "batch row)", figures)


def _row_0_twice(t: torch.Tensor) -> torch.Tensor:
    """Two rows, each row 0 of `t`, in a storage of their own; a stride-0 last axis (dt's per head) kept so."""
    if t.stride(-1) == 0:
        return t[:1, ..., :1].repeat(2, *[1] * (t.dim() - 1)).expand(2, *t.shape[1:])
    return t[:1].repeat(2, *[1] * (t.dim() - 1))
