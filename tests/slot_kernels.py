"""Kernels shaped like serving batches with padding, correct and with planted bugs.

State updates with slot indices (a pool of states, pad rows), for the padded-slot check (drift.slots):
`slots_correct` is the built-in kernel as it is; the others each plant one serving bug in its calls with
slot indices (the drift case's own decode, without them, runs the built-in kernel unchanged).
Chunk scans with pad tokens (seq_idx -1), for the `padded` scan regime: the built-in one, and one that
lets pads into the state of the sequence before them.
"""

import sys

import torch

from ssmcheck.ops.chunk_scan.chunk import chunk_scan_combined
from ssmcheck.ops.state_update.fused_recurrent import selective_state_update


def slots_correct(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, state_batch_indices=None,
                  pad_slot_id=-1, out=None):
    return selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices,
                                  pad_slot_id, out=out)


def slot_stride_taken_as_the_states_size(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                                         state_batch_indices=None, pad_slot_id=-1, out=None):
    """Planted: slot s read and written at s times a state's size from the pool's start, as if the pool were
    contiguous: right for a contiguous pool, wrong for a paged one (a slot stride longer than a state)."""
    contiguous = torch.empty(state.shape).stride()
    pool = state.as_strided(state.shape, contiguous, state.storage_offset())
    return selective_state_update(pool, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices,
                                  pad_slot_id, out=out)


def out_written_nothing_returned(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                                 state_batch_indices=None, pad_slot_id=-1, out=None):
    """vLLM's convention, correct: y written into the `out` it is given (it takes none of its own) and nothing
    returned."""
    selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id,
                           out=out)


def out_written_for_the_first_row_only(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                                       state_batch_indices=None, pad_slot_id=-1, out=None):
    """Planted, in vLLM's convention: the states are right, but y goes into `out`'s first row only (a store
    masked by a row bound of 1); nothing returned."""
    y = selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id)
    out[:1] = y[:1]


def pad_rows_found_by_sign(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                           state_batch_indices=None, pad_slot_id=-1, out=None):
    """Planted: takes pad_slot_id but finds pad rows by a negative index (PAD_SLOT_ID -1), whatever it is told: a
    pad row given vLLM's null block, 0, is stepped on slot 0 like a live row."""
    return selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, -1,
                                  out=out)


def pad_clamped_to_slot_0(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                          state_batch_indices=None, pad_slot_id=-1, out=None):
    """Planted: a pad row's slot id -1 clamped to 0, so pad rows update slot 0 of the pool."""
    if state_batch_indices is None:
        return slots_correct(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, out=out)
    return selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus,
                                  state_batch_indices.clamp(min=0), pad_slot_id, out=out)


def pad_wrapped_to_the_last_slot(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                                 state_batch_indices=None, pad_slot_id=-1, out=None):
    """Planted: a pad row's slot id -1 taken as a Python index, so pad rows update the pool's last slot."""
    if state_batch_indices is None:
        return slots_correct(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, out=out)
    wrapped = torch.where(state_batch_indices < 0, state_batch_indices + state.shape[0], state_batch_indices)
    return selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, wrapped, pad_slot_id, out=out)


def pad_rows_left_unwritten(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                            state_batch_indices=None, pad_slot_id=-1, out=None):
    """Correct, but writes no output for pad rows (their out keeps what it held)."""
    if state_batch_indices is None:
        return slots_correct(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, out=out)
    full = selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id)
    live = state_batch_indices != pad_slot_id
    out[live] = full[live]
    return out


def pad_rows_write_nan(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                       state_batch_indices=None, pad_slot_id=-1, out=None):
    """Planted: the states are right, but pad rows' out is garbage (NaN)."""
    if state_batch_indices is None:
        return slots_correct(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, out=out)
    selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id,
                           out=out)
    out[state_batch_indices == pad_slot_id] = float("nan")
    return out


