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
  in place and returns out.

Neither takes a state_dtype, rounding or seed keyword: `scan` runs its fp32/nearest cases,
`drift` judges it against the --rounding the user declares.
"""

from __future__ import annotations

from collections.abc import Callable

from ssmcheck.peers import import_ops

NAME = "mamba_ssm"
_WHAT = "mamba_ssm's Triton ops"


def chunk_scan() -> Callable:
    """mamba_ssm's `mamba_chunk_scan_combined`. Raises KernelSpecError when it cannot be imported."""
    return import_ops(NAME, _WHAT, "mamba_ssm.ops.triton.ssd_combined").mamba_chunk_scan_combined


def state_update() -> Callable:
    """mamba_ssm's `selective_state_update`. Raises KernelSpecError when it cannot be imported."""
    return import_ops(NAME, _WHAT, "mamba_ssm.ops.triton.selective_state_update").selective_state_update
