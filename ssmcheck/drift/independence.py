"""The independence check of a stochastic-rounding drift case: state elements given the same value must round
with random bits of their own, along every axis of the state.

Ideal stochastic rounding draws a fresh uniform for every element. A kernel whose random offsets leave an axis
out (Philox counters from the head, channel and state index but not the batch row; one draw per program shared
by its channels; the same offsets for every head) rounds the elements along that axis with the same bits: each
element on its own is exact stochastic rounding, so the bias test and the drift see nothing, but their rounding
errors are one and the same, and what decodes alike drifts alike.

One step, the case's regime, state dtype and kernel call, on inputs made of twins: a batch of 2 whose row 1 is a
copy of row 0 (state and every step input), and within it heads, channels and state indices in pairs, 2k + 1 a
copy of 2k (its state, inputs and parameters; every group's B and C group 0's, so that twin heads read the same
ones). The pairs along each axis (AXES: rows, heads, channels, state indices) are compared apart. An element
whose float64 update lies a fraction p of the way from its lower to its upper neighbour in the state dtype is
stored differently by two independent draws with probability q = 2p(1 - p): over an axis's pairs the number
that differ has mean E = Σq (the message gives √(Σq(1 - q)) beside it). So few that independent draws differ
that rarely with probability below FALSE_ALARM (Chernoff's bound on the lower tail: e^-E (eE/k)^k for k < E
differing) fails, and the message has a clause per axis that does (`random bits: twin batch rows (given the
same state and inputs) stored the same bits in 256 of 256 elements where independent draws differ in 88 ± 7:
the stochastic rounding's random bits do not depend on the batch row`; where some twins differ, but too few:
`... are correlated across channels`). Where E is small (below 21 even none differing passes: an axis of one
element, states the step leaves representable) that axis cannot tell, and passes with its figures. The values
themselves are the decode's to judge, not this check's.
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

NAME, TITLE = "independence", "random bits"
# The chance, at most, that independent twins differ as rarely as a failing axis's did (per axis and case).
FALSE_ALARM = 1e-9
# The axes compared, each as (its name in the message, what a kernel's bits then do not depend on), by the axis
# of the state (batch, nheads, headdim, dstate).
AXES = {"rows": ("batch rows", "the batch row"), "heads": ("heads", "the head"),
        "channels": ("channels", "the channel"), "state_indices": ("state indices", "the state index")}
# Where each axis lies in each input: (batch, heads, channels, state indices); None where it has none. A, D and
# dt_bias are parameters (no batch axis); B and C have groups for heads (made one group's, below).
_INPUT_AXES = {
    "state": (0, 1, 2, 3), "x": (0, 1, 2, None), "dt": (0, 1, 2, None), "z": (0, 1, 2, None),
    "B": (0, None, None, 2), "C": (0, None, None, 2),
    "A": (None, 0, 1, 2), "D": (None, 0, 1, None), "dt_bias": (None, 0, 1, None),
}


def run_check(case: DriftCase, kernel: DriftAdapter, device: str, transcript: Transcript) -> SlotCheck:
    """The verdict of `case` (a stochastic-rounding one) for `kernel`."""
    seed = sweep.case_seed(case.seed, {"check": NAME})
    problem = make_problem(case.regime, replace(case.shape(), batch=2), case.dtype, 1, seed, device)
    step = next(problem.steps())
    given = {"state": problem.initial_state, **dict(step.given()), "A": problem.A, "D": problem.D,
             "dt_bias": problem.dt_bias}
    for name in ("B", "C"):  # every group group 0's: twin heads read the same B and C, however heads map to groups
        given[name] = given[name][:, :1].expand(given[name].shape).contiguous()
    twins = {name: _twinned(t, _INPUT_AXES[name]) for name, t in given.items()}
    state = twins.pop("state")
    before = state.double()
    arguments = {"z": None, **twins, "dt_softplus": problem.dt_softplus}
    try:
        kernel.update(state, arguments, case.rounding, sweep.case_seed(seed, {"step": 1}), "independence check",
                      transcript)
    except KernelRaised as exc:
        return SlotCheck(NAME, Status.ERROR, f"{TITLE}: {exc}")
    double = {name: None if t is None else t.double() for name, t in arguments.items() if name != "dt_softplus"}
    exact, _ = state_update_step(before, double["x"], double["dt"], double["A"], double["B"], double["C"],
                                 D=double["D"], z=double["z"], dt_bias=double["dt_bias"],
                                 dt_softplus=problem.dt_softplus)
    p = fraction_between_neighbours(exact, case.dtype)
    stored = bits(state)
    figures, failed = {}, []
    for axis, name in enumerate(AXES):
        first, second = _pairs(axis, stored.shape[axis])
        q = 2 * p[first] * (1 - p[first])
        expected, spread = q.sum().item(), math.sqrt((q * (1 - q)).sum().item())
        differ = int((stored[first] != stored[second]).sum())
        figures[name] = {"pairs": q.numel(), "differ": differ, "expected": round(expected, 1),
                         "sigma": round(spread, 2)}
        if lower_tail_bound(differ, expected) < FALSE_ALARM:
            failed.append(name)
    if not failed:
        return SlotCheck(NAME, Status.PASS, "", figures)
    return SlotCheck(NAME, Status.FAIL, f"{TITLE}: " + "; ".join(_failure(name, figures[name]) for name in failed),
                     figures)


def lower_tail_bound(k: int, mean: float) -> float:
    """A bound on P(X <= k) for X a sum of independent Bernoulli variables of mean `mean` (Chernoff's lower tail:
    e^-mean (e mean / k)^k for k < mean; 1 from the mean on)."""
    if k >= mean:
        return 1.0
    return math.exp(-mean + (k * (1 + math.log(mean / k)) if k > 0 else 0.0))


def _failure(name: str, f: dict) -> str:
    what, depends = AXES[name]
    why = f"do not depend on {depends}" if f["differ"] == 0 else f"are correlated across {what}"
    return (f"twin {what} (given the same state and inputs) stored the same bits in {f['pairs'] - f['differ']} of "
            f"{f['pairs']} elements where independent draws differ in {f['expected']:.0f} ± {f['sigma']:.0f}: the "
            f"stochastic rounding's random bits {why}")


def _pairs(axis: int, size: int) -> tuple[tuple, tuple]:
    """The indices of the state's twins along `axis` (of `size`): the elements 2k, and the elements 2k + 1. Rows
    whole; along the other axes, in row 0."""
    row = () if axis == 0 else (0,) + (slice(None),) * (axis - 1)
    return row + (slice(0, size // 2 * 2, 2),), row + (slice(1, size, 2),)


def _twinned(t: torch.Tensor | None, axes: tuple[int | None, ...]) -> torch.Tensor | None:
    """`t` with index 2k + 1 a copy of 2k along each of `axes` (the batch's 2 rows: row 1 a copy of row 0), in a
    storage of its own; its stride-0 axes (a per-head parameter's expanded view, dt's per head) kept so."""
    if t is None:
        return None
    zero = [d for d in range(t.dim()) if t.stride(d) == 0]
    twin = t[tuple(slice(0, 1) if d in zero else slice(None) for d in range(t.dim()))]
    for axis in axes:
        if axis is not None and axis not in zero:
            index = torch.arange(t.shape[axis], device=t.device) // 2 * 2
            twin = twin.index_select(axis, index)
    return twin.contiguous().expand(t.shape)
