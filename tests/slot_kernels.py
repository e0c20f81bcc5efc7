"""State updates with slot indices (a pool of states, pad rows), for the padded-slot check (drift.slots).

`slots_correct` is the built-in kernel as it is; the others each plant one serving bug in its calls with
slot indices (the drift case's own decode, without them, runs the built-in kernel unchanged).
"""

from ssmcheck.ops.state_update.fused_recurrent import selective_state_update


def slots_correct(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, state_batch_indices=None,
                  pad_slot_id=-1, out=None):
    return selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices,
                                  pad_slot_id, out=out)


def pad_clamped_to_slot_0(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                          state_batch_indices=None, pad_slot_id=-1, out=None):
    """Planted: a pad row's slot id -1 clamped to 0, so pad rows update slot 0 of the pool."""
    if state_batch_indices is None:
        return slots_correct(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, out=out)
    return selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus,
                                  state_batch_indices.clamp(min=0), pad_slot_id, out=out)


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
