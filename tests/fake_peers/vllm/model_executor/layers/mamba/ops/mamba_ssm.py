"""Fake `selective_state_update` with vLLM 0.33's signature: D and dt_bias positional and required,
z after them, y written into a preallocated `out`, None returned, the state updated in place (stored
in its own dtype, rounded to nearest, or stochastically with `enable_stochastic_rounding`, from a seed drawn
from torch's generator as vLLM draws its own). Computed with ssmcheck's torch step. Every call is recorded
in CALLS (the keywords it was given)."""


import torch

from ssmcheck.drift.adapter import torch_state_update

NULL_BLOCK_ID = 0
CALLS: list[dict] = []
# vLLM's hook pinning the launch config (BLOCK_SIZE_M, num_warps) its tuned tables would pick: recorded per call.
_ssm_config_override = None


def selective_state_update(
    state, x, dt, A, B, C, D, dt_bias, z=None, dt_softplus=False, state_batch_indices=None,
    dst_state_batch_indices=None, null_block_id=NULL_BLOCK_ID, out=None, num_accepted_tokens=None,
    cu_seqlens=None, is_blackwell=False, enable_stochastic_rounding=False, cache_philox_rounds=0,
):
    assert D.dim() == 2 and dt_bias.dim() == 2, "D and dt_bias: (nheads, dim)"
    assert out is not None and out.shape == x.shape, "out: preallocated, like x"
    _, nheads, dim, dstate = state.shape
    batch = x.shape[0]
    assert x.shape == (batch, nheads, dim) and dt.shape == x.shape and A.shape == (nheads, dim, dstate)
    assert D.shape == (nheads, dim) and dt_bias.shape == (nheads, dim)
    drafts = (dst_state_batch_indices, num_accepted_tokens, cu_seqlens)
    assert drafts == (None,) * 3 or None not in drafts, "speculative decoding: all three or none"
    assert not enable_stochastic_rounding or state.dtype == torch.float16, "vLLM's SR: fp16 states only"
    CALLS.append({"D": D, "dt_bias": dt_bias, "z": z, "dt_softplus": dt_softplus, "state_dtype": state.dtype,
                  "state_batch_indices": state_batch_indices, "null_block_id": null_block_id,
                  "enable_stochastic_rounding": enable_stochastic_rounding, "config": _ssm_config_override,
                  "num_accepted_tokens": num_accepted_tokens})
    rounding = {"rounding": "stochastic", "seed": int(torch.randint(0, 2**31, (1,)))} \
        if enable_stochastic_rounding else {}
    if num_accepted_tokens is not None:
        _verify_drafts(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices,
                       dst_state_batch_indices, null_block_id, out, num_accepted_tokens, cu_seqlens, rounding)
        return
    if state_batch_indices is None:
        assert state.shape[0] == batch
        out.copy_(torch_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, **rounding))
        return
    # As vLLM's kernel: row i on pool slot state_batch_indices[i]; a row on the null block reads a zero
    # state (its load is masked), writes its out and stores no state. Its random offsets start from the slot's
    # place in the pool: each row's draws its own (here a seed per slot).
    for row, slot in enumerate(state_batch_indices.flatten().tolist()):
        one = slice(row, row + 1)
        state_row = state[slot:slot + 1] if slot != null_block_id else torch.zeros_like(state[:1])
        own = {**rounding, "seed": rounding["seed"] + slot} if rounding else {}
        out[one] = torch_state_update(state_row, x[one], dt[one], A, B[one], C[one], D,
                                      None if z is None else z[one], dt_bias, dt_softplus, **own)


def _verify_drafts(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, dst_state_batch_indices,
                   null_block_id, out, num_accepted_tokens, cu_seqlens, rounding):
    """As vLLM's speculative path: row b's tokens cu_seqlens[b]..cu_seqlens[b + 1] from the state in slot
    state_batch_indices[b, max(accepted - 1, 0)], the state after its token t stored in slot
    dst_state_batch_indices[b, t] (one step at a time here, each stored and continued from)."""
    assert state_batch_indices.dim() == dst_state_batch_indices.dim() == 2
    cu = cu_seqlens.tolist()
    for b, accepted in enumerate(num_accepted_tokens.tolist()):
        source = int(state_batch_indices[b, max(accepted - 1, 0)])
        current = state[source:source + 1].clone() if source != null_block_id else torch.zeros_like(state[:1])
        for t, token in enumerate(range(cu[b], cu[b + 1])):
            one = slice(token, token + 1)
            out[one] = torch_state_update(current, x[one], dt[one], A, B[one], C[one], D,
                                          None if z is None else z[one], dt_bias, dt_softplus, **rounding)
            destination = int(dst_state_batch_indices[b, t])
            if destination != null_block_id:
                state[destination] = current[0]
