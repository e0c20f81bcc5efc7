"""The built-in Triton state update (one decode step), with state-spaces/mamba's
`selective_state_update` signature.

Per (batch, head) and a block of BLOCK_P channels, the program reads the
state rows once, computes in fp32

    state = exp(dt * A) * state + dt * x * B,   out = C . state + D * x,  out *= silu(z)

and stores the state back rounded to its dtype: to nearest, or stochastically.
The output uses the unrounded fp32 state, as mamba's kernel does.

The step is memory-bound: it moves the state twice and little else, so the
kernel reads each state element once, with wide vector accesses, keeps
per-element arithmetic small, and issues every load before its first store
(how long a program holds its slot on the SM limits the bytes in flight).
Consecutive programs take consecutive pieces of the state (heads vary faster
than batch entries), so DRAM streams as in a copy: 84% -> 96% of the bytes
floor for an fp16 state on the H200 (benchmarks/RESULTS.md).
Parameters tied across a head (A of shape (nheads,) expanded to (nheads,
headdim, dstate), dt and dt_bias expanded over headdim, as Mamba2 passes
them) are detected from their zero strides and read once per program, so
exp(dt * A) is one scalar per head.

Stochastic rounding gives each state element 16 random bits: a block's
channels form four row groups, and elements (r, 2j) and (r, 2j + 1) of group k
take the low and the high half of word k of Philox(seed, counter), counter =
the flat state index of group 0's element (r, 2j): one call per eight elements.
That is exact into bf16; into fp16 a row group holding an element that 16 bits
cannot round (a tie below 2**-17, or a value below 2**-24: rare) is not stored
but redone from the old state at the end of its block, each draw continued
from a second stream. Each group is advanced, rounded and stored before the
next, so that one group's fp32 state is live at a time. SR is bound by its
instructions, not by DRAM: at large batches a program takes several blocks of
channels in turn, loading the next block's state while it computes the current
one (launch_config). The arithmetic is the same in every launch (the decay's
multiply-add is written out), so a step's bits do not depend on how the
channels are split. See ssmcheck/ops/rounding/stochastic.py.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ssmcheck.ops import interpreting
from ssmcheck.ops.common import softplus
from ssmcheck.ops.host import cdiv, next_power_of_2
from ssmcheck.ops.rounding.stochastic import (
    DEFAULT_PHILOX_ROUNDS,
    check_rounding,
    check_seed,
    round_nearest,
    round_saturating,
    shared_words,
    stochastic_round_exact,
    stochastic_round_hardware,
    stochastic_round_pairs,
    triton_dtype,
)

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The slot index of a pad row (state_batch_indices): serving engines' PAD_SLOT_ID.
PAD_SLOT_ID = -1


# A block's channels form four row groups: one Philox call serves an element of each under stochastic rounding.
ROW_GROUPS = 4
# Under software SR a program takes LaunchConfig.sr_blocks blocks of channels in turn where the launch keeps at least
# this many programs; with fewer, one block each was as fast or faster on the H200 (benchmarks/RESULTS.md, "the
# state update's SR blocks in turn").
SR_MIN_PROGRAMS = 10240


@dataclass(frozen=True)
class LaunchConfig:
    block_p: int  # channels (headdim rows) per block, a multiple of the row groups
    num_warps: int
    sr_blocks: int = 1  # under software SR, the most blocks a program takes in turn (a power of two)
    sr_maxnreg: int | None = None  # the register cap of a launch whose programs take several blocks


@functools.cache  # asked at every decode step
def launch_config(headdim: int, dstate: int, state_dtype: torch.dtype, interpreter: bool) -> LaunchConfig:
    """One warp per program, each row group as many rows as give every thread one 16-byte vector of state.

    That is blocks of 4 channels for an fp32 state and 8 for fp16/bf16 at dstate 128, one a program: in
    every mode, stochastic rounding included, the fastest or within 2% of the fastest of the
    configurations measured on the H200 (benchmarks/RESULTS.md, state update, launch
    configurations at batch 256). Small one-warp programs keep the most state loads in flight
    per SM for the registers they hold.
    Software SR is bound by its instructions instead (Philox, the rounding), and a program that waits
    on DRAM issues none: there a program takes several blocks in turn, each block's state loaded
    while the one before is computed, 4 for fp16 and 2 for bf16 (the fastest of 1, 2, 4 and 8 at
    batch 64 to 256 on the H200, where fp16 SR went from 0.238 to 0.216 ms at batch 256;
    benchmarks/RESULTS.md, "the state update's SR blocks in turn"). Capped at 96 registers (from 128,
    with a few spills), fp16's programs ran 2% faster still (0.211 ms).
    The interpreter pays per program, not per byte: there one program takes up to 64 channels.
    """
    if interpreter:
        return LaunchConfig(block_p=max(ROW_GROUPS, min(64, next_power_of_2(headdim))), num_warps=1)
    row_bytes = next_power_of_2(dstate) * state_dtype.itemsize
    channels = ROW_GROUPS * max(1, 32 * 16 // row_bytes)  # a warp's 32 threads x 16 bytes per row group
    return LaunchConfig(block_p=max(ROW_GROUPS, min(channels, next_power_of_2(headdim))), num_warps=1,
                        sr_blocks={torch.float16: 4, torch.bfloat16: 2}.get(state_dtype, 1),
                        sr_maxnreg=96 if state_dtype == torch.float16 else None)


def blocks_per_program(config: LaunchConfig, blocks: int, heads: int) -> int:
    """How many of a head's `blocks` blocks of channels a software-SR program takes in turn, for `heads` (batch x
    nheads) heads: config.sr_blocks, or the largest power of two up to `blocks` if smaller (a program's pad rows
    are a power of two), where that leaves SR_MIN_PROGRAMS programs, else 1."""
    per_program = min(config.sr_blocks, 1 << (blocks.bit_length() - 1))
    return per_program if cdiv(blocks, per_program) * heads >= SR_MIN_PROGRAMS else 1


@triton.jit
def _exp(v, INTERPRET: tl.constexpr):
    # The decay compounds over a decode: on the GPU tl.exp is ex2.approx (about 2 ulp,
    # the same sign for the same input, so it drifts like a bias); libdevice's expf is
    # within an ulp. The interpreter has no libdevice, and numpy's exp is accurate.
    if INTERPRET:
        return tl.exp(v)
    else:
        return libdevice.exp(v)


@triton.jit
def _softplus(v, INTERPRET: tl.constexpr):
    # log(1 + exp(v)) without overflow, accurate to an ulp or two: dt scales the whole
    # update, and tl.log's approximation on the GPU costs dt about 2**-20 relative.
    if INTERPRET:
        return softplus(v)
    else:
        return tl.maximum(v, 0.0) + libdevice.log1p(libdevice.exp(-tl.abs(v)))


@triton.jit
def _load_dt(dt_ptr, dt_bias_ptr, offset, bias_offset, mask, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
             INTERPRET: tl.constexpr):
    dt = tl.load(dt_ptr + offset, mask=mask, other=0.0).to(tl.float32)
    if HAS_DT_BIAS:
        dt += tl.load(dt_bias_ptr + bias_offset, mask=mask, other=0.0).to(tl.float32)
    if DT_SOFTPLUS:
        dt = _softplus(dt, INTERPRET)
    return dt


@triton.jit
def _state_tile(group, block, slot, h, headdim, dstate, n, state_ptr, s_b, s_h, s_p, s_n, GROUPS: tl.constexpr,
                BLOCK_P: tl.constexpr):
    """(pointers, mask) of row group `group`'s state tile (R, len(n)) at columns n in pool slot `slot`."""
    R: tl.constexpr = BLOCK_P // GROUPS
    p = block * BLOCK_P + group * R + tl.arange(0, R)
    return (state_ptr + slot * s_b + h * s_h + (p[:, None] * s_p + n[None, :] * s_n),
            (p < headdim)[:, None] & (n < dstate)[None, :])


