"""Reference decode step: one token of the recurrence, as a pure function.

The state-spaces/mamba `selective_state_update` math without the in-place update,
computed in the inputs' dtype (pass float64 tensors for the ground truth).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ssmcheck.ops.naive import NO_DT_LIMIT, heads_of_groups, process_dt, skip_and_gate


class StepParts(NamedTuple):
    """One step and the terms its new state adds (state_update_parts)."""

    new_state: torch.Tensor  # decayed + drive
    out: torch.Tensor
    decayed: torch.Tensor  # state * exp(dt * A)
    drive: torch.Tensor  # (dt * x) * B
    dt: torch.Tensor  # (batch, nheads, headdim): dt after dt_bias and softplus
    Bh: torch.Tensor  # (batch, nheads, dstate): B of each head's group


def state_update_step(
    state, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step: returns (new_state, out) and leaves `state` unchanged.

    state (batch, nheads, headdim, dstate); x, dt, z (batch, nheads, headdim);
    A (nheads, headdim, dstate); B, C (batch, ngroups, dstate); D, dt_bias
    (nheads, headdim). Tied parameters may be stride-0 expanded views. The state may have
    leading dimensions of its own (several states stepped on the same inputs at once).
    """
    parts = state_update_parts(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus)
    return parts.new_state, parts.out


def state_update_parts(state, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False) -> StepParts:
    """state_update_step's step with the terms of its new state: what a kernel's arithmetic rounds (drift.stats's
    allowance for a store is made of them)."""
    dtype = torch.promote_types(torch.promote_types(state.dtype, x.dtype), A.dtype)
    nheads = state.shape[-3]
    dt = process_dt(dt, dt_bias, dt_softplus, NO_DT_LIMIT, dtype)
    decay = torch.exp(dt[..., None] * A.to(dtype))  # (batch, nheads, headdim, dstate)
    Bh = heads_of_groups(B.to(dtype), nheads)  # (batch, nheads, dstate)
    Ch = heads_of_groups(C.to(dtype), nheads)
    xd = x.to(dtype)
    decayed = state.to(dtype) * decay
    drive = (dt * xd)[..., None] * Bh[..., None, :]
    new_state = decayed + drive
    # A product and a sum, not a matmul: compiled (drift.follow), they fuse into the kernel that computes the
    # state, where a matmul is a cuBLAS call of its own.
    out = skip_and_gate((new_state * Ch[..., None, :]).sum(-1), xd, D, z, dtype)
    return StepParts(new_state, out, decayed, drive, dt, Bh)
