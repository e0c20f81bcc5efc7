"""Stage 3: the serial passing of states from chunk to chunk, within each sequence.

    state_in[first chunk] = initial state (or 0)
    state_in[c + 1]       = exp(dA_last[c]) * state_in[c] + local[c]

carried in fp32 and stored in state_dtype (rounded to nearest, or stochastically
with Philox bits keyed by (seed, element index within its sequence): a sequence
draws the same bits alone or packed with others, so stochastic storage keeps
batch invariance; sequences of one call share bits position for position).
The states entering the chunks may be stored in another dtype than the final ones
(`passed_dtype`): the output stage reads them as matmul operands, rounded to nearest
into the inputs' dtype, so fp32 states stored so cost half the bytes both ways and
give the same bits.

One program owns a slice of one head's state for one sequence; its loads do not
depend on the recurrence, so they are prefetched while the serial multiply-adds run.
"""

import torch
import triton
import triton.language as tl

from ssmcheck.ops.host import cdiv, next_power_of_2
from ssmcheck.ops.rounding.stochastic import DEFAULT_PHILOX_ROUNDS, round_to_storage, triton_dtype

from .layout import ChunkTable


# A seed is no shape: its divisibility by 16 must not mean another compilation (the default scan's cases draw
# their own seeds). Whether there are initial states, and the chunk size (a stride here), are run-time values for
# the same reason: as constexprs they multiplied the variants compiled (benchmarks/RESULTS.md, "fewer variants").
@triton.jit(do_not_specialize=["seed"])
def _state_passing_kernel(
    local_ptr, dA_cs_ptr, init_ptr, seq_chunk_ptr, states_ptr, final_ptr, seed,
    nheads, headdim, dstate, chunk_size,
    stride_init_seq, stride_init_head, stride_init_dim, stride_init_state, has_init,
    STATE_DTYPE: tl.constexpr, PASSED_DTYPE: tl.constexpr, STOCHASTIC: tl.constexpr, N_ROUNDS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    head_size = headdim * dstate
    nb = tl.cdiv(head_size, BLOCK)
    eb = pid % nb
    h = (pid // nb) % nheads
    s = tl.cast(pid // (nb * nheads), tl.int64)
    e = eb * BLOCK + tl.arange(0, BLOCK)  # flattened (headdim, dstate) index
    ev = e < head_size
    state = tl.zeros((BLOCK,), dtype=tl.float32)
    if has_init:
        state = tl.load(init_ptr + s * stride_init_seq + h * stride_init_head + (e // dstate) * stride_init_dim
                        + (e % dstate) * stride_init_state, mask=ev, other=0.0).to(tl.float32)
    c_first = tl.load(seq_chunk_ptr + s)
    c_end = tl.load(seq_chunk_ptr + s + 1)
    # Philox counter: the element's index among its own sequence's chunk states, `at` less the sequence's first
    # chunk's offset. (Each index is computed once: the interpreter pays per tile op, scalars included.)
    first = tl.cast(c_first, tl.int64) * nheads * head_size
    dA_last_ptr = dA_cs_ptr + chunk_size - 1
    # The loads do not depend on the recurrence: prefetch them two chunks ahead.
    for c in tl.range(c_first, c_end, num_stages=3):
        ch = tl.cast(c, tl.int64) * nheads + h
        at = ch * head_size + e
        tl.store(states_ptr + at, round_to_storage(state, seed, at - first, PASSED_DTYPE, STOCHASTIC, N_ROUNDS),
                 mask=ev)
        dA_last = tl.load(dA_last_ptr + ch * chunk_size).to(tl.float32)
        state = state * tl.exp(tl.minimum(dA_last, 0.0)) + tl.load(local_ptr + at, mask=ev, other=0.0)
    at = (s * nheads + h) * head_size + e
    # The final state counts as the state entering the chunk after the sequence's last.
    counter = (tl.cast(c_end - c_first, tl.int64) * nheads + h) * head_size + e
    tl.store(final_ptr + at, round_to_storage(state, seed, counter, STATE_DTYPE, STOCHASTIC, N_ROUNDS),
             mask=ev)


def default_config(headdim: int, dstate: int) -> dict:
    """Block size and launch options: enough programs to keep loads in flight; not yet swept on a GPU."""
    return dict(BLOCK=min(next_power_of_2(headdim * dstate), 1024), num_warps=4)


def passed_dtype_of(state_dtype, stochastic: bool, passed_dtype: torch.dtype | None) -> torch.dtype:
    """The dtype the states entering the chunks are stored in (None: state_dtype). Another one than state_dtype
    takes fp32 states rounded to nearest (their rounding to nearest into it is then the output stage's own)."""
    passed_dtype = passed_dtype or state_dtype
    if passed_dtype != state_dtype and (state_dtype != torch.float32 or stochastic):
        raise ValueError(f"passed states in {passed_dtype} need fp32 states rounded to nearest, not {state_dtype}"
                         f"{' stochastically' if stochastic else ''}")
    return passed_dtype


def state_passing(local, dA_cs, initial_states, state_dtype, stochastic: bool, seed: int, table: ChunkTable,
                  config: dict | None = None, alloc=torch.empty, passed_dtype: torch.dtype | None = None):
    """local (nchunks, nheads, headdim, dstate) fp32 -> (incoming state of every chunk, same shape, in
    `passed_dtype` (None: state_dtype), state after every sequence (nseq, nheads, headdim, dstate) in state_dtype),
    allocated by `alloc`. A `passed_dtype` other than state_dtype takes fp32 states rounded to nearest."""
    _, nheads, headdim, dstate = local.shape
    passed_dtype = passed_dtype_of(state_dtype, stochastic, passed_dtype)
    cfg = {**default_config(headdim, dstate), **(config or {})}
    states = alloc(local.shape, device=local.device, dtype=passed_dtype)
    final = alloc((table.nseq, nheads, headdim, dstate), device=local.device, dtype=state_dtype)
    grid = (table.nseq * nheads * cdiv(headdim * dstate, cfg["BLOCK"]),)
    # Without initial states, `final` stands in (never read): its strides are a contiguous state's, so the call
    # shares the variant of one with contiguous initial states of the same dtype.
    init = initial_states if initial_states is not None else final
    _state_passing_kernel[grid](
        local, dA_cs, init, table.seq_chunk, states, final, seed,
        nheads, headdim, dstate, table.chunk_size, *init.stride(), initial_states is not None,
        STATE_DTYPE=triton_dtype(state_dtype), PASSED_DTYPE=triton_dtype(passed_dtype), STOCHASTIC=stochastic,
        N_ROUNDS=DEFAULT_PHILOX_ROUNDS, **cfg,
    )
    return states, final
