"""Cutting a scan case's inputs the way a serving engine feeds them: a sequence alone, the pieces of a
chunked prefill, the decode tokens after a prefill. Pure data movement, no numerics.

A piece is a run of tokens of one sequence (`Piece`: its row and token range in the case's inputs).
`packed` lays pieces out as the kernel would get them from an engine: pieces of a batch-mode case (rows
of one length) as batch rows, pieces of a varlen case as one varlen row (cu_seqlens), a single piece as
a batch of one; each starts from its own initial state or from zero.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ssmcheck.scan.inputs import ScanInputs

# The per-token tensors of ScanInputs, (batch, seqlen, ...); the others are per head or per sequence.
PER_TOKEN = ("x", "dt", "B", "C", "z")


@dataclass(frozen=True)
class Piece:
    sequence: int  # the sequence's index in the case (batch row, or varlen sequence)
    row: int  # the row of the case's inputs that holds it
    start: int  # token range [start, stop) in that row
    stop: int

    @property
    def length(self) -> int:
        return self.stop - self.start


def whole_sequences(inputs: ScanInputs) -> list[Piece]:
    """Every sequence of the case, whole."""
    if inputs.varlen:
        cu = inputs.cu_seqlens.tolist()
        return [Piece(s, 0, cu[s], cu[s + 1]) for s in range(len(cu) - 1)]
    seqlen = inputs.x.shape[1]
    return [Piece(b, b, 0, seqlen) for b in range(inputs.x.shape[0])]


def _as_rows(inputs: ScanInputs, pieces: list[Piece]) -> bool:
    return not inputs.varlen and len({p.length for p in pieces}) == 1


def packed(inputs: ScanInputs, pieces: list[Piece], initial_states: torch.Tensor | None) -> ScanInputs:
    """The pieces as one kernel input (see the module docstring). `initial_states` holds one state per
    piece (None: every piece starts from zero)."""
    rows = _as_rows(inputs, pieces)

    def gather(t: torch.Tensor) -> torch.Tensor:
        parts = [t[p.row, p.start:p.stop] for p in pieces]
        return (torch.stack(parts) if rows else torch.cat(parts)[None]).contiguous()

    tokens = {name: gather(getattr(inputs, name)) for name in PER_TOKEN if getattr(inputs, name) is not None}
    lengths = torch.tensor([0] + [p.length for p in pieces], dtype=torch.int64)
    # In the case's own index dtype (ragged's int64), int32 where the case has none.
    index = inputs.cu_seqlens.dtype if inputs.varlen else torch.int32
    cu = None if rows or len(pieces) == 1 else torch.cumsum(lengths, 0).to(index).to(inputs.x.device)
    # Pieces are packed as an engine packs them, without the case's pad tokens (scan.padding).
    return replace(inputs, **tokens, initial_states=initial_states, cu_seqlens=cu, pad_after=None)


def unpacked(inputs: ScanInputs, y: torch.Tensor, pieces: list[Piece]) -> list[torch.Tensor]:
    """The kernel's y of `packed(inputs, pieces)`, one (length, nheads, headdim) tensor per piece."""
    if _as_rows(inputs, pieces):
        return list(y)
    offsets = torch.cumsum(torch.tensor([0] + [p.length for p in pieces]), 0).tolist()
    return [y[0, a:b] for a, b in zip(offsets, offsets[1:])]


def scattered(inputs: ScanInputs, parts: list[tuple[Piece, torch.Tensor]]) -> torch.Tensor:
    """A y laid out as the case's own (its rows and tokens) from the y of its pieces."""
    y = torch.full_like(inputs.x, float("nan"))
    for piece, part in parts:
        y[piece.row, piece.start:piece.stop] = part
    return y


def initial_state_of(inputs: ScanInputs, sequence: int) -> torch.Tensor | None:
    """(1, nheads, headdim, dstate): the initial state the case gives a sequence (None: zero)."""
    return None if inputs.initial_states is None else inputs.initial_states[sequence:sequence + 1]


def split_points(inputs: ScanInputs, chunk_size: int, generator: torch.Generator) -> list[int]:
    """Where each sequence is cut in two (a length within it, 1..length-1), drawn at random and mid-chunk
    where the sequence allows (a multiple of chunk_size only when no other point exists); 0 for a
    sequence of one token, which stays whole. Batch rows are all cut at one point, as an engine cuts
    a batch."""
    pieces = whole_sequences(inputs)
    if not inputs.varlen:
        pieces = pieces[:1]
    points = []
    for piece in pieces:
        candidates = [t for t in range(1, piece.length) if t % chunk_size] or list(range(1, piece.length))
        points.append(candidates[int(torch.randint(len(candidates), (1,), generator=generator))] if candidates else 0)
    return points if inputs.varlen else points * inputs.x.shape[0]
