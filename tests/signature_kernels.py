"""Correct kernels with other signatures than mamba's, to check that ssmcheck calls a kernel as its signature says:
`ssmcheck drift --kernel tests/signature_kernels.py:NAME` (state updates), `ssmcheck scan ...` (chunk scans)."""

from ssmcheck.drift.adapter import torch_state_update
from ssmcheck.scan.adapter import torch_kernel


def state_update_in_vllms_order(state, x, dt, A, B, C, D, dt_bias, z=None, dt_softplus=False, *, rounding="nearest",
                                seed=0):
    """vLLM's order: D and dt_bias required, before z (mamba's: D, z, dt_bias, all optional). Otherwise the plain
    PyTorch step, right."""
    return torch_state_update(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                              rounding=rounding, seed=seed)


def chunk_scan_before_varlen(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                             seq_idx=None, dt_softplus=False, return_final_states=False):
    """mamba_chunk_scan_combined as it was before packed sequences and dt_limit: no cu_seqlens, return_varlen_states
    or dt_limit keyword. Otherwise the plain PyTorch chunk scan, right."""
    return torch_kernel(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                        seq_idx=seq_idx, dt_softplus=dt_softplus, return_final_states=return_final_states)


def state_update_without_a_gate(state, x, dt, A, B, C, D=None, dt_bias=None, dt_softplus=False, *, rounding="nearest",
                                seed=0):
    """A Mamba2-only state update: no z keyword (Mamba2 gates after the update, in its norm). Otherwise the plain
    PyTorch step, right."""
    return torch_state_update(state, x, dt, A, B, C, D=D, dt_bias=dt_bias, dt_softplus=dt_softplus,
                              rounding=rounding, seed=seed)
