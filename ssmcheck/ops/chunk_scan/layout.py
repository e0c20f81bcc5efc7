"""The chunk table: which tokens each chunk of the scan covers.

Every sequence is cut into its own chunks, starting at its first token, so a
chunk never straddles a sequence boundary (the last chunk of a sequence may be
short). Batch mode is the same thing over batch * seqlen flattened tokens, one
sequence per row. The kernels then never mask by sequence inside a chunk, and a
sequence that starts mid-way through a fixed chunk grid needs no special case.
Sequences need not tile the tokens: a pad token between them (seq_idx -1) lies in
no chunk, so it changes no state and no kernel writes its output.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ChunkTable:
    chunk_size: int
    nseq: int
    nchunks: int
    chunk_token: torch.Tensor  # (nchunks,) int32: flattened index of the chunk's first token
    chunk_len: torch.Tensor  # (nchunks,) int32: tokens in the chunk, 1..chunk_size
    seq_chunk: torch.Tensor  # (nseq + 1,) int32: first chunk of each sequence; last = nchunks
    last_seq: int  # the sequence holding the last token (trailing empty sequences hold none)


def _build(spans: tuple[tuple[int, int], ...], chunk_size: int, device: torch.device) -> ChunkTable:
    chunk_token, chunk_len, seq_chunk = [], [], [0]
    for start, end in spans:
        for tok in range(start, end, chunk_size):
            chunk_token.append(tok)
            chunk_len.append(min(chunk_size, end - tok))
        seq_chunk.append(len(chunk_token))
    as_tensor = functools.partial(torch.tensor, dtype=torch.int32, device=device)
    return ChunkTable(
        chunk_size=chunk_size,
        nseq=len(spans),
        nchunks=len(chunk_token),
        chunk_token=as_tensor(chunk_token),
        chunk_len=as_tensor(chunk_len),
        seq_chunk=as_tensor(seq_chunk),
        last_seq=max(s for s, (start, end) in enumerate(spans) if end > start),
    )


@functools.lru_cache(maxsize=64)
def _batch_table(batch: int, seqlen: int, chunk_size: int, device: torch.device) -> ChunkTable:
    return _build(tuple((b * seqlen, (b + 1) * seqlen) for b in range(batch)), chunk_size, device)


def batch_table(batch: int, seqlen: int, chunk_size: int, device: torch.device) -> ChunkTable:
    """One sequence per batch row (cached: no host work or copies on repeated calls)."""
    return _batch_table(batch, seqlen, chunk_size, torch.device(device))


def varlen_table(spans: list[tuple[int, int]], chunk_size: int, device: torch.device) -> ChunkTable:
    """Sequences [start, end) of one flattened row, in order."""
    return _build(tuple(spans), chunk_size, torch.device(device))
