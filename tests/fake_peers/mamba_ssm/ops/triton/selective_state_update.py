"""Fake `selective_state_update` with mamba_ssm 2.3.2's signature: the state updated in place (stored
in its own dtype, rounded to nearest), out returned. Computed with ssmcheck's torch step."""

from ssmcheck.drift.adapter import torch_state_update

CALLS: list[dict] = []


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                           state_batch_indices=None):
    assert state_batch_indices is None, "not faked"
    CALLS.append({"state_dtype": state.dtype})
    return torch_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
