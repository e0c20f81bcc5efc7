"""Stages 2 and 3 in one kernel: each sequence's chunks in order, each chunk's own state computed
on chip and passed on at once.

    state_in[first chunk] = initial state (or 0)
    local[c]              = sum_t exp(dA_last - dA_t) * dt_t * x_tᵀ ⊗ B_t      (chunk_state.py)
    state_in[c + 1]       = exp(dA_last[c]) * state_in[c] + local[c]          (state_passing.py)

The same arithmetic as the two stages, in the same order (a chunk's own state accumulated from
zero in fp32, then added to the decayed passed state), so the results are theirs: bitwise in
Triton's interpreter, where both take a whole chunk a tile.

The chunk scan runs it in the interpreter, where its stages are not kept for comparison (chunk.py):
the interpreter runs programs one after another and pays for every tile operation, and this kernel
has a program per sequence and head where the two have one per chunk and head and then one per
sequence, head and state block: the default scan on the CPU about 10% faster (benchmarks/RESULTS.md,
sixty-eighth session). Compiled, the two kernels are faster (0.861 ms against this kernel's 1.145 at
64k tokens on an H100, at its best tiles): a program here walks its sequence's chunks one after
another, the passed state being the dependency, where the chunk-state stage runs every chunk at once.

One program owns a slice of one head's state for one sequence, as in state_passing, and walks the
sequence's chunks with the whole chunk in one tile (the loop over chunks is the one Triton pipelines).
"""

import torch
import triton
import triton.language as tl

from ssmcheck.ops.host import cdiv, next_power_of_2
from ssmcheck.ops.rounding.stochastic import DEFAULT_PHILOX_ROUNDS, round_to_storage, triton_dtype

from .layout import ChunkTable
from .numerics import LOG2E, decay2, mma, operand, program_coords
from .state_passing import passed_dtype_of


# As in the two stages: the seed, the group count, whether there are initial states and the chunk size's stride use
# are run-time values, so that they do not multiply the variants compiled. The chunk's tile (CHUNK) is a constexpr.
@triton.jit(do_not_specialize=["seed", "ngroups"])
def _states_passed_kernel(
    x_ptr, B_ptr, dt_ptr, dA_cs_ptr, init_ptr, seq_chunk_ptr, chunk_token_ptr, chunk_len_ptr, states_ptr, final_ptr,
    seed, nheads, ngroups, headdim, dstate, chunk_size,
    stride_x_tok, stride_x_head, stride_x_dim,
    stride_b_tok, stride_b_group, stride_b_state,
    stride_init_seq, stride_init_head, stride_init_dim, stride_init_state, has_init,
    MM_DTYPE: tl.constexpr, STATE_DTYPE: tl.constexpr, PASSED_DTYPE: tl.constexpr, STOCHASTIC: tl.constexpr,
    N_ROUNDS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    pid = tl.program_id(0)
    nb, pb, h, s = program_coords(pid, tl.cdiv(dstate, BLOCK_N), tl.cdiv(headdim, BLOCK_P), nheads)
    s = s.to(tl.int64)
    g = h // (nheads // ngroups)
    p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    d = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    pv = p < headdim
    dv = d < dstate
    ev = pv[:, None] & dv[None, :]
    head_size = headdim * dstate
    e = p[:, None] * dstate + d[None, :]  # the element's index in its head's (headdim, dstate) state
    state = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    if has_init:
        state = tl.load(init_ptr + s * stride_init_seq + h * stride_init_head + p[:, None] * stride_init_dim
                        + d[None, :] * stride_init_state, mask=ev, other=0.0).to(tl.float32)
    c_first = tl.load(seq_chunk_ptr + s)
    c_end = tl.load(seq_chunk_ptr + s + 1)
    # Philox counter of a stored state: its index among its own sequence's chunk states (state_passing's).
    first = tl.cast(c_first, tl.int64) * nheads * head_size
    # 64-bit token bases (chunk_state's reason), 32-bit offsets inside the chunk.
    x_head = x_ptr + h * stride_x_head + p[:, None] * stride_x_dim
    b_group = B_ptr + g * stride_b_group + d[None, :] * stride_b_state
    t = tl.arange(0, CHUNK)
    for c in tl.range(c_first, c_end, num_stages=NUM_STAGES):
        ch = tl.cast(c, tl.int64) * nheads + h
        at = ch * head_size + e
        tl.store(states_ptr + at, round_to_storage(state, seed, at - first, PASSED_DTYPE, STOCHASTIC, N_ROUNDS),
                 mask=ev)
        tok0 = tl.load(chunk_token_ptr + c).to(tl.int64)
        tv = t < tl.load(chunk_len_ptr + c)
        row = ch * chunk_size
        dA_last = tl.load(dA_cs_ptr + row + chunk_size - 1)
        xt = tl.load(x_head + (tok0 + t[None, :]) * stride_x_tok, mask=tv[None, :] & pv[:, None], other=0.0)
        bt = tl.load(b_group + (tok0 + t[:, None]) * stride_b_tok, mask=tv[:, None] & dv[None, :], other=0.0)
        # Token t's weight: exp(dA_last - dA_t) * dt_t (the fp64 difference keeps small segments exact).
        w = decay2((dA_last - tl.load(dA_cs_ptr + row + t)).to(tl.float32) * LOG2E, tv) * tl.load(dt_ptr + row + t)
        local = mma(operand(xt.to(tl.float32) * w[None, :], MM_DTYPE), operand(bt, MM_DTYPE),
                    tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32))
        state = state * tl.exp(tl.minimum(dA_last.to(tl.float32), 0.0)) + local
    # The final state counts as the state entering the chunk after the sequence's last.
    counter = (tl.cast(c_end - c_first, tl.int64) * nheads + h) * head_size + e
    tl.store(final_ptr + (s * nheads + h) * head_size + e,
             round_to_storage(state, seed, counter, STATE_DTYPE, STOCHASTIC, N_ROUNDS), mask=ev)


