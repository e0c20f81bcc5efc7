"""Kernels with one planted serving bug each, for `ssmcheck scan --invariance` and `drift --from-prefill` tests.

The chunk scans wrap the same-precision baseline (a correct kernel) and the state update wraps the
built-in Triton kernel; each breaks them the way serving engines' kernels broke (issue #16), in a way
the plain checks of `scan` and `drift` do not see. Used as `--kernel tests/serving_kernels.py:NAME`
(or `--decode-kernel` for the state update).
"""

import torch

from ssmcheck.ops.chunk_scan.baseline import scan_baseline
from ssmcheck.ops.state_update.fused_recurrent import selective_state_update


def _scan(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit,
          return_final_states, return_varlen_states, scale=None):
    """The baseline with the mamba signature's return; y and the states times `scale` when given."""
    out = scan_baseline(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                        cu_seqlens=cu_seqlens, dt_softplus=dt_softplus, dt_limit=dt_limit)
    if scale is not None:
        out.y = (out.y.float() * scale).to(x.dtype)
        out.final_states, out.varlen_states = (None if s is None else s * scale
                                               for s in (out.final_states, out.varlen_states))
    extra = ([out.final_states] if return_final_states else []) + ([out.varlen_states] if return_varlen_states else [])
    return (out.y, *extra) if extra else out.y


def batch_dependent(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                    cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
                    return_varlen_states=False):
    """Normalises x (and the initial states) by the largest |x| of the whole batch before the scan and scales
    y and the states back after: exact in exact arithmetic (everything is linear in them), but every
    sequence's rounding now depends on its batch-mates (vLLM #57267's class). Its errors are the
    baseline's size, so only the batch-invariance check sees it."""
    scale = x.abs().amax().float()
    initial = None if initial_states is None else initial_states / scale
    return _scan((x.float() / scale).to(x.dtype), dt, A, B, C, chunk_size, D, z, dt_bias, initial, cu_seqlens,
                 dt_softplus, dt_limit, return_final_states, return_varlen_states, scale=scale)


def ignores_midchunk_initial_state(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                   seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                   return_final_states=False, return_varlen_states=False):
    """Drops the initial state of every varlen sequence that starts mid-chunk in the packed row, as a
    continuation of a chunked prefill does (vLLM #21783, #23279). Right wherever sequences start from zero."""
    if initial_states is not None and cu_seqlens is not None:
        aligned = (cu_seqlens[:-1].long() % chunk_size == 0).to(initial_states.dtype)
        initial_states = initial_states * aligned[:, None, None, None]
    return _scan(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit,
                 return_final_states, return_varlen_states)


def decode_ignores_z(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """The built-in state update without the z gate: the decode output of a model with a gate disagrees
    with the prefill's (vLLM #54993's class). `drift` passes no z, so only prefill→decode sees it."""
    return selective_state_update(state, x, dt, A, B, C, D=D, z=None, dt_bias=dt_bias, dt_softplus=dt_softplus)



def one_initial_state_per_row(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                              return_final_states=False, return_varlen_states=False):
    """A correct scan that, as mamba_ssm 2.3.2 does, rejects one initial state per varlen sequence with a
    bare assert: a chunked-prefill continuation of a packed batch cannot run on it."""
    assert initial_states is None or initial_states.shape[0] == x.shape[0]
    return _scan(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit,
                 return_final_states, return_varlen_states)


def _writing_cache(write):
    """The baseline with vLLM 0.33's fused cache write: given final_states_out and final_state_indices, it calls
    `write(cache, slots, states)` with each sequence's final state (as the call without them returns them) and
    returns y alone."""
    def kernel(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
               cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
               return_varlen_states=False, final_states_out=None, final_state_indices=None):
        if final_states_out is None:
            return _scan(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit,
                         return_final_states, return_varlen_states)
        varlen = cu_seqlens is not None
        y, states = _scan(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus,
                          dt_limit, not varlen, varlen)
        write(final_states_out, final_state_indices.long(), states)
        return y

    kernel.__doc__ = write.__doc__
    return kernel


def _write(cache, slots, states):
    """Each sequence's state into its slot."""
    cache[slots] = states.to(cache.dtype)


def _write_at_sequence_index(cache, slots, states):
    """Planted: sequence i's state into slot i, the indices ignored."""
    cache[:states.shape[0]] = states.to(cache.dtype)


def _write_all_heads_but_the_last(cache, slots, states):
    """Planted: a grid one head short: the last head of each slot is never written."""
    cache[slots, :-1] = states[:, :-1].to(cache.dtype)


def _write_through_bf16(cache, slots, states):
    """Planted: the fused write casts through the activations' bf16 on its way into an fp32 cache: the cached
    states are coarser than the ones the call without the cache returns."""
    cache[slots] = states.to(torch.bfloat16).to(cache.dtype)


def _write_as_if_contiguous(cache, slots, states):
    """Planted: slot s written at s times a state's size from the cache's start, as if the cache were contiguous:
    right for a contiguous cache, wrong for a paged one (vLLM's: a slot stride longer than a state)."""
    contiguous = torch.empty(cache.shape).stride()
    cache.as_strided(cache.shape, contiguous, cache.storage_offset())[slots] = states.to(cache.dtype)


cache_write_correct = _writing_cache(_write)
cache_write_at_sequence_index = _writing_cache(_write_at_sequence_index)
cache_write_all_heads_but_the_last = _writing_cache(_write_all_heads_but_the_last)
cache_write_through_bf16 = _writing_cache(_write_through_bf16)
cache_write_as_if_contiguous = _writing_cache(_write_as_if_contiguous)
