"""Reference chunk scans: the float64 ground truth, and the SSD form the baseline shares.

- `scan_recurrent`: the sequential recurrence of DESIGN §2, one token at a time (no
  chunking, so it shares no algorithm with the kernels under test).
- `scan_chunked`: the chunked (SSD) form in float64, for long sequences.
- `scan_ssd`: the SSD form with the places it rounds (`Arithmetic`) as a parameter:
  `scan_chunked` rounds nowhere; the same-precision baseline (baseline.py) rounds
  as a straightforward implementation in the kernel's dtype does.

Conventions follow state-spaces/mamba `mamba_chunk_scan_combined` (ssmcheck/ops/naive.py).
Varlen means batch 1 with cu_seqlens (nseq+1,): the state restarts at every
sequence start from initial_states[s] (shape (nseq, ...)) or zero.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ssmcheck.ops.naive import NO_DT_LIMIT, heads_of_groups, process_dt, skip_and_gate


@dataclass
class ScanOutput:
    y: torch.Tensor  # (batch, seqlen, nheads, headdim)
    final_states: torch.Tensor  # (batch, nheads, headdim, dstate): state after each batch row's last token
    varlen_states: torch.Tensor | None  # (nseq, nheads, headdim, dstate) with cu_seqlens, else None
    y_ssm: torch.Tensor | None = None  # C·h alone: y before the D skip and the z gate
    # The SSD form's intermediates, when asked for (scan_ssd's record_stages): see _ssd.
    stages: dict[str, torch.Tensor] | None = None


def _sequence_bounds(x, B, cu_seqlens, initial_states) -> list[int] | None:
    """Validate the batch/varlen arguments; return cu_seqlens as a list (None in batch mode)."""
    batch, seqlen, nheads, headdim = x.shape
    cu = None
    if cu_seqlens is not None:
        if batch != 1:
            raise ValueError(f"varlen (cu_seqlens) needs batch 1, got batch {batch}")
        cu = [int(c) for c in cu_seqlens.tolist()]
        if len(cu) < 2 or cu[0] != 0 or cu[-1] != seqlen or any(b < a for a, b in zip(cu, cu[1:])):
            raise ValueError(f"cu_seqlens must rise from 0 to seqlen ({seqlen}), got {cu}")
    if initial_states is not None:
        rows = batch if cu is None else len(cu) - 1
        want = (rows, nheads, headdim, B.shape[-1])
        if tuple(initial_states.shape) != want:
            per = "batch row" if cu is None else "sequence"
            raise ValueError(f"initial_states must be {want} (one row per {per}), got {tuple(initial_states.shape)}")
    return cu


def _last_sequence(cu: list[int]) -> int:
    """Index of the sequence holding the last token (trailing empty sequences hold none)."""
    return max(s for s in range(len(cu) - 1) if cu[s + 1] > cu[s])


def scan_recurrent(
    x, dt, A, B, C, *, D=None, z=None, dt_bias=None, initial_states=None, cu_seqlens=None,
    dt_softplus=False, dt_limit=NO_DT_LIMIT, dtype=torch.float64,
) -> ScanOutput:
    """The sequential recurrence, computed in `dtype`, looping over time only.

    x (batch, seqlen, nheads, headdim), dt (batch, seqlen, nheads), A (nheads,),
    B/C (batch, seqlen, ngroups, dstate). Results are in `dtype` on x's device.
    """
    batch, seqlen, nheads, headdim = x.shape
    dstate = B.shape[-1]
    dtv = process_dt(dt, dt_bias, dt_softplus, dt_limit, dtype)
    decay = torch.exp(dtv * A.to(dtype))  # (batch, seqlen, nheads)
    dtx = dtv[..., None] * x.to(dtype)  # (batch, seqlen, nheads, headdim)
    Bh = heads_of_groups(B.to(dtype), nheads)
    Ch = heads_of_groups(C.to(dtype), nheads)
    zero = torch.zeros(batch, nheads, headdim, dstate, dtype=dtype, device=x.device)

    def start_state(row):
        return zero[:1].clone() if initial_states is None else initial_states[row : row + 1].to(dtype).clone()

    # Varlen: token t starts sequence starts[t] and ends sequence ends[t]; an empty
    # sequence's state is its initial state.
    starts, ends, varlen_states = {}, {}, None
    cu = _sequence_bounds(x, B, cu_seqlens, initial_states)
    if cu is not None:
        varlen_states = zero.new_zeros(len(cu) - 1, nheads, headdim, dstate)
        for s in range(len(cu) - 1):
            if cu[s + 1] > cu[s]:
                starts[cu[s]] = s
                ends[cu[s + 1] - 1] = s
            else:
                varlen_states[s] = start_state(s)[0]
        state = zero
    else:
        state = zero if initial_states is None else initial_states.to(dtype).clone()

    ys = []
    for t in range(seqlen):
        if t in starts:
            state = start_state(starts[t])
        state = state * decay[:, t, :, None, None] + dtx[:, t, :, :, None] * Bh[:, t, :, None, :]
        ys.append(torch.matmul(state, Ch[:, t, :, :, None])[..., 0])
        if t in ends:
            varlen_states[ends[t]] = state[0]
    y = torch.stack(ys, dim=1) if ys else x.new_zeros(x.shape, dtype=dtype)
    y_ssm = y
    y = skip_and_gate(y, x, D, z, dtype)
    return ScanOutput(y=y, final_states=state, varlen_states=varlen_states, y_ssm=y_ssm)


# ---------------------------------------------------------------------------
# The chunked (SSD) form, shared by the float64 reference and the baseline (baseline.py).
#
# Tokens are flattened to (batch*seqlen, ...) and cut into pieces: chunk_size
# tokens from each sequence start (a batch row is one sequence), so chunks
# restart at every varlen boundary, as in vLLM. Pieces are processed in blocks,
# in parallel within a block, with the state passed serially from piece to piece.

# Upper bound on block_pieces * nheads * chunk_size**2, the size of the largest
# temporaries (decay and C·Bᵀ matrices).
_BLOCK_ELEMENTS = 2**24


@dataclass(frozen=True)
class Arithmetic:
    """Where the SSD form rounds. The float64 reference rounds nowhere."""

    compute: torch.dtype  # elementwise work and matmul accumulation
    operand: torch.dtype  # matmul operands are rounded to this first (what tensor cores read)
    store_state: Callable[[torch.Tensor], torch.Tensor]  # state in `compute` -> state as stored
    exact_segments: bool  # decays from direct segment sums (reference) or cumsum differences (peers)

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a.to(self.operand).to(self.compute), b.to(self.operand).to(self.compute))

    def segment_decays(self, dA: torch.Tensor, cum: torch.Tensor) -> torch.Tensor:
        """exp of sum_{k=j+1..i} dA_k for i >= j, 0 above the diagonal; dA, cum = cumsum(dA) (..., Q) -> (..., Q, Q).

        The mask is applied before exp, so a masked entry is exp(-inf) = 0 and never inf * 0.
        """
        Q = dA.shape[-1]
        causal = torch.ones(Q, Q, dtype=torch.bool, device=dA.device).tril()
        if self.exact_segments:
            # Summing each segment directly keeps its relative accuracy when the
            # cumulative sums are huge (decay-extreme inputs).
            terms = dA[..., :, None].expand(*dA.shape, Q).tril(-1)  # terms[i, j] = dA_i for i > j
            log_decay = torch.cumsum(terms, dim=-2)
        else:
            # The peers' form: differences of cumulative sums, which rounding can make
            # slightly positive; clamp at 0 so exp cannot overflow.
            log_decay = torch.clamp(cum[..., :, None] - cum[..., None, :], max=0.0)
        return torch.exp(torch.where(causal, log_decay, float("-inf")))


@dataclass
class _Piece:
    start: int  # flattened token index
    length: int
    seq: int  # sequence (varlen) or batch row
    first: bool  # starts its sequence
    last: bool  # ends its sequence


def _pieces(bounds: list[tuple[int, int]], chunk_size: int) -> list[_Piece]:
    return [
        _Piece(k, min(chunk_size, end - k), s, k == begin, k + chunk_size >= end)
        for s, (begin, end) in enumerate(bounds)
        for k in range(begin, end, chunk_size)
    ]


def _ssd(x, dt, A, B, C, chunk_size, initial_states, bounds, arith: Arithmetic, record_stages: bool = False):
    """The SSD form over flattened tokens.

    x (T, nheads, headdim), dt (T, nheads) processed, A (nheads,), B/C (T, ngroups, dstate),
    all in arith.compute; bounds: [begin, end) of each sequence. Returns y (T, nheads, headdim)
    without D and z, the stored state at the end of each sequence (nseq, nheads, headdim, dstate),
    and, with `record_stages`, the intermediates of every piece in piece order (else None):
    "cumsum" (pieces, nheads, Q) the log-decay from the piece start, "chunk_states" (pieces, nheads,
    headdim, dstate) the state a piece leaves from zero, "passed_states" (same) the stored state
    entering it, "cb" (pieces, ngroups, Q, Q) C·Bᵀ; Q is the longest piece, padding past a piece's
    end holds dt = 0 terms.
    """
    T, nheads, headdim = x.shape
    ngroups, dstate = B.shape[-2:]
    dev = x.device
    pieces = _pieces(bounds, chunk_size)
    Q = max((p.length for p in pieces), default=1)  # no wider than the longest piece: padding costs time only
    zero = torch.zeros(nheads, headdim, dstate, dtype=arith.compute, device=dev)
    seq_states = [arith.store_state(zero if initial_states is None else initial_states[s]) for s in range(len(bounds))]
    y = torch.zeros(T, nheads, headdim, dtype=arith.compute, device=dev)
    offsets = torch.arange(Q, device=dev)
    block = max(1, _BLOCK_ELEMENTS // (nheads * Q * Q))
    carry = zero
    recorded = {name: [] for name in ("cumsum", "chunk_states", "passed_states", "cb")} if record_stages else None
    for b0 in range(0, len(pieces), block):
        blk = pieces[b0 : b0 + block]
        starts = torch.tensor([p.start for p in blk], device=dev)
        lengths = torch.tensor([p.length for p in blk], device=dev)
        valid = offsets[None, :] < lengths[:, None]  # (P, Q)
        idx = torch.where(valid, starts[:, None] + offsets[None, :], starts[:, None])
        xq = x[idx].permute(0, 2, 1, 3)  # (P, nheads, Q, headdim)
        # Padding gets dt = 0: no decay, no contribution, so the last row is the piece's end.
        dtq = torch.where(valid[..., None], dt[idx], 0.0).transpose(1, 2)  # (P, nheads, Q)
        Bq = B[idx].transpose(1, 2)  # (P, ngroups, Q, dstate)
        Cq = C[idx].transpose(1, 2)
        dA = dtq * A[None, :, None]
        cum = torch.cumsum(dA, dim=-1)  # log-decay from the piece start
        decays = arith.segment_decays(dA, cum)  # (P, nheads, Q, Q)
        CB_groups = arith.matmul(Cq, Bq.transpose(-1, -2))  # (P, ngroups, Q, Q)
        CB = heads_of_groups(CB_groups, nheads, dim=1)
        y_intra = arith.matmul(CB * decays * dtq[:, :, None, :], xq)  # (P, nheads, Q, headdim)
        to_end = decays[..., Q - 1, :] * dtq  # (P, nheads, Q): weight of token j in the piece's state
        Bh = heads_of_groups(Bq, nheads, dim=1)  # (P, nheads, Q, dstate)
        piece_states = arith.matmul(xq.transpose(-1, -2), Bh * to_end[..., None])  # (P, nheads, headdim, dstate)
        piece_decay = torch.exp(cum[..., -1])  # (P, nheads)
        incoming = []
        for k, p in enumerate(blk):
            if p.first:
                carry = zero if initial_states is None else initial_states[p.seq]
            incoming.append(arith.store_state(carry))
            carry = piece_decay[k, :, None, None] * carry + piece_states[k]
            if p.last:
                seq_states[p.seq] = arith.store_state(carry)
        Ch = heads_of_groups(Cq, nheads, dim=1)
        if recorded is not None:
            for name, value in (("cumsum", cum), ("chunk_states", piece_states), ("passed_states", torch.stack(incoming)),
                                ("cb", CB_groups)):
                recorded[name].append(value)
        state_part = arith.matmul(Ch, torch.stack(incoming).to(arith.compute).transpose(-1, -2))
        y_piece = y_intra + state_part * torch.exp(cum)[..., None]
        y[idx[valid]] = y_piece.permute(0, 2, 1, 3)[valid]
    stages = None if recorded is None else {name: torch.cat(parts) for name, parts in recorded.items() if parts}
    return y, torch.stack(seq_states), stages


def scan_ssd(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit,
             arith: Arithmetic, record_stages: bool = False) -> ScanOutput:
    """Validate, flatten to sequences, run the SSD form, and shape the results like scan_recurrent
    (with `record_stages`, ScanOutput.stages holds the intermediates, as _ssd describes them)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    batch, seqlen, nheads, headdim = x.shape
    cu = _sequence_bounds(x, B, cu_seqlens, initial_states)
    if cu is None:
        bounds = [(r * seqlen, (r + 1) * seqlen) for r in range(batch)]
    else:
        bounds = list(zip(cu[:-1], cu[1:]))
    dtype = arith.compute
    y, seq_states, stages = _ssd(
        x.to(dtype).reshape(batch * seqlen, nheads, headdim),
        process_dt(dt, dt_bias, dt_softplus, dt_limit, dtype).reshape(batch * seqlen, nheads),
        A.to(dtype),
        B.to(dtype).flatten(0, 1),
        C.to(dtype).flatten(0, 1),
        chunk_size,
        None if initial_states is None else initial_states.to(dtype),
        bounds,
        arith,
        record_stages,
    )
    y_ssm = y.reshape(x.shape)
    y = skip_and_gate(y_ssm, x, D, z, dtype)
    if cu is None:
        return ScanOutput(y=y, final_states=seq_states, varlen_states=None, y_ssm=y_ssm, stages=stages)
    return ScanOutput(y=y, final_states=seq_states[_last_sequence(cu)][None], varlen_states=seq_states, y_ssm=y_ssm,
                      stages=stages)


def scan_chunked(
    x, dt, A, B, C, chunk_size, *, D=None, z=None, dt_bias=None, initial_states=None, cu_seqlens=None,
    dt_softplus=False, dt_limit=NO_DT_LIMIT, dtype=torch.float64, record_stages=False,
) -> ScanOutput:
    """The chunked (SSD) form in `dtype` (float64: the ground truth for long sequences).

    Same inputs and results as scan_recurrent; segment decays are summed directly,
    so it agrees with the recurrence to ~1e-12 relative in float64. With `record_stages`,
    ScanOutput.stages holds its intermediates (_ssd): the ground truth of a kernel's stages.
    """
    arith = Arithmetic(dtype, dtype, store_state=lambda s: s, exact_segments=True)
    return scan_ssd(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus,
                    dt_limit, arith, record_stages)
