"""Fake `mamba_chunk_scan_combined` with mamba_ssm 2.3.2's signature, computed with ssmcheck's
baseline (states in fp32). Like the real one it reads cu_seqlens only with return_varlen_states (and
then needs batch 1), takes seq_idx as (batch, seqlen) and parts y's sequences by it (without cu_seqlens too);
unlike it, it takes one initial state per sequence of a varlen row (mamba_ssm 2.3.2 asserts one per row).
Every call is recorded in CALLS."""

import torch

from ssmcheck.ops.chunk_scan.baseline import scan_baseline

CALLS: list[dict] = []


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                              return_final_states=False, return_varlen_states=False):
    batch, seqlen, nheads, headdim = x.shape
    if seq_idx is not None:
        assert seq_idx.shape == (batch, seqlen)
    if not return_varlen_states:
        cu_seqlens = None
    else:
        assert cu_seqlens is not None, "cu_seqlens must be provided if return_varlen_states is True"
        assert batch == 1, "passing cu_seqlens to get the varlen states is only supported if batch dimension is 1"
    CALLS.append({"seq_idx": seq_idx, "cu_seqlens": cu_seqlens, "return_final_states": return_final_states,
                  "return_varlen_states": return_varlen_states})
    result = scan_baseline(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                           cu_seqlens=_sequences(cu_seqlens, seq_idx), dt_softplus=dt_softplus, dt_limit=tuple(dt_limit),
                           state_dtype=torch.float32)
    if not return_varlen_states:
        return result.y if not return_final_states else (result.y, result.final_states)
    if not return_final_states:
        return result.y, result.varlen_states
    return result.y, result.final_states, result.varlen_states


def _sequences(cu_seqlens, seq_idx):
    """cu_seqlens, or else the boundaries seq_idx (1, seqlen) marks, as the real kernel's chunk scan keeps the
    sequences apart by seq_idx alone; None in batch mode."""
    if cu_seqlens is not None or seq_idx is None or seq_idx.shape[0] != 1:
        return cu_seqlens
    row = seq_idx[0]
    starts = [0, *(torch.nonzero(row[1:] != row[:-1]).flatten() + 1).tolist(), row.shape[0]]
    return torch.tensor(starts, dtype=torch.int32, device=row.device)
