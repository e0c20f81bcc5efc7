"""Deliberately broken chunk-scan kernels with the state-spaces/mamba signature, for `ssmcheck scan` tests.

Each wraps the same-precision baseline (a correct kernel) and breaks it the way
real kernels broke (DESIGN §1). Used as `--kernel tests/broken_scan_kernels.py:NAME`.
"""

import math
import sys
from collections import Counter
from dataclasses import dataclass, replace
from itertools import pairwise
from unittest import mock

import torch

from ssmcheck.ops.chunk_scan.baseline import TF32_BITS, scan_baseline
from ssmcheck.ops.chunk_scan.naive import Arithmetic, ScanOutput, scan_recurrent, scan_ssd
from ssmcheck.ops.naive import process_dt

# nan_in_partial_last_chunk poisons the last chunk from this offset into it, in this head.
NAN_OFFSET = 2
NAN_HEAD = 1
# whole_dstate_blocks' block of state columns.
DSTATE_BLOCK = 16
# one_headdim_block's block of channels.
HEADDIM_BLOCK = 64
# dstate_capped_at_128's largest block of state indices.
DSTATE_CAP = 128
# state_carried_32_chunks' and state_carried_128_chunks' trip counts.
CARRIED_CHUNKS = 32
CARRIED_CHUNKS_WIDE = 128
# varlen_carried_16_chunks' trip count, in chunks of one sequence.
VARLEN_CARRIED_CHUNKS = 16
# initial_states_mod_4's block of sequences.
SEQUENCE_BLOCK = 4
# sequences_past_8_merged's sequences found (three binary-search steps).
SEQUENCE_LOOKUP = 8
# microbatches_share_a_gate's rows a micro-batch.
MICROBATCH_ROWS = 2
# group_of_head_within_block_of_32's block of heads.
HEAD_BLOCK = 32
# softplus's threshold, past which kernels take its linear branch.
SOFTPLUS_THRESHOLD = 20.0
# initial_state_only_in_its_start_block's block of a chunk's tokens (rows) a program.
TOKEN_BLOCK = 64
# fp32_state_blocks_stuck_at_the_first's block of state indices for fp32 inputs.
FP32_DSTATE_BLOCK = 64
# four_sequence_pieces_a_chunk's sequence pieces a chunk (its varlen metadata's table).
SEQUENCE_PIECES = 4


def _mamba_result(y, out, return_final_states, return_varlen_states):
    extra = ([out.final_states] if return_final_states else []) + ([out.varlen_states] if return_varlen_states else [])
    return (y, *extra) if extra else y


def _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit):
    return scan_baseline(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                         cu_seqlens=cu_seqlens, dt_softplus=dt_softplus, dt_limit=dt_limit)


def nan_in_partial_last_chunk(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                              return_final_states=False, return_varlen_states=False):
    """Mask applied after exp (mamba #352): inf * 0 = NaN in the padded tail of a partial last chunk.

    In batch mode, when seqlen is not a multiple of chunk_size, y of head NAN_HEAD is NaN
    from NAN_OFFSET tokens into the last chunk to the end, in every row.
    """
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    y = out.y.clone()
    seqlen = x.shape[1]
    if cu_seqlens is None and seqlen % chunk_size:
        y[:, seqlen - seqlen % chunk_size + NAN_OFFSET:, NAN_HEAD] = float("nan")
    return _mamba_result(y, out, return_final_states, return_varlen_states)


def leaky_varlen(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                 cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
                 return_varlen_states=False):
    """Ignores varlen boundaries for y: the state of one sequence leaks into the next (vLLM #21783 family).

    Its states are right, and in batch mode (no cu_seqlens) so is y.
    """
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    y = out.y
    if cu_seqlens is not None:
        first = None if initial_states is None else initial_states[:1]
        y = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, first, None, dt_softplus, dt_limit).y
    return _mamba_result(y, out, return_final_states, return_varlen_states)


def no_reset_at_chunk_start(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                            seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                            return_final_states=False, return_varlen_states=False):
    """Resets the carried state where seq_idx changes inside a chunk only: a sequence that starts exactly where a
    chunk does continues the state of the sequence before it (its own initial state never loaded) in y.

    Its states are right, and so is y at every mid-chunk boundary and in batch mode.
    """
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    y = out.y
    if cu_seqlens is not None:
        starts = cu_seqlens[1:-1]
        mid_chunk = starts % chunk_size != 0
        merged = torch.cat([cu_seqlens[:1], starts[mid_chunk], cu_seqlens[-1:]])  # aligned starts dropped
        kept = torch.cat([torch.ones(1, dtype=torch.bool, device=starts.device), mid_chunk])  # sequences kept
        first = None if initial_states is None else initial_states[kept]
        y = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, first, merged, dt_softplus, dt_limit).y
    return _mamba_result(y, out, return_final_states, return_varlen_states)


def initial_state_of_row_0(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                           seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                           return_final_states=False, return_varlen_states=False):
    """In batch mode, starts every row from row 0's initial state (a batch stride of 0 for initial_states).

    Right with one row, without initial states, and in varlen mode (one initial state per sequence).
    """
    if cu_seqlens is None and initial_states is not None:
        initial_states = initial_states[:1].expand_as(initial_states)
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def one_headdim_block(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                      seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                      return_final_states=False, return_varlen_states=False):
    """Channel c's y and states are those of channel c % HEADDIM_BLOCK: every block of channels computes the
    first one (a program's channel offset, pid * BLOCK, left out). Right while headdim fits one block."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    channel = torch.arange(x.shape[-1], device=x.device) % HEADDIM_BLOCK

    def first_block(states):
        return None if states is None else states[..., channel, :]

    out = replace(out, final_states=first_block(out.final_states), varlen_states=first_block(out.varlen_states))
    return _mamba_result(out.y[..., channel], out, return_final_states, return_varlen_states)


def slightly_inaccurate(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                        seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                        return_final_states=False, return_varlen_states=False):
    """y's error is 3x the baseline's: truth + 3 * (baseline - truth). Its states are the baseline's."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    truth = scan_recurrent(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                           cu_seqlens=cu_seqlens, dt_softplus=dt_softplus, dt_limit=dt_limit).y
    y = (truth + 3 * (out.y.double() - truth)).to(x.dtype)
    return _mamba_result(y, out, return_final_states, return_varlen_states)


