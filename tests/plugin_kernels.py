"""A planted-bug chunk-scan kernel for the pytest-plugin tests: `--ssmcheck-scan tests/plugin_kernels.py:NAME`."""

import torch

from ssmcheck.scan.adapter import torch_kernel

# The head whose output the planted bug poisons.
NAN_HEAD = 1


def nan_in_varlen_partial_chunk(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                return_final_states=False, return_varlen_states=False, *,
                                state_dtype=torch.float32, rounding="nearest", seed=0):
    """The same-precision baseline (torch_kernel), except that on the varlen path without initial
    states y of head NAN_HEAD is NaN over the partial last chunk of each sequence. Of the smoke
    preset's cases that is the `ragged` one only (`initial-state` is varlen with initial states)."""
    out = torch_kernel(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                       seq_idx=seq_idx, cu_seqlens=cu_seqlens, dt_softplus=dt_softplus, dt_limit=dt_limit,
                       return_final_states=return_final_states, return_varlen_states=return_varlen_states,
                       state_dtype=state_dtype, rounding=rounding, seed=seed)
    if cu_seqlens is None or initial_states is not None:
        return out
    y, *states = out if isinstance(out, tuple) else (out,)
    y = y.clone()
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds, bounds[1:]):
        partial = (end - start) % chunk_size
        if partial:
            y[:, end - partial:end, NAN_HEAD] = float("nan")
    return (y, *states) if states else y
