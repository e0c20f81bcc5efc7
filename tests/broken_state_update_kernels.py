"""Deliberately broken state-update kernels (state-spaces/mamba `selective_state_update` signature).

Each one is a plausible bug, written in plain PyTorch independently of
ssmcheck's references, for `ssmcheck drift --kernel tests/broken_state_update_kernels.py:NAME`.
None takes a `rounding` keyword, so `--rounding` declares what each is supposed to do, except
the step-counting kernels (skips_one_store, stores_every_step, inf_at_one_element), the random_bits_shared_by_* kernels,
whole_dstate_blocks, dstate_capped_at_128, softplus_without_threshold, per_head_parameters,
interleaved_groups, groups_by_ngroups, parameters_of_head_mod_8, parameters_of_first_64_channels, gate_in_fp16,
softplus_in_inputs_dtype, update_in_inputs_dtype, update_in_half_for_fp16_inputs,
channels_in_blocks_of_32_from_8_rows, softplus_only_with_a_bias, skip_term_from_x_without_D, flushes_subnormals, random_bits_ignore_the_seed,
random_bits_from_the_global_generator, random_bits_from_an_8_bit_seed, random_bits_from_a_seed_through_float32,
skip_after_gate, inputs_of_row_0, contiguous_inputs, contiguous_gate, z_read_with_x_strides, updates_a_contiguous_copy,
softplus_regardless, bias_only_with_softplus, gate_of_head_0, rows_in_tiles_of_16, heads_in_blocks_of_32,
narrow_states_round_to_nearest, random_bits_from_the_row_in_a_block_of_4, random_bits_from_the_head_mod_16,
bf16_truncated_past_128_state_indices, skip_term_flag_from_dt_bias, d_read_with_dt_bias_strides, out_stored_toward_zero,
out_stored_toward_minus_inf,
out_of_the_stored_state, gate_only_with_the_skip_term, dt_clamped_below_at_1e_6, sr_spacing_of_the_nearest_value and
sr_8_bits_toward_minus_inf, half_inputs_read_as_contiguous, half_inputs_from_interleaved_groups, half_inputs_b_c_of_row_0,
tied_path_gate_of_row_0, tied_path_skip_after_gate, dt_of_head_0_without_bias, channels_in_whole_blocks_of_8,
dstate_in_vectors_of_8, channels_in_blocks_of_16_from_64_programs, parameters_of_head_mod_64,
skips_steps_with_dt_below_1e_4, narrow_bf16_sr_bits_shared_along_a_row, random_bits_from_the_row_in_a_block_of_8 and
slot_path_sr_with_4_bits, silu_through_exp, half_out_through_fp16,
c_read_with_b_strides, which implement both modes
themselves (`rounding` and `seed` keywords) so that their only bug is the one named.

A step-counting kernel numbers its calls on the state tensor it is given (an attribute of that
tensor): the runner clones a fresh state for every trial and updates it in place, so call n of a
trial is decode step n of that trial, whatever ran before (no module-level state to reset).
"""

import torch

# fraction bits dropped by fp32 -> dtype for normal values, and the bits of the kept part
_DROPPED_BITS = {torch.float16: 13, torch.bfloat16: 16}
_FRACTION_BITS = {torch.float16: 10, torch.bfloat16: 7}
# channels_in_blocks_of_32_from_8_rows' batch from which its other launch config runs, and that config's block
LARGE_BATCH = 8
CHANNEL_BLOCK = 32
# rows_in_tiles_of_16's tile of rows (from this many rows on) and heads_in_blocks_of_32's block of heads (past it)
ROW_TILE = 16
HEAD_BLOCK = 32
# narrow_states_round_to_nearest's widest state of its own path (Mamba1's dstate)
NARROW_DSTATE = 16
# random_bits_from_the_row_in_a_block_of_4's block of rows and random_bits_from_the_head_mod_16's period of heads
ROW_BLOCK = 4
HEAD_PERIOD = 16
# random_bits_from_the_row_in_a_block_of_8's block of rows (the alike step has rows 8 apart on a GPU only)
ROW_BLOCK_WIDE = 8


def _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, decay=True, update_dtype=torch.float32):
    """The recurrence in fp32 (the update dt*x*B formed in `update_dtype`): returns (new_state, out)."""
    dt = dt.float() + (dt_bias.float() if dt_bias is not None else 0.0)
    if dt_softplus:
        dt = torch.nn.functional.softplus(dt)
    heads_per_group = state.shape[1] // B.shape[1]
    # output_size: no read-back from the device, so that a CUDA graph can capture the step
    Bh = B.float().repeat_interleave(heads_per_group, dim=1, output_size=state.shape[1])[:, :, None, :]
    new = state.float()
    if decay:
        new = new * torch.exp(dt[..., None] * A.float())
    new = new + ((dt.to(update_dtype) * x.to(update_dtype))[..., None] * Bh.to(update_dtype)).float()
    return new, _out_of(new, x, C, D, z)


def _out_of(state, x, C, D, z):
    """The step's output from `state` (read in fp32): C·h, plus D·x, gated by silu(z), in x's dtype."""
    heads_per_group = state.shape[1] // C.shape[1]
    Ch = C.float().repeat_interleave(heads_per_group, dim=1, output_size=state.shape[1])[:, :, None, :]
    out = (state.float() * Ch).sum(-1)
    if D is not None:
        out = out + D.float() * x.float()
    if z is not None:
        out = out * torch.nn.functional.silu(z.float())
    return out.to(x.dtype)


def _round_magnitude_bits(value, dtype, add_bits):
    """fp32 -> dtype by adding `add_bits` (int32) to the magnitude's dropped bits and clearing them."""
    dropped = _DROPPED_BITS[dtype]
    bits = value.view(torch.int32)
    sign = bits & torch.tensor(-(2**31), dtype=torch.int32)
    magnitude = bits & 0x7FFFFFFF
    kept = (magnitude + add_bits) & ~((1 << dropped) - 1)
    return (sign | kept).view(torch.float32).to(dtype)