def raises_at_chunk_256(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                        seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                        return_final_states=False, return_varlen_states=False):
    """Raises for chunk_size 256 (as an out-of-resources launch would), else correct."""
    if chunk_size == 256:
        raise RuntimeError("out of resource: shared memory, required 262144, hardware limit 232448")
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def nan_final_state(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                    cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
                    return_varlen_states=False):
    """y is right but the stored state of the last sequence overflows to inf at head 0, channel 3, state 5."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    for states in (out.final_states, out.varlen_states):
        if states is not None:
            states[-1, 0, 3, 5] = float("inf")
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def final_state_element_doubled(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                return_final_states=False, return_varlen_states=False):
    """y is right; the stored state of the last sequence is twice the truth at head 1, channel 2, state 4 (a
    finite error in one element: a wrong offset in a state store's tail)."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    for states in (out.final_states, out.varlen_states):
        if states is not None:
            states[-1, 1, 2, 4] *= 2
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def state_carried_32_chunks(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                            seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                            return_final_states=False, return_varlen_states=False):
    """In batch mode, carries the state through 32 chunks at most (a fixed trip count): from chunk 32 on, each row
    starts again from a zero state. Right wherever a row spans 32 chunks or fewer."""
    return _carried(CARRIED_CHUNKS, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens,
                    dt_softplus, dt_limit, return_final_states, return_varlen_states)


def state_carried_128_chunks(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                             seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                             return_final_states=False, return_varlen_states=False):
    """In batch mode, the state passing loads the chunks' decays and states in one block of at most 128 chunks
    and has no loop past it: from chunk 128 on (32k tokens at chunk 256), each row starts again from zero."""
    return _carried(CARRIED_CHUNKS_WIDE, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens,
                    dt_softplus, dt_limit, return_final_states, return_varlen_states)


def _carried(chunks, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit,
             return_final_states, return_varlen_states):
    cut = chunks * chunk_size
    if cu_seqlens is not None or x.shape[1] <= cut:
        out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
        return _mamba_result(out.y, out, return_final_states, return_varlen_states)
    head, tail = (_baseline(*(t[:, part] for t in (x, dt)), A, *(t[:, part] for t in (B, C)), chunk_size, D,
                            None if z is None else z[:, part], dt_bias, states, None, dt_softplus, dt_limit)
                  for part, states in ((slice(0, cut), initial_states), (slice(cut, None), None)))
    return _mamba_result(torch.cat([head.y, tail.y], dim=1), tail, return_final_states, return_varlen_states)


def dt_bias_only_with_softplus(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                               seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                               return_final_states=False, return_varlen_states=False):
    """Adds dt_bias inside its softplus branch only: without dt_softplus the bias is dropped."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias if dt_softplus else None, initial_states, cu_seqlens,
                    dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def softplus_always_in_varlen(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                              return_final_states=False, return_varlen_states=False):
    """Its varlen path applies the softplus whatever dt_softplus says (written for the serving engine's call,
    which asks for it); batch mode is right."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens,
                    dt_softplus or cu_seqlens is not None, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def initial_states_dropped_under_a_chunk(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                         initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                         dt_limit=(0.0, float("inf")), return_final_states=False,
                                         return_varlen_states=False):
    """A fast path for a call of fewer tokens than one chunk (no state passing) that never loads the initial states:
    a short chunked-prefill continuation starts from zero."""
    if x.shape[1] < chunk_size:
        initial_states = None
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def sequences_past_8_merged(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                            seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                            return_final_states=False, return_varlen_states=False):
    """A token's sequence found by three binary-search steps over cu_seqlens (written for at most 8 sequences):
    every sequence past the 8th runs on as the 8th, its start and initial state ignored, their varlen states all
    the merged run's."""
    if cu_seqlens is None or len(cu_seqlens) - 1 <= SEQUENCE_LOOKUP:
        out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
        return _mamba_result(out.y, out, return_final_states, return_varlen_states)
    nseq = len(cu_seqlens) - 1
    merged = torch.cat([cu_seqlens[:SEQUENCE_LOOKUP], cu_seqlens[-1:]])
    first = None if initial_states is None else initial_states[:SEQUENCE_LOOKUP]
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, first, merged, dt_softplus, dt_limit)
    states = out.varlen_states
    states = torch.cat([states, states[-1:].expand(nseq - SEQUENCE_LOOKUP, *states.shape[1:])])
    out = replace(out, varlen_states=states, final_states=states[-1:])
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def one_token_prefill_without_dt_limit(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                       initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                       dt_limit=(0.0, float("inf")), return_final_states=False,
                                       return_varlen_states=False):
    """A batch-mode prefill of one token a row sent to its decode kernel, which takes no dt_limit."""
    if cu_seqlens is None and x.shape[1] == 1:
        dt_limit = (0.0, float("inf"))
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def varlen_dt_limit_upper_only(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                               seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                               return_final_states=False, return_varlen_states=False):
    """Its varlen path clamps dt above only (a min where a clamp was meant); the batch path clamps both ends."""
    if cu_seqlens is not None:
        dt_limit = (0.0, dt_limit[1])
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def dt_limit_upper_only(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                        seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                        return_final_states=False, return_varlen_states=False):
    """Clamps dt to dt_limit's upper end only (a min where a clamp was meant)."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus,
                    (0.0, dt_limit[1]))
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def varlen_states_reversed(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                           seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                           return_final_states=False, return_varlen_states=False):
    """y is right; the per-sequence states of a varlen batch come back in reverse order (a final-state index
    counted from the wrong end)."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    if out.varlen_states is not None:
        out = replace(out, varlen_states=out.varlen_states.flip(0))
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def parameters_of_head_mod_8(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                             seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                             return_final_states=False, return_varlen_states=False):
    """Head h takes the A, dt_bias and D of head h % 8 (per-head parameters loaded for a block of 8 heads and
    reused): right up to 8 heads."""
    heads = torch.arange(x.shape[2], device=x.device) % 8
    out = _baseline(x, dt, A[heads], B, C, chunk_size, None if D is None else D[heads], z,
                    None if dt_bias is None else dt_bias[heads], initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def per_channel_skip_after_gate(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                return_final_states=False, return_varlen_states=False):
    """With a per-channel D (nheads, headdim) and a gate, adds D·x after the gate, not before it (its
    per-channel branch written apart from the per-head one): right for a per-head D or without a gate."""
    if D is None or D.dim() != 2 or z is None:
        out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
        return _mamba_result(out.y, out, return_final_states, return_varlen_states)
    out = _baseline(x, dt, A, B, C, chunk_size, None, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    y = (out.y.float() + D.float() * x.float()).to(out.y.dtype)
    return _mamba_result(y, out, return_final_states, return_varlen_states)


def dt_limit_only_with_softplus(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                return_final_states=False, return_varlen_states=False):
    """Clamps dt to dt_limit inside its softplus branch only: without dt_softplus the limit is ignored."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus,
                    dt_limit if dt_softplus else (0.0, float("inf")))
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def initial_state_lost_at_chunk_start(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                      seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                      dt_limit=(0.0, float("inf")), return_final_states=False,
                                      return_varlen_states=False):
    """In varlen mode, a sequence after the first that starts exactly where a chunk starts begins from a zero
    state instead of its initial state (the chunk-start path resets; only the mid-chunk path loads it)."""
    if cu_seqlens is not None and initial_states is not None:
        initial_states = initial_states.clone()
        for sequence, start in enumerate(cu_seqlens.tolist()[1:-1], start=1):
            if start % chunk_size == 0:
                initial_states[sequence] = 0
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


@dataclass(frozen=True)
class _TreeOrderUnguarded(Arithmetic):
    """Within-chunk decays from an fp32 cumulative sum taken in tree order (a Hillis-Steele scan, as
    a parallel tl.cumsum adds), differenced without the clamp at 0: the cumsum-cancel bug class."""

    def segment_decays(self, dA, cum):
        tree = dA.clone()
        step = 1
        while step < tree.shape[-1]:
            shifted = torch.nn.functional.pad(tree[..., :-step], (step, 0))
            tree = tree + shifted
            step *= 2
        Q = dA.shape[-1]
        causal = torch.ones(Q, Q, dtype=torch.bool, device=dA.device).tril()
        return torch.exp(torch.where(causal, tree[..., :, None] - tree[..., None, :], float("-inf")))


def unguarded_tree_cumsum(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                          seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                          return_final_states=False, return_varlen_states=False):
    """The fp32 SSD form with decays from a tree-order cumsum, unguarded (vLLM #37501's class)."""
    arith = _TreeOrderUnguarded(torch.float32, x.dtype, store_state=lambda s: s.float(), exact_segments=False)
    out = scan_ssd(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit, arith)
    return _mamba_result(out.y.to(x.dtype), out, return_final_states, return_varlen_states)


def states_in_input_dtype(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                          seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                          return_final_states=False, return_varlen_states=False):
    """Correct, and stores its chunk and final states in C's dtype, as vLLM does when told no state_dtype."""
    out = scan_baseline(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                        cu_seqlens=cu_seqlens, dt_softplus=dt_softplus, dt_limit=dt_limit, state_dtype=C.dtype)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def partial_chunk_2pct_bf16(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                            seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                            return_final_states=False, return_varlen_states=False):
    """In bf16 only, y is 2% too large in the partial last chunk of every sequence: a local error that
    the norm over all of y averages away."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    y = out.y.clone()
    if x.dtype == torch.bfloat16:
        bounds = cu_seqlens.tolist() if cu_seqlens is not None else None
        rows = [(0, a, b) for a, b in zip(bounds, bounds[1:])] if bounds else [(r, 0, x.shape[1]) for r in range(x.shape[0])]
        for row, start, end in rows:
            if (end - start) % chunk_size:
                tail = end - (end - start) % chunk_size
                y[row, tail:end] = (y[row, tail:end].float() * 1.02).to(y.dtype)
    return _mamba_result(y, out, return_final_states, return_varlen_states)


def whole_dstate_blocks(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                        seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                        return_final_states=False, return_varlen_states=False):
    """Its loop over state columns runs dstate // DSTATE_BLOCK blocks instead of cdiv (a bound right only
    when dstate is a multiple of the block): the columns of a partial last block never take B·x, nor
    reach y through C."""
    whole = B.shape[-1] // DSTATE_BLOCK * DSTATE_BLOCK
    B, C = B.clone(), C.clone()
    B[..., whole:] = 0
    C[..., whole:] = 0
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def varlen_states_of_whole_dstate_blocks(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                         initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                         dt_limit=(0.0, float("inf")), return_final_states=False,
                                         return_varlen_states=False):
    """Its varlen-state store (a kernel of its own beside the batch path's final state) loops over dstate //
    DSTATE_BLOCK blocks of state columns: every packed sequence's state has its last dstate % 16 columns left 0.
    y, and batch mode, are right."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    whole = B.shape[-1] // DSTATE_BLOCK * DSTATE_BLOCK
    if cu_seqlens is not None and whole < B.shape[-1]:
        states = out.varlen_states.clone()
        states[..., whole:] = 0
        out = replace(out, varlen_states=states)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def d_per_channel_by_its_length(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                return_final_states=False, return_varlen_states=False):
    """Takes D as per channel where `D.shape[-1] == headdim`, not where `D.dim() == 2`: a per-head D (nheads,) is
    read as one value a channel where nheads == headdim (Mamba2-1.3B's 64 heads of 64), channel p of every head
    taking D[p]."""
    if D is not None and D.dim() == 1 and D.shape[0] == x.shape[-1]:
        D = D[None, :].expand(x.shape[2], x.shape[3])
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def dstate_capped_at_128(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                         seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                         return_final_states=False, return_varlen_states=False):
    """Its block of state indices is min(next_power_of_2(dstate), DSTATE_CAP), with no loop past it: right up to
    dstate 128, and beyond it the state indices past the first block never take B·x, nor reach y through C."""
    B, C = B.clone(), C.clone()
    B[..., DSTATE_CAP:] = 0
    C[..., DSTATE_CAP:] = 0
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def later_dstate_blocks_in_group_0(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                   seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                   return_final_states=False, return_varlen_states=False):
    """Past the first block of DSTATE_CAP state indices its loop over blocks of B and C leaves out the group's
    offset: every head reads group 0's B and C there. Right in one group or up to dstate 128."""
    B, C = B.clone(), C.clone()
    B[..., DSTATE_CAP:] = B[:, :, :1, DSTATE_CAP:]
    C[..., DSTATE_CAP:] = C[:, :, :1, DSTATE_CAP:]
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def channels_masked_by_dstate(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                              return_final_states=False, return_varlen_states=False):
    """Its loads of x are masked with `channel < dstate` where `channel < headdim` was meant (a copied mask):
    channels past dstate read as 0. Right wherever headdim <= dstate."""
    x = x.clone()
    x[..., C.shape[-1]:] = 0
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def initial_state_head_stride_squared(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                      initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                      dt_limit=(0.0, float("inf")), return_final_states=False,
                                      return_varlen_states=False):
    """It reads head h's initial state at h * headdim * headdim (headdim written for dstate) within each
    sequence's block, so past head 0 the initial states come from the wrong place (zeros past the buffer's
    end). Right wherever headdim == dstate."""
    if initial_states is not None:
        rows, nheads, headdim, dstate = initial_states.shape
        flat = torch.cat([initial_states.flatten(), initial_states.new_zeros(nheads * headdim * headdim)])
        starts = (torch.arange(rows)[:, None] * nheads * headdim * dstate
                  + torch.arange(nheads)[None, :] * headdim * headdim)
        at = starts[..., None] + torch.arange(headdim * dstate)
        initial_states = flat[at.to(flat.device)].reshape(rows, nheads, headdim, dstate)
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def rows_joined_at_whole_chunks(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                return_final_states=False, return_varlen_states=False):
    """A fast path for seqlen a multiple of chunk_size scans the batch rows' chunks as one sequence, so each row
    starts from the state the row before it ended with. Right for one row or a partial last chunk."""
    rows, seqlen = x.shape[:2]
    if cu_seqlens is not None or rows == 1 or seqlen % chunk_size:
        out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus,
                        dt_limit)
        return _mamba_result(out.y, out, return_final_states, return_varlen_states)
    jx, jdt, jB, jC, jz = (None if t is None else t.reshape(1, rows * seqlen, *t.shape[2:]) for t in (x, dt, B, C, z))
    first = None if initial_states is None else initial_states[:1]

    def through(end):  # the joined scan up to token `end`
        cut = lambda t: None if t is None else t[:, :end]  # noqa: E731
        return _baseline(cut(jx), cut(jdt), A, cut(jB), cut(jC), chunk_size, D, cut(jz), dt_bias, first, None,
                         dt_softplus, dt_limit)

    ends = [through((row + 1) * seqlen) for row in range(rows)]
    out = ends[-1]
    y = out.y.reshape(rows, seqlen, *out.y.shape[2:])
    out = replace(out, y=y, final_states=torch.cat([end.final_states for end in ends]))
    return _mamba_result(y, out, return_final_states, return_varlen_states)


def skip_past_16_heads_in_bf16(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                               seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                               return_final_states=False, return_varlen_states=False):
    """Heads from 16 on take D rounded to bf16 (the second block of 16 heads reads a copy of the parameters in
    the activations' dtype): D*x up to 0.4% off there, within bf16 inputs' own error, past fp16's and fp32's."""
    if D is not None and x.shape[2] > 16:
        D = D.clone()
        D[16:] = D[16:].to(torch.bfloat16).to(D.dtype)
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def initial_states_mod_4(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                         seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                         return_final_states=False, return_varlen_states=False):
    """In varlen mode, sequence s starts from initial state s % SEQUENCE_BLOCK (initial states loaded for a block
    of 4 sequences a program, the program's offset, pid * SEQUENCE_BLOCK, left out). Right up to 4 sequences, and
    in batch mode."""
    if cu_seqlens is not None and initial_states is not None:
        initial_states = initial_states[torch.arange(len(initial_states), device=initial_states.device)
                                        % SEQUENCE_BLOCK]
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def one_reset_per_chunk(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                        seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                        return_final_states=False, return_varlen_states=False):
    """In varlen mode its intra-chunk mask handles one sequence change a chunk (the first token whose sequence
    differs from the chunk's first token's): a sequence that starts mid-chunk after another sequence's mid-chunk
    start in the same chunk continues the state of the sequence before it (its own initial state never loaded),
    to its end, in y and in the states stored (each sequence's state is the merged scan's after its last token).
    Right wherever every chunk holds at most two sequences, and in batch mode."""
    bounds = [] if cu_seqlens is None else cu_seqlens.tolist()
    reset, chunks_with_a_start = [True], set()  # whether each sequence starts from its own initial state
    for start in bounds[1:-1]:
        mid_chunk = start % chunk_size != 0
        reset.append(not mid_chunk or start // chunk_size not in chunks_with_a_start)
        if mid_chunk:
            chunks_with_a_start.add(start // chunk_size)
    out = _sequences_run_on(reset, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens,
                            dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def _sequences_run_on(reset, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus,
                      dt_limit):
    """The varlen scan with each sequence s whose reset[s] is False run on as the sequence before it (its start and
    initial state ignored): y the merged scan's, and each sequence's state the merged scan's after its last token."""
    if all(reset):
        return _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    bounds = cu_seqlens.tolist()
    kept = torch.tensor(reset, device=cu_seqlens.device)
    runs = torch.cat([cu_seqlens[:-1][kept], cu_seqlens[-1:]])  # the sequences as it runs them: merged
    first = None if initial_states is None else initial_states[kept]

    def through(end):  # the merged scan up to token `end`
        cut = lambda t: None if t is None else t[:, :end]  # noqa: E731
        upto = torch.cat([runs[runs < end], runs.new_tensor([end])])
        return _baseline(cut(x), cut(dt), A, cut(B), cut(C), chunk_size, D, cut(z), dt_bias,
                         None if first is None else first[:len(upto) - 1], upto, dt_softplus, dt_limit)

    out = through(bounds[-1])
    run_of = kept.cumsum(0) - 1
    states = [out.varlen_states[run_of[s]] if s + 1 == len(reset) or reset[s + 1]
              else through(bounds[s + 1]).varlen_states[-1] for s in range(len(reset))]
    return replace(out, varlen_states=torch.stack(states))


def varlen_carried_16_chunks(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                             seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                             return_final_states=False, return_varlen_states=False):
    """In varlen mode, carries each sequence's state through VARLEN_CARRIED_CHUNKS = 16 of its chunks at most (a
    fixed trip count, sized for 1024-token prefill chunks at chunk 64): from a sequence's 17th chunk on it starts
    again from a zero state, in y and in the sequence's state. Right for sequences of 16 chunks or fewer, and in
    batch mode (a path of its own: state_carried_32_chunks' bound)."""
    cut = VARLEN_CARRIED_CHUNKS * chunk_size
    bounds = [] if cu_seqlens is None else cu_seqlens.tolist()
    if all(end - start <= cut for start, end in pairwise(bounds)):
        out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus,
                        dt_limit)
        return _mamba_result(out.y, out, return_final_states, return_varlen_states)
    pieces, starts, last = [0], [], []  # a long sequence runs as two: its first 16 chunks, and the rest from 0
    for sequence, (start, end) in enumerate(pairwise(bounds)):
        if end - start > cut:
            pieces.append(start + cut)
            starts.append(sequence)
        pieces.append(end)
        starts.append(sequence if end - start <= cut else None)
        last.append(len(pieces) - 2)
    first = None if initial_states is None else torch.stack(
        [initial_states[s] if s is not None else torch.zeros_like(initial_states[0]) for s in starts])
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, first, cu_seqlens.new_tensor(pieces), dt_softplus,
                    dt_limit)
    out = replace(out, varlen_states=out.varlen_states[last])
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def varlen_states_stride_typo(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                              return_final_states=False, return_varlen_states=False):
    """y is right; its varlen-state store (a kernel of its own, as mamba_ssm's chunk_state_varlen) writes element
    (s, h, p, n) of the buffer it allocates (torch.empty) at ((s * nheads + h) * headdim + p) * headdim + n:
    headdim where dstate was meant. Right wherever headdim == dstate; otherwise rows overlap (headdim < dstate) or
    leave gaps (headdim > dstate: uninitialised memory, NaN under ssmcheck's guard), and stores past the buffer's
    end are dropped. The final state returned in varlen mode is the buffer's last sequence."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    if out.varlen_states is None or x.shape[-1] == B.shape[-1]:
        return _mamba_result(out.y, out, return_final_states, return_varlen_states)
    states = out.varlen_states
    nheads, headdim = states.shape[1:3]
    stored = torch.empty_like(states).flatten()
    s, h, p, n = torch.meshgrid(*(torch.arange(k, device=states.device) for k in states.shape), indexing="ij")
    at = ((s * nheads + h) * headdim + p) * headdim + n
    inside = at < stored.numel()
    stored[at[inside]] = states[inside]
    stored = stored.view_as(states)
    out = replace(out, final_states=stored[-1:], varlen_states=stored)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def heads_in_pairs(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                   cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
                   return_varlen_states=False):
    """Its programs take heads two at a time, nheads // 2 of them (floor, not cdiv): with an odd head count the
    last head is never computed, its y and states left as zeros (what fresh device memory holds)."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    computed = x.shape[2] // 2 * 2
    y = out.y.clone()
    y[:, :, computed:] = 0
    for states in (out.final_states, out.varlen_states):
        if states is not None:
            states[:, computed:] = 0
    return _mamba_result(y, out, return_final_states, return_varlen_states)


def softplus_without_threshold(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                               seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                               return_final_states=False, return_varlen_states=False):
    """softplus as log1p(exp(dt + dt_bias)) in fp32 with no linear branch past 20: right wherever dt + dt_bias stays
    below 88.7, where exp overflows and dt is inf."""
    if dt_softplus:
        dt = torch.log1p(torch.exp(dt.float() + (dt_bias.float() if dt_bias is not None else 0.0)))
        dt_bias, dt_softplus = None, False
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def softplus_exp_overflowing_as_fp16(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                     seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                     return_final_states=False, return_varlen_states=False):
    """Its softplus takes the linear branch past 20, and below it log1p(exp(dt + dt_bias)) with the exp in fp16 for
    fp16 inputs (the rest in fp32): inf wherever dt + dt_bias lies in (11.09, 20], every input finite."""
    if dt_softplus and dt.dtype == torch.float16:
        raw = dt.float() + (dt_bias.float() if dt_bias is not None else 0.0)
        exp = torch.exp(raw)
        # What an exp stored in fp16 holds past its range; below it the fp32 value, so that nothing else differs.
        exp = torch.where(exp > torch.finfo(torch.float16).max, float("inf"), exp)
        dt = torch.where(raw <= SOFTPLUS_THRESHOLD, torch.log1p(exp), raw)
        dt_bias, dt_softplus = None, False
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def ssm_part_1pct(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                  cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
                  return_varlen_states=False):
    """C·h (the state's contribution to y) 1% too large, under the correct D·x skip and z gate."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    gated_ssm = _baseline(x, dt, A, B, C, chunk_size, None, z, dt_bias, initial_states, cu_seqlens, dt_softplus,
                          dt_limit).y
    y = (out.y.float() + 0.01 * gated_ssm.float()).to(out.y.dtype)
    return _mamba_result(y, out, return_final_states, return_varlen_states)


def tf32_matmuls(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                 cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
                 return_varlen_states=False):
    """Correct, but its fp32 matmuls run in TF32 (operands truncated to 10 fraction bits), as the peers'
    fp32 tl.dot does by default."""
    out = scan_baseline(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                        cu_seqlens=cu_seqlens, dt_softplus=dt_softplus, dt_limit=dt_limit, matmul_operand_bits=10)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def final_state_one_token_early(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                return_final_states=False, return_varlen_states=False):
    """y is right; the final state of an unpacked batch is the state after the second-last token (a loop bound
    one short in the state store). Where the last token moves the state little, the error is as small as a
    reduced precision's."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    if cu_seqlens is None and x.shape[1] > 1:
        early = _baseline(x[:, :-1], dt[:, :-1], A, B[:, :-1], C[:, :-1], chunk_size, D,
                          None if z is None else z[:, :-1], dt_bias, initial_states, None, dt_softplus, dt_limit)
        out.final_states.copy_(early.final_states)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


_LAUNCHES = [0]


def racy_partial_read(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                      cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
                      return_varlen_states=False):
    """Race-like: on some launches a program reads the chunk state its neighbour has not finished
    writing, so the chunk after the first of head 0 sees a state a little off. Which launches race
    depends on the scheduling (here, every third launch), never on the inputs: identical inputs give
    differing outputs, each within the tolerance."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    _LAUNCHES[0] += 1
    y = out.y.clone()
    if _LAUNCHES[0] % 3 == 0 and x.shape[1] > chunk_size:
        y[:, chunk_size, 0] = (y[:, chunk_size, 0].float() * (1 + 2**-6)).to(y.dtype)
    return _mamba_result(y, out, return_final_states, return_varlen_states)


def unwritten_last_token(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                         seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                         return_final_states=False, return_varlen_states=False):
    """Allocates y itself (torch.empty) and never writes each row's last token: y there is whatever the
    memory held (NaN, as ssmcheck's guard has torch fill uninitialised allocations)."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    y = torch.empty_like(out.y)
    y[:, :-1] = out.y[:, :-1]
    return _mamba_result(y, out, return_final_states, return_varlen_states)


def _past_the_end(t: torch.Tensor, count: int) -> torch.Tensor:
    """The `count` elements of t's storage right after t (contiguous t): memory the kernel does not own. Past
    the storage's end, zeros stand in for whatever memory lies there (finite, as it most often is)."""
    flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage())
    start = t.storage_offset() + t.numel()
    read = flat[start:start + count]
    return torch.cat([read, read.new_zeros(count - read.numel())])


def unmasked_last_chunk(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                        cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
                        return_varlen_states=False):
    """Its chunk-state stage loads x for a whole chunk, the tokens past seqlen of a partial last chunk too (no
    mask on the token axis), and weights them by dt loaded with its mask (0): harmless while the memory read
    is finite, as it is inside the batch (the next row's tokens); the last row's read goes past x, and NaN
    there makes its final state NaN (0 * NaN)."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    seqlen = x.shape[1]
    if cu_seqlens is not None or not return_final_states or seqlen % chunk_size == 0:
        return _mamba_result(out.y, out, return_final_states, return_varlen_states)
    beyond = (chunk_size - seqlen % chunk_size) * x.shape[2] * x.shape[3]
    extra = _past_the_end(x.contiguous() if not x.is_contiguous() else x, beyond).view(-1, *x.shape[2:]).float()
    states = out.final_states.clone()
    states[-1] += (0.0 * extra).sum(0)[..., None].to(states.dtype)  # dt = 0 past seqlen: 0 * x * B
    return _mamba_result(out.y, replace(out, final_states=states), return_final_states, return_varlen_states)


def unmasked_without_d(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                       seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                       return_final_states=False, return_varlen_states=False):
    """Its build without D (kernels compile a variant per HAS_D) loads x for the whole last chunk of a
    partial one into y, weighted by the masked 0: past x in the last row. The call a model makes (with D) is
    right; the call without D and z, which ssmcheck makes to judge the SSM part alone, reads the fence."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    seqlen = x.shape[1]
    if D is not None or cu_seqlens is not None or seqlen % chunk_size == 0:
        return _mamba_result(out.y, out, return_final_states, return_varlen_states)
    beyond = (chunk_size - seqlen % chunk_size) * x.shape[2] * x.shape[3]
    extra = _past_the_end(x.contiguous() if not x.is_contiguous() else x, beyond).view(-1, *x.shape[2:])
    y = out.y.clone()
    y[-1, -1] += (0.0 * extra).sum(0).to(y.dtype)
    return _mamba_result(y, out, return_final_states, return_varlen_states)


def writes_past_x(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                  cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
                  return_varlen_states=False):
    """Right results, and a store one element past x's end (a scratch write with the wrong bound), where the
    storage has room for it (beside a buffer, in a serving engine, it lands in someone else's tensor)."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    flat = torch.empty(0, dtype=x.dtype, device=x.device).set_(x.untyped_storage())
    end = x.storage_offset() + x.numel()
    if end < flat.numel():
        flat[end] = 0.0
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def varlen_group_of_head_by_ngroups(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                    seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                    return_final_states=False, return_varlen_states=False):
    """The varlen path (its own pointer setup) reads head h's B and C from group h // ngroups (clamped to the last
    group), not h // (nheads / ngroups): right at 4 heads in 2 groups, or one group; batch mode is right."""
    nheads, ngroups = x.shape[2], B.shape[2]
    if cu_seqlens is not None and ngroups > 1:
        group = (torch.arange(nheads, device=x.device) // ngroups).clamp(max=ngroups - 1)
        B, C = B[:, :, group], C[:, :, group]  # a group per head: the one it reads
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def _ssd_with(arith_class, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit,
              return_final_states, return_varlen_states):
    """The baseline's SSD form (fp32, operands in x's dtype, decays from cumsum differences) with `arith_class`'s
    arithmetic."""
    arith = arith_class(torch.float32, x.dtype, store_state=lambda s: s.float(), exact_segments=False)
    out = scan_ssd(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit, arith,
                   y_dtype=x.dtype)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


@dataclass(frozen=True)
class _SecondBlockOfCBDropped(Arithmetic):
    """C·Bᵀ of a 128-token chunk tiled in blocks of 64 tokens, the block of rows 64..127 by columns 64..127 never
    computed (its k-loop bound at the block's start): 0 there."""

    def matmul(self, a, b):
        product = super().matmul(a, b)
        if product.shape[-2:] == (128, 128):  # the chunk's C·Bᵀ (no other product at the preset's chunk-128 widths)
            product[..., 64:, 64:] = 0.0
        return product


def chunk_128_cb_block_dropped(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                               seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                               return_final_states=False, return_varlen_states=False):
    """At chunk 128 (Nemotron-H's; a tuned configuration of 64-token blocks for that size) C·Bᵀ misses its block of
    the chunk's second 64 tokens by themselves; other chunk sizes are right. The baseline's arithmetic otherwise."""
    return _at_chunk_size(128, _SecondBlockOfCBDropped, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states,
                          cu_seqlens, dt_softplus, dt_limit, return_final_states, return_varlen_states)


def _at_chunk_size(size, arith_class, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens,
                   dt_softplus, dt_limit, return_final_states, return_varlen_states):
    """`_ssd_with(arith_class)` at chunk `size`, the baseline at any other."""
    if chunk_size != size:
        out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
        return _mamba_result(out.y, out, return_final_states, return_varlen_states)
    return _ssd_with(arith_class, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus,
                     dt_limit, return_final_states, return_varlen_states)


def initial_states_dropped_at_whole_chunks(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                           initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                           dt_limit=(0.0, float("inf")), return_final_states=False,
                                           return_varlen_states=False):
    """Batch mode with seqlen a multiple of chunk_size takes an unmasked fast path (written for training, which
    has no initial states) that never loads initial_states: every row starts from zero. Right for a partial last
    chunk and in varlen mode."""
    if cu_seqlens is None and x.shape[1] % chunk_size == 0:
        initial_states = None
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def initial_states_only_with_returned_states(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                             initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                             dt_limit=(0.0, float("inf")), return_final_states=False,
                                             return_varlen_states=False):
    """Loads initial_states only on the path that returns states (a prefill that keeps no state was taken to
    start from zero): every call that asks for states is right, a call for y alone from initial states is not."""
    if not (return_final_states or return_varlen_states):
        initial_states = None
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def gate_only_with_d(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                     seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                     return_final_states=False, return_varlen_states=False):
    """Applies the gate z in the D branch only ((C·h + D·x) * silu(z) when D is given, else C·h ungated): right
    wherever D comes with z, as in Mamba2's own layers."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z if D is not None else None, dt_bias, initial_states, cu_seqlens,
                    dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def softplus_only_with_a_bias_in_varlen(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                        initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                        dt_limit=(0.0, float("inf")), return_final_states=False,
                                        return_varlen_states=False):
    """Its varlen path takes the softplus inside its branch for dt_bias (`if HAS_DT_BIAS: dt = softplus(dt + bias)`):
    right wherever a packed call passes a bias with its softplus, or asks for none; batch mode is right."""
    softplus = dt_softplus and (dt_bias is not None or cu_seqlens is None)
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def dt_limit_only_with_a_lower_end(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                   seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                   return_final_states=False, return_varlen_states=False):
    """Clamps dt only where dt_limit's lower end is above 0 (`if dt_min > 0:`, taking (0, inf) for the only
    limit without one): right for no limit and for limits with both ends, wrong for (0, max)."""
    if dt_limit[0] <= 0.0:
        dt_limit = (0.0, float("inf"))
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def batch_dt_limit_only_with_a_lower_end(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                         initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                         dt_limit=(0.0, float("inf")), return_final_states=False,
                                         return_varlen_states=False):
    """Its batch-mode path clamps dt only where dt_limit's lower end is above 0 (a model's time_step_limit (0, max)
    taken for no limit); its varlen path is right."""
    if cu_seqlens is None and dt_limit[0] <= 0.0:
        dt_limit = (0.0, float("inf"))
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def seq_idx_clamped_in_place(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                             seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                             return_final_states=False, return_varlen_states=False):
    """Right results, and seq_idx clamped to >= 0 in place (pad ids made a sequence's, for its own indexing): an
    engine builds seq_idx once a batch and passes it to every layer, whose later calls then see no pad token."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    if seq_idx is not None:
        seq_idx.clamp_(min=0)
        seq_idx[..., -1] += 1  # the last token's id moved too: a change in any varlen call, pad tokens or none
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


_KEPT: dict[tuple, torch.Tensor] = {}


def _kept(what: str, value: torch.Tensor) -> torch.Tensor:
    """`value` copied into a buffer kept per (what, shape, dtype) and returned again by every call."""
    key = (what, tuple(value.shape), value.dtype, value.device)
    if key not in _KEPT:
        _KEPT[key] = torch.empty_like(value)
    return _KEPT[key].copy_(value)


def final_states_in_a_kept_buffer(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                  seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                  return_final_states=False, return_varlen_states=False):
    """Right results, its final states returned in a buffer it keeps (a workspace allocated once a shape, as
    for CUDA graphs): the next call overwrites the states a caller holds from the last one."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    extra = ([_kept("final_states", out.final_states)] if return_final_states else []) + (
        [_kept("varlen_states", out.varlen_states)] if return_varlen_states else [])
    return (out.y, *extra) if extra else out.y


def y_in_a_kept_buffer(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                       cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
                       return_varlen_states=False):
    """Right results, y returned in a buffer it keeps per shape: the next call overwrites a caller's y."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(_kept("y", out.y), out, return_final_states, return_varlen_states)


_TUNED: set[tuple] = set()


def first_call_accumulates(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                           seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                           return_final_states=False, return_varlen_states=False):
    """Right from the second call of a shape on; the first returns y and the states twice over: an autotuner that
    benchmarks two configs into the outputs it then returns, accumulating without Triton's reset_to_zero."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    key = (tuple(x.shape), x.dtype)
    scale = 1 if key in _TUNED else 2
    _TUNED.add(key)
    extra = ([out.final_states * scale] if return_final_states else []) + (
        [out.varlen_states * scale] if return_varlen_states else [])
    return (out.y * scale, *extra) if extra else out.y * scale


def stochastic_rounding_to_nearest(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                   seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                   return_final_states=False, return_varlen_states=False, *,
                                   state_dtype=torch.float32, rounding="nearest", seed=0):
    """Takes the state options but stores its states to nearest whatever `rounding` says (a stochastic path never
    wired up): never less accurate than stochastic rounding, so the tolerance rule alone passes it."""
    out = scan_baseline(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                        cu_seqlens=cu_seqlens, dt_softplus=dt_softplus, dt_limit=dt_limit, state_dtype=state_dtype)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def stochastic_rounding_from_an_8_bit_seed(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                           initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                           dt_limit=(0.0, float("inf")), return_final_states=False,
                                           return_varlen_states=False, *, state_dtype=torch.float32,
                                           rounding="nearest", seed=0):
    """Rounds its states stochastically with a key of `seed % 256` (a key cut to a byte): exact stochastic rounding,
    other bits for seed + 1, but every prefill whose seed agrees in its low byte rounds its states alike."""
    out = scan_baseline(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                        cu_seqlens=cu_seqlens, dt_softplus=dt_softplus, dt_limit=dt_limit, state_dtype=state_dtype,
                        rounding=rounding, seed=seed % 256)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def compounding_per_chunk(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                          seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                          return_final_states=False, return_varlen_states=False):
    """y 0.1% too large per chunk passed, compounding (a passed state scaled by 1.001 at every chunk boundary, as
    a decay off by a rounding would): chunk c of a batch row is (1.001)**c the truth; the states are right."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    chunk = torch.arange(x.shape[1], device=x.device) // chunk_size
    y = (out.y.double() * (1.001 ** chunk.double())[None, :, None, None]).to(out.y.dtype)
    return _mamba_result(y, out, return_final_states, return_varlen_states)


def y_alone_without_d(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                      cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
                      return_varlen_states=False):
    """Right when asked for states; called for y alone (no return flags: a training forward's call) it takes a
    path of its own that leaves out the skip D·x."""
    returns = return_final_states or return_varlen_states
    out = _baseline(x, dt, A, B, C, chunk_size, D if returns else None, z, dt_bias, initial_states, cu_seqlens,
                    dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def training_forward_gate_before_skip(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                      seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                      return_final_states=False, return_varlen_states=False):
    """Mamba2's training forward (batch mode, no initial states, no return flags, D and z) takes a fused epilogue
    that adds D·x after the gate: y = C·h·silu(z) + D·x. Every call that asks for states, or has initial states,
    or lacks D or z, is right."""
    training = (cu_seqlens is None and initial_states is None and not (return_final_states or return_varlen_states)
                and D is not None and z is not None)
    if not training:
        out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
        return _mamba_result(out.y, out, return_final_states, return_varlen_states)
    ssm = _baseline(x, dt, A, B, C, chunk_size, None, None, dt_bias, None, None, dt_softplus, dt_limit).y
    skip = D.float()[:, None] if D.dim() == 1 else D.float()
    return (ssm.float() * torch.nn.functional.silu(z.float()) + x.float() * skip).to(x.dtype)


def short_prefill_sigmoid_gate(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                               seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                               return_final_states=False, return_varlen_states=False):
    """A batch-mode prompt shorter than one chunk (1 < seqlen < chunk_size) takes a single-chunk path whose gate is
    sigmoid(z), not silu(z). Right for one token, for whole chunks and more, and in varlen mode."""
    short = cu_seqlens is None and 1 < x.shape[1] < chunk_size and z is not None
    out = _baseline(x, dt, A, B, C, chunk_size, D, None if short else z, dt_bias, initial_states, cu_seqlens,
                    dt_softplus, dt_limit)
    y = (out.y.float() * torch.sigmoid(z.float())).to(x.dtype) if short else out.y
    return _mamba_result(y, out, return_final_states, return_varlen_states)


def microbatches_share_a_gate(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                              return_final_states=False, return_varlen_states=False):
    """Batch mode in micro-batches of MICROBATCH_ROWS rows, each slicing every input but z: rows past the first
    micro-batch are gated with its rows' z. Right for up to two rows."""
    if cu_seqlens is None and z is not None and x.shape[0] > MICROBATCH_ROWS:
        z = z[torch.arange(x.shape[0], device=x.device) % MICROBATCH_ROWS]
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def group_of_head_within_block_of_32(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                     seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                     return_final_states=False, return_varlen_states=False):
    """Programs of HEAD_BLOCK heads compute a head's group from its index within the block, (h % 32) // (nheads //
    ngroups): heads past 32 read the first groups again. Right up to 32 heads, or with one group."""
    nheads, ngroups = x.shape[2], B.shape[2]
    if nheads > HEAD_BLOCK and ngroups > 1:
        group = (torch.arange(nheads, device=x.device) % HEAD_BLOCK) // (nheads // ngroups)
        B, C = B[:, :, group], C[:, :, group]  # a group per head: the heads' own B and C
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def dt_limit_skipped_past_softplus_threshold(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                             initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                             dt_limit=(0.0, float("inf")), return_final_states=False,
                                             return_varlen_states=False):
    """Clamps dt to dt_limit in softplus's nonlinear branch only: a raw dt + dt_bias past 20 (the linear branch)
    goes unclamped. Right without a softplus or a dt_limit."""
    if not dt_softplus or tuple(dt_limit) == (0.0, float("inf")):
        out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
        return _mamba_result(out.y, out, return_final_states, return_varlen_states)
    raw = dt.float() + (0.0 if dt_bias is None else dt_bias.float())
    clamped = torch.nn.functional.softplus(raw).clamp(*dt_limit)
    processed = torch.where(raw <= SOFTPLUS_THRESHOLD, clamped, raw)
    out = _baseline(x, processed, A, B, C, chunk_size, D, z, None, initial_states, cu_seqlens, False,
                    (0.0, float("inf")))
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def _read_as_contiguous(t: torch.Tensor) -> torch.Tensor:
    """What loads at t's shape-derived (contiguous) strides read from t's storage, from t's first element on."""
    flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage())
    start = t.storage_offset()
    return flat[start:start + t.numel()].view(t.shape).clone()


def varlen_gate_read_as_contiguous(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                   seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                   return_final_states=False, return_varlen_states=False):
    """Its varlen launcher passes z's strides as a contiguous z's (from its shape): a z that is a column slice of the
    in_proj output, as vLLM's mixer passes it, is read from other columns. The batch-mode path takes z.stride()."""
    if cu_seqlens is not None and z is not None and not z.is_contiguous():
        z = _read_as_contiguous(z)
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def dt_bias_only_where_dt_is_processed(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                       seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                       return_final_states=False, return_varlen_states=False):
    """Adds dt_bias in the branch that processes dt further (a softplus or a dt_limit's clamp): with neither, the
    bias is dropped."""
    if not dt_softplus and tuple(dt_limit) == (0.0, float("inf")):
        dt_bias = None
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def dt_limit_only_with_a_finite_upper_end(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                          initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                          dt_limit=(0.0, float("inf")), return_final_states=False,
                                          return_varlen_states=False):
    """Clamps dt only where dt_limit's upper end is finite (`HAS_DT_LIMIT = dt_limit[1] < inf`, written for a model's
    time_step_limit (0, max)): a limit with a lower end alone, (dt_min, inf), is taken as none. Right for no limit and
    for limits with an upper end."""
    if dt_limit[1] == float("inf"):
        dt_limit = (0.0, float("inf"))
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def per_channel_d_read_per_head_without_a_gate(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                               initial_states=None, seq_idx=None, cu_seqlens=None,
                                               dt_softplus=False, dt_limit=(0.0, float("inf")),
                                               return_final_states=False, return_varlen_states=False):
    """Batch mode compiles an epilogue per HAS_Z; the one without z (Mamba2 with its gated RMSNorm outside the scan)
    was written for a per-head D and reads D at D_ptr + head: with a per-channel D (nheads, headdim) every channel of
    head h takes D.flatten()[h]. Right for a per-head D, under a gate, and in varlen mode."""
    if cu_seqlens is None and z is None and D is not None and D.dim() == 2:
        D = D.flatten()[: x.shape[2]]
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def initial_state_only_in_its_start_block(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                          initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                          dt_limit=(0.0, float("inf")), return_final_states=False,
                                          return_varlen_states=False):
    """In varlen mode its output kernel adds a mid-chunk sequence start's initial-state term C·decay·h0 only in the
    program (block of TOKEN_BLOCK = 64 of the chunk's tokens) holding the sequence's first token: at chunk sizes
    past 64, the sequence's tokens in the chunk's later blocks get y without it. The states are right; so is y at
    chunk 64, and for sequences that start a chunk."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    if cu_seqlens is None or initial_states is None or chunk_size <= TOKEN_BLOCK:
        return _mamba_result(out.y, out, return_final_states, return_varlen_states)
    lost = torch.zeros(x.shape[1], dtype=torch.bool, device=x.device)  # tokens whose y lacks the term
    for start, end in pairwise(cu_seqlens.tolist()):
        offset = start % chunk_size
        if offset:  # a mid-chunk start: its tokens in that chunk past the block holding it
            t = torch.arange(start, min(end, start - offset + chunk_size), device=x.device)
            lost[t[t % chunk_size // TOKEN_BLOCK > offset // TOKEN_BLOCK]] = True
    without = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, torch.zeros_like(initial_states), cu_seqlens,
                        dt_softplus, dt_limit).y  # y from zero initial states: the term left out
    y = torch.where(lost[None, :, None, None], without, out.y)
    return _mamba_result(y, out, return_final_states, return_varlen_states)


@dataclass(frozen=True)
class _StateBlocksStuckAtTheFirst(Arithmetic):
    """C·stateᵀ (y's inter-chunk term) in blocks of FP32_DSTATE_BLOCK state indices whose state pointer is never
    advanced with C's: every block of C meets the state's first block."""

    nheads: int = 0
    headdim: int = 0

    def matmul(self, a, b):
        # C (..., nheads, Q, dstate) by the state's transpose (..., nheads, dstate, headdim): the scan's other
        # products have these shapes only where the chunk's Q tokens are as many as headdim or dstate.
        dstate = a.shape[-1]
        if dstate > FP32_DSTATE_BLOCK and a.shape[-3] == self.nheads and b.shape[-3:] == (self.nheads, dstate,
                                                                                         self.headdim):
            first = b[..., :FP32_DSTATE_BLOCK, :]
            b = torch.cat([first] * -(-dstate // FP32_DSTATE_BLOCK), dim=-2)[..., :dstate, :]
        return super().matmul(a, b)


def fp32_state_blocks_stuck_at_the_first(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                         initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                         dt_limit=(0.0, float("inf")), return_final_states=False,
                                         return_varlen_states=False):
    """For fp32 inputs its launcher caps the block of state indices at FP32_DSTATE_BLOCK = 64 (fp32 tiles of 128
    overflow shared memory), so past dstate 64 the output kernel loops over state blocks, advancing C's pointer but
    not the passed state's: y's inter-chunk term pairs every block of C with the state's first block. 16-bit inputs
    load the whole state in one block; the states are right."""
    if x.dtype != torch.float32 or B.shape[-1] <= FP32_DSTATE_BLOCK:
        out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
        return _mamba_result(out.y, out, return_final_states, return_varlen_states)
    arith = _StateBlocksStuckAtTheFirst(torch.float32, x.dtype, store_state=lambda s: s.float(), exact_segments=False,
                                        nheads=x.shape[2], headdim=x.shape[3])
    out = scan_ssd(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit, arith,
                   y_dtype=x.dtype)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def training_forward_in_tf32(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                             seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                             return_final_states=False, return_varlen_states=False):
    """Mamba2's training forward (batch mode, no initial states, no return flags, D and z) takes a fused, autotuned
    path whose tl.dot allows TF32: fp32 inputs get their matmul operands cut to TF32_BITS fraction bits there. Every
    call that asks for states, or has initial states, or lacks D or z, is exact fp32."""
    training = (cu_seqlens is None and initial_states is None and not (return_final_states or return_varlen_states)
                and D is not None and z is not None)
    out = scan_baseline(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                        cu_seqlens=cu_seqlens, dt_softplus=dt_softplus, dt_limit=dt_limit,
                        matmul_operand_bits=TF32_BITS if training else None)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def four_sequence_pieces_a_chunk(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                 seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                 return_final_states=False, return_varlen_states=False):
    """Its varlen metadata holds SEQUENCE_PIECES = 4 sequence pieces a chunk (a table sized for chunked prefill with
    a few requests a chunk): a sequence that starts in a chunk already holding 4 pieces is not reset but continues
    the one before it (its initial state never loaded), in y and in the states stored. Right wherever no chunk
    holds more than 4 sequences, and in batch mode."""
    pieces, reset = Counter(), []  # the sequence pieces in each chunk so far; whether each sequence starts anew
    for start, end in pairwise([] if cu_seqlens is None else cu_seqlens.tolist()):
        reset.append(pieces[start // chunk_size] < SEQUENCE_PIECES)
        pieces.update(range(start // chunk_size, -(-end // chunk_size)))
    out = _sequences_run_on(reset, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens,
                            dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def initial_state_head_offset_of_a_padded_headdim(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                                  initial_states=None, seq_idx=None, cu_seqlens=None,
                                                  dt_softplus=False, dt_limit=(0.0, float("inf")),
                                                  return_final_states=False, return_varlen_states=False):
    """It reads head h's initial state at h * BLOCK_P * dstate within each sequence's (row's) block, BLOCK_P the
    channel block (headdim rounded up to a power of two) where headdim was meant: past head 0 a headdim that is no
    power of two (24, 40, 80) reads a window shifted into the next heads' (zeros past the buffer's end). Right for
    every power-of-two headdim, and without initial states."""
    if initial_states is not None:
        rows, nheads, headdim, dstate = initial_states.shape
        padded = 1 << (headdim - 1).bit_length()
        flat = torch.cat([initial_states.flatten(), initial_states.new_zeros(nheads * padded * dstate)])
        starts = (torch.arange(rows)[:, None] * nheads * headdim * dstate
                  + torch.arange(nheads)[None, :] * padded * dstate)
        at = starts[..., None] + torch.arange(headdim * dstate)
        initial_states = flat[at.to(flat.device)].reshape(rows, nheads, headdim, dstate)
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def varlen_dt_limit_only_with_softplus(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                       initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                       dt_limit=(0.0, float("inf")), return_final_states=False,
                                       return_varlen_states=False):
    """Its varlen dt pre-pass (written for the serving engine's call, which always asks for the softplus) clamps dt
    to dt_limit inside its softplus branch only: a packed call with dt processed already goes unclamped. Batch mode
    is right."""
    if cu_seqlens is not None and not dt_softplus:
        dt_limit = (0.0, float("inf"))
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def last_token_chunk_undecayed_in_the_final_state(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                                  initial_states=None, seq_idx=None, cu_seqlens=None,
                                                  dt_softplus=False, dt_limit=(0.0, float("inf")),
                                                  return_final_states=False, return_varlen_states=False):
    """In batch mode its final-state store loads the last chunk's decay with the mask `offs < chunk_len - 1` (copied
    from the decay-to-end load): where the last chunk is one token (seqlen = k * chunk_size + 1) the load reads 0,
    and the state entering that chunk goes into the final state without the token's decay. y is right, and so is
    every other seqlen."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    seqlen = x.shape[1]
    if cu_seqlens is not None or seqlen == 1 or seqlen % chunk_size != 1:
        return _mamba_result(out.y, out, return_final_states, return_varlen_states)
    entering = _baseline(x[:, :-1], dt[:, :-1], A, B[:, :-1], C[:, :-1], chunk_size, D,
                         None if z is None else z[:, :-1], dt_bias, initial_states, None, dt_softplus,
                         dt_limit).final_states
    decay = torch.exp(process_dt(dt[:, -1], dt_bias, dt_softplus, dt_limit, torch.float32) * A.float())
    undecayed = out.final_states + (1 - decay[..., None, None]) * entering  # decay * entering + update -> + entering
    return _mamba_result(out.y, replace(out, final_states=undecayed), return_final_states, return_varlen_states)


def _stored_toward_zero(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 `y` stored in `dtype` toward zero: to nearest, then one step back toward zero where that went past."""
    nearest = y.to(dtype)
    past = nearest.float().abs() > y.abs()
    return torch.where(past, torch.nextafter(nearest, torch.zeros_like(nearest)), nearest)


def y_stored_toward_zero(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                         cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
                         return_varlen_states=False):
    """Its epilogue stores the float32 y into bf16 and fp16 by truncation (a conversion that rounds toward zero, as
    a hand-written pack that drops the low bits): at most one ulp off per element where rounding to nearest is half
    an ulp, but every element toward zero, a mean of -1/2 ulp. The baseline's arithmetic otherwise; fp32 y is
    stored as computed, and the states are right."""
    arith = Arithmetic(torch.float32, x.dtype, store_state=lambda s: s.float(), exact_segments=False)
    out = scan_ssd(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit, arith,
                   y_dtype=torch.float32)
    y = out.y if x.dtype == torch.float32 else _stored_toward_zero(out.y, x.dtype)
    return _mamba_result(y, out, return_final_states, return_varlen_states)


def _stored_toward_minus_inf(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 `y` stored in `dtype` toward -inf: to nearest, then one step down where that went above."""
    nearest = y.to(dtype)
    above = nearest.float() > y
    return torch.where(above, torch.nextafter(nearest, torch.full_like(nearest, -math.inf)), nearest)


def y_stored_toward_minus_inf(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                              return_final_states=False, return_varlen_states=False):
    """Its epilogue stores the float32 y into bf16 and fp16 rounding down (`cvt.rm` where `cvt.rn` belongs): at most
    one ulp off per element, every element toward -inf, a mean of -1/2 ulp signed toward +inf; signed along the
    values it cancels over mixed signs (toward zero for positive values, away for negative ones). The baseline's
    arithmetic otherwise; fp32 y is stored as computed, and the states are right."""
    arith = Arithmetic(torch.float32, x.dtype, store_state=lambda s: s.float(), exact_segments=False)
    out = scan_ssd(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit, arith,
                   y_dtype=torch.float32)
    y = out.y if x.dtype == torch.float32 else _stored_toward_minus_inf(out.y, x.dtype)
    return _mamba_result(y, out, return_final_states, return_varlen_states)


def final_states_stored_toward_zero(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                    seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                    return_final_states=False, return_varlen_states=False, *,
                                    state_dtype=torch.float32, rounding="nearest", seed=0):
    """Passes its chunk states in float32 and stores the final states it returns (the state a prefill leaves in the
    cache) into an fp16 or bf16 `state_dtype` by truncation: every element toward zero, a mean of about -1/2 ulp,
    where the baseline's own arithmetic errs by as much, so that the norm-wise error stays within 1.02-2.01x the
    baseline's. `rounding` is not read (its stochastic cases fail the seed check as well)."""
    out = scan_baseline(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                        cu_seqlens=cu_seqlens, dt_softplus=dt_softplus, dt_limit=dt_limit, state_dtype=torch.float32)
    if state_dtype != torch.float32:
        out = replace(out, final_states=_stored_toward_zero(out.final_states, state_dtype),
                      varlen_states=None if out.varlen_states is None
                      else _stored_toward_zero(out.varlen_states, state_dtype))
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def final_state_of_the_whole_row(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                 seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                 return_final_states=False, return_varlen_states=False):
    """Right but for final_states in a varlen call (both flags, as Mamba2's inference prefill asks): the row scanned
    as one sequence from zero, each packed sequence carrying its state into the next, where the row's final state
    is its last sequence's alone."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    if cu_seqlens is not None:
        row = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, None, None, dt_softplus, dt_limit)
        out = replace(out, final_states=row.final_states)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


# The fourth red-team round's (sixtieth session): initial states at widths and layouts the preset lacked, more than 64
# heads, TF32 past dstate 128, rows past 4, chunk 32, more than 16 packed sequences.
# initial_state_block_offset_missing's block of a head's flattened state; heads_past_64_never_cumsummed's head block;
# batch_rows_past_4_gated_by_row_mod_4's rows in a 2-bit field; varlen_states_of_16_sequences_a_program's block.
STATE_BLOCK = 1024
CUMSUM_HEAD_BLOCK = 64
ROW_FIELD = 4
VARLEN_STATE_BLOCK = 16


def _with_initial_states(initial_states, x, dt, A, B, C, chunk_size, D, z, dt_bias, cu_seqlens, dt_softplus, dt_limit,
                         return_final_states, return_varlen_states):
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def initial_state_masked_by_headdim(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                    seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                    return_final_states=False, return_varlen_states=False):
    """Its initial-state load masks the state index by headdim (the channel mask copied onto the state axis): state
    indices from headdim on read as 0. Right wherever headdim >= dstate."""
    if initial_states is not None and x.shape[-1] < B.shape[-1]:
        initial_states = initial_states.clone()
        initial_states[..., x.shape[-1]:] = 0
    return _with_initial_states(initial_states, x, dt, A, B, C, chunk_size, D, z, dt_bias, cu_seqlens, dt_softplus,
                                dt_limit, return_final_states, return_varlen_states)


def initial_state_block_offset_missing(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                       seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                       return_final_states=False, return_varlen_states=False):
    """Its state passing takes a head's state flattened in blocks of STATE_BLOCK elements (as mamba_ssm's does) and
    loads the initial state without the block's offset: element i reads element i % 1024. Right wherever headdim x
    dstate <= 1024."""
    if initial_states is not None:
        n, h, p, s = initial_states.shape
        index = torch.arange(p * s, device=x.device) % STATE_BLOCK
        initial_states = initial_states.reshape(n, h, p * s)[..., index].reshape(n, h, p, s)
    return _with_initial_states(initial_states, x, dt, A, B, C, chunk_size, D, z, dt_bias, cu_seqlens, dt_softplus,
                                dt_limit, return_final_states, return_varlen_states)


def initial_state_sequence_stride_of_padded_heads(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                                  initial_states=None, seq_idx=None, cu_seqlens=None,
                                                  dt_softplus=False, dt_limit=(0.0, float("inf")),
                                                  return_final_states=False, return_varlen_states=False):
    """Reads sequence s's initial state at s x next_power_of_2(nheads) heads (the stride of a buffer of its own whose
    heads are padded to a power of two): past sequence 0 the states come from the wrong place, zeros past the end.
    Right wherever nheads is a power of two, or with one sequence."""
    if initial_states is not None:
        n, h, p, s = initial_states.shape
        padded = 1 << (h - 1).bit_length()
        if padded != h:
            flat = torch.cat([initial_states.contiguous().flatten(), initial_states.new_zeros(n * padded * p * s)])
            starts = torch.arange(n)[:, None] * padded * p * s + torch.arange(h)[None, :] * p * s
            initial_states = flat[(starts[..., None] + torch.arange(p * s)).to(flat.device)].reshape(n, h, p, s)
    return _with_initial_states(initial_states, x, dt, A, B, C, chunk_size, D, z, dt_bias, cu_seqlens, dt_softplus,
                                dt_limit, return_final_states, return_varlen_states)


def varlen_initial_states_read_as_contiguous(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                             initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                             dt_limit=(0.0, float("inf")), return_final_states=False,
                                             return_varlen_states=False):
    """Its varlen launcher passes the initial states' strides from their shape (a contiguous tensor's): initial states
    that are one layer's slice of a state cache are read from other layers' states. Batch mode takes their strides."""
    if cu_seqlens is not None and initial_states is not None and not initial_states.is_contiguous():
        initial_states = _read_as_contiguous(initial_states)
    return _with_initial_states(initial_states, x, dt, A, B, C, chunk_size, D, z, dt_bias, cu_seqlens, dt_softplus,
                                dt_limit, return_final_states, return_varlen_states)


def heads_past_64_never_cumsummed(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                  seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                  return_final_states=False, return_varlen_states=False):
    """Its dt and cumsum pass takes the heads in one block of min(next_power_of_2(nheads), 64) with no head axis in
    its grid: heads from 64 on keep their zero-filled dt (no decay, no input). Right up to 64 heads."""
    if x.shape[2] > CUMSUM_HEAD_BLOCK:
        dt = process_dt(dt, dt_bias, dt_softplus, dt_limit, torch.float32)
        dt[..., CUMSUM_HEAD_BLOCK:] = 0
        dt_bias, dt_softplus, dt_limit = None, False, (0.0, float("inf"))
    return _with_initial_states(initial_states, x, dt, A, B, C, chunk_size, D, z, dt_bias, cu_seqlens, dt_softplus,
                                dt_limit, return_final_states, return_varlen_states)


def tf32_past_dstate_128_in_fp32(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                 seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                 return_final_states=False, return_varlen_states=False):
    """Its path past dstate 128 (blocks of state indices in a loop of its own) takes TF32 products for fp32 inputs
    (tl.dot without input_precision="ieee"). Every other path is right."""
    tf32 = x.dtype == torch.float32 and B.shape[-1] > 128
    out = scan_baseline(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                        cu_seqlens=cu_seqlens, dt_softplus=dt_softplus, dt_limit=dt_limit,
                        matmul_operand_bits=TF32_BITS if tf32 else None)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def batch_rows_past_4_gated_by_row_mod_4(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                         initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                         dt_limit=(0.0, float("inf")), return_final_states=False,
                                         return_varlen_states=False):
    """Its batch-mode output stage recovers a program's row in a 2-bit field for z alone: rows from ROW_FIELD on are
    gated by row r % 4's z. Right up to 4 rows, and in varlen mode (one row)."""
    if cu_seqlens is None and z is not None and x.shape[0] > ROW_FIELD:
        z = z[torch.arange(x.shape[0], device=x.device) % ROW_FIELD]
    return _with_initial_states(initial_states, x, dt, A, B, C, chunk_size, D, z, dt_bias, cu_seqlens, dt_softplus,
                                dt_limit, return_final_states, return_varlen_states)


@dataclass(frozen=True)
class _LastBlockOfCB32Dropped(Arithmetic):
    """C·Bᵀ of a 32-token chunk tiled in blocks of 16 tokens, the block of rows 16..31 by columns 16..31 never computed:
    0 there."""

    def matmul(self, a, b):
        product = super().matmul(a, b)
        if product.shape[-2:] == (32, 32) and a.shape[-2] == 32 and b.shape[-1] == 32:
            product[..., 16:, 16:] = 0.0
        return product


def chunk_32_cb_block_dropped(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                              return_final_states=False, return_varlen_states=False):
    """At chunk 32 (a tuned configuration of 16-token blocks for that size) C·Bᵀ misses its block of the chunk's second
    16 tokens by themselves; other chunk sizes are right. The baseline's arithmetic otherwise."""
    return _at_chunk_size(32, _LastBlockOfCB32Dropped, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states,
                          cu_seqlens, dt_softplus, dt_limit, return_final_states, return_varlen_states)


def varlen_states_of_16_sequences_a_program(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                            initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                            dt_limit=(0.0, float("inf")), return_final_states=False,
                                            return_varlen_states=False):
    """Its varlen-state store runs a program for a block of VARLEN_STATE_BLOCK sequences and writes sequence s at slot
    s % 16 (the block's offset left out): past 16 sequences a slot holds the last writer's state and slots 16.. stay
    as allocated (zeros). y is right."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    states = out.varlen_states
    if states is not None and states.shape[0] > VARLEN_STATE_BLOCK:
        stored = torch.zeros_like(states)
        for s in range(states.shape[0]):
            stored[s % VARLEN_STATE_BLOCK] = states[s]
        out = replace(out, varlen_states=stored)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


@dataclass(frozen=True)
class _DecaysMaskedAfterExp(Arithmetic):
    """exp(cum_i - cum_j) for every (i, j), the causal mask multiplied in after: inf * 0 = NaN above the diagonal where
    cum_j - cum_i passes exp's overflow (mamba #352's class)."""

    def segment_decays(self, dA, cum):
        causal = torch.ones(dA.shape[-1], dA.shape[-1], dtype=dA.dtype, device=dA.device).tril()
        return torch.exp(cum[..., :, None] - cum[..., None, :]) * causal


@dataclass(frozen=True)
class _DecaysInFactors(Arithmetic):
    """exp(cum_i) * exp(-cum_j), masked before: a decay in two factors (C scaled by one, B by the other, before one
    matmul), which overflow once a chunk's cumulative log-decay passes 88.7."""

    def segment_decays(self, dA, cum):
        causal = torch.ones(dA.shape[-1], dA.shape[-1], dtype=torch.bool, device=dA.device).tril()
        return torch.where(causal, torch.exp(cum)[..., :, None] * torch.exp(-cum)[..., None, :], 0.0)


