"""Fake `mamba_chunk_scan_combined_varlen` with vLLM 0.33's signature and checks.

It asserts what vLLM's asserts (flat token layout, a power-of-two chunk size, seq_idx per chunk,
per-sequence initial states, a preallocated out) and, beyond that, that the chunk metadata is the
metadata vLLM's builder makes: every chunk inside one sequence and at most chunk_size long, seq_idx
naming its sequence, last_chunk_indices each sequence's last chunk. It computes with ssmcheck's
baseline, storing the chunk states in `state_dtype`, or in C's dtype when state_dtype is None, as
vLLM does, or, given final_states_out and final_state_indices, writes them into that state cache and returns
None, as vLLM 0.33 does. Every call is recorded in CALLS (the keyword arguments as given, and the states).
"""

import torch

from ssmcheck.ops.chunk_scan.baseline import scan_baseline

CALLS: list[dict] = []


def is_int_pow_2(n):
    return isinstance(n, int) and n > 0 and (n & (n - 1)) == 0


def _check_metadata(chunk_size, cu_seqlens, cu_chunk_seqlens, last_chunk_indices, seq_idx, seqlen):
    for name, t in (("cu_seqlens", cu_seqlens), ("cu_chunk_seqlens", cu_chunk_seqlens),
                    ("last_chunk_indices", last_chunk_indices), ("seq_idx", seq_idx)):
        assert t.dtype == torch.int32 and t.dim() == 1, f"{name}: expected 1-D int32, got {t.dtype} {t.dim()}-D"
    cu, chunks = cu_seqlens.tolist(), cu_chunk_seqlens.tolist()
    owners, last = seq_idx.tolist(), last_chunk_indices.tolist()
    assert cu[0] == 0 and cu[-1] == seqlen and chunks[0] == 0 and chunks[-1] == seqlen
    assert len(owners) == len(chunks) - 1 and len(last) == len(cu) - 1
    for c, (lo, hi) in enumerate(zip(chunks[:-1], chunks[1:])):
        s = owners[c]
        assert 0 < hi - lo <= chunk_size, f"chunk {c} holds {hi - lo} tokens"
        assert cu[s] <= lo and hi <= cu[s + 1], f"chunk {c} [{lo}, {hi}) is not inside sequence {s}"
        assert (lo - cu[s]) % chunk_size == 0, f"chunk {c} does not start on its sequence's chunk grid"
    for s, c in enumerate(last):
        assert owners[c] == s and chunks[c + 1] == cu[s + 1], f"last_chunk_indices[{s}] = {c} is not its last chunk"


def mamba_chunk_scan_combined_varlen(
    x, dt, A, B, C, chunk_size, cu_seqlens, cu_chunk_seqlens, last_chunk_indices, seq_idx, out, D=None, z=None,
    dt_bias=None, initial_states=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
    return_intermediate_states=False, state_dtype=None, final_states_out=None, final_state_indices=None,
):
    assert is_int_pow_2(chunk_size), "chunk_size must be integer power of 2"
    seqlen, nheads, headdim = x.shape
    _, ngroups, dstate = B.shape
    assert nheads % ngroups == 0
    assert B.shape == (seqlen, ngroups, dstate) and C.shape == B.shape
    assert dt.shape == (seqlen, nheads) and A.shape == (nheads,)
    assert z is None or z.shape == x.shape
    assert D is None or D.shape in ((nheads, headdim), (nheads,))
    assert seq_idx.shape == (cu_chunk_seqlens.shape[0] - 1,)
    assert cu_seqlens is not None, "Assuming varlen input - must supply cu_seqlens"
    if initial_states is not None:
        assert initial_states.shape == (len(cu_seqlens) - 1, nheads, headdim, dstate)
    assert out.shape == x.shape and out.is_contiguous()
    assert not return_intermediate_states, "not faked"
    assert final_states_out is None or (final_state_indices is not None and final_state_indices.shape == (
        len(cu_seqlens) - 1,) and final_states_out.shape[1:] == (nheads, headdim, dstate))
    _check_metadata(chunk_size, cu_seqlens, cu_chunk_seqlens, last_chunk_indices, seq_idx, seqlen)

    stored = state_dtype if state_dtype is not None else C.dtype
    # vLLM's state passing kernel loads initial states through the pointer it stores states through:
    # another dtype fails to compile ("Mismatched type for prev_states_ptr").
    assert initial_states is None or initial_states.dtype == stored, (
        f"initial_states in {initial_states.dtype}, states stored in {stored}")
    result = scan_baseline(
        x[None], dt[None], A, B[None], C[None], chunk_size, D=D, z=None if z is None else z[None], dt_bias=dt_bias,
        initial_states=initial_states, cu_seqlens=cu_seqlens, dt_softplus=dt_softplus,
        dt_limit=tuple(dt_limit),
        state_dtype=stored,
    )
    out.copy_(result.y[0])
    states = result.varlen_states.to(stored)
    CALLS.append({"chunk_size": chunk_size, "cu_seqlens": cu_seqlens, "cu_chunk_seqlens": cu_chunk_seqlens,
                  "last_chunk_indices": last_chunk_indices, "seq_idx": seq_idx, "state_dtype": state_dtype,
                  "x_shape": tuple(x.shape), "initial_states": initial_states, "states": states, "D": D,
                  "final_state_indices": final_state_indices})
    if final_states_out is not None:  # vLLM's fused write: each sequence's state into its cache slot
        final_states_out[final_state_indices.long()] = states.to(final_states_out.dtype)
        return None
    return states
