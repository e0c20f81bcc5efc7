"""The float64 side of one lockstep decode step, as one function of tensors.

After the kernel has stored its new state, `follow` advances the three float64 recurrences (the
reference, the baseline before its rounding, and the exact update of the kernel's previous state) as
one stacked step, rounds the baseline, adds the kernel's store errors to the running sums and sets the
non-finite flag; all in place, so a CUDA graph that captured it keeps doing the same.

Eagerly that is some eighty device operations, and in a CUDA graph each costs a launch: they, not the
kernel, set the time of a drift step on a GPU. On CUDA `follower` compiles it (torch.compile), which
fuses them into a few kernels; the source stays the plain-PyTorch references (ops.*.naive) in float64.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ssmcheck.core.formats import ulp
from ssmcheck.core.tensors import nonfinite_mask
from ssmcheck.drift.stats import error_sums
from ssmcheck.ops.rounding.naive import round_to
from ssmcheck.ops.state_update.naive import state_update_step

RECOMPILE_LIMIT = 1024


def follow(ref, baseline, before, after, out, x, dt, A, B, C, D, dt_bias, sums, tripped, uniform, *,
           dt_softplus: bool, dtype: torch.dtype, rounding: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of the float64 recurrences beside the kernel's; returns (reference out, baseline out).

    ref, baseline: float64 states, advanced in place (the baseline rounded into `dtype` per `rounding`,
    against `uniform`'s draws when stochastic); before, after: the kernel's state before and after its
    call; out: the kernel's output; x, dt, B, C: the step's inputs (any float dtype); A, D, dt_bias:
    float64 parameters; sums: the running store-error sums (stats.error_sums' layout), added to in
    place; tripped: a bool flag, set where the kernel's state or output is non-finite and the reference's
    is finite.
    """
    new, outs = state_update_step(torch.stack([ref, baseline, before.double()]), x.double(), dt.double(), A,
                                  B.double(), C.double(), D=D, dt_bias=dt_bias, dt_softplus=dt_softplus)
    ref.copy_(new[0])
    baseline.copy_(round_to(new[1], dtype, rounding, uniform=uniform))
    # The kernel's store against the exact update of its own previous state: its rounding error, in ulps,
    # signed along the exact value (free of the drift accumulated before it).
    exact, stored = new[2], after.double()
    sums.add_(error_sums(torch.sign(exact) * (stored - exact) / ulp(exact, dtype)))
    tripped |= nonfinite_mask(stored, new[0]).any() | nonfinite_mask(out, outs[0]).any()
    return outs[0], outs[1]


def follower(device: str) -> Callable:
    """`follow` as a step on `device` runs it: compiled on CUDA, else as it is."""
    if torch.device(device).type != "cuda":
        return follow
    compiled = torch.compile(follow, fullgraph=True, dynamic=False)

    def run(*args, **kwargs):
        # One compilation per shape, state dtype and rounding mode: a sweep has more than torch's default
        # limit of eight, past which it would quietly run the rest eagerly.
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
            return compiled(*args, **kwargs)

    return run