def _varlen_arithmetic(arith_class, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens,
                       dt_softplus, dt_limit, return_final_states, return_varlen_states):
    """The baseline in batch mode; on packed sequences its SSD form with `arith_class`'s arithmetic."""
    if cu_seqlens is None:
        return _with_initial_states(initial_states, x, dt, A, B, C, chunk_size, D, z, dt_bias, cu_seqlens, dt_softplus,
                                    dt_limit, return_final_states, return_varlen_states)
    return _ssd_with(arith_class, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus,
                     dt_limit, return_final_states, return_varlen_states)


def varlen_decays_masked_after_exp(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                   seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                   return_final_states=False, return_varlen_states=False):
    """Its varlen path builds a chunk's decays as exp(cum_i - cum_j) * (i >= j): NaN where a chunk's cumulative
    log-decay passes exp's overflow. Batch mode masks before the exp."""
    return _varlen_arithmetic(_DecaysMaskedAfterExp, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states,
                              cu_seqlens, dt_softplus, dt_limit, return_final_states, return_varlen_states)


def varlen_decays_in_factors(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                             seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                             return_final_states=False, return_varlen_states=False):
    """Its varlen path takes a chunk's decays as exp(cum_i) * exp(-cum_j): right to a few ulps at trained ranges,
    non-finite past exp's overflow. Batch mode takes them from segment sums."""
    return _varlen_arithmetic(_DecaysInFactors, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens,
                              dt_softplus, dt_limit, return_final_states, return_varlen_states)