def default_config(headdim: int, dstate: int, interpret: bool = False) -> dict:
    """Tiles and launch options: in the interpreter a whole head's state a program (chunk_state's whole-chunk tiles'
    reason); compiled, the fastest of the tiles timed on an H100 (benchmarks/RESULTS.md, sixty-eighth session)."""
    if interpret:
        return dict(BLOCK_P=max(16, next_power_of_2(headdim)), BLOCK_N=max(16, next_power_of_2(dstate)),
                    num_warps=4, NUM_STAGES=1)
    return dict(BLOCK_P=max(16, min(next_power_of_2(headdim), 64)), BLOCK_N=max(16, min(next_power_of_2(dstate), 64)),
                num_warps=4, NUM_STAGES=2)


def states_passed(x, B, dt_proc, dA_cs, initial_states, state_dtype, stochastic: bool, seed: int, table: ChunkTable,
                  mm_dtype, interpret: bool, config: dict | None = None, alloc=torch.empty,
                  passed_dtype: torch.dtype | None = None):
    """x (ntok, nheads, headdim), B (ntok, ngroups, dstate) -> (incoming state of every chunk (nchunks, nheads,
    headdim, dstate) in `passed_dtype` (None: state_dtype), state after every sequence (nseq, nheads, headdim,
    dstate) in state_dtype), allocated by `alloc`: state_passing's results, without the chunks' own states."""
    _, nheads, headdim = x.shape
    ngroups, dstate = B.shape[1], B.shape[2]
    passed_dtype = passed_dtype_of(state_dtype, stochastic, passed_dtype)
    cfg = {**default_config(headdim, dstate, interpret), **(config or {})}
    states = alloc((table.nchunks, nheads, headdim, dstate), device=x.device, dtype=passed_dtype)
    final = alloc((table.nseq, nheads, headdim, dstate), device=x.device, dtype=state_dtype)
    grid = (table.nseq * nheads * cdiv(headdim, cfg["BLOCK_P"]) * cdiv(dstate, cfg["BLOCK_N"]),)
    # Without initial states, `final` stands in (never read), as in state_passing.
    init = initial_states if initial_states is not None else final
    _states_passed_kernel[grid](
        x, B, dt_proc, dA_cs, init, table.seq_chunk, table.chunk_token, table.chunk_len, states, final, seed,
        nheads, ngroups, headdim, dstate, table.chunk_size, *x.stride(), *B.stride(), *init.stride(),
        initial_states is not None,
        MM_DTYPE=mm_dtype, STATE_DTYPE=triton_dtype(state_dtype), PASSED_DTYPE=triton_dtype(passed_dtype),
        STOCHASTIC=stochastic, N_ROUNDS=DEFAULT_PHILOX_ROUNDS, CHUNK=max(16, next_power_of_2(table.chunk_size)),
        **cfg,
    )
    return states, final
