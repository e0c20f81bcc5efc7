"""Reference chunk scans: the float64 ground truth, and the SSD form the baseline shares.

- `scan_recurrent`: the recurrence of DESIGN §2 over the tokens (no chunking, so it shares no
  algorithm with the kernels under test), evaluated in groups of 16 tokens (`_recur`).
- `scan_chunked`: the chunked (SSD) form in float64, for long sequences.
- `scan_ssd`: the SSD form with the places it rounds (`Arithmetic`) as a parameter:
  `scan_chunked` rounds nowhere; the same-precision baseline (baseline.py) rounds
  as a straightforward implementation in the kernel's dtype does.

Both forms also run as streams (`RecurrentStream`, `SSDStream`): the tokens, flattened to
(batch*seqlen) in row order, are computed one segment [f0, f1) at a time, in order, carrying the
state from segment to segment, so a long sequence's float64 copy is never whole. A stream
computes exactly what the whole call computes (the whole call is one segment): the SSD form's
segments must start on its chunk grid (`SSDStream.segment` checks), and its state stores run in
the whole call's order, so even stochastic rounding draws the same bits.

Conventions follow state-spaces/mamba `mamba_chunk_scan_combined` (ssmcheck/ops/naive.py).
Varlen means batch 1 with cu_seqlens (nseq+1,): the state restarts at every
sequence start from initial_states[s] (shape (nseq, ...)) or zero.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ssmcheck.core.formats import saturate
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
    stream = RecurrentStream(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                             cu_seqlens=cu_seqlens, dt_softplus=dt_softplus, dt_limit=dt_limit, dtype=dtype)
    y, y_ssm = (t.reshape(*x.shape[:2], *t.shape[1:]) for t in stream.segment(0, x.shape[0] * x.shape[1]))
    final_states, varlen_states = stream.states()
    return ScanOutput(y=y, final_states=final_states, varlen_states=varlen_states, y_ssm=y_ssm)


def _row_runs(f0: int, f1: int, seqlen: int) -> list[tuple[slice, int, int]]:
    """Flattened tokens [f0, f1) as (rows, t0, t1) runs in order: a partial first row, the whole rows,
    a partial last row."""
    r0, a = divmod(f0, seqlen)
    r1, b = divmod(f1, seqlen)
    if r0 == r1:
        return [(slice(r0, r0 + 1), a, b)] if b > a else []
    runs = []
    if a:
        runs.append((slice(r0, r0 + 1), a, seqlen))
        r0 += 1
    if r1 > r0:
        runs.append((slice(r0, r1), 0, seqlen))
    if b:
        runs.append((slice(r1, r1 + 1), 0, b))
    return runs


# Upper bound on the elements of the states a block of tokens keeps at once (RecurrentStream._run).
_RECURRENT_BLOCK_ELEMENTS = 2**24


# Tokens a group of _recur holds. RecurrentStream's blocks start on a grid of this step counted from each
# sequence's start, so a stream cut on a chunk grid of 16 or a multiple of it (scan.segments) groups the tokens
# as the whole call does, and computes what it computes, bit for bit.
_RECURRENCE_GROUP = 16


def _recur(states: torch.Tensor, decay: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """h_k = decay_k * h_(k-1) + u_k through the tokens of one block of a sequence, in place: `states` (rows,
    tokens, nheads, headdim, dstate) holds the updates u and leaves holding the states h; decay (rows, tokens,
    nheads); `state` h before the first token. Returns the state after the last.

    Groups of _RECURRENCE_GROUP tokens from the block's start are evaluated in two levels rather than one token
    after another, so that n tokens cost about 16 + n/16 tensor operations instead of n (on a GPU each is a
    launch, the whole cost at these sizes): the groups run the recurrence side by side from a zero state, then
    the states entering them follow one another (each h_in·∏decay + the group's last local state), then every
    token adds its group's entering state times the decays since the group began. Each h is then a sum of at
    most about 16 + n/16 rounded terms, as exact in float64 as the token loop; nothing is chunked as the kernels
    chunk (no log-decay cumsums, no C·Bᵀ, no matmul in the recurrence). Tokens after the last whole group go
    one at a time.
    """
    tokens, width = states.shape[1], _RECURRENCE_GROUP
    whole = tokens // width * width
    if whole:
        groups = states[:, :whole].unflatten(1, (-1, width))  # (rows, groups, width, nheads, headdim, dstate)
        group_decay = decay[:, :whole].unflatten(1, (-1, width))[..., None, None]
        for k in range(1, width):
            groups[:, :, k].addcmul_(groups[:, :, k - 1], group_decay[:, :, k])
        since_start = torch.cumprod(group_decay, dim=2)  # the decay from each group's start through token k
        entering = states.new_empty(states.shape[0], groups.shape[1] + 1, *states.shape[2:])
        entering[:, 0] = state
        for g in range(groups.shape[1]):
            torch.addcmul(groups[:, g, -1], entering[:, g], since_start[:, g, -1], out=entering[:, g + 1])
        groups.addcmul_(entering[:, :-1, None], since_start)
        state = groups[:, -1, -1]
    for k in range(whole, tokens):  # fewer than a group left over
        state = states[:, k].addcmul_(state, decay[:, k, :, None, None])
    return state


class RecurrentStream:
    """`scan_recurrent` one segment of flattened tokens at a time: `segment(f0, f1)` returns (y, y_ssm)
    of tokens [f0, f1) as (f1 - f0, nheads, headdim); `states()`, after the last, the final states."""

    def __init__(self, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, initial_states=None, cu_seqlens=None,
                 dt_softplus=False, dt_limit=NO_DT_LIMIT, dtype=torch.float64):
        batch, seqlen, nheads, headdim = x.shape
        self.inputs = x, dt, B, C, D, z
        self.dt_options = dt_bias, dt_softplus, dt_limit
        self.A, self.dtype, self.next = A.to(dtype), dtype, 0
        zero = torch.zeros(batch, nheads, headdim, B.shape[-1], dtype=dtype, device=x.device)
        self.initial_states = initial_states
        # Varlen: token t starts sequence starts[t] and ends sequence ends[t]; an empty
        # sequence's state is its initial state.
        self.starts, self.ends, self.varlen_states = {}, {}, None
        self.state = zero
        cu = _sequence_bounds(x, B, cu_seqlens, initial_states)
        if cu is not None:
            self.varlen_states = zero.new_zeros(len(cu) - 1, nheads, headdim, B.shape[-1])
            for s in range(len(cu) - 1):
                if cu[s + 1] > cu[s]:
                    self.starts[cu[s]] = s
                    self.ends[cu[s + 1] - 1] = s
                else:
                    self.varlen_states[s] = self._start_state(s)[0]
        elif initial_states is not None:
            self.state = initial_states.to(dtype).clone()

    def _position(self, t: int) -> int:
        """Token t's place in its sequence (t is its place in its row)."""
        return t - max((start for start in self.starts if start <= t), default=0)

    def _blocks(self, t0: int, t1: int, most: int) -> list[tuple[int, int]]:
        """Tokens [t0, t1) of a row as blocks [k0, k1), counted from t0: a sequence starts at a block's first
        token or not within it, and a block ends at a sequence's end, at t1, or on the _RECURRENCE_GROUP grid of
        its sequence, holding at most `most` tokens where the grid allows. The groups of _recur then fall
        where they fall in the whole call however the row was cut into segments on that grid."""
        blocks, t = [], t0
        begin = t0 - self._position(t0)  # where the sequence holding t starts
        for end in sorted({t1, *(start for start in self.starts if t0 < start < t1)}):
            while t < end:
                position = t - begin
                target = (position + most) // _RECURRENCE_GROUP * _RECURRENCE_GROUP
                if target <= position:
                    target = (position // _RECURRENCE_GROUP + 1) * _RECURRENCE_GROUP
                blocks.append((t - t0, min(end, t + target - position) - t0))
                t = t0 + blocks[-1][1]
            begin = end  # every end but t1 is a sequence's start
        return blocks

    def _start_state(self, s: int) -> torch.Tensor:
        if self.initial_states is None:
            return self.state.new_zeros(1, *self.state.shape[1:])
        return self.initial_states[s : s + 1].to(self.dtype).clone()

    def segment(self, f0: int, f1: int) -> tuple[torch.Tensor, torch.Tensor]:
        if f0 != self.next:
            raise ValueError(f"segments must follow each other: expected one from token {self.next}, got {f0}")
        self.next = f1
        parts = [self._run(rows, t0, t1) for rows, t0, t1 in _row_runs(f0, f1, self.inputs[0].shape[1])] if f1 > f0 else []
        if not parts:
            empty = self.inputs[0].new_zeros(0, *self.inputs[0].shape[2:], dtype=self.dtype)
            return empty, empty
        return tuple(torch.cat([part[k].flatten(0, 1) for part in parts]) for k in range(2))

    def _run(self, rows: slice, t0: int, t1: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, dt, B, C, D, z = (t if t is None or t.dim() < 3 else t[rows, t0:t1] for t in self.inputs)
        dtype, nheads = self.dtype, x.shape[2]
        dtv = process_dt(dt, *self.dt_options, dtype)
        decay = torch.exp(dtv * self.A)  # (rows, tokens, nheads)
        dtx = dtv[..., None] * x.to(dtype)  # (rows, tokens, nheads, headdim)
        Bh = heads_of_groups(B.to(dtype), nheads)
        Ch = heads_of_groups(C.to(dtype), nheads)
        state = self.state[rows]
        ys = []
        # Tokens in blocks: each block's updates dt*x*Bᵀ in one operation, then the recurrence through them in
        # place (_recur), then its outputs C·h in one matmul.
        for k0, k1 in self._blocks(t0, t1, max(1, _RECURRENT_BLOCK_ELEMENTS // state.numel())):
            if t0 + k0 in self.starts:
                state = self._start_state(self.starts[t0 + k0])
            states = dtx[:, k0:k1, :, :, None] * Bh[:, k0:k1, :, None, :]  # (rows, tokens, nheads, headdim, dstate)
            state = _recur(states, decay[:, k0:k1], state)
            if t0 + k1 - 1 in self.ends:
                self.varlen_states[self.ends[t0 + k1 - 1]] = state[0]
            ys.append(torch.matmul(states, Ch[:, k0:k1, :, :, None])[..., 0])
        self.state[rows] = state
        y_ssm = torch.cat(ys, dim=1)
        return skip_and_gate(y_ssm, x, D, z, dtype), y_ssm

    def states(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(final_states, varlen_states): the state after each batch row's last token, and with
        cu_seqlens each sequence's."""
        return self.state, self.varlen_states


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
    # States in `compute` (stacked along a leading dimension) -> as stored; with `state_draws`, also the uniform
    # draws their rounding takes, stacked alike.
    store_state: Callable[..., torch.Tensor]
    exact_segments: bool  # decays from direct segment sums (reference) or cumsum differences (peers)
    # Which operand of a chunk's state matmul (xᵀ · B) the tokens' weights (decay to the chunk's end × dt) scale
    # before it is rounded: "B" as mamba_ssm's and vLLM's chunk-state kernels, "x" as ssmcheck's own.
    state_weights: str = "B"
    # The random draws one state's storing takes (stochastic rounding: a uniform per element), given its shape; None
    # where storing draws nothing.
    state_draws: Callable[[torch.Size], torch.Tensor] | None = None

    def store_states(self, states: list[torch.Tensor]) -> torch.Tensor:
        """`states` as stored, stacked: rounded together, some thirty operations for them all where one at a time
        stochastic rounding took as many each (a long sequence stores a state per chunk). Each state's draws are
        made one after another in list order, as storing them one by one made them: the same figures, bit for bit,
        however the states are grouped."""
        stacked = torch.stack(states)
        if self.state_draws is None:
            return self.store_state(stacked)
        return self.store_state(stacked, torch.stack([self.state_draws(s.shape) for s in states]))

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
    start: int  # token index within its segment
    length: int
    seq: int  # sequence (varlen) or batch row
    first: bool  # starts its sequence
    last: bool  # ends its sequence


def _pieces(bounds: list[tuple[int, int]], chunk_size: int, f0: int, f1: int) -> list[_Piece]:
    """The pieces of the flattened tokens [f0, f1), each sequence's grid counted from its start."""
    return [
        _Piece(k - f0, min(chunk_size, end - k), s, k == begin, k + chunk_size >= end)
        for s, (begin, end) in enumerate(bounds)
        if begin < f1 and end > f0
        for k in range(max(begin, f0), min(end, f1), chunk_size)
    ]


def _ssd(x, dt, A, B, C, pieces: list[_Piece], carry, initial_states, seq_states: list, arith: Arithmetic,
         record_stages: bool = False):
    """The SSD form over the pieces of one segment of flattened tokens.

    x (T, nheads, headdim), dt (T, nheads) processed, A (nheads,), B/C (T, ngroups, dstate): the
    segment's tokens, all in arith.compute; `carry` the unrounded state entering the first piece when
    that piece continues a sequence. Stores the state at the end of each sequence that ends here in
    `seq_states`. Returns y (T, nheads, headdim) without D and z, the unrounded state leaving the last
    piece, and, with `record_stages`, the intermediates of every piece in piece order (else None):
    "cumsum" (pieces, nheads, Q) the log-decay from the piece start, "chunk_states" (pieces, nheads,
    headdim, dstate) the state a piece leaves from zero, "passed_states" (same) the stored state
    entering it, "cb" (pieces, ngroups, Q, Q) C·Bᵀ; Q is the longest piece, padding past a piece's
    end holds dt = 0 terms.
    """
    T, nheads, headdim = x.shape
    dev = x.device
    Q = max((p.length for p in pieces), default=1)  # no wider than the longest piece: padding costs time only
    zero = torch.zeros_like(carry)
    y = torch.zeros(T, nheads, headdim, dtype=arith.compute, device=dev)
    offsets = torch.arange(Q, device=dev)
    block = max(1, _BLOCK_ELEMENTS // (nheads * Q * Q))
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
        if arith.state_weights == "x":
            piece_states = arith.matmul((xq * to_end[..., None]).transpose(-1, -2), Bh)
        else:
            piece_states = arith.matmul(xq.transpose(-1, -2), Bh * to_end[..., None])  # (P, nheads, headdim, dstate)
        piece_decay = torch.exp(cum[..., -1])  # (P, nheads)
        # The states to store, in the order they are stored: each piece's incoming one, and after a sequence's last
        # piece its final one. The carry itself stays unrounded.
        unstored, incoming_at, final_at = [], [], []
        for k, p in enumerate(blk):
            if p.first:
                carry = zero if initial_states is None else initial_states[p.seq]
            incoming_at.append(len(unstored))
            unstored.append(carry)
            carry = piece_decay[k, :, None, None] * carry + piece_states[k]
            if p.last:
                final_at.append((p.seq, len(unstored)))
                unstored.append(carry)
        stored = arith.store_states(unstored)
        incoming = stored if not final_at else stored[incoming_at]
        for seq, at in final_at:
            seq_states[seq] = stored[at]
        Ch = heads_of_groups(Cq, nheads, dim=1)
        if recorded is not None:
            for name, value in (("cumsum", cum), ("chunk_states", piece_states), ("passed_states", incoming),
                                ("cb", CB_groups)):
                recorded[name].append(value)
        state_part = arith.matmul(Ch, incoming.to(arith.compute).transpose(-1, -2))
        y_piece = y_intra + state_part * torch.exp(cum)[..., None]
        y[idx[valid]] = y_piece.permute(0, 2, 1, 3)[valid]
    stages = None if recorded is None else {name: torch.cat(parts) for name, parts in recorded.items() if parts}
    return y, carry, stages


class SSDStream:
    """The SSD form one segment of flattened tokens at a time: `segment(f0, f1)` returns (y, y_ssm) of
    tokens [f0, f1) as (f1 - f0, nheads, headdim), y in `y_dtype` (None: arith.compute); `states()`,
    after the last, the final states. A segment that cuts a sequence must cut it on that sequence's
    chunk grid: the pieces, and so the rounding, are then the whole call's."""

    def __init__(self, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit,
                 arith: Arithmetic, y_dtype: torch.dtype | None = None):
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        batch, seqlen, nheads, headdim = x.shape
        self.cu = _sequence_bounds(x, B, cu_seqlens, initial_states)
        if self.cu is None:
            self.bounds = [(r * seqlen, (r + 1) * seqlen) for r in range(batch)]
        else:
            self.bounds = list(zip(self.cu[:-1], self.cu[1:]))
        self.flat = tuple(None if t is None else t.flatten(0, 1) for t in (x, dt, B, C, z))
        self.D, self.dt_options, self.chunk_size = D, (dt_bias, dt_softplus, dt_limit), chunk_size
        self.arith, self.y_dtype, self.A = arith, y_dtype, A.to(arith.compute)
        self.initial_states = None if initial_states is None else initial_states.to(arith.compute)
        self.carry = torch.zeros(nheads, headdim, B.shape[-1], dtype=arith.compute, device=x.device)
        self.seq_states = list(arith.store_states(
            [self.carry if self.initial_states is None else self.initial_states[s] for s in range(len(self.bounds))]))
        self.next = 0
        self.recorded = None  # the last segment's stages, with record_stages

    def _check_cut(self, f: int) -> None:
        for begin, end in self.bounds:
            if begin < f < end and (f - begin) % self.chunk_size:
                raise ValueError(f"a segment boundary at token {f} cuts a chunk (chunk size {self.chunk_size} "
                                 f"from the sequence start {begin})")

    def segment(self, f0: int, f1: int, record_stages: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        if f0 != self.next:
            raise ValueError(f"segments must follow each other: expected one from token {self.next}, got {f0}")
        self._check_cut(f0)
        self._check_cut(f1)
        self.next = f1
        dtype = self.arith.compute
        x, dt, B, C, z = (None if t is None else t[f0:f1] for t in self.flat)
        y_ssm, self.carry, self.recorded = _ssd(
            x.to(dtype), process_dt(dt, *self.dt_options, dtype), self.A, B.to(dtype), C.to(dtype),
            _pieces(self.bounds, self.chunk_size, f0, f1), self.carry, self.initial_states, self.seq_states,
            self.arith, record_stages,
        )
        y = skip_and_gate(y_ssm, x, self.D, z, dtype)
        # Saturated into y_dtype (core.formats.saturate): what an output stored there holds.
        return (y if self.y_dtype is None else saturate(y, self.y_dtype).to(self.y_dtype)), y_ssm

    def states(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(final_states, varlen_states), as scan_recurrent's."""
        stored = torch.stack(self.seq_states)
        if self.cu is None:
            return stored, None
        return stored[_last_sequence(self.cu)][None], stored


def scan_ssd(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit,
             arith: Arithmetic, record_stages: bool = False, y_dtype: torch.dtype | None = None) -> ScanOutput:
    """The SSD form over the whole input (one segment), shaped like scan_recurrent's results (with
    `record_stages`, ScanOutput.stages holds the intermediates, as _ssd describes them)."""
    stream = SSDStream(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit,
                       arith, y_dtype)
    y, y_ssm = (t.reshape(*x.shape[:2], *t.shape[1:]) for t in stream.segment(0, x.shape[0] * x.shape[1], record_stages))
    final_states, varlen_states = stream.states()
    return ScanOutput(y=y, final_states=final_states, varlen_states=varlen_states, y_ssm=y_ssm, stages=stream.recorded)


def chunked_arithmetic(dtype: torch.dtype = torch.float64) -> Arithmetic:
    """The chunked form's arithmetic: everything in `dtype`, rounding nowhere."""
    return Arithmetic(dtype, dtype, store_state=lambda s: s, exact_segments=True)


def scan_chunked(
    x, dt, A, B, C, chunk_size, *, D=None, z=None, dt_bias=None, initial_states=None, cu_seqlens=None,
    dt_softplus=False, dt_limit=NO_DT_LIMIT, dtype=torch.float64, record_stages=False,
) -> ScanOutput:
    """The chunked (SSD) form in `dtype` (float64: the ground truth for long sequences).

    Same inputs and results as scan_recurrent; segment decays are summed directly,
    so it agrees with the recurrence to ~1e-12 relative in float64. With `record_stages`,
    ScanOutput.stages holds its intermediates (_ssd): the ground truth of a kernel's stages.
    `SSDStream` with `chunked_arithmetic()` computes it a segment at a time.
    """
    return scan_ssd(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus,
                    dt_limit, chunked_arithmetic(dtype), record_stages)