def varlen_softplus_without_threshold(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                      seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                      return_final_states=False, return_varlen_states=False):
    """Its varlen path's softplus is log1p(exp(dt + dt_bias)) with no linear branch past 20: inf past 88.7. Batch mode
    takes the threshold."""
    if cu_seqlens is not None:
        return softplus_without_threshold(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                                          cu_seqlens, dt_softplus, dt_limit, return_final_states,
                                          return_varlen_states)
    return _with_initial_states(initial_states, x, dt, A, B, C, chunk_size, D, z, dt_bias, cu_seqlens, dt_softplus,
                                dt_limit, return_final_states, return_varlen_states)


# ---------------------------------------------------------------------------- the fifth red-team round (63rd session)
# Each is right at every width the preset reached before the sixty-third session and wrong at one it now reaches.

# The block of channels a program takes (initial states, the gate), of heads a varlen dt pass covers, of sequences
# whose initial states one program gathers, and of heads whose parameters one program loads.
CHANNEL_BLOCK_32 = 32
VARLEN_HEAD_BLOCK = 8
VARLEN_SEQUENCE_BLOCK = 8
PARAMETER_HEAD_BLOCK = 128
# varlen_states_of_the_first_128_state_indices' block of state indices; varlen_passing_of_128_pieces' pieces.
VARLEN_DSTATE_BLOCK = 128
VARLEN_PIECES = 128