def out_stored_in_blocks_of_4_rows(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                                   state_batch_indices=None, pad_slot_id=-1, out=None):
    """Planted: right, but out is stored a block of 4 batch rows at a time without a mask on the last block: the
    rows past the batch get zeros, in whatever lies after out."""
    result = selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices,
                                    pad_slot_id, out=out)
    if out is not None:
        flat = torch.empty(0, dtype=out.dtype, device=out.device).set_(out.untyped_storage())
        row, end = out[0].numel(), out.storage_offset() + out.numel()
        past = min(-(-out.shape[0] // 4) * 4 * row + out.storage_offset(), flat.numel())
        flat[end:past] = 0.0
    return result


def skip_term_dropped_without_slots(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                                    state_batch_indices=None, pad_slot_id=-1, out=None):
    """Planted: a path of its own for calls without slot indices (a plain batch, as a training or offline loop calls
    it) that leaves out the skip term D * x; right through slot indices, as a serving engine's decode calls it."""
    if state_batch_indices is None:
        D = None
    return selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices,
                                  pad_slot_id, out=out)


def x_read_at_the_slot(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                       state_batch_indices=None, pad_slot_id=-1, out=None):
    """Planted: row i's x read at row state_batch_indices[i], as if x were laid out like the pool: a slot past the
    batch reads past x (whatever lies there: here zeros where x's storage ends)."""
    if state_batch_indices is None:
        return slots_correct(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, out=out)
    flat = torch.empty(0, dtype=x.dtype, device=x.device).set_(x.untyped_storage())
    row, start = x[0].numel(), x.storage_offset()
    rows = []
    for slot in state_batch_indices.clamp(min=0).tolist():
        begin = start + slot * row
        inside = begin + row <= flat.numel()
        rows.append(flat[begin:begin + row].reshape(x.shape[1:]) if inside else torch.zeros_like(x[0]))
    return selective_state_update(state, torch.stack(rows), dt, A, B, C, D, z, dt_bias, dt_softplus,
                                  state_batch_indices, pad_slot_id, out=out)


def slot_0_taken_for_a_pad(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                           state_batch_indices=None, pad_slot_id=-1, out=None):
    """Planted: the pad test written `slot > 0` (slot 0 taken for a null block): a live row on slot 0 is skipped
    like a pad row (its state not advanced, its out zeros)."""
    if state_batch_indices is None:
        return slots_correct(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, out=out)
    skipped = torch.where(state_batch_indices > 0, state_batch_indices, pad_slot_id)
    return selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, skipped, pad_slot_id, out=out)


def last_slot_out_of_bounds(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                            state_batch_indices=None, pad_slot_id=-1, out=None):
    """Planted: the bounds test written `slot < pool - 1`: a live row on the pool's last slot is skipped like a
    pad row."""
    if state_batch_indices is None:
        return slots_correct(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, out=out)
    inside = (state_batch_indices >= 0) & (state_batch_indices < state.shape[0] - 1)
    skipped = torch.where(inside, state_batch_indices, pad_slot_id)
    return selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, skipped, pad_slot_id, out=out)


def out_returned_not_written(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                             state_batch_indices=None, pad_slot_id=-1, out=None):
    """Planted: takes `out` but returns y in a tensor of its own and leaves `out` as it was (an engine, which
    passes out and ignores the return value, reads stale memory)."""
    return selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices,
                                  pad_slot_id)


# ---------------------------------------------------------------------------- chunk scans with pad tokens


def pad_tokens_correct(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                       cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
                       return_varlen_states=False):
    """The built-in chunk scan, which leaves pad tokens (seq_idx -1) out of every sequence."""
    return chunk_scan_combined(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                               dt_softplus, dt_limit, return_final_states, return_varlen_states)


pad_tokens_correct.pad_tokens = True


def pads_continue_the_sequence(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                               seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                               return_final_states=False, return_varlen_states=False):
    """Planted: a pad token (seq_idx -1) taken as a token of the sequence before it, so pads leak into its state."""
    if seq_idx is not None:
        ids = seq_idx.clone()
        for t in range(1, ids.shape[1]):
            if ids[0, t] < 0:
                ids[0, t] = ids[0, t - 1]
        seq_idx = ids
    return chunk_scan_combined(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                               dt_softplus, dt_limit, return_final_states, return_varlen_states)


pads_continue_the_sequence.pad_tokens = True


def pads_drop_initial_states(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                             seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                             return_final_states=False, return_varlen_states=False):
    """Planted: its pad-aware path (taken where seq_idx holds -1) starts every sequence from zero, its initial
    state dropped; right without pads, and with pads but no initial states."""
    if seq_idx is not None and bool((seq_idx < 0).any()):
        initial_states = None
    return chunk_scan_combined(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                               dt_softplus, dt_limit, return_final_states, return_varlen_states)


pads_drop_initial_states.pad_tokens = True


