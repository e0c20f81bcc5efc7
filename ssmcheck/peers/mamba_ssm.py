"""state-spaces/mamba (`mamba_ssm`) as `--kernel mamba_ssm`.

Its Triton ops have ssmcheck's signatures already (they are where DESIGN §2's come from), so
the callables returned here are its own functions, unwrapped:

- `mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size,
  D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None, cu_seqlens=None,
  dt_softplus=False, dt_limit=(0.0, inf), return_final_states=False,
  return_varlen_states=False)`: returns out, (out, final_states), (out, varlen_states) or
  (out, final_states, varlen_states). It reads cu_seqlens only with return_varlen_states (and
  then asserts batch 1); seq_idx is (batch, seqlen) int32. In 2.3.2 the final states come back
  in fp32, the varlen states in C's dtype (computed from the chunk states it stores in C's
  dtype), and initial_states must be (batch, ...): one initial state per row, so a varlen
  batch of several sequences with initial states fails its assertion.
- `mamba_ssm.ops.triton.selective_state_update.selective_state_update(state, x, dt, A, B, C,
  D=None, z=None, dt_bias=None, dt_softplus=False, state_batch_indices=None)`: updates state
  in place and returns out. With state_batch_indices, row i updates pool slot
  state_batch_indices[i]; a negative index is a pad row, which touches no state and gets out 0.

Neither takes a state_dtype, rounding or seed keyword: `scan` runs its fp32/nearest cases,
`drift` judges it against the --rounding the user declares.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ssmcheck.peers import import_ops

NAME = "mamba_ssm"
_WHAT = "mamba_ssm's Triton ops"


def chunk_scan() -> Callable:
    """mamba_ssm's `mamba_chunk_scan_combined`. Raises KernelSpecError when it cannot be imported."""
    return import_ops(NAME, _WHAT, "mamba_ssm.ops.triton.ssd_combined").mamba_chunk_scan_combined


def chunk_scan_stages() -> Callable:
    """mamba_ssm's five SSD stage functions (imported by its ssd_combined), composed as its
    `_mamba_chunk_scan_combined_fwd` composes them, behind our chunk-scan signature without the return
    flags: a function returning the stages in the built-in kernel's layout (scan.stages). mamba_ssm cuts
    every batch row into chunks from its first token, as the built-in kernel does a sequence; a varlen
    row's chunks straddle its sequences, so there it raises ValueError. Raises KernelSpecError when
    mamba_ssm cannot be imported."""
    ops = import_ops(NAME, _WHAT, "mamba_ssm.ops.triton.ssd_combined")

    def mamba_ssm_stages(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                         seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf"))):
        if seq_idx is not None or cu_seqlens is not None:
            raise ValueError("mamba_ssm's chunks straddle the sequences of a varlen row: its stages have no "
                             "chunk per sequence to compare")
        batch, _, nheads, headdim = x.shape
        dstate = B.shape[-1]
        # The contiguity mamba_ssm's combined function ensures before its stages.
        x, B, C = x.contiguous(), B.contiguous(), C.contiguous()
        z = None if z is None else z.contiguous()
        dA_cumsum, dt_out = ops._chunk_cumsum_fwd(dt, A, chunk_size, dt_bias=dt_bias, dt_softplus=dt_softplus,
                                                  dt_limit=dt_limit)
        nchunks = dA_cumsum.shape[2]
        poisoned = torch.full((batch, nchunks, nheads, headdim, dstate), float("nan"), device=x.device)
        local = ops._chunk_state_fwd(B, x, dt_out, dA_cumsum, states=poisoned, states_in_fp32=True)
        before, _ = ops._state_passing_fwd(
            local.flatten(-2), dA_cumsum[:, :, :, -1],
            initial_states=None if initial_states is None else initial_states.flatten(-2),
            chunk_size=chunk_size, out_dtype=C.dtype,
        )
        before = before.unflatten(-1, (headdim, dstate))
        cb = ops._bmm_chunk_fwd(C, B, chunk_size, output_dtype=torch.float32)
        y, _ = ops._chunk_scan_fwd(cb, x, dt_out, dA_cumsum, C, before, D=None if D is None else D.contiguous(), z=z)
        return {"cumsum": dA_cumsum.transpose(1, 2).flatten(0, 1), "chunk_states": local.flatten(0, 1),
                "passed_states": before.flatten(0, 1), "cb": cb.flatten(0, 1), "y": y}

    return mamba_ssm_stages


def state_update() -> Callable:
    """mamba_ssm's `selective_state_update`. Raises KernelSpecError when it cannot be imported."""
    return import_ops(NAME, _WHAT, "mamba_ssm.ops.triton.selective_state_update").selective_state_update