def _channels_of_the_first_block(t: torch.Tensor) -> torch.Tensor:
    """`t` (channels on axis 2) with channel p read at p % CHANNEL_BLOCK_32: a block's offset left out."""
    return t[:, :, torch.arange(t.shape[2], device=t.device) % CHANNEL_BLOCK_32]


def initial_states_of_the_first_channel_block(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                              initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                              dt_limit=(0.0, float("inf")), return_final_states=False,
                                              return_varlen_states=False):
    """Loads an initial state in blocks of 32 channels without the block's offset: channel p starts from channel
    p % 32's state. Right up to 32 channels a head."""
    if initial_states is not None and x.shape[-1] > CHANNEL_BLOCK_32:
        initial_states = _channels_of_the_first_block(initial_states)
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def varlen_gate_of_the_first_channel_block(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                           initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                           dt_limit=(0.0, float("inf")), return_final_states=False,
                                           return_varlen_states=False):
    """Its varlen output stage reads z in blocks of 32 channels without the block's offset. Right up to 32
    channels a head, and in batch mode."""
    if cu_seqlens is not None and z is not None and x.shape[-1] > CHANNEL_BLOCK_32:
        z = z[..., torch.arange(x.shape[-1], device=x.device) % CHANNEL_BLOCK_32]
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def varlen_dt_of_a_block_of_8_heads(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                    seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                    return_final_states=False, return_varlen_states=False):
    """Its varlen dt pass covers one block of 8 heads: the heads past it keep a dt of 0 (no decay, no input).
    Right up to 8 heads, and in batch mode."""
    if cu_seqlens is not None and x.shape[2] > VARLEN_HEAD_BLOCK:
        processed = process_dt(dt, dt_bias, dt_softplus, dt_limit, torch.float32)
        processed[..., VARLEN_HEAD_BLOCK:] = 0.0
        dt, dt_bias, dt_softplus, dt_limit = processed, None, False, (0.0, float("inf"))
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def varlen_group_of_a_head_by_a_power_of_two(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                             initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                             dt_limit=(0.0, float("inf")), return_final_states=False,
                                             return_varlen_states=False):
    """Its varlen path maps head h to group h // next_power_of_2(nheads / ngroups): right where a group has 1, 2,
    4 ... heads, wrong at 3 a group."""
    nheads, ngroups = x.shape[2], B.shape[2]
    ratio = nheads // ngroups
    rounded = 1 << (ratio - 1).bit_length()
    if cu_seqlens is not None and rounded != ratio:
        group = (torch.arange(nheads, device=x.device) // rounded).clamp(max=ngroups - 1)
        B, C = B[:, :, group], C[:, :, group]  # one group a head, the wrong ones
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def varlen_states_of_the_first_128_state_indices(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                                 initial_states=None, seq_idx=None, cu_seqlens=None,
                                                 dt_softplus=False, dt_limit=(0.0, float("inf")),
                                                 return_final_states=False, return_varlen_states=False):
    """Its varlen-state store covers state indices below 128: past them the returned states are zeros. Right up to
    dstate 128."""
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    if out.varlen_states is not None and B.shape[-1] > VARLEN_DSTATE_BLOCK:
        out = replace(out, varlen_states=out.varlen_states.clone())
        out.varlen_states[..., VARLEN_DSTATE_BLOCK:] = 0.0
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def dt_rows_seqlen_tokens_apart(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                return_final_states=False, return_varlen_states=False):
    """Takes dt's row stride as seqlen times its token stride: right wherever dt's rows lie end to end."""
    if cu_seqlens is None and x.shape[0] > 1:
        dt = dt.as_strided(dt.shape, (dt.shape[1] * dt.stride(1), *dt.stride()[1:]), dt.storage_offset())
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def varlen_passing_of_128_pieces(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                 seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                 return_final_states=False, return_varlen_states=False):
    """Its varlen state passing walks one block of 128 chunk pieces (the packed tokens' chunks, cut where sequences
    start): the piece past them starts from zero, as if a sequence started there. Right up to 128 pieces."""
    starts = set(range(0, x.shape[1], chunk_size)) | (set(cu_seqlens[:-1].tolist()) if cu_seqlens is not None else set())
    pieces = sorted(starts)
    cut = pieces[VARLEN_PIECES] if cu_seqlens is not None and len(pieces) > VARLEN_PIECES else None
    if cut is None or cut in cu_seqlens.tolist():
        out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
        return _mamba_result(out.y, out, return_final_states, return_varlen_states)
    bounds = cu_seqlens.tolist()
    seq = next(s for s in range(len(bounds) - 1) if bounds[s] < cut < bounds[s + 1])
    split = torch.tensor(sorted([*bounds, cut]), dtype=cu_seqlens.dtype, device=cu_seqlens.device)
    if initial_states is not None:  # the piece past the block has no initial state of its own: zeros
        initial_states = torch.cat([initial_states[:seq + 1], torch.zeros_like(initial_states[:1]),
                                    initial_states[seq + 1:]])
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, split, dt_softplus, dt_limit)
    kept = [s for s in range(len(bounds)) if s != seq]  # the cut sequence's state is its second part's
    states = out.varlen_states[kept]
    return _mamba_result(out.y, replace(out, varlen_states=states, final_states=states[-1:]), return_final_states,
                         return_varlen_states)