def rows_at_their_batch_index_without_pads(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                                           state_batch_indices=None, pad_slot_id=-1, out=None):
    """Planted: a batch with no pad row (a CUDA-graph batch that is full) takes a path that reads and stores row b's
    state at slot b, its index in the batch, not at its slot: right wherever a batch has a pad row, or no slots."""
    if state_batch_indices is not None and not bool((state_batch_indices == pad_slot_id).any()):
        rows = torch.arange(len(state_batch_indices), device=state.device, dtype=state_batch_indices.dtype)
        return selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, rows, pad_slot_id, out=out)
    return selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices,
                                  pad_slot_id, out=out)


def null_block_cleared(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                       state_batch_indices=None, pad_slot_id=-1, out=None):
    """Planted: right, but a call with slot indices clears the pool's slot 0 (vLLM's null block, where its pad rows
    point) as scratch of its own, whether or not a row names it."""
    y = selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id,
                               out=out)
    if state_batch_indices is not None:
        state[0].zero_()
    return y


def raises_out_of_resources(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                            state_batch_indices=None, pad_slot_id=-1, out=None):
    """A kernel with slot indices that cannot run here: every call raises."""
    raise RuntimeError("out of resources: shared memory, required 262144, hardware limit 232448")


# The wrap of slot_offsets_wrapping: tests set drift.far_slots.FAR_ELEMENTS to it.
WRAP_ELEMENTS = 2**14


def slot_offsets_wrapping(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                          state_batch_indices=None, pad_slot_id=-1, out=None):
    """Planted: a row's state offset, slot x slot stride, wraps at WRAP_ELEMENTS (2**14) elements, as one formed in
    32-bit integers wraps at 2**32: a row on a far slot updates the slot its wrapped offset names (offsets that
    wrap to a slot's start: widths whose slot size divides 2**14)."""
    if state_batch_indices is None:
        return slots_correct(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, out=out)
    slots = torch.where(state_batch_indices >= 0, wrapped_slots(state_batch_indices, state),
                        state_batch_indices.long()).to(state_batch_indices.dtype)
    return selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, pad_slot_id, out=out)


def wrapped_slots(indices: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """The slots (int64) that `indices`' offsets into `pool`, slot x slot stride, name once wrapped at WRAP_ELEMENTS
    (offsets that wrap to a slot's start: widths whose slot size divides 2**14)."""
    stride = pool.stride(0)
    return indices.long() * stride % WRAP_ELEMENTS // stride


def varlen_head_d_of_head_0_without_a_gate(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                           initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                           dt_limit=(0.0, float("inf")), return_final_states=False,
                                           return_varlen_states=False):
    """Planted (fifth red-team round): its varlen epilogue without a gate (vLLM's call: D per head, the gated norm
    after the scan) reads D without the head's offset, every head head 0's D. Right with a gate, with D per
    channel, and in batch mode."""
    if cu_seqlens is not None and z is None and D is not None and D.dim() == 1:
        D = D[:1].expand(D.shape)
    return chunk_scan_combined(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                               dt_softplus, dt_limit, return_final_states, return_varlen_states)


varlen_head_d_of_head_0_without_a_gate.pad_tokens = True


def slot_indices_read_as_int32(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                               state_batch_indices=None, pad_slot_id=-1, out=None):
    """Planted: reads state_batch_indices through an int32 pointer whatever its dtype (a CUDA port's `(const int *)
    indices.data_ptr()`): right for the int32 engines pass; int64 indices come in as their words, low then high, so
    row 1 takes row 0's high word, slot 0, for its slot."""
    if state_batch_indices is not None and state_batch_indices.dtype == torch.int64:
        state_batch_indices = state_batch_indices.view(torch.int32)[: len(state_batch_indices)]
    return slots_correct(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id, out)


def slot_indices_int32_only(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                            state_batch_indices=None, pad_slot_id=-1, out=None):
    """Correct, and refuses int64 slot indices (a kernel whose contract is the int32 engines pass)."""
    if state_batch_indices is not None and state_batch_indices.dtype != torch.int32:
        raise TypeError(f"state_batch_indices must be int32, got {state_batch_indices.dtype}")
    return slots_correct(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id, out)


def slot_indices_int64_exit(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                            state_batch_indices=None, pad_slot_id=-1, out=None):
    """Planted: calls sys.exit when given int64 slot indices (a process-ending failure, no refusal); right on int32."""
    if state_batch_indices is not None and state_batch_indices.dtype == torch.int64:
        sys.exit(3)
    return slots_correct(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id, out)
