"""Where a case's tokens are cut into the segments its float64 reference and baselines are computed in
(issue #13): their memory is then O(segment), not O(sequence).

Tokens are flattened in row order (batch*seqlen; a varlen batch is one row). A segment is a run of
whole chunks: every cut lies on the chunk grid of the sequence it falls in, counted from that
sequence's start, at the case's chunk size (and at the chunked reference's, the grid being their least
common multiple). The reason: the baseline chunks at the case's chunk size and rounds as its chunks
fall, so a segment that cut a chunk would compute another baseline, and the figures would no longer be
the whole case's; cut on the grid, every reference and baseline value is the whole computation's, bit
for bit, and every (sequence, chunk) group of the figures lies within one segment. A segment holds at
most SEGMENT_ELEMENTS elements of y where the grid allows (at least one grid step), so a short case is
one segment, computed as before.
"""

from __future__ import annotations

import math
from bisect import bisect_right

from ssmcheck.scan.inputs import ScanInputs

# y elements (tokens x heads x headdim) per segment: 512 MiB as a float64 tensor (scan.memory estimates
# what a segment costs in all).
SEGMENT_ELEMENTS = 2**26


def segment_tokens(nheads: int, headdim: int) -> int:
    """Flattened tokens per segment at most (before the cuts are moved onto the grid)."""
    return max(1, SEGMENT_ELEMENTS // (nheads * headdim))


def sequence_starts(inputs: ScanInputs) -> list[int]:
    """Where each sequence starts among the flattened tokens, in order."""
    rows, seqlen = inputs.x.shape[:2]
    if inputs.varlen:
        return [int(c) for c in inputs.cu_seqlens[:-1].tolist()]
    return [r * seqlen for r in range(rows)]


def cuts(starts: list[int], total: int, grid: int, tokens: int) -> list[tuple[int, int]]:
    """Segments [f0, f1) covering `total` flattened tokens, in order, each cut on the `grid` of the
    sequence it falls in (`starts`: sequence starts, ascending), each at most `tokens` long where the
    grid allows."""
    segments, f0 = [], 0
    while f0 < total:
        f1 = total if f0 + tokens >= total else _on_grid(f0 + tokens, starts, grid)
        if f1 <= f0:  # less than one grid step: the next grid point, or the next sequence's start
            following = bisect_right(starts, f0)
            f1 = min(f0 + grid, starts[following] if following < len(starts) else total, total)
        segments.append((f0, f1))
        f0 = f1
    return segments


def _on_grid(f: int, starts: list[int], grid: int) -> int:
    """The last grid point at or before token f in the sequence holding it."""
    begin = starts[bisect_right(starts, f) - 1]
    return begin + (f - begin) // grid * grid


def case_cuts(inputs: ScanInputs, chunk_size: int, reference_chunk: int | None) -> list[tuple[int, int]]:
    """The segments of a case: `reference_chunk` is the chunked reference's chunk size (None: the
    sequential reference, which any cut suits)."""
    rows, seqlen, nheads, headdim = inputs.x.shape
    grid = chunk_size if reference_chunk is None else math.lcm(chunk_size, reference_chunk)
    return cuts(sequence_starts(inputs), rows * seqlen, grid, segment_tokens(nheads, headdim))
