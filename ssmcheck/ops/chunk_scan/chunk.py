"""The built-in Triton chunk scan (Mamba2 SSD forward), with state-spaces/mamba's
`mamba_chunk_scan_combined` signature.

Pipeline, one kernel each (DESIGN §2 for the math):
  1. dt processing and the cumulative log-decay per chunk   (dt_cumsum.py)
  2. each chunk's own state, parallel over chunks            (chunk_state.py)
  3. serial state passing from chunk to chunk                (state_passing.py)
     (2 and 3 in one kernel in Triton's interpreter, where the stages are not kept: states_passed.py)
  4. C·Bᵀ per chunk                                          (chunk_cb.py)
  5. chunk output: intra-chunk + incoming state, D, z        (chunk_output.py)
Chunks follow sequences (layout.py): batch mode and varlen share every kernel.
Matmul operands are rounded to x.dtype with fp32 accumulation; states are
carried in fp32 and stored in `state_dtype`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ssmcheck.ops import interpreting
from ssmcheck.ops.rounding.stochastic import DEFAULT_PHILOX_ROUNDS, check_rounding, triton_dtype

from .chunk_cb import chunk_cb
from .chunk_output import chunk_output
from .chunk_state import chunk_state
from .dt_cumsum import dt_cumsum
from .layout import ChunkTable, batch_table, varlen_table
from .state_passing import state_passing
from .states_passed import states_passed

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CHUNK_SIZES = (16, 32, 64, 128, 256)
MAX_DSTATE = 256


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def _spans(seqlen: int, cu_seqlens, seq_idx) -> list[tuple[int, int]]:
    """Each sequence's token range [start, end) in the row. A token whose seq_idx is -1 is a pad token,
    of no sequence. Without cu_seqlens a sequence is a run of equal ids (pads left out); with it, sequence s
    is the tokens of [cu_seqlens[s], cu_seqlens[s+1]) that are not pads, which must be contiguous."""
    if cu_seqlens is None:
        ids = seq_idx[0]
        edges = torch.cat([ids.new_zeros(1), torch.nonzero(ids[1:] != ids[:-1]).flatten() + 1,
                           ids.new_full((1,), seqlen)]).tolist()
        return [(a, b) for a, b, first in zip(edges[:-1], edges[1:], ids[edges[:-1]].tolist()) if first >= 0]
    bounds = cu_seqlens.tolist()
    _check(cu_seqlens.dim() == 1 and len(bounds) >= 2 and bounds[0] == 0 and bounds[-1] == seqlen
           and all(a <= b for a, b in zip(bounds[:-1], bounds[1:])),
           f"cu_seqlens must rise from 0 to seqlen={seqlen}, got {bounds}")
    spans = list(zip(bounds[:-1], bounds[1:]))
    if seq_idx is None or not bool((seq_idx < 0).any()):
        return spans
    live = (seq_idx[0] >= 0).tolist()
    trimmed = []
    for s, (a, b) in enumerate(spans):
        tokens = [t for t in range(a, b) if live[t]]
        lo, hi = (tokens[0], tokens[-1] + 1) if tokens else (a, a)
        _check(hi - lo == len(tokens), f"sequence {s} has pad tokens (seq_idx -1) among its own tokens {lo}..{hi - 1}")
        trimmed.append((lo, hi))
    return trimmed


def _table(batch: int, seqlen: int, chunk_size: int, cu_seqlens, seq_idx, device) -> ChunkTable:
    if cu_seqlens is None and seq_idx is None:
        return batch_table(batch, seqlen, chunk_size, device)
    _check(batch == 1, f"varlen (cu_seqlens/seq_idx) needs batch 1, got batch {batch}")
    _check(seq_idx is None or tuple(seq_idx.shape) == (1, seqlen),
           f"seq_idx must be (1, {seqlen}), got {None if seq_idx is None else tuple(seq_idx.shape)}")
    return varlen_table(_spans(seqlen, cu_seqlens, seq_idx), chunk_size, device)


def _check_inputs(x, dt, A, B, C, chunk_size, D, z, dt_bias, state_dtype, rounding, seed):
    _check(x.dim() == 4, f"x must be (batch, seqlen, nheads, headdim), got {tuple(x.shape)}")
    batch, seqlen, nheads, headdim = x.shape
    _check(batch >= 1 and seqlen >= 1, f"x must hold at least one token, got {tuple(x.shape)}")
    _check(x.dtype in FLOAT_DTYPES, f"x dtype {x.dtype} is not one of fp32/fp16/bf16")
    _check(chunk_size in CHUNK_SIZES, f"chunk_size must be a power of two in 16..256, got {chunk_size}")
    _check(tuple(dt.shape) == (batch, seqlen, nheads), f"dt must be {(batch, seqlen, nheads)}, got {tuple(dt.shape)}")
    _check(tuple(A.shape) == (nheads,), f"A must be ({nheads},), got {tuple(A.shape)}")
    _check(B.dim() == 4 and tuple(B.shape[:2]) == (batch, seqlen) and B.shape == C.shape,
           f"B and C must be (batch, seqlen, ngroups, dstate) alike, got {tuple(B.shape)} and {tuple(C.shape)}")
    _check(nheads % B.shape[2] == 0, f"ngroups={B.shape[2]} must divide nheads={nheads}")
    _check(B.shape[3] <= MAX_DSTATE, f"dstate={B.shape[3]} is above {MAX_DSTATE} (one tile holds a whole state row)")
    _check(D is None or tuple(D.shape) in ((nheads,), (nheads, headdim)),
           f"D must be ({nheads},) or ({nheads}, {headdim}), got {None if D is None else tuple(D.shape)}")
    _check(z is None or z.shape == x.shape, f"z must be shaped like x {tuple(x.shape)}")
    _check(dt_bias is None or tuple(dt_bias.shape) == (nheads,), f"dt_bias must be ({nheads},)")
    check_rounding(state_dtype, rounding, seed, DEFAULT_PHILOX_ROUNDS, "software")


@dataclass(frozen=True)
class Pipeline:
    """The five stage functions the chunk scan composes, each with the signature of the built-in one.

    A test builds a kernel with one stage replaced (`dataclasses.replace(PIPELINE, chunk_cb=...)`)
    to check that a wrong stage is found where it is."""

    dt_cumsum: Callable = dt_cumsum
    chunk_state: Callable = chunk_state
    state_passing: Callable = state_passing
    chunk_cb: Callable = chunk_cb
    chunk_output: Callable = chunk_output

    @property
    def passes_in_one_kernel(self) -> bool:
        """Whether stages 2 and 3 may run as states_passed: only where both are the built-in ones (a pipeline with
        either replaced must run the replacement)."""
        return self.chunk_state is chunk_state and self.state_passing is state_passing


PIPELINE = Pipeline()


def _poisoned(shape, *, device, dtype):
    """torch.empty's signature, NaN-filled: an entry a stage never writes shows as NaN, not as stale memory."""
    return torch.full(shape, float("nan"), device=device, dtype=dtype)


def chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                        seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                        return_final_states=False, return_varlen_states=False, *,
                        state_dtype=torch.float32, rounding="nearest", seed=0, out=None,
                        interpret: bool | None = None, pipeline: Pipeline = PIPELINE):
    """Returns out; (out, final_states); (out, varlen_states); or (out, final_states, varlen_states).

    A token whose seq_idx is -1 is a pad token between (or after) sequences, as a serving engine's packed
    batch has them: it belongs to no sequence, changes no state, and its output is 0. With cu_seqlens,
    sequence s is the non-pad tokens of [cu_seqlens[s], cu_seqlens[s+1]).

    out (batch, seqlen, nheads, headdim) in x.dtype (written into `out` when given);
    final_states (batch, nheads, headdim, dstate) and varlen_states (nseq, ...) in state_dtype.
    `interpret`: whether Triton runs the kernels through its interpreter (None: as TRITON_INTERPRET says).
    """
    _check(not return_varlen_states or cu_seqlens is not None or seq_idx is not None,
           "return_varlen_states needs cu_seqlens")
    stages = _run(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus,
                  dt_limit, state_dtype, rounding, seed, out, interpret, pipeline, keep_stages=False)
    result = (stages["y"],)
    if return_final_states:
        result += (stages["final_states"],)
    if return_varlen_states:
        result += (stages["seq_states"],)
    return result[0] if len(result) == 1 else result


def chunk_scan_stages(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                      seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), *,
                      state_dtype=torch.float32, rounding="nearest", seed=0, interpret: bool | None = None,
                      pipeline: Pipeline = PIPELINE) -> dict[str, torch.Tensor]:
    """The chunk scan with every stage's result kept, its buffers NaN-filled before the stages run:
    "cumsum" (nchunks, nheads, chunk_size) fp64 cumulative dt·A within each chunk, "chunk_states"
    (nchunks, nheads, headdim, dstate) fp32 each chunk's state from zero, "passed_states" (same shape,
    state_dtype) the state entering each chunk, "cb" (nchunks, ngroups, chunk_size, chunk_size) fp32
    C·Bᵀ, "y" (batch, seqlen, nheads, headdim). Chunks follow sequences (layout.py), in order."""
    stages = _run(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus,
                  dt_limit, state_dtype, rounding, seed, torch.full_like(x, float("nan")), interpret, pipeline,
                  keep_stages=True)
    return {name: stages[name] for name in ("cumsum", "chunk_states", "passed_states", "cb", "y")}