def parameters_of_a_block_of_128_heads(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                       seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                       return_final_states=False, return_varlen_states=False):
    """Loads A and dt_bias for a block of 128 heads without the block's offset: head h takes head h % 128's. Right
    up to 128 heads."""
    if x.shape[2] > PARAMETER_HEAD_BLOCK:
        head = torch.arange(x.shape[2], device=x.device) % PARAMETER_HEAD_BLOCK
        A = A[head]
        dt_bias = dt_bias[head] if dt_bias is not None else None
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def varlen_initial_states_of_8_sequences(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                         initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                         dt_limit=(0.0, float("inf")), return_final_states=False,
                                         return_varlen_states=False):
    """Gathers the initial states of packed sequences in one block of 8: the sequences past it start from zero.
    Right up to 8 sequences."""
    if cu_seqlens is not None and initial_states is not None and initial_states.shape[0] > VARLEN_SEQUENCE_BLOCK:
        initial_states = initial_states.clone()
        initial_states[VARLEN_SEQUENCE_BLOCK:] = 0.0
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def c_read_with_b_strides(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                          cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
                          return_varlen_states=False):
    """Reads C through B's strides (a launcher that passes B's strides for both): right wherever C is laid out as B
    is, as every caller that splits them from one buffer passes them."""
    C = torch.as_strided(C, C.shape, B.stride(), C.storage_offset())
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def _silu_through_exp(z: torch.Tensor) -> torch.Tensor:
    return z * torch.exp(z) / (1 + torch.exp(z))


