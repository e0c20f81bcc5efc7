"""A decode step (the torch state update) whose output passes through the autotuned copy of copy.py:
correct under the copy's first config, missing the last element of out under its second (BLOCK=32)."""

from ssmcheck.drift.adapter import torch_state_update
from tests.tuned_kernels.copy import copy


def state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *, rounding="nearest",
                 seed=0):
    out = torch_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, rounding=rounding, seed=seed)
    return copy(out.flatten().float()).view_as(out).to(out.dtype)
