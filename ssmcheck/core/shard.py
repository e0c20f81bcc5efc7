"""Shards of a sweep: the K-th of N deterministic slices of its case list (`--shard K/N`, torchrun ranks).

The rule is round-robin by position: case i (0-based, in the sweep's order) belongs to shard
(i mod N) + 1. A sweep is a cartesian product whose last axes vary fastest, so neighbouring cases
differ in one cheap-to-vary axis and every shard gets a like mix of regimes, lengths and dtypes;
contiguous blocks would hand one shard every case of the slowest-varying axis (all of the `long`
regime, say) and its cost. The rule depends on the case list alone, never on timing, so a merge
(core.merge) puts the cases back in the sweep's order without being told where each one was.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

_FORM = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


@dataclass(frozen=True)
class Shard:
    index: int  # K, from 1
    count: int  # N

    def positions(self, total: int) -> range:
        """The positions in a sweep of `total` cases that this shard runs."""
        return range(self.index - 1, total, self.count)

    def take(self, cases: Sequence) -> list:
        return [cases[i] for i in self.positions(len(cases))]

    def record(self, sweep_ids: Sequence[str]) -> dict:
        """The report's `shard` field: which slice, and of which sweep (its size and a digest of its case
        ids, so that a merge can tell shards of different sweeps apart)."""
        return {"index": self.index, "count": self.count, "sweep_cases": len(sweep_ids),
                "sweep_digest": sweep_digest(sweep_ids)}


def parse_shard(option: str, text: str) -> Shard:
    """`K/N` with 1 <= K <= N; a ValueError naming `option` otherwise."""
    match = _FORM.fullmatch(str(text))
    if match is None:
        raise ValueError(f"{option}: invalid value {text!r} (expected K/N, e.g. 1/4)")
    index, count = int(match[1]), int(match[2])
    if count < 1 or not 1 <= index <= count:
        raise ValueError(f"{option}: invalid value {text!r} (expected K/N with 1 <= K <= N, e.g. 1/4)")
    return Shard(index, count)


def sweep_digest(ids: Sequence[str]) -> str:
    """A short digest of a sweep's case ids in order: equal for the same sweep, whoever lists it."""
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]