@triton.jit
def _load_state(group, block, slot, h, headdim, dstate, state_ptr, s_b, s_h, s_p, s_n,
                GROUPS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """Row group `group`'s state tile (R, BLOCK_N) of pool slot `slot`, as stored."""
    ptrs, inside = _state_tile(group, block, slot, h, headdim, dstate, tl.arange(0, BLOCK_N), state_ptr, s_b, s_h,
                               s_p, s_n, GROUPS, BLOCK_P)
    # Each element is read once and written once: let the state stream past L2
    # rather than evict B, C and the per-head parameters that every program reads.
    return tl.load(ptrs, mask=inside, other=0.0, eviction_policy="evict_first")


@triton.jit
def _load_block(block, slot, h, headdim, dstate, state_ptr, s_b, s_h, s_p, s_n, GROUPS: tl.constexpr,
                BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """Block `block`'s state tiles, one per row group (`_load_state`)."""
    tiles = ()
    for group in tl.static_range(GROUPS):
        tiles = tiles + (_load_state(group, block, slot, h, headdim, dstate, state_ptr, s_b, s_h, s_p, s_n, GROUPS,
                                     BLOCK_P, BLOCK_N),)
    return tiles


@triton.jit
def _load_channels(group, block, b, h, headdim, x_ptr, D_ptr, z_ptr, x_b, x_h, x_p, d_h, d_p, z_b, z_h, z_p,
                   HAS_D: tl.constexpr, HAS_Z: tl.constexpr, GROUPS: tl.constexpr, BLOCK_P: tl.constexpr):
    """Row group `group`'s x, D and z (R,) in fp32; D and z are 0 where absent (and unused)."""
    R: tl.constexpr = BLOCK_P // GROUPS
    p = block * BLOCK_P + group * R + tl.arange(0, R)
    rows = p < headdim
    x = tl.load(x_ptr + b * x_b + h * x_h + p * x_p, mask=rows, other=0.0).to(tl.float32)
    d = tl.zeros_like(x)
    z = tl.zeros_like(x)
    if HAS_D:
        d = tl.load(D_ptr + h * d_h + p * d_p, mask=rows, other=0.0).to(tl.float32)
    if HAS_Z:
        z = tl.load(z_ptr + b * z_b + h * z_h + p * z_p, mask=rows, other=0.0).to(tl.float32)
    return x, d, z


@triton.jit
def _step(state, x, p, n, rows, b_cols, b, h, dstate, dt_ptr, dt_bias_ptr, A_ptr, dt_b, dt_h, dt_p, dtb_h, dtb_p, a_h,
          a_p, a_n, dt_head, dA_head, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr, DT_PER_HEAD: tl.constexpr,
          A_PER_HEAD: tl.constexpr, INTERPRET: tl.constexpr):
    """The new fp32 state of the tile at channels p (rows: p < headdim) and state columns n, stored `state`:
    exp(dt * A) * state + dt * x * B, B's values at n given (b_cols)."""
    if DT_PER_HEAD:
        dt = dt_head
        dA = dA_head
    else:
        dt = _load_dt(dt_ptr, dt_bias_ptr, b * dt_b + h * dt_h + p * dt_p, h * dtb_h + p * dtb_p, rows,
                      HAS_DT_BIAS, DT_SOFTPLUS, INTERPRET)
        if A_PER_HEAD:
            dA = _exp(dt * tl.load(A_ptr + h * a_h).to(tl.float32), INTERPRET)[:, None]
        dt = dt[:, None]
    if not A_PER_HEAD:
        A = tl.load(A_ptr + h * a_h + (p[:, None] * a_p + n[None, :] * a_n),
                    mask=rows[:, None] & (n < dstate)[None, :], other=0.0).to(tl.float32)
        dA = _exp(dt * A, INTERPRET)
    # One fused multiply-add, written out: left to the compiler, which product it fuses changed with the code
    # around it (an ulp, or more where the two terms cancel), so the same step gave other bits in another launch.
    return tl.fma(state.to(tl.float32), dA, (dt * x[:, None]) * b_cols[None, :])


@triton.jit
def _advance_group(group, state, x, d, z, block, b, h, headdim, dstate, dt_ptr, dt_bias_ptr, A_ptr,
                   dt_b, dt_h, dt_p, dtb_h, dtb_p, a_h, a_p, a_n, dt_head, dA_head, b_row, c_row,
                   HAS_DT_BIAS: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
                   DT_PER_HEAD: tl.constexpr, A_PER_HEAD: tl.constexpr, INTERPRET: tl.constexpr,
                   GROUPS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """Row group `group`: (new fp32 state (R, BLOCK_N), output (R,) = (C . state + D * x) * silu(z))."""
    R: tl.constexpr = BLOCK_P // GROUPS
    p = block * BLOCK_P + group * R + tl.arange(0, R)
    state = _step(state, x, p, tl.arange(0, BLOCK_N), p < headdim, b_row, b, h, dstate, dt_ptr, dt_bias_ptr, A_ptr,
                  dt_b, dt_h, dt_p, dtb_h, dtb_p, a_h, a_p, a_n, dt_head, dA_head, HAS_DT_BIAS, DT_SOFTPLUS,
                  DT_PER_HEAD, A_PER_HEAD, INTERPRET)
    y = tl.sum(state * c_row[None, :], axis=1)
    if HAS_D:
        y += x * d
    if HAS_Z:
        y *= z / (1.0 + tl.exp(-z))
    return state, y


@triton.jit
def _store_group(group, block, b, slot, h, headdim, dstate, state, y, state_ptr, out_ptr, s_b, s_h, s_p, s_n, o_b, o_h,
                 o_p, OUT_DTYPE: tl.constexpr, GROUPS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
                 skip_state=False):
    """Store row group `group`'s rounded state (into its slot of the pool; not where skip_state) and its output
    (row b, saturated: core.formats.saturate)."""
    ptrs, inside = _state_tile(group, block, slot, h, headdim, dstate, tl.arange(0, BLOCK_N), state_ptr, s_b, s_h,
                               s_p, s_n, GROUPS, BLOCK_P)
    tl.store(ptrs, state, mask=inside & (not skip_state), cache_modifier=".cs")
    R: tl.constexpr = BLOCK_P // GROUPS
    p = block * BLOCK_P + group * R + tl.arange(0, R)
    tl.store(out_ptr + b * o_b + h * o_h + p * o_p, round_saturating(y, OUT_DTYPE), mask=p < headdim)


@triton.jit
def _sr_group(group, t, words, block, b, slot, h, headdim, dstate, x_ptr, D_ptr, z_ptr, x_b, x_h, x_p, d_h, d_p, z_b,
              z_h, z_p, dt_ptr, dt_bias_ptr, A_ptr, dt_b, dt_h, dt_p, dtb_h, dtb_p, a_h, a_p, a_n, dt_head, dA_head,
              b_row, c_row, state_ptr, out_ptr, s_b, s_h, s_p, s_n, o_b, o_h, o_p, HAS_DT_BIAS: tl.constexpr,
              HAS_D: tl.constexpr, HAS_Z: tl.constexpr, DT_SOFTPLUS: tl.constexpr, DT_PER_HEAD: tl.constexpr,
              A_PER_HEAD: tl.constexpr, STATE_DTYPE: tl.constexpr, OUT_DTYPE: tl.constexpr, HARDWARE: tl.constexpr,
              INTERPRET: tl.constexpr, GROUPS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """Row group `group` under stochastic rounding: its channels loaded, its state tile `t` advanced, rounded
    with its random `words` and stored, with its output. Returns whether the group's state must be redone
    (`_redo_half`): then its state is not stored, and the old one stays in memory for the redo."""
    x, d, z = _load_channels(group, block, b, h, headdim, x_ptr, D_ptr, z_ptr, x_b, x_h, x_p, d_h, d_p, z_b, z_h,
                             z_p, HAS_D, HAS_Z, GROUPS, BLOCK_P)
    state, y = _advance_group(group, t, x, d, z, block, b, h, headdim, dstate, dt_ptr, dt_bias_ptr, A_ptr, dt_b, dt_h,
                              dt_p, dtb_h, dtb_p, a_h, a_p, a_n, dt_head, dA_head, b_row, c_row, HAS_DT_BIAS, HAS_D,
                              HAS_Z, DT_SOFTPLUS, DT_PER_HEAD, A_PER_HEAD, INTERPRET, GROUPS, BLOCK_P, BLOCK_N)
    redo = False
    if HARDWARE:
        state = stochastic_round_hardware(state, words, STATE_DTYPE)
    else:
        state, redo = stochastic_round_pairs(state, words, STATE_DTYPE)
    _store_group(group, block, b, slot, h, headdim, dstate, state, y, state_ptr, out_ptr, s_b, s_h, s_p, s_n, o_b, o_h,
                 o_p, OUT_DTYPE, GROUPS, BLOCK_P, BLOCK_N, redo)
    return redo


@triton.jit
def _redo_half(group, parity, block, b, slot, h, nheads, headdim, dstate, seed, x_ptr, B_ptr, x_b, x_h, x_p, b_b, b_g,
               b_n, g, dt_ptr, dt_bias_ptr, A_ptr, dt_b, dt_h, dt_p, dtb_h, dtb_p, a_h, a_p, a_n, dt_head, dA_head,
               state_ptr, s_b, s_h, s_p, s_n, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
               DT_PER_HEAD: tl.constexpr, A_PER_HEAD: tl.constexpr, WIDE_COUNTERS: tl.constexpr,
               N_ROUNDS: tl.constexpr, INTERPRET: tl.constexpr, GROUPS: tl.constexpr, BLOCK_P: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """The even (parity 0) or odd (1) state columns of row group `group`, advanced again from the old state in
    memory (the same arithmetic: the same fp32 values) and rounded into fp16 by `stochastic_round_exact`:
    each element's 16 bits drawn again (its half of word `group` of the pair's call), the rest of its draw
    from word `group` of the second stream's call at group 0's element (four groups share a call), stored.
    Half a tile at a time, for fewer registers; the odd half's loads wait for the even half's stores."""
    R: tl.constexpr = BLOCK_P // GROUPS
    row = block * BLOCK_P + tl.arange(0, R)
    p = row + group * R
    pairs = 2 * tl.arange(0, BLOCK_N // 2)
    n = pairs + parity
    rows = p < headdim
    ptrs, inside = _state_tile(group, block, slot, h, headdim, dstate, n, state_ptr, s_b, s_h, s_p, s_n, GROUPS,
                               BLOCK_P)
    x = tl.load(x_ptr + b * x_b + h * x_h + p * x_p, mask=rows, other=0.0).to(tl.float32)
    b_cols = tl.load(B_ptr + b * b_b + g * b_g + n * b_n, mask=n < dstate, other=0.0).to(tl.float32)
    state = _step(tl.load(ptrs, mask=inside, other=0.0), x, p, n, rows, b_cols, b, h, dstate, dt_ptr, dt_bias_ptr,
                  A_ptr, dt_b, dt_h, dt_p, dtb_h, dtb_p, a_h, a_p, a_n, dt_head, dA_head, HAS_DT_BIAS, DT_SOFTPLUS,
                  DT_PER_HEAD, A_PER_HEAD, INTERPRET)
    r0, r1, r2, r3 = tl.randint4x(seed, _flat_index(slot, h, row[:, None], pairs[None, :], nheads, headdim, dstate,
                                                    WIDE_COUNTERS), n_rounds=N_ROUNDS)
    r16 = tl.where(group == 0, r0, tl.where(group == 1, r1, tl.where(group == 2, r2, r3))) >> (16 * parity)
    counters = _flat_index(slot, h, row[:, None], n[None, :], nheads, headdim, dstate, WIDE_COUNTERS)
    tl.store(ptrs, stochastic_round_exact(state, r16, seed, counters, group, N_ROUNDS), mask=inside)


@triton.jit
def _flat_index(slot, h, p, n, nheads, headdim, dstate, WIDE: tl.constexpr):
    """The flat index of state element (slot, h, p, n) in the pool: a Philox counter."""
    if WIDE:
        return ((slot * nheads + h) * headdim + p) * dstate + n
    else:
        # A pool of at most 2**32 elements: every index fits 32 unsigned bits, and Philox's counter is the
        # same as from the 64-bit index (its high word is 0), in cheaper arithmetic and a cheaper first round.
        return ((slot.to(tl.uint32) * nheads + h.to(tl.uint32)) * headdim + p.to(tl.uint32)) * dstate + n.to(tl.uint32)


@triton.jit
def _sr_block(block, tiles, b, slot, h, nheads, headdim, dstate, seed, x_ptr, B_ptr, D_ptr, z_ptr, x_b, x_h, x_p, b_b,
              b_g, b_n, g, d_h, d_p, z_b, z_h, z_p, dt_ptr, dt_bias_ptr, A_ptr, dt_b, dt_h, dt_p, dtb_h, dtb_p, a_h,
              a_p, a_n, dt_head, dA_head, b_row, c_row, state_ptr, out_ptr, s_b, s_h, s_p, s_n, o_b, o_h, o_p,
              HAS_DT_BIAS: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
              DT_PER_HEAD: tl.constexpr, A_PER_HEAD: tl.constexpr, STATE_DTYPE: tl.constexpr,
              OUT_DTYPE: tl.constexpr, HARDWARE: tl.constexpr, WIDE_COUNTERS: tl.constexpr, N_ROUNDS: tl.constexpr,
              INTERPRET: tl.constexpr, GROUPS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """Block `block` of BLOCK_P channels under stochastic rounding, its state tiles (one per row group) loaded:
    advanced, rounded and stored, with its outputs."""
    R: tl.constexpr = BLOCK_P // GROUPS
    n = tl.arange(0, BLOCK_N)
    row = block * BLOCK_P + tl.arange(0, R)
    # Counters: flat indices of (slot, head, channel, n) in group 0's rows, so that the bits follow the
    # state; group k takes word k of each call.
    if HARDWARE:
        # cvt.rs: element (r, n) of group k takes word k of Philox(seed, index of group 0's (r, n)).
        words = shared_words(seed, _flat_index(slot, h, row[:, None], n[None, :], nheads, headdim, dstate,
                                               WIDE_COUNTERS), tiles[0], N_ROUNDS)
    else:
        # 16 bits an element: elements (r, 2j) and (r, 2j + 1) of group k take the low and the high half
        # of word k of Philox(seed, index of group 0's (r, 2j)): one call per eight elements.
        pairs = 2 * tl.arange(0, BLOCK_N // 2)
        words = tl.randint4x(seed, _flat_index(slot, h, row[:, None], pairs[None, :], nheads, headdim, dstate,
                                               WIDE_COUNTERS), n_rounds=N_ROUNDS)
    # Each group is advanced, rounded and stored before the next, so that one group's fp32 state is live
    # at a time, not all four.
    redo = ()  # whether each row group must be redone
    for group in tl.static_range(GROUPS):
        redo = redo + (_sr_group(group, tiles[group], words[group], block, b, slot, h, headdim, dstate, x_ptr,
                                 D_ptr, z_ptr, x_b, x_h, x_p, d_h, d_p, z_b, z_h, z_p, dt_ptr, dt_bias_ptr, A_ptr,
                                 dt_b, dt_h, dt_p, dtb_h, dtb_p, a_h, a_p, a_n, dt_head, dA_head, b_row, c_row,
                                 state_ptr, out_ptr, s_b, s_h, s_p, s_n, o_b, o_h, o_p, HAS_DT_BIAS, HAS_D, HAS_Z,
                                 DT_SOFTPLUS, DT_PER_HEAD, A_PER_HEAD, STATE_DTYPE, OUT_DTYPE, HARDWARE,
                                 INTERPRET, GROUPS, BLOCK_P, BLOCK_N),)
    if STATE_DTYPE == tl.float16 and not HARDWARE:
        # Rare: a group holding an element that its 16 random bits cannot round (a tie, or a value below
        # 2**-24; ops.rounding.stochastic_round_pairs). Its state was not stored: redo it from the old one,
        # once nothing else is live (a branch inside the group would hold its registers through the
        # common path, and cost every program occupancy).
        if redo[0] | redo[1] | redo[2] | redo[3]:
            # Loops, not unrolled code: the branch's code and registers stay small.
            for redone in range(GROUPS):
                if (((redone == 0) & redo[0]) | ((redone == 1) & redo[1]) | ((redone == 2) & redo[2])
                        | ((redone == 3) & redo[3])):
                    for parity in range(2):
                        _redo_half(redone, parity, block, b, slot, h, nheads, headdim, dstate, seed, x_ptr, B_ptr,
                                   x_b, x_h, x_p, b_b, b_g, b_n, g, dt_ptr, dt_bias_ptr, A_ptr, dt_b, dt_h, dt_p,
                                   dtb_h, dtb_p, a_h, a_p, a_n, dt_head, dA_head, state_ptr, s_b, s_h, s_p, s_n,
                                   HAS_DT_BIAS, DT_SOFTPLUS, DT_PER_HEAD, A_PER_HEAD, WIDE_COUNTERS, N_ROUNDS,
                                   INTERPRET, GROUPS, BLOCK_P, BLOCK_N)


# A new seed every step must not mean a new compilation; nor a pad slot id of 0 (vLLM's null block, divisible by
# 16 to Triton's specialisation) where it is -1: only compared with a row's slot, it gains nothing from it, and
# a drift case's null-slot check compiled a variant of its own for it (fiftieth session). Nor whether the call
# passes slot indices (`has_slots`, 0 or 1, read once a program): as a constexpr it doubled the variants of a
# drift case, whose trials and checks call both ways (the default GPU drift's 182 variants would be 124).
@triton.jit(do_not_specialize=["seed", "pad_slot_id", "has_slots"])
def _state_update_kernel(
    state_ptr, x_ptr, dt_ptr, dt_bias_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, out_ptr, slots_ptr,
    seed, nheads, headdim, dstate, pad_slot_id, has_slots,
    s_b, s_h, s_p, s_n,
    x_b, x_h, x_p,
    dt_b, dt_h, dt_p,
    dtb_h, dtb_p,
    a_h, a_p, a_n,
    b_b, b_g, b_n,
    c_b, c_g, c_n,
    d_h, d_p,
    z_b, z_h, z_p,
    o_b, o_h, o_p,
    HEADS_PER_GROUP: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    DT_PER_HEAD: tl.constexpr, A_PER_HEAD: tl.constexpr,
    STATE_DTYPE: tl.constexpr, OUT_DTYPE: tl.constexpr, STOCHASTIC: tl.constexpr, HARDWARE: tl.constexpr,
    SEED_IN_MEMORY: tl.constexpr, WIDE_COUNTERS: tl.constexpr, N_ROUNDS: tl.constexpr, INTERPRET: tl.constexpr,
    GROUPS: tl.constexpr, BLOCKS: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # Heads vary faster than batch entries, so that consecutive programs walk the state
    # (batch, nheads, headdim, dstate) in memory order: DRAM then streams as in a copy.
    pid_p = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    slot = b  # the row's state in the pool: its own row, or the slot state_batch_indices names
    if has_slots != 0:
        slot = tl.load(slots_ptr + b).to(tl.int64)
    if (has_slots != 0) & (slot == pad_slot_id):
        # A pad row (a CUDA-graph batch's filler): no state is read or written; its output is defined as 0.
        p = pid_p * (BLOCKS * BLOCK_P) + tl.arange(0, BLOCKS * BLOCK_P)
        tl.store(out_ptr + b * o_b + h * o_h + p * o_p, tl.zeros((BLOCKS * BLOCK_P,), tl.float32).to(OUT_DTYPE),
                 mask=p < headdim)
        return
    # Every load comes before the first store: the compiler cannot move a load above a
    # store that might alias it, and each load left behind a store costs the program
    # another memory latency (and none crosses the barrier of a layout conversion). The
    # state tiles go first, so that their DRAM latency overlaps everything else.
    tiles = _load_block(pid_p * BLOCKS, slot, h, headdim, dstate, state_ptr, s_b, s_h, s_p, s_n, GROUPS, BLOCK_P,
                        BLOCK_N)
    if not STOCHASTIC:
        channels = ()  # (x, D, z) of each row group
        for group in tl.static_range(GROUPS):
            channels = channels + (_load_channels(group, pid_p, b, h, headdim, x_ptr, D_ptr, z_ptr, x_b, x_h, x_p,
                                                  d_h, d_p, z_b, z_h, z_p, HAS_D, HAS_Z, GROUPS, BLOCK_P),)
    g = h // HEADS_PER_GROUP
    n = tl.arange(0, BLOCK_N)
    b_row = tl.load(B_ptr + b * b_b + g * b_g + n * b_n, mask=n < dstate, other=0.0).to(tl.float32)
    c_row = tl.load(C_ptr + b * c_b + g * c_g + n * c_n, mask=n < dstate, other=0.0).to(tl.float32)
    dt_head = 0.0  # per-head dt and decay, when dt (and A) are tied across the head's channels
    dA_head = 1.0
    if DT_PER_HEAD:
        dt_head = _load_dt(dt_ptr, dt_bias_ptr, b * dt_b + h * dt_h, h * dtb_h, True, HAS_DT_BIAS, DT_SOFTPLUS,
                           INTERPRET)
        if A_PER_HEAD:
            dA_head = _exp(dt_head * tl.load(A_ptr + h * a_h).to(tl.float32), INTERPRET)

    # A block's BLOCK_P channels in GROUPS row groups, so that SR can give each
    # group its own share of one Philox call; every row is contiguous in dstate.
    if STOCHASTIC:
        if SEED_IN_MEMORY:  # a one-element tensor: a CUDA graph can advance it between replays
            seed = tl.load(seed)
        t0, t1, t2, t3 = tiles
        # The program's BLOCKS blocks of channels one after the other, each block's state tiles loaded while
        # the one before is computed: a program then waits on DRAM once, not once per block.
        for i in range(BLOCKS):
            block = pid_p * BLOCKS + i
            if BLOCKS > 1:  # (one block a program, as in the interpreter and at small batches: nothing to load ahead)
                # The next block's tiles; past the program's last block, rows past headdim: masked, nothing read.
                ahead = tl.where(i + 1 < BLOCKS, block + 1, (headdim + BLOCK_P - 1) // BLOCK_P)
                n0, n1, n2, n3 = _load_block(ahead, slot, h, headdim, dstate, state_ptr, s_b, s_h, s_p, s_n, GROUPS,
                                             BLOCK_P, BLOCK_N)
            _sr_block(block, (t0, t1, t2, t3), b, slot, h, nheads, headdim, dstate, seed, x_ptr, B_ptr, D_ptr, z_ptr,
                      x_b, x_h, x_p, b_b, b_g, b_n, g, d_h, d_p, z_b, z_h, z_p, dt_ptr, dt_bias_ptr, A_ptr, dt_b,
                      dt_h, dt_p, dtb_h, dtb_p, a_h, a_p, a_n, dt_head, dA_head, b_row, c_row, state_ptr, out_ptr,
                      s_b, s_h, s_p, s_n, o_b, o_h, o_p, HAS_DT_BIAS, HAS_D, HAS_Z, DT_SOFTPLUS, DT_PER_HEAD,
                      A_PER_HEAD, STATE_DTYPE, OUT_DTYPE, HARDWARE, WIDE_COUNTERS, N_ROUNDS, INTERPRET, GROUPS,
                      BLOCK_P, BLOCK_N)
            if BLOCKS > 1:
                t0, t1, t2, t3 = n0, n1, n2, n3
    else:
        advanced = ()  # (new fp32 state, output) of each row group; every group's loads before any store
        for group in tl.static_range(GROUPS):
            x, d, z = channels[group]
            advanced = advanced + (_advance_group(group, tiles[group], x, d, z, pid_p, b, h, headdim, dstate, dt_ptr,
                                                  dt_bias_ptr, A_ptr, dt_b, dt_h, dt_p, dtb_h, dtb_p, a_h, a_p, a_n,
                                                  dt_head, dA_head, b_row, c_row, HAS_DT_BIAS, HAS_D, HAS_Z,
                                                  DT_SOFTPLUS, DT_PER_HEAD, A_PER_HEAD, INTERPRET, GROUPS, BLOCK_P,
                                                  BLOCK_N),)
        for group in tl.static_range(GROUPS):
            state, y = advanced[group]
            _store_group(group, pid_p, b, slot, h, headdim, dstate, round_nearest(state, STATE_DTYPE), y,
                         state_ptr, out_ptr, s_b, s_h, s_p, s_n, o_b, o_h, o_p, OUT_DTYPE, GROUPS, BLOCK_P, BLOCK_N)


def _check(cond: bool, message: Callable[[], str]) -> None:
    # The message is built only for a failed check: a decode step at batch 1 is launch-bound, and
    # formatting some twenty messages cost more than the checks themselves.
    if not cond:
        raise ValueError(message())


def _shape(t) -> tuple | None:
    return None if t is None else tuple(t.shape)


def _check_inputs(state, x, dt, A, B, C, D, z, dt_bias, out, slots):
    _check(state.dim() == 4, lambda: f"state must be (batch, nheads, headdim, dstate), got {_shape(state)}")
    _check(x.dim() == 3, lambda: f"x must be (batch, nheads, headdim), got {_shape(x)}")
    pool, nheads, headdim, dstate = state.shape
    batch = x.shape[0]
    if slots is None:
        _check(pool == batch,
               lambda: f"state has {pool} rows for a batch of {batch} (pass state_batch_indices for a pool)")
    else:
        _check(_shape(slots) == (batch,) and not slots.is_floating_point() and slots.device == state.device,
               lambda: f"state_batch_indices must be ({batch},) integers on {state.device}, got {_shape(slots)}")
    ngroups = B.shape[1] if B.dim() == 3 else 0
    for name, t in (("state", state), ("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D), ("z", z),
                    ("dt_bias", dt_bias)):
        _check(t is None or t.dtype in FLOAT_DTYPES,
               lambda: f"{name} dtype {t.dtype} is not one of float32/float16/bfloat16")
        _check(t is None or t.device == state.device, lambda: f"{name} is on {t.device}, state on {state.device}")
    want_x = (batch, nheads, headdim)
    _check(_shape(x) == want_x, lambda: f"x must be {want_x}, got {_shape(x)}")
    _check(_shape(dt) == want_x, lambda: f"dt must be {want_x}, got {_shape(dt)}")
    _check(z is None or _shape(z) == want_x, lambda: f"z must be {want_x}, got {_shape(z)}")
    _check(_shape(A) == (nheads, headdim, dstate),
           lambda: f"A must be {(nheads, headdim, dstate)}, got {_shape(A)}")
    _check(ngroups >= 1 and _shape(B) == (batch, ngroups, dstate) and _shape(C) == _shape(B),
           lambda: f"B and C must be (batch={batch}, ngroups, dstate={dstate}) alike, got {_shape(B)} and "
                   f"{_shape(C)}")
    _check(nheads % ngroups == 0, lambda: f"ngroups={ngroups} must divide nheads={nheads}")
    _check(D is None or _shape(D) == (nheads, headdim), lambda: f"D must be {(nheads, headdim)}, got {_shape(D)}")
    _check(dt_bias is None or _shape(dt_bias) == (nheads, headdim),
           lambda: f"dt_bias must be {(nheads, headdim)}, got {_shape(dt_bias)}")
    _check(out is None or (_shape(out) == want_x and out.dtype == x.dtype and out.device == x.device),
           lambda: f"out must be {want_x} {x.dtype} on {x.device}")


@dataclass(frozen=True)
class _Plan:
    """One call signature's launch, worked out once, after its checks passed."""
    grid: tuple[int, int, int] | None  # None: no state or no token, nothing to launch
    sizes: tuple[int, int, int]  # nheads, headdim, dstate
    strides: tuple[int, ...]
    options: dict  # the constexprs and launch options
    int_seed: bool  # stochastic with an int seed: its value, not in the signature, is checked every call


# Plans by call signature. A decode loop repeats one signature every step, and at batch 1 the step is bound by
# the host: the checks and the launch's arithmetic took about 45 us a call on a 2-core CPU, more than the kernel.
# A signature holds all that the checks and the plan read (each tensor's shape, strides, dtype and device, the
# options, and the launch rules, which a benchmark's sweep or a test may replace), never a value or an address:
# those go to the launch at every call.
_PLANS: dict[tuple, _Plan] = {}
_MAX_PLANS = 1024


def _signature(tensors, *options) -> tuple:
    return (*[None if t is None else (t.shape, t.stride(), t.dtype, t.device) for t in tensors], *options)


def _plan(state, x, dt, A, B, C, D, z, dt_bias, out, slots, seed, dt_softplus, rounding, philox_rounds,
          rounding_impl, interpret) -> _Plan:
    """Check a call (ValueError with a one-line reason) and work out its launch."""
    _check_inputs(state, x, dt, A, B, C, D, z, dt_bias, out, slots)
    seed_in_memory = isinstance(seed, torch.Tensor)
    if seed_in_memory:  # its value is the kernel's to read: checking it here would wait on the device
        _check(seed.dtype == torch.int64 and seed.numel() == 1 and seed.device == state.device,
               lambda: f"a seed tensor must be one int64 on {state.device}, got {seed.numel()} {seed.dtype} on "
                       f"{seed.device}")
    check_rounding(state.dtype, rounding, 0 if seed_in_memory else seed, philox_rounds, rounding_impl,
                   interpret=interpret)
    _, nheads, headdim, dstate = state.shape
    batch = x.shape[0]
    stochastic = rounding == "stochastic"
    sizes = (nheads, headdim, dstate)
    int_seed = stochastic and not seed_in_memory
    if x.numel() == 0 or state.numel() == 0:
        return _Plan(None, sizes, (), {}, int_seed)
    config = launch_config(headdim, dstate, state.dtype, interpret)
    # An absent tensor's placeholder is x (never read: its HAS_* flag is off).
    z_strides = (z if z is not None else x).stride()
    out_strides = out.stride() if out is not None else (nheads * headdim, headdim, 1)  # torch.empty's
    dtb_strides = dt_bias.stride() if dt_bias is not None else (0, 0)
    d_strides = D.stride() if D is not None else (0, 0)
    dt_per_head = dt.stride(2) == 0 and (dt_bias is None or dt_bias.stride(1) == 0)
    blocks = cdiv(headdim, config.block_p)
    per_program = 1
    if stochastic and rounding_impl == "software":
        per_program = blocks_per_program(config, blocks, batch * nheads)
    options = {"maxnreg": config.sr_maxnreg} if per_program > 1 and config.sr_maxnreg else {}
    return _Plan(
        grid=(cdiv(blocks, per_program), nheads, batch), sizes=sizes,
        strides=(*state.stride(), *x.stride(), *dt.stride(), *dtb_strides, *A.stride(), *B.stride(), *C.stride(),
                 *d_strides, *z_strides, *out_strides),
        options=dict(
            HEADS_PER_GROUP=nheads // B.shape[1], HAS_DT_BIAS=dt_bias is not None, HAS_D=D is not None,
            HAS_Z=z is not None, DT_SOFTPLUS=bool(dt_softplus),
            DT_PER_HEAD=dt_per_head, A_PER_HEAD=A.stride(1) == 0 and A.stride(2) == 0,
            STATE_DTYPE=triton_dtype(state.dtype), OUT_DTYPE=triton_dtype(x.dtype),
            STOCHASTIC=stochastic, HARDWARE=rounding_impl == "hardware",
            # Wide Philox counters are SR's alone: rounding to nearest keeps one variant for any pool's size (the
            # default GPU drift's far-slot checks, a pool past 2**32 elements each, compiled 22 of their own).
            SEED_IN_MEMORY=seed_in_memory, WIDE_COUNTERS=stochastic and state.numel() > 2**32, N_ROUNDS=philox_rounds,
            INTERPRET=interpret, GROUPS=ROW_GROUPS, BLOCKS=per_program, BLOCK_P=config.block_p,
            BLOCK_N=max(2, next_power_of_2(dstate)),
            num_warps=config.num_warps, **options,
        ),
        int_seed=int_seed,
    )


# What the kernel's slots_ptr gets in a call without state_batch_indices (never read: has_slots is 0), by device:
# an int32 pointer, as engines' indices are, so that such a call shares its variant with a call through them.
_NO_SLOTS: dict[torch.device, torch.Tensor] = {}


def _no_slots(device: torch.device) -> torch.Tensor:
    if device not in _NO_SLOTS:
        _NO_SLOTS[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return _NO_SLOTS[device]


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                           state_batch_indices=None, pad_slot_id=PAD_SLOT_ID, *,
                           rounding="nearest", seed=0, philox_rounds=DEFAULT_PHILOX_ROUNDS,
                           rounding_impl="software", out=None, interpret: bool | None = None):
    """One decode step: updates `state` in place and returns out (batch, nheads, headdim) in x.dtype.

    state (batch, nheads, headdim, dstate) in fp32/fp16/bf16 (computed in fp32,
    stored rounded per `rounding`, "nearest" or "stochastic"), or, with
    `state_batch_indices` (batch,) integers, a pool of any number of states of
    which row i updates slot state_batch_indices[i] (in range, distinct across
    rows); a row whose index is `pad_slot_id` is a pad row: it reads and
    writes no state, and its out is 0. x, dt, z
    (batch, nheads, headdim); A (nheads, headdim, dstate); B, C (batch,
    ngroups, dstate); D, dt_bias (nheads, headdim). Any strides, including
    stride-0 expanded views. Stochastic rounding draws its bits from
    Philox(seed, element): pass a new seed every step, an int or a one-element int64 tensor on the
    state's device (read by the kernel: what a CUDA graph captures and replays). `out`, when given, is
    written and returned. `interpret`: whether Triton runs the kernel through
    its interpreter (None: as TRITON_INTERPRET says).
    """
    if interpret is None:
        interpret = interpreting()
    slots = state_batch_indices
    seed_tensor = seed if isinstance(seed, torch.Tensor) else None
    signature = _signature((state, x, dt, A, B, C, D, z, dt_bias, out, slots, seed_tensor), bool(dt_softplus),
                           rounding, philox_rounds, rounding_impl, interpret, launch_config, SR_MIN_PROGRAMS)
    try:
        plan = _PLANS.get(signature)
    except TypeError:  # an unhashable option, which _plan refuses by name
        plan = None
    if plan is None:
        plan = _plan(state, x, dt, A, B, C, D, z, dt_bias, out, slots, seed, dt_softplus, rounding, philox_rounds,
                     rounding_impl, interpret)
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[signature] = plan
    elif plan.int_seed:
        check_seed(seed)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if plan.grid is None:
        return out
    _state_update_kernel[plan.grid](
        state, x, dt, dt_bias if dt_bias is not None else x, A, B, C, D if D is not None else x,
        z if z is not None else x, out, slots if slots is not None else _no_slots(state.device), seed, *plan.sizes,
        pad_slot_id, int(slots is not None), *plan.strides, **plan.options,
    )
    return out