def _run(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus, dt_limit,
         state_dtype, rounding, seed, out, interpret, pipeline: Pipeline, keep_stages: bool) -> dict[str, torch.Tensor]:
    """Check the inputs and run the stages; every stage's result by name ("chunk_states" None unless
    `keep_stages`, which also NaN-fills the buffers), "final_states" (per row, or the last sequence's for
    varlen) and "seq_states" (per sequence)."""
    _check_inputs(x, dt, A, B, C, chunk_size, D, z, dt_bias, state_dtype, rounding, seed)
    batch, seqlen, nheads, headdim = x.shape
    dstate = B.shape[3]
    table = _table(batch, seqlen, chunk_size, cu_seqlens, seq_idx, x.device)
    if initial_states is not None:
        want = (table.nseq, nheads, headdim, dstate)
        _check(tuple(initial_states.shape) == want, f"initial_states must be {want}, got {tuple(initial_states.shape)}")
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    _check(out.shape == x.shape and out.dtype == x.dtype and out.device == x.device,
           f"out must be {tuple(x.shape)} {x.dtype} on {x.device}")
    _check(batch == 1 or out.stride(0) == seqlen * out.stride(1), "out must have mergeable batch and seqlen dimensions")
    y = out.view(batch * seqlen, nheads, headdim)

    if interpret is None:
        interpret = interpreting()
    mm_dtype = triton_dtype(x.dtype)
    alloc = _poisoned if keep_stages else torch.empty
    ntok = batch * seqlen
    x2 = x.reshape(ntok, nheads, headdim)
    B2 = B.reshape(ntok, *B.shape[2:])
    C2 = C.reshape(ntok, *C.shape[2:])
    z2 = z.reshape(ntok, nheads, headdim) if z is not None else None
    D2 = D.contiguous() if D is not None else None

    dt_proc, dA_cs, log2_pairs = pipeline.dt_cumsum(dt.reshape(ntok, nheads), A.contiguous(),
                                                    dt_bias.contiguous() if dt_bias is not None else None,
                                                    dt_softplus, dt_limit, table, alloc=alloc)
    # The output stage rounds each chunk's incoming state to the inputs' dtype (its matmul operand): fp32 states are
    # passed in that dtype already, which gives the same bits and halves their bytes, written and read (the stages,
    # kept for their comparison, stay in the storage dtype).
    passed = x.dtype if state_dtype == torch.float32 and not keep_stages else state_dtype
    stochastic = rounding == "stochastic"
    # In the interpreter, stages 2 and 3 run as one kernel (the same bits, fewer programs: states_passed.py); compiled,
    # the two kernels are faster (benchmarks/RESULTS.md, sixty-eighth session).
    if keep_stages or not interpret or not pipeline.passes_in_one_kernel:
        local = pipeline.chunk_state(x2, B2, dt_proc, dA_cs, mm_dtype, table, interpret, alloc=alloc)
        states, seq_final = pipeline.state_passing(local, dA_cs, initial_states, state_dtype, stochastic, seed, table,
                                                   alloc=alloc, passed_dtype=passed)
        if not keep_stages:
            del local  # fp32, one state per chunk: free it before C·Bᵀ is allocated
    else:
        states, seq_final = states_passed(x2, B2, dt_proc, dA_cs, initial_states, state_dtype, stochastic, seed,
                                          table, mm_dtype, interpret, alloc=alloc, passed_dtype=passed)
    cb = pipeline.chunk_cb(C2, B2, mm_dtype, table, interpret, alloc=alloc)
    pipeline.chunk_output(x2, z2, C2, D2, cb, dt_proc, log2_pairs, states, y, mm_dtype, table, interpret)
    if seq_idx is not None:
        y[seq_idx.flatten() < 0] = 0  # pad tokens lie in no chunk: their output is defined as 0

    varlen = cu_seqlens is not None or seq_idx is not None
    return {"cumsum": dA_cs, "chunk_states": local if keep_stages else None, "passed_states": states, "cb": cb, "y": out,
            "final_states": seq_final[table.last_seq : table.last_seq + 1] if varlen else seq_final,
            "seq_states": seq_final}