def sr_3bit(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """"Stochastic" rounding with only 3 random bits (from torch's generator): rounds up with
    probability floor(8 * fraction) / 8, so values are biased toward zero (by 1/16 ulp on average,
    and by the whole fraction below 1/8 ulp: tiny updates are lost as with round-to-nearest)."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    dropped = _DROPPED_BITS[state.dtype]
    random3 = torch.randint(0, 8, new.shape, dtype=torch.int32, device=new.device)
    state.copy_(_round_magnitude_bits(new, state.dtype, random3 << (dropped - 3)))
    return out


def truncating(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """Stores the state rounded toward zero (what Triton's interpreter does for fp32 -> bf16)."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    state.copy_(_round_magnitude_bits(new, state.dtype, torch.zeros_like(new, dtype=torch.int32)))
    return out


def skips_last_head_store(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """An off-by-one store mask: the last head's state is never written back."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    state[:, :-1].copy_(new[:, :-1].to(state.dtype))
    return out


def unwritten_last_channel(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """Allocates out itself (torch.empty_like) and never writes each head's last channel: out there is whatever
    the memory held (NaN, as ssmcheck's guard has torch fill uninitialised allocations)."""
    new, full = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    state.copy_(new.to(state.dtype))
    out = torch.empty_like(x)
    out[..., :-1] = full[..., :-1]
    return out


def unmasked_c_block(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """Loads C in blocks of 16 state indices with no mask on the state axis, and weights each by the state
    loaded with its mask (0 past dstate): harmless where the read lands in the next group's C (finite); past the
    last row's last group it leaves C, and NaN there makes those heads' out NaN (0 * NaN). dstate 16k: no read."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    state.copy_(new.to(state.dtype))
    beyond = -C.shape[-1] % 16
    if beyond:
        flat = torch.empty(0, dtype=C.dtype, device=C.device).set_(C.untyped_storage())
        end = C.storage_offset() + C.numel()  # C is one step's tensor, contiguous
        past = flat[end:end + beyond]  # past the storage's end: nothing read, as where memory reads finite
        heads = state.shape[1] // C.shape[1]
        out = out.clone()
        out[-1, -heads:] += (0.0 * past.float()).sum().to(out.dtype)
    return out


def unmasked_state_tail(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """Loads the state in blocks of 16 state indices with no mask, weighted by C loaded with its mask (0 past
    dstate): inside the state the read lands in the next channel's state (finite); past the last row's last
    channel it leaves the state, and NaN there makes that head's out NaN (0 * NaN). dstate 16k: no read."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    beyond = -state.shape[-1] % 16
    flat = torch.empty(0, dtype=state.dtype, device=state.device).set_(state.untyped_storage())
    end = state.storage_offset() + state.numel()  # the runner's state is contiguous
    past = flat[end:end + beyond].float()  # past the storage's end: nothing read, as where memory reads finite
    state.copy_(new.to(state.dtype))
    out = out.clone()
    out[-1, -1] += (0.0 * past).sum().to(out.dtype)
    return out


def writes_past_state(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """Right results, and a store one element past the state's end where its storage has room."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    state.copy_(new.to(state.dtype))
    _store_past_the_end(state)
    return out


def writes_past_x(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """Right results, and a store one element past x's end where its storage has room (a scratch write with the
    wrong bound; in a serving engine it lands in a neighbouring tensor)."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    state.copy_(new.to(state.dtype))
    _store_past_the_end(x)
    return out


def _store_past_the_end(t: torch.Tensor) -> None:
    """0 into the element right after contiguous t, where t's storage holds one."""
    flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage())
    if t.storage_offset() + t.numel() < flat.numel():
        flat[t.storage_offset() + t.numel()] = 0.0


def forgets_decay(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """Never applies exp(dt * A): the state only accumulates, and a growing one overflows to inf."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, decay=False)
    state.copy_(new.to(state.dtype))
    return out


def clamps_at_half_max(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """A defensive clamp "to leave headroom for the next update": the stored state is clamped to half the
    largest value of its format, silently wrong (finite, saturated) where the true state lies above it."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    limit = torch.finfo(state.dtype).max / 2
    state.copy_(new.clamp(-limit, limit).to(state.dtype))
    return out


def raises(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """A kernel that cannot run here."""
    raise RuntimeError("out of resources: shared memory, required 262144, hardware limit 232448")


def plain_nearest(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """Correct, and round-to-nearest only: passes when declared nearest, fails when declared
    stochastic wherever round-to-nearest stagnates."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    state.copy_(new.to(state.dtype))
    return out


def plain_stochastic(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """Correct software SR, subnormals included, its uniforms drawn from torch's generator."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    state.copy_(_stochastic(new, state.dtype, torch.rand(new.shape, device=new.device)))
    return out


def sr_normals_only(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """Software SR with every dropped bit random (torch's generator), written for normals: it adds random bits
    below a normal's 10 (fp16) or 7 (bf16) fraction bits and truncates them, so a value the format holds as a
    subnormal (fewer fraction bits) is rounded to nearest from there, its random bits lost."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    dropped = _DROPPED_BITS[state.dtype]
    random_bits = torch.randint(0, 1 << dropped, new.shape, dtype=torch.int32, device=new.device)
    state.copy_(_round_magnitude_bits(new, state.dtype, random_bits))
    return out


def _stochastic(value, dtype, uniform):
    """fp32 `value` rounded to `dtype` stochastically (normals and subnormals): down to the multiple of the
    format's spacing there, up with probability the remainder's fraction of it (`uniform` in [0, 1))."""
    magnitude = value.abs().clamp_min(torch.finfo(dtype).tiny)  # subnormals share the smallest normal's spacing
    _, exponent = torch.frexp(magnitude)  # magnitude = m * 2**exponent, m in [0.5, 1)
    spacing = torch.exp2((exponent - 1 - _FRACTION_BITS[dtype]).float())
    down = torch.floor(value / spacing) * spacing  # exact: spacing is a power of two
    up = torch.where(uniform < (value - down) / spacing, down + spacing, down)
    return up.to(dtype)


# skips_one_store leaves the state untouched at this decode step of every trial (11 is not
# one of the log-spaced checkpoints of a 32-step run, so only the lingering error is seen).
SKIPPED_STORE_STEP = 11
# inf_at_one_element stores inf here: (step, batch, head, channel, state index), every trial
# (needs batch >= 3, nheads >= 2, headdim >= 5, dstate >= 6).
INF_STEP, INF_BATCH, INF_HEAD, INF_CHANNEL, INF_STATE_INDEX = 7, 2, 1, 3, 5
# whole_dstate_blocks' block of state columns.
DSTATE_BLOCK = 16
# dstate_capped_at_128's largest block of state columns, and bf16_truncated_past_128_state_indices' first block.
DSTATE_CAP = 128


def _step_number(state) -> int:
    """1 on the first call with this state tensor, 2 on the next, ..."""
    calls = getattr(state, "_broken_kernel_calls", 0) + 1
    state._broken_kernel_calls = calls
    return calls


def _store(state, new, rounding, seed):
    """Store fp32 `new` into `state` rounded to nearest, or stochastically (`_stochastic`, subnormals
    included), its uniforms drawn from a generator seeded with `seed`."""
    if rounding == "stochastic" and state.dtype in _DROPPED_BITS:
        generator = torch.Generator(device=new.device).manual_seed(seed)
        state.copy_(_stochastic(new, state.dtype, torch.rand(new.shape, device=new.device, generator=generator)))
    else:
        state.copy_(new.to(state.dtype))


def whole_dstate_blocks(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                        rounding="nearest", seed=0):
    """Its loop over state columns runs dstate // DSTATE_BLOCK blocks instead of cdiv (a bound right only when
    dstate is a multiple of the block): the columns of a partial last block are never advanced, stored or read
    into the output. Both rounding modes, as `_store` does, so that this is its only bug."""
    return _first_state_columns(state.shape[-1] // DSTATE_BLOCK * DSTATE_BLOCK, state, x, dt, A, B, C, D, z, dt_bias,
                                dt_softplus, rounding, seed)


def dstate_capped_at_128(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                         rounding="nearest", seed=0):
    """Its block of state columns is min(next_power_of_2(dstate), DSTATE_CAP), with no loop past it: right up to
    dstate 128; beyond it the columns past the first block are never advanced, stored or read into the output.
    Both rounding modes, as `_store` does, so that this is its only bug."""
    return _first_state_columns(DSTATE_CAP, state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, rounding, seed)


def _first_state_columns(n, state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, rounding, seed):
    """One step over state columns [0, n) only, the rest left as they are and out of the output."""
    new, out = _fp32_step(state[..., :n], x, dt, A[..., :n], B[..., :n], C[..., :n], D, z, dt_bias, dt_softplus)
    _store(state[..., :n], new, rounding, seed)
    return out


def softplus_without_threshold(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                               rounding="nearest", seed=0):
    """softplus as log1p(exp(dt + dt_bias)) in fp32 with no linear branch past 20: right wherever dt + dt_bias stays
    below 88.7, where exp overflows, dt becomes inf and so does the state. Both rounding modes, as `_store` does."""
    if dt_softplus:
        dt = torch.log1p(torch.exp(dt.float() + (dt_bias.float() if dt_bias is not None else 0.0)))
        dt_bias, dt_softplus = None, False
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return out


def softplus_regardless(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                        rounding="nearest", seed=0):
    """Takes softplus(dt + dt_bias) whether dt_softplus asks for it or not (the flag fixed at True): right for
    every serving engine's call, which asks for it, and wrong for a dt passed already processed."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, True)
    _store(state, new, rounding, seed)
    return out


def bias_only_with_softplus(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                            rounding="nearest", seed=0):
    """Adds dt_bias inside the softplus branch only (softplus(dt + dt_bias), else dt as given): right wherever a
    softplus is asked for, as serving engines ask."""
    if not dt_softplus:
        dt_bias = None
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return out


def per_head_parameters(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                        rounding="nearest", seed=0):
    """Reads A, dt, D and dt_bias at channel 0 (and A at state index 0) of each head, as a kernel written for
    Mamba2's tied parameters does: right for stride-0 expanded views, wrong for whole ones. Both rounding
    modes, as `_store` does, so that this is its only bug."""
    heads = (state.shape[1], state.shape[2])
    A = A[:, :1, :1].expand_as(A)
    dt = dt[..., :1].expand_as(dt)
    D = None if D is None else D[:, :1].expand(heads)
    dt_bias = None if dt_bias is None else dt_bias[:, :1].expand(heads)
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return out


def interleaved_groups(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                       rounding="nearest", seed=0):
    """Reads head h's B and C from group h % ngroups instead of h // (nheads / ngroups): the same with one
    group, or one head a group, wrong otherwise. Both rounding modes, as `_store` does."""
    group = torch.arange(state.shape[1], device=B.device) % B.shape[1]  # of each head
    # B and C a head each (one head a group for _fp32_step), in the wrong order.
    new, out = _fp32_step(state, x, dt, A, B[:, group], C[:, group], D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return out


def groups_by_ngroups(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                      rounding="nearest", seed=0):
    """Reads head h's B and C from group h // ngroups (clamped to the last group) instead of h // (nheads /
    ngroups): right with one group, and wherever nheads / ngroups == ngroups (4 heads in 2 groups), wrong
    elsewhere. Both rounding modes, as `_store` does."""
    ngroups = B.shape[1]
    group = (torch.arange(state.shape[1], device=B.device) // ngroups).clamp(max=ngroups - 1)
    new, out = _fp32_step(state, x, dt, A, B[:, group], C[:, group], D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return out


def parameters_of_head_mod_8(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                             rounding="nearest", seed=0):
    """Head h takes the A, D and dt_bias of head h % 8 (per-head parameters loaded for a block of 8 heads and
    reused): right up to 8 heads. Both rounding modes, as `_store` does."""
    return _parameters_of_head_mod(8, state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, rounding, seed)


def _parameters_of_head_mod(period, state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, rounding, seed):
    """The step with head h taking the A, D and dt_bias of head h % period."""
    heads = torch.arange(state.shape[1], device=state.device) % period
    new, out = _fp32_step(state, x, dt, A[heads], B, C, None if D is None else D[heads], z,
                          None if dt_bias is None else dt_bias[heads], dt_softplus)
    _store(state, new, rounding, seed)
    return out


def parameters_of_first_64_channels(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                                    rounding="nearest", seed=0):
    """Channel c takes the A, dt, D and dt_bias of channel c % 64 (per-channel parameters loaded for a first
    block of 64 channels and reused for the next blocks): right for Mamba2's tied parameters and up to 64
    channels a head. Both rounding modes, as `_store` does."""
    channel = torch.arange(state.shape[2], device=state.device) % 64
    new, out = _fp32_step(state, x, dt[..., channel], A[:, channel], B, C, None if D is None else D[:, channel], z,
                          None if dt_bias is None else dt_bias[:, channel], dt_softplus)
    _store(state, new, rounding, seed)
    return out


def gate_in_fp16(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                 rounding="nearest", seed=0):
    """Evaluates silu(z) in fp16 (the gate loaded and activated in half precision): y off by up to 2**-11
    relative wherever a gate is given, which an fp16 or bf16 state's own error hides. Both rounding modes, as
    `_store` does."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, None, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    if z is None:
        return out
    return (out.float() * torch.nn.functional.silu(z.half()).float()).to(x.dtype)


def flushes_subnormals(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                       rounding="nearest", seed=0):
    """Stores every value below the state dtype's smallest normal as zero (a flush-to-zero store): right wherever
    the state stays normal, as in every regime but `subnormal`. Both rounding modes, as `_store` does."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, torch.where(new.abs() < torch.finfo(state.dtype).tiny, 0.0, new), rounding, seed)
    return out


def softplus_in_inputs_dtype(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                             rounding="nearest", seed=0):
    """Takes dt + dt_bias and its softplus in dt's own dtype (the bias cast to it), the rest in fp32: right for
    fp32 inputs; with a bf16 model's activations dt is off by up to 2**-8 of itself every step. Both rounding
    modes, as `_store` does."""
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = torch.nn.functional.softplus(dt)
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, None, False)
    _store(state, new, rounding, seed)
    return out


def update_in_inputs_dtype(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                           rounding="nearest", seed=0):
    """Forms the update dt*x*B in x's dtype (dt processed in fp32, then cast), the decay and the rest in fp32:
    right for fp32 inputs, off by up to 2**-8 of the update in bf16 ones. Both rounding modes, as `_store` does."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, update_dtype=x.dtype)
    _store(state, new, rounding, seed)
    return out


def update_in_half_for_fp16_inputs(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                                   rounding="nearest", seed=0):
    """A branch for fp16 activations (an fp16-served model) forms dt*x*B in fp16, for packed half2 arithmetic; fp32
    and bf16 activations take the fp32 path, right. Both rounding modes, as `_store` does."""
    half = x.dtype == torch.float16
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus,
                          update_dtype=torch.float16 if half else torch.float32)
    _store(state, new, rounding, seed)
    return out


def channels_in_blocks_of_32_from_8_rows(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                                         rounding="nearest", seed=0):
    """A launch config picked by batch (as vLLM's by batch x heads): from LARGE_BATCH rows on, channels in blocks
    of CHANNEL_BLOCK over a grid of headdim // CHANNEL_BLOCK (floor, not ceil), so the channels of a partial last
    block are never advanced and their out stays as allocated (0). Right below LARGE_BATCH rows, and at any batch
    where headdim is a multiple of the block (Mamba2's 64). Both rounding modes, as `_store` does."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    if x.shape[0] >= LARGE_BATCH:
        covered = x.shape[-1] // CHANNEL_BLOCK * CHANNEL_BLOCK
        new[:, :, covered:] = state[:, :, covered:].float()
        out = out.clone()
        out[..., covered:] = 0
    _store(state, new, rounding, seed)
    return out


def rows_in_tiles_of_16(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                        rounding="nearest", seed=0):
    """A launch config for large batches: from ROW_TILE rows on, rows in tiles of ROW_TILE over a grid of
    batch // ROW_TILE (floor, not ceil), so the rows of a partial last tile are never advanced and their out stays as
    allocated (0). Right below ROW_TILE rows and at any multiple of it. Both rounding modes, as `_store` does."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    if x.shape[0] >= ROW_TILE:
        new, out = _never_launched(x.shape[0] // ROW_TILE * ROW_TILE, 0, state, new, out)
    _store(state, new, rounding, seed)
    return out


def heads_in_blocks_of_32(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                          rounding="nearest", seed=0):
    """Past HEAD_BLOCK heads, heads in blocks of HEAD_BLOCK over a grid of nheads // HEAD_BLOCK (floor, not ceil), so
    the heads of a partial last block are never advanced and their out stays as allocated (0). Right up to
    HEAD_BLOCK heads and at any multiple of it (64, 128). Both rounding modes, as `_store` does."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    if state.shape[1] > HEAD_BLOCK:
        new, out = _never_launched(state.shape[1] // HEAD_BLOCK * HEAD_BLOCK, 1, state, new, out)
    _store(state, new, rounding, seed)
    return out


def _never_launched(start, axis, state, new, out):
    """`new` and `out` with the rows (axis 0), heads (axis 1) or channels (axis 2) from `start` on as no program
    touched them: the state as it was, out 0."""
    index = (slice(None),) * axis + (slice(start, None),)
    new[index] = state[index].float()
    out = out.clone()
    out[index] = 0
    return new, out


def gate_of_head_0(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                   rounding="nearest", seed=0):
    """Reads z at head 0's offset for every head (its pointer leaves out the head's stride): every head is gated by
    head 0's z. Right with one head and wherever z is None (Mamba2 with its gated RMSNorm outside). Both rounding
    modes, as `_store` does."""
    if z is not None:
        z = z[:, :1].expand_as(z)
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return out


def skip_term_flag_from_dt_bias(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                                rounding="nearest", seed=0):
    """Decides whether to add the skip term D * x by whether dt_bias was given (a launcher's HAS_D copied from the
    line setting HAS_DT_BIAS): right wherever both are passed or both left out, and where dt_bias alone is passed
    (there is no D to add); with D passed and dt_bias None the skip term is dropped. Both rounding modes, as
    `_store` does."""
    has_D = dt_bias is not None
    new, out = _fp32_step(state, x, dt, A, B, C, D if has_D else None, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return out


def d_read_with_dt_bias_strides(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                                rounding="nearest", seed=0):
    """Reads D through dt_bias's strides (a launcher passing dt_bias.stride() for both): right wherever the two have
    the same strides (both per head, as Mamba2 passes them, or both per channel, as Mamba1's), and where dt_bias is
    not given; with D per channel beside a per-head dt_bias every channel of a head takes D[h, 0]. Both rounding
    modes, as `_store` does."""
    if D is not None and dt_bias is not None:
        D = torch.as_strided(D, D.shape, dt_bias.stride())
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return out


def narrow_states_round_to_nearest(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                                   rounding="nearest", seed=0):
    """A path of its own for states of NARROW_DSTATE state indices or fewer (Mamba1's: whole rows in registers),
    written before stochastic rounding came, stores to nearest whatever `rounding` says. Right for every wider
    state, and to nearest."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, new, "nearest" if state.shape[-1] <= NARROW_DSTATE else rounding, seed)
    return out


def bf16_truncated_past_128_state_indices(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                                          rounding="nearest", seed=0):
    """Its loop over blocks of state indices past the first DSTATE_CAP stores into bf16 with a plain cast that
    truncates toward zero (as Triton's interpreter does), where the first block rounds as asked: a bf16 state's
    indices DSTATE_CAP.. lose up to an ulp toward zero every step, in either mode. Right for fp16 and fp32 states and
    up to dstate DSTATE_CAP."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    if state.dtype == torch.bfloat16 and state.shape[-1] > DSTATE_CAP:
        tail = new[..., DSTATE_CAP:]
        state[..., DSTATE_CAP:] = _round_magnitude_bits(tail, state.dtype, torch.zeros_like(tail, dtype=torch.int32))
    return out


def out_stored_toward_zero(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                           rounding="nearest", seed=0):
    """Stores its fp16/bf16 output with a conversion that truncates toward zero (a hand-written pack that drops the
    low bits): each element errs by up to an ulp toward zero, at most twice a store to nearest's error, which the
    output's norm-wise tolerance (2 x the baseline's) passes or fails by chance. The state is right, in both
    modes, as `_store` does; an fp32 output is right too."""
    new, out = _fp32_step(state, x.float(), dt, A, B, C, D, z, dt_bias, dt_softplus)  # out in fp32
    _store(state, new, rounding, seed)
    if x.dtype == torch.float32:
        return out
    return _round_magnitude_bits(out.contiguous(), x.dtype, torch.zeros_like(out, dtype=torch.int32))


def out_stored_toward_minus_inf(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                                rounding="nearest", seed=0):
    """Stores its fp16/bf16 output rounding down (`cvt.rm` where `cvt.rn` belongs): each element errs by up to an ulp
    toward -inf, toward zero where the output is positive and away from it where it is negative, so that its mean
    signed along the values cancels over an output of either sign. The state is right, in both modes, as `_store`
    does; an fp32 output is right too."""
    new, out = _fp32_step(state, x.float(), dt, A, B, C, D, z, dt_bias, dt_softplus)  # out in fp32
    _store(state, new, rounding, seed)
    if x.dtype == torch.float32:
        return out
    nearest = out.to(x.dtype)
    return torch.where(nearest.float() > out, torch.nextafter(nearest, torch.full_like(nearest, -torch.inf)), nearest)


def out_of_the_stored_state(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                            rounding="nearest", seed=0):
    """Computes its output from the state it stored (rounded into fp16/bf16), not from the fp32 state before the
    store: each output errs by the state's rounding, within what the drift before the step lets the output's error
    against the reference show, except where the state is fp32. Both modes, as `_store` does."""
    new, _ = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return _out_of(state, x, C, D, z)


def gate_only_with_the_skip_term(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                                 rounding="nearest", seed=0):
    """Applies the gate inside its `if D is not None` branch (an indentation slip): with z given and D left out the
    output goes ungated. Right wherever D is passed, or z is not. Both modes, as `_store` does."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z if D is not None else None, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return out


def dt_clamped_below_at_1e_6(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                             rounding="nearest", seed=0):
    """Clamps the processed dt from below at 1e-6 ("never a zero step"): right for every trained model's dt (1e-3 and
    up); a step whose true dt is ~0 decays the state by exp(-1e-6 |A|) and adds 1e-6 x B instead of leaving it, less
    than an fp16 or bf16 state's rounding to nearest absorbs. Both modes, as `_store` does."""
    processed = dt.float() + (dt_bias.float() if dt_bias is not None else 0.0)
    if dt_softplus:
        processed = torch.nn.functional.softplus(processed)
    new, out = _fp32_step(state, x, processed.clamp_min(1e-6), A, B, C, D, z, None, False)
    _store(state, new, rounding, seed)
    return out


def sr_spacing_of_the_nearest_value(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                                    rounding="nearest", seed=0):
    """Stochastic rounding on the grid of the value's round to nearest: the spacing taken at RN(value), not at the
    value. Where a value just below a power of two rounds to nearest up to it, the spacing is the next binade's
    (twice the value's own), and the value is rounded between the power of two and the point two of its own
    spacings below it, which is not a neighbour of it. Unbiased all the same (SR on a coarser grid is), so the
    stores' mean error stays zero; only the stores near a binade edge are wrong. To nearest it is right."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    if rounding != "stochastic":
        state.copy_(new.to(state.dtype))
        return out
    generator = torch.Generator(device=new.device).manual_seed(seed)
    uniform = torch.rand(new.shape, device=new.device, generator=generator)
    nearest = new.to(state.dtype).float().abs().clamp_min(torch.finfo(state.dtype).tiny)
    _, exponent = torch.frexp(nearest)
    spacing = torch.exp2((exponent - 1 - _FRACTION_BITS[state.dtype]).float())
    down = torch.floor(new / spacing) * spacing
    state.copy_(torch.where(uniform < (new - down) / spacing, down + spacing, down).to(state.dtype))
    return out


def sr_8_bits_toward_minus_inf(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                               rounding="nearest", seed=0):
    """Stochastic rounding by 8 random bits added below the kept bits of the value and a floor (toward -inf, not
    toward zero): up with probability floor(256 f) / 256, 1/512 ulp toward -inf on average whatever the sign, so
    that the errors along the values cancel over a state of mixed signs. To nearest it is right."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    if rounding != "stochastic":
        state.copy_(new.to(state.dtype))
        return out
    generator = torch.Generator(device=new.device).manual_seed(seed)
    r = torch.randint(0, 256, new.shape, device=new.device, generator=generator).float() / 256
    magnitude = new.abs().clamp_min(torch.finfo(state.dtype).tiny)
    _, exponent = torch.frexp(magnitude)
    spacing = torch.exp2((exponent - 1 - _FRACTION_BITS[state.dtype]).float())
    state.copy_((torch.floor(new / spacing + r) * spacing).to(state.dtype))
    return out


def random_bits_from_the_row_in_a_block_of_4(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                                             *, rounding="nearest", seed=0):
    """Stochastic rounding whose random offset takes the row's index within its block of ROW_BLOCK rows where the
    row's own index belongs: rows ROW_BLOCK apart round with the same bits (each element alone exact SR, rows of one
    block independent). Right to nearest."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store_with_bits_repeating(0, ROW_BLOCK, state, new, rounding, seed)
    return out


def random_bits_from_the_row_in_a_block_of_8(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                                             *, rounding="nearest", seed=0):
    """random_bits_from_the_row_in_a_block_of_4 with blocks of ROW_BLOCK_WIDE rows: rows 8 apart round with the same
    bits. Right to nearest."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store_with_bits_repeating(0, ROW_BLOCK_WIDE, state, new, rounding, seed)
    return out


def random_bits_from_the_head_mod_16(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                                     rounding="nearest", seed=0):
    """Stochastic rounding whose random offset holds the head in a 4-bit field (head % HEAD_PERIOD): heads
    HEAD_PERIOD apart round with the same bits (each element alone exact SR). Right to nearest."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store_with_bits_repeating(1, HEAD_PERIOD, state, new, rounding, seed)
    return out


def _store_with_bits_repeating(axis, period, state, new, rounding, seed):
    """`_store`, except that the stochastic rounding's uniforms along `axis` repeat every `period` (index i takes
    index i % period's)."""
    if rounding != "stochastic" or state.dtype not in _DROPPED_BITS:
        _store(state, new, rounding, seed)
        return
    drawn = [*new.shape[:axis], period, *new.shape[axis + 1:]]
    generator = torch.Generator(device=new.device).manual_seed(seed)
    uniform = torch.rand(drawn, device=new.device, generator=generator)
    index = torch.arange(new.shape[axis], device=new.device) % period
    state.copy_(_stochastic(new, state.dtype, uniform.index_select(axis, index)))


def softplus_only_with_a_bias(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                              rounding="nearest", seed=0):
    """Takes dt's softplus in its bias branch (`if dt_bias is not None: dt = softplus(dt + dt_bias)`): right
    wherever a bias is passed, as serving engines pass one; without one the raw dt goes into the decay. Both
    rounding modes, as `_store` does."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus and dt_bias is not None)
    _store(state, new, rounding, seed)
    return out


def skip_term_from_x_without_D(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                               rounding="nearest", seed=0):
    """Passes x in D's place when D is None (a launcher's placeholder for an absent tensor) and forgets the flag
    that says so: the skip term becomes x * x. Right wherever D is passed. Both rounding modes, as `_store` does."""
    new, out = _fp32_step(state, x, dt, A, B, C, x if D is None else D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return out


def contiguous_gate(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                    rounding="nearest", seed=0):
    """Reads z at offsets computed from its shape, as if contiguous: right for a whole z and for the first row
    of a view into a wider buffer (Mamba1's z, a half of each in_proj row), wrong for the other rows. Both
    rounding modes, as `_store` does."""
    if z is not None:
        z = z.as_strided(z.shape, torch.empty(z.shape).stride(), z.storage_offset())
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return out


def z_read_with_x_strides(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                          rounding="nearest", seed=0):
    """Reads z at z's start with x's strides (one stride argument passed for both): right wherever the two are laid
    out alike, wrong for every row but the first where z's row stride differs from x's (Mamba1's z, half of each
    in_proj row, beside x from the conv). A read past z's storage wraps around it, as a GPU's would land in other
    memory. Both rounding modes, as `_store` does."""
    if z is not None:
        storage = torch.empty(0, dtype=z.dtype, device=z.device).set_(z.untyped_storage())
        index = torch.full(z.shape, z.storage_offset(), dtype=torch.int64, device=z.device)
        for axis, stride in enumerate(x.stride()):
            shape = [1] * z.dim()
            shape[axis] = z.shape[axis]
            index = index + torch.arange(z.shape[axis], device=z.device).view(shape) * stride
        z = storage[index % storage.numel()]
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return out


def skip_after_gate(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                    rounding="nearest", seed=0):
    """Gates C . state with silu(z), then adds D * x, where y = (C . state + D * x) * silu(z): the same as the
    right order whenever z is None (Mamba2's serving call), wrong under a gate. Both rounding modes, as `_store`
    does, so that this is its only bug."""
    new, gated = _fp32_step(state, x, dt, A, B, C, None, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return gated if D is None else (gated.float() + D.float() * x.float()).to(x.dtype)


def inputs_of_row_0(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                    rounding="nearest", seed=0):
    """Advances every batch row's state with row 0's x, dt, B, C and z (a batch stride of 0 for the step's
    inputs): right with one row. Both rounding modes, as `_store` does."""
    def row_0(t):
        return None if t is None else t[:1].expand_as(t)

    new, out = _fp32_step(state, row_0(x), row_0(dt), A, row_0(B), row_0(C), D, row_0(z), dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return out


def updates_a_contiguous_copy(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                              rounding="nearest", seed=0):
    """Makes the state contiguous for its pointer arithmetic (`s = state.contiguous()`) and stores into `s`: right
    for a contiguous state (s is state); for a view whose rows are not (one layer's slice of a state cache) the
    update goes to a temporary and the caller's state never changes. Both rounding modes, as `_store` does."""
    s = state.contiguous()
    new, out = _fp32_step(s, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(s, new, rounding, seed)
    return out


def contiguous_inputs(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                      rounding="nearest", seed=0):
    """Reads x, B and C at offsets computed from their shapes, as if contiguous (a kernel that ignores the
    strides it is given): right for whole tensors, and for the first row of views into a wider buffer only.
    Both rounding modes, as `_store` does."""
    new, out = _fp32_step(state, _offsets_from_shape(x), dt, A, _offsets_from_shape(B), _offsets_from_shape(C), D, z,
                          dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return out


def _bits_shared_along(axis):
    def kernel(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *, rounding="nearest",
               seed=0):
        new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
        for i in range(state.shape[axis]):  # each slice along the axis from the same seed: the same bits
            _store(state.select(axis, i), new.select(axis, i), rounding, seed)
        return out

    what = ("batch row", "head", "channel", "state index")[axis]
    kernel.__doc__ = (f"Stochastic rounding whose random bits depend on the step's seed and the element's place, "
                      f"not on its {what}: every {what} is rounded with the same bits (each on its own exact SR, "
                      "as `_store` rounds). Right to nearest.")
    return kernel


def random_bits_ignore_the_seed(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                                rounding="nearest", seed=0):
    """Stochastic rounding with a fixed key (its seed keyword unread, as a Philox key left constant or an offset
    that never advances): each element exact SR on its own and every element's bits its own, but every decode step
    rounds with the same bits. Right to nearest."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, 0)
    return out


def random_bits_from_an_8_bit_seed(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                                   rounding="nearest", seed=0):
    """Stochastic rounding keyed by `seed % 256` (a key cut to a byte): exact SR, bits of their own for every element
    and for most pairs of seeds, but every two decode steps whose seeds agree in their low byte round with the same
    bits (one pair of steps in 256; a run of 8192 steps repeats its bits every 256 steps on average). Right to
    nearest."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed % 256)
    return out


def random_bits_from_a_seed_through_float32(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                                            *, rounding="nearest", seed=0):
    """Stochastic rounding keyed by its seed passed through a 32-bit float (a seed tensor made float32 on its way
    in): seeds past 2**24 lose their low bits, and steps whose seeds round to the same float round with the same
    bits. Right to nearest."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, int(torch.tensor(float(seed), dtype=torch.float32).item()))
    return out


def random_bits_from_the_global_generator(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                                          rounding="nearest", seed=0):
    """Stochastic rounding whose uniforms come from torch's global generator (its seed keyword unread): each
    element exact SR with bits of its own, and other bits for every call, but the same seed gives other bits each
    time, so no run can be reproduced. Right to nearest."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    if rounding == "stochastic" and state.dtype in _DROPPED_BITS:
        state.copy_(_stochastic(new, state.dtype, torch.rand(new.shape, device=new.device)))
    else:
        state.copy_(new.to(state.dtype))
    return out


random_bits_shared_by_rows = _bits_shared_along(0)
random_bits_shared_by_heads = _bits_shared_along(1)
random_bits_shared_by_channels = _bits_shared_along(2)
random_bits_shared_by_state_indices = _bits_shared_along(3)


def stores_every_step(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                      rounding="nearest", seed=0):
    """Correct in both modes, and counts its steps as skips_one_store does: its control."""
    _step_number(state)
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return out


def skips_one_store(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                    rounding="nearest", seed=0):
    """A race / early exit that drops one write-back: at step SKIPPED_STORE_STEP the state is left as
    it was (out is still right for that step); every other store is correct in either mode."""
    step = _step_number(state)
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    if step != SKIPPED_STORE_STEP:
        _store(state, new, rounding, seed)
    return out


def inf_at_one_element(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                       rounding="nearest", seed=0):
    """Correct, except that at step INF_STEP one element of the state, (INF_BATCH, INF_HEAD,
    INF_CHANNEL, INF_STATE_INDEX), is stored as inf (a bad address, say), and two elements after
    it in index order as NaN and -inf: the first non-finite element is the inf."""
    step = _step_number(state)
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    if step == INF_STEP:
        state[INF_BATCH, INF_HEAD, INF_CHANNEL, INF_STATE_INDEX] = float("inf")
        state[INF_BATCH, INF_HEAD, INF_CHANNEL + 1, 0] = float("nan")
        state[-1, -1, -1, -1] = -float("inf")
    return out


_LAUNCHES = [0]


def racy_store(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """Race-like: on some launches one program's store of state element [0, 0, 0, 0] lands a unit in
    the last place off, as when it reads a neighbour's value before that value is written. Which
    launches race depends on the scheduling (here, every third launch), never on the inputs: the same
    step from the same state gives differing states, each well within the tolerance."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    stored = new.to(state.dtype)
    _LAUNCHES[0] += 1
    if _LAUNCHES[0] % 3 == 0:
        first = stored.view(-1)[:1]
        first.copy_(torch.nextafter(first, torch.full_like(first, float("inf"))))
    state.copy_(stored)
    return out.to(x.dtype)


def random_offsets_with_dstate_for_headdim(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                                           *, rounding="nearest", seed=0):
    """Stochastic rounding whose per-element random offset takes dstate where headdim belongs, ((row * nheads +
    head) * dstate + channel) * dstate + state index: with headdim > dstate, channel c of head h and channel
    c - dstate of head h + 1 draw the same uniform. Each element alone is exact SR, and its bits follow the seed and
    differ from its neighbours' along every axis. Right to nearest."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    if rounding != "stochastic" or state.dtype not in _DROPPED_BITS:
        state.copy_(new.to(state.dtype))
        return out
    rows, nheads, headdim, dstate = new.shape
    index = [torch.arange(size, device=new.device) for size in new.shape]
    offsets = (((index[0][:, None, None, None] * nheads + index[1][None, :, None, None]) * dstate
                + index[2][None, None, :, None]) * dstate + index[3][None, None, None, :])
    generator = torch.Generator(device=new.device).manual_seed(seed)
    uniform = torch.rand(int(offsets.max()) + 1, device=new.device, generator=generator)[offsets]
    state.copy_(_stochastic(new, state.dtype, uniform))
    return out


def slot_path_bits_shared_by_channels(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                                      state_batch_indices=None, pad_slot_id=-1, out=None, *, rounding="nearest",
                                      seed=0):
    """Right as it is called without slot indices; with them (a serving engine's call, another compiled variant)
    its random offsets leave out the channel: every channel of a state row rounds with the same bits. Its pad rows
    change nothing and get zeros in out. Right to nearest."""
    if state_batch_indices is None:
        new, y = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
        _store(state, new, rounding, seed)
    else:
        live = state_batch_indices != pad_slot_id
        slots = state_batch_indices[live].long()
        z_live = None if z is None else z[live]
        new, y_live = _fp32_step(state[slots], x[live], dt[live], A, B[live], C[live], D, z_live, dt_bias,
                                 dt_softplus)
        rows = state[slots]
        for channel in range(rows.shape[2]):  # each channel from the same seed: the same bits
            _store(rows[:, :, channel], new[:, :, channel], rounding, seed)
        state[slots] = rows
        y = torch.zeros_like(x)
        y[live] = y_live
    if out is not None:
        out.copy_(y)
    return out if out is not None else y


def random_bits_from_the_value(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                               rounding="nearest", seed=0):
    """Stochastic rounding whose uniform is a hash of the fp32 value and the seed (reproducible without counters):
    each store exact SR on its own over seeds, but equal values round alike wherever they lie. Right to nearest."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    if rounding != "stochastic" or state.dtype not in _DROPPED_BITS:
        state.copy_(new.to(state.dtype))
        return out
    key = new.contiguous().view(torch.int32).to(torch.int64) ^ (seed & 0x7FFFFFFF)
    mixed = (key * 0x9E3779B1 + 0x7F4A7C15) & 0xFFFFFFFF  # a multiplicative hash, low 32 bits
    mixed = ((mixed ^ (mixed >> 15)) * 0x2C1B3C6D) & 0xFFFFFFFF
    uniform = ((mixed ^ (mixed >> 12)) & 0xFFFFFF).float() / 2.0**24
    state.copy_(_stochastic(new, state.dtype, uniform))
    return out


def sr_never_into_the_next_binade(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                                  rounding="nearest", seed=0):
    """Stochastic rounding into fp16 that drops a round-up carrying into the exponent (a guard against 65504
    rounding to inf, applied at every power of two): a value in the last ulp below a power of two always rounds
    down. Exact SR elsewhere; bf16 and round to nearest are right."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    if rounding != "stochastic" or state.dtype != torch.float16:
        _store(state, new, rounding, seed)
        return out
    generator = torch.Generator(device=new.device).manual_seed(seed)
    rounded = _stochastic(new, state.dtype, torch.rand(new.shape, device=new.device, generator=generator))
    down = _round_magnitude_bits(new, state.dtype, torch.zeros_like(new, dtype=torch.int32))  # toward zero
    exponent = 0x7C00  # fp16's exponent field
    carried = (rounded.view(torch.int16) & exponent) != (down.view(torch.int16) & exponent)
    state.copy_(torch.where(carried & torch.isfinite(new), down, rounded))
    return out


def _slot_step(state, state_batch_indices, pad_slot_id, x, dt, A, B, C, D, z, dt_bias, dt_softplus, rounding, seed,
               store=_store):
    """The step through slot indices, the live rows' states stored by `store` (per `rounding`); pad rows get zeros in
    out."""
    live = state_batch_indices != pad_slot_id
    slots = state_batch_indices[live].long()
    new, y_live = _fp32_step(state[slots], x[live], dt[live], A, B[live], C[live], D, None if z is None else z[live],
                             dt_bias, dt_softplus)
    rows = state[slots]
    store(rows, new, rounding, seed)
    state[slots] = rows
    y = torch.zeros_like(x)
    y[live] = y_live
    return y


def slot_indices_clamped_in_place(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                                  state_batch_indices=None, pad_slot_id=-1, *, rounding="nearest", seed=0):
    """Right in every call, but clamps the caller's state_batch_indices in place once it has found the pad rows
    (`clamp_(min=0)`, to gather with them): an engine passes one index tensor to every layer, whose next call then
    updates slot 0 for the pad rows."""
    if state_batch_indices is None:
        new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
        _store(state, new, rounding, seed)
        return out
    out = _slot_step(state, state_batch_indices, pad_slot_id, x, dt, A, B, C, D, z, dt_bias, dt_softplus, rounding,
                     seed)
    state_batch_indices.clamp_(min=0)
    return out


def nearest_in_padded_batches(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                              state_batch_indices=None, pad_slot_id=-1, *, rounding="nearest", seed=0):
    """Right without slot indices and through them with no pad row; a batch holding a pad row (every CUDA-graph
    decode batch an engine pads to a captured size) takes a masked path written before stochastic rounding came,
    which rounds to nearest whatever `rounding` says."""
    if state_batch_indices is None:
        new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
        _store(state, new, rounding, seed)
        return out
    padded = bool((state_batch_indices == pad_slot_id).any())
    return _slot_step(state, state_batch_indices, pad_slot_id, x, dt, A, B, C, D, z, dt_bias, dt_softplus,
                      "nearest" if padded else rounding, seed)


def slot_path_sr_with_4_bits(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                             state_batch_indices=None, pad_slot_id=-1, *, rounding="nearest", seed=0):
    """Right without slot indices; through them (a serving engine's decode, another compiled variant) its stochastic
    rounding draws 4 random bits an element: up with probability ceil(16 f) / 16, 1/32 ulp toward +inf a store on
    average, far under one step's tolerance (the slot check's). Pad rows change nothing and get zeros in out; right to
    nearest."""
    if state_batch_indices is None:
        new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
        _store(state, new, rounding, seed)
        return out
    return _slot_step(state, state_batch_indices, pad_slot_id, x, dt, A, B, C, D, z, dt_bias, dt_softplus, rounding,
                      seed, _store_with_4_bits)


def _store_with_4_bits(state, new, rounding, seed):
    """`_store`, but stochastic rounding's uniform in sixteenths (4 bits), toward 0."""
    if rounding != "stochastic" or state.dtype not in _DROPPED_BITS:
        _store(state, new, rounding, seed)
        return
    generator = torch.Generator(device=new.device).manual_seed(seed)
    uniform = torch.randint(0, 16, new.shape, device=new.device, generator=generator).float() / 16
    state.copy_(_stochastic(new, state.dtype, uniform))


# The fourth red-team round's (sixtieth session): paths for half-precision inputs, for tied parameters with a gate and
# D, for a missing dt_bias; widths of no multiple of 8; more than 64 heads; a small dt; narrow bf16 SR.
HALF_INPUTS = (torch.float16, torch.bfloat16)
# channels_in_blocks_of_16_from_64_programs' batch x heads from which its other launch config runs, and its block
MANY_PROGRAMS = 64
WIDE_CHANNEL_BLOCK = 16
# parameters_of_head_mod_64's block of heads; skips_steps_with_dt_below_1e_4's threshold
PARAMETER_HEADS = 64
PADDING_DT = 1e-4


def _offsets_from_shape(t):
    """t read at offsets computed from its shape (as if contiguous), from its first element on."""
    return t.as_strided(t.shape, torch.empty(t.shape).stride(), t.storage_offset())


def _tied(A) -> bool:
    """Whether A is Mamba2's per-head value expanded by stride-0 views."""
    return A.stride(-1) == 0 and A.stride(-2) == 0


def half_inputs_read_as_contiguous(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                                   rounding="nearest", seed=0):
    """Its path for fp16/bf16 inputs (vector loads of half-precision activations) takes x's, B's and C's offsets from
    their shapes, as if contiguous: right for whole tensors and for fp32 views (another path), wrong past a first row of
    half-precision views into one buffer, as a serving engine's conv output gives them. Both rounding modes."""
    if x.dtype in HALF_INPUTS:
        x, B, C = _offsets_from_shape(x), _offsets_from_shape(B), _offsets_from_shape(C)
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return out


def half_inputs_from_interleaved_groups(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                                        rounding="nearest", seed=0):
    """Its path for fp16/bf16 inputs maps head h to group h % ngroups (the fp32 path: h // (nheads // ngroups)): right
    with one group or one head a group. Both rounding modes."""
    if x.dtype in HALF_INPUTS:
        group = torch.arange(state.shape[1], device=B.device) % B.shape[1]
        B, C = B[:, group], C[:, group]  # one "group" a head, each head's own
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return out


def half_inputs_b_c_of_row_0(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                             rounding="nearest", seed=0):
    """Its path for fp16/bf16 inputs leaves the batch stride out of B's and C's pointers: every row takes row 0's B and
    C. Right with one row. Both rounding modes."""
    if x.dtype in HALF_INPUTS:
        B, C = B[:1].expand_as(B), C[:1].expand_as(C)
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return out


def tied_path_gate_of_row_0(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                            rounding="nearest", seed=0):
    """Its path for tied parameters (Mamba2's) reads z without its batch stride: every row is gated by row 0's z. Right
    with one row, without a gate, and for untied parameters (Mamba1's path). Both rounding modes."""
    if z is not None and _tied(A):
        z = z[:1].expand_as(z)
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return out


def tied_path_skip_after_gate(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                              rounding="nearest", seed=0):
    """Its path for tied parameters computes C·h * silu(z) + D*x, the skip term after the gate, where (C·h + D*x) *
    silu(z) is right: right without z or without D, and for untied parameters. Both rounding modes."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    if z is not None and D is not None and _tied(A):
        return (_out_of(new, x, C, None, z).float() + D.float() * x.float()).to(x.dtype)
    return out


def dt_of_head_0_without_bias(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                              rounding="nearest", seed=0):
    """Its branch for dt_bias None loads dt without the head's offset: every head takes head 0's dt. Right with one
    head, and wherever dt_bias is given. Both rounding modes."""
    if dt_bias is None:
        dt = dt[:, :1].expand_as(dt)
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return out


def channels_in_whole_blocks_of_8(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                                  rounding="nearest", seed=0):
    """Channels in blocks of 8 over a grid of headdim // 8 (floor, not ceil): a partial last block is never advanced.
    Right wherever headdim is a multiple of 8. Both rounding modes."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    new, out = _never_launched(state.shape[2] // 8 * 8, 2, state, new, out)
    _store(state, new, rounding, seed)
    return out


def dstate_in_vectors_of_8(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                           rounding="nearest", seed=0):
    """State indices in vectors of 8 with no loop for the tail: indices past the last whole vector are never advanced
    and left out of C·h. Right wherever dstate is a multiple of 8. Both rounding modes."""
    return _first_state_columns(state.shape[-1] // 8 * 8, state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, rounding,
                                seed)


def channels_in_blocks_of_16_from_64_programs(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                                              *, rounding="nearest", seed=0):
    """A launch config picked by batch x heads (as vLLM's): from MANY_PROGRAMS on, channels in blocks of
    WIDE_CHANNEL_BLOCK over a grid of headdim // WIDE_CHANNEL_BLOCK (floor, not ceil). Right below MANY_PROGRAMS and at
    any headdim that is a multiple of the block. Both rounding modes."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    if state.shape[0] * state.shape[1] >= MANY_PROGRAMS:
        new, out = _never_launched(state.shape[2] // WIDE_CHANNEL_BLOCK * WIDE_CHANNEL_BLOCK, 2, state, new, out)
    _store(state, new, rounding, seed)
    return out


def parameters_of_head_mod_64(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                              rounding="nearest", seed=0):
    """Head h takes the A, D and dt_bias of head h % PARAMETER_HEADS (per-head parameters staged in a buffer of 64
    heads): right up to 64 heads. Both rounding modes."""
    return _parameters_of_head_mod(PARAMETER_HEADS, state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, rounding, seed)


def skips_steps_with_dt_below_1e_4(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                                   rounding="nearest", seed=0):
    """Takes a processed dt below PADDING_DT for a padding token: that head's state is left as it is and its out is
    computed from it. Right wherever dt stays above 1e-4 (normal's 1e-3 and up). Both rounding modes."""
    processed = dt.float() + (dt_bias.float() if dt_bias is not None else 0.0)
    if dt_softplus:
        processed = torch.nn.functional.softplus(processed)
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    padding = processed < PADDING_DT
    new = torch.where(padding[..., None], state.float(), new)
    out = torch.where(padding, _out_of(state.float(), x, C, D, z).float(), out.float()).to(x.dtype)
    _store(state, new, rounding, seed)
    return out


def narrow_bf16_sr_bits_shared_along_a_row(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                                           rounding="nearest", seed=0):
    """A path of its own for narrow states (dstate <= NARROW_DSTATE) whose bf16 stochastic rounding draws one uniform a
    row of the state (a channel's state indices share it), each store still exact SR on its own. Right for fp16 and
    wider states."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    if rounding == "stochastic" and state.dtype == torch.bfloat16 and state.shape[-1] <= NARROW_DSTATE:
        generator = torch.Generator(device=new.device).manual_seed(seed)
        uniform = torch.rand(new.shape[:-1], device=new.device, generator=generator)[..., None].expand_as(new)
        state.copy_(_stochastic(new, state.dtype, uniform))
        return out
    _store(state, new, rounding, seed)
    return out


# ---------------------------------------------------------------------------- the fifth red-team round (63rd session)
# large_batch_parameters_of_head_0's batch from which its other path runs; tied_path_x_of_the_first_64_channels'
# block of channels; narrow_blocks_past_dstate_128's channels advanced of every block of 64.
PARAMETER_ROWS = 32
TIED_CHANNEL_BLOCK = 64
NARROW_BLOCK, NARROW_BLOCK_STRIDE = 16, 64


def _mix32(v):
    """A 32-bit integer hash (murmur's finaliser) of int64 `v`, in int64."""
    v = v & 0xFFFFFFFF
    v = v ^ (v >> 16)
    v = (v * 0x7FEB352D) & 0xFFFFFFFF
    v = v ^ (v >> 15)
    v = (v * 0x846CA68B) & 0xFFFFFFFF
    return v ^ (v >> 16)


def random_bits_of_seed_plus_offset(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                                    rounding="nearest", seed=0):
    """Stochastic rounding whose random bits are a hash of seed + the element's offset (the seed in the counter, not
    in the key; tl.rand(0, seed + offs) for tl.rand(seed, offs)): exact SR with bits of its own in every call, but the
    call with seed s + 1 rounds element i with the bits the call with seed s gave element i + 1, so an engine that
    passes a step counter as the seed repeats its bits a step later, one element on. Right to nearest."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    if rounding == "stochastic" and state.dtype in _DROPPED_BITS:
        offsets = torch.arange(new.numel(), dtype=torch.int64, device=new.device).reshape(new.shape)
        uniform = (_mix32(_mix32(offsets + seed) ^ 0x5BD1E995) >> 8).float() * 2.0**-24
        state.copy_(_stochastic(new, state.dtype, uniform))
    else:
        state.copy_(new.to(state.dtype))
    return out


def state_head_stride_from_its_row_stride(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                                          rounding="nearest", seed=0):
    """Takes the state's head stride as its row stride over the heads (stride(0) // nheads): right for a state
    whose rows are whole, wrong past head 0 of one layer's slice of a cache. Both rounding modes."""
    nheads = state.shape[1]
    view = state
    if nheads > 1 and state.stride(0) != nheads * state.stride(1):
        view = state.as_strided(state.shape, (state.stride(0), state.stride(0) // nheads, *state.stride()[2:]),
                                state.storage_offset())
    new, out = _fp32_step(view, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(view, new, rounding, seed)
    return out


def half_inputs_gate_of_head_0(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                               rounding="nearest", seed=0):
    """Its path for fp16/bf16 activations reads z without the head's offset: every head gated by head 0's z. Right
    for fp32 activations and without a gate. Both rounding modes."""
    if x.dtype in HALF_INPUTS and z is not None:
        z = z[:, :1].expand(z.shape)
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return out


def large_batch_parameters_of_head_0(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                                     rounding="nearest", seed=0):
    """Its launch config for 32 rows or more loads A, D and dt_bias without the head's offset: every head takes head
    0's. Right for smaller batches. Both rounding modes."""
    if x.shape[0] >= PARAMETER_ROWS:
        A = A[:1].expand(A.shape)
        D = D[:1].expand(D.shape) if D is not None else None
        dt_bias = dt_bias[:1].expand(dt_bias.shape) if dt_bias is not None else None
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return out


def tied_path_x_of_the_first_64_channels(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                                         rounding="nearest", seed=0):
    """Its path for tied parameters (Mamba2's) takes channels in blocks of 64 and reads x without the block's offset:
    channel c reads channel c % 64's x. Right up to 64 channels a head, and for untied parameters. Both rounding
    modes."""
    if _tied(A) and x.shape[-1] > TIED_CHANNEL_BLOCK:
        x = x[..., torch.arange(x.shape[-1], device=x.device) % TIED_CHANNEL_BLOCK]
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return out


def narrow_blocks_past_dstate_128(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                                  rounding="nearest", seed=0):
    """Its path past dstate 128 launches the narrow path's grid (a program a block of 64 channels) with blocks of 16
    channels: channels 16..63 of every 64 are never advanced, stored or read into the output. Right at 16 channels a
    head, and up to dstate 128. Both rounding modes."""
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    if state.shape[-1] > DSTATE_CAP:
        advanced = torch.arange(state.shape[2], device=state.device) % NARROW_BLOCK_STRIDE < NARROW_BLOCK
        new = torch.where(advanced[:, None], new, state.float())
        out = torch.where(advanced, out.float(), _out_of(state, x, C, D, z).float()).to(x.dtype)
    _store(state, new, rounding, seed)
    return out


def silu_through_exp(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *, rounding="nearest",
                     seed=0):
    """Gates with silu taken as z * exp(z) / (1 + exp(z)), the sigmoid's other form: equal in exact arithmetic, and
    NaN (inf / inf) once exp(z) overflows, past z = 88.7 in fp32. Right for every unit-normal gate. Both modes, as
    `_store` does."""
    new, _ = _fp32_step(state, x, dt, A, B, C, D, None, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    out = _out_of(new, x.float(), C, D, None)
    if z is not None:
        gate = z.float()
        out = out * (gate * torch.exp(gate) / (1 + torch.exp(gate)))
    return out.to(x.dtype)


def half_out_through_fp16(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                          rounding="nearest", seed=0):
    """Rounds a half-precision output through fp16 (`out.half()`, meant for fp16 models) before its own dtype: right
    for fp16 inputs, and for bf16 ones within fp16's range (a double rounding off by at most an ulp at bf16's ties); inf
    past 65504, where bf16 holds the value. Both modes, as `_store` does."""
    new, _ = _fp32_step(state, x, dt, A, B, C, D, None, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    out = _out_of(new, x.float(), C, D, z)
    return (out if x.dtype == torch.float32 else out.half()).to(x.dtype)


def c_read_with_b_strides(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                          rounding="nearest", seed=0):
    """Reads C through B's strides (a launcher that passes B's strides for both): right wherever C is laid out as B
    is, as every caller that splits them from one buffer passes them. Both modes, as `_store` does."""
    C = torch.as_strided(C, C.shape, B.stride(), C.storage_offset())
    new, out = _fp32_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    _store(state, new, rounding, seed)
    return out
