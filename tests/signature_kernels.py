"""Correct state updates with other callers' signatures, to check that ssmcheck calls a kernel as its signature
says: `ssmcheck drift --kernel tests/signature_kernels.py:NAME`."""

from ssmcheck.drift.adapter import torch_state_update


def state_update_in_vllms_order(state, x, dt, A, B, C, D, dt_bias, z=None, dt_softplus=False, *, rounding="nearest",
                                seed=0):
    """vLLM's order: D and dt_bias required, before z (mamba's: D, z, dt_bias, all optional). Otherwise the plain
    PyTorch step, right."""
    return torch_state_update(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                              rounding=rounding, seed=seed)