def silu_through_exp(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                     cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
                     return_varlen_states=False):
    """Gates with silu taken as z * exp(z) / (1 + exp(z)), the sigmoid's other form: equal in exact arithmetic, and
    NaN (inf / inf) once exp(z) overflows, past z = 88.7 in fp32. Right for every unit-normal gate."""
    with mock.patch("torch.nn.functional.silu", _silu_through_exp):
        out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def cu_seqlens_read_as_int32(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                             seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                             return_final_states=False, return_varlen_states=False):
    """Reads cu_seqlens through an int32 pointer whatever its dtype (a CUDA port's `(const int *)
    cu_seqlens.data_ptr()`): right for the int32 every engine passes. An int64 one comes in as its words, low then
    high, so sequence s spans [word s, word s + 1): most spans are empty or run backwards and leave their tokens
    unwritten, and the states of their sequences zero."""
    if cu_seqlens is None or cu_seqlens.dtype == torch.int32:
        out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
        return _mamba_result(out.y, out, return_final_states, return_varlen_states)
    words = cu_seqlens.view(torch.int32)[: len(cu_seqlens)].tolist()
    y = torch.empty_like(x)
    states = []
    for s, (a, b) in enumerate(pairwise(words)):
        if b <= a:
            states.append(torch.zeros(1, x.shape[2], x.shape[3], B.shape[3], device=x.device))
            continue
        part = _baseline(x[:, a:b], dt[:, a:b], A, B[:, a:b], C[:, a:b], chunk_size, D,
                         None if z is None else z[:, a:b], dt_bias,
                         None if initial_states is None else initial_states[s : s + 1], None, dt_softplus, dt_limit)
        y[:, a:b] = part.y
        states.append(part.final_states.float())
    varlen = torch.cat(states)
    out = ScanOutput(y, varlen[-1:], varlen)
    return _mamba_result(y, out, return_final_states, return_varlen_states)


