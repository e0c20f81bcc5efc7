"""Fake `selective_state_update` with mamba_ssm 2.3.2's signature: the state updated in place (stored
in its own dtype, rounded to nearest), out returned. Computed with ssmcheck's torch step."""

import torch

from ssmcheck.drift.adapter import torch_state_update

CALLS: list[dict] = []


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                           state_batch_indices=None):
    CALLS.append({"state_dtype": state.dtype, "state_batch_indices": state_batch_indices})
    if state_batch_indices is None:
        return torch_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    # As mamba_ssm's kernel: row i on pool slot state_batch_indices[i]; a negative index is a pad row,
    # which gets out 0 and touches no state.
    out = torch.zeros_like(x)
    for row, slot in enumerate(state_batch_indices.tolist()):
        if slot >= 0:
            one = slice(row, row + 1)
            out[one] = torch_state_update(state[slot:slot + 1], x[one], dt[one], A, B[one], C[one], D,
                                          None if z is None else z[one], dt_bias, dt_softplus)
    return out