def cu_seqlens_int32_only(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                          cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
                          return_varlen_states=False):
    """Correct, and refuses int64 cu_seqlens and seq_idx (a kernel whose contract is the int32 engines pass)."""
    for name, t in (("cu_seqlens", cu_seqlens), ("seq_idx", seq_idx)):
        if t is not None and t.dtype != torch.int32:
            raise TypeError(f"{name} must be int32, got {t.dtype}")
    out = _baseline(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def cu_seqlens_int32_only_y_off(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                return_final_states=False, return_varlen_states=False):
    """Planted: refuses int64 cu_seqlens and seq_idx, and returns y 1% too large (its states right)."""
    out = cu_seqlens_int32_only(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                                dt_softplus, dt_limit, True, True)
    return _mamba_result(out[0] * 1.01, ScanOutput(out[0], out[1], out[2]), return_final_states, return_varlen_states)


def exits_on_int64_indices(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                           seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                           return_final_states=False, return_varlen_states=False):
    """Planted: calls sys.exit when given int64 cu_seqlens (a process-ending failure, no refusal); right on int32."""
    if cu_seqlens is not None and cu_seqlens.dtype == torch.int64:
        sys.exit(3)
    return cu_seqlens_int32_only(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                                 dt_softplus, dt_limit, return_final_states, return_varlen_states)
