"""Pad tokens between packed sequences, as a serving engine's packed prefill batch has them (the `padded`
regime): the kernel's call has them, the case and its references do not.

A padded case's ScanInputs hold its own tokens (a varlen row) and `pad_after`, the pad tokens that follow
each sequence. `padded` lays out the row the kernel gets: each sequence, then its pad tokens, whose
seq_idx is -1 and whose inputs are copies of the sequence's own first tokens (finite, at the regime's
scale, so a kernel that lets them into a state changes it); cu_seqlens bound each sequence with the pads
after it, so a kernel that reads cu_seqlens alone runs the pads as the sequence's own last tokens.
`live` is where the case's tokens lie in that row: the kernel's y there is the case's y.
Pure data movement, no numerics.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ssmcheck.scan.inputs import ScanInputs
from ssmcheck.scan.sequences import PER_TOKEN

PAD = -1  # the seq_idx of a pad token


@dataclass(frozen=True)
class PaddedCall:
    inputs: ScanInputs  # the row with its pad tokens; cu_seqlens: each sequence and the pads after it
    seq_idx: torch.Tensor  # (1, tokens) int32: each token's sequence, PAD for a pad token
    live: torch.Tensor  # (the case's tokens,) int64: where they lie in the row

    def case_y(self, y: torch.Tensor) -> torch.Tensor:
        """The kernel's y (1, tokens, ...) on the case's own tokens."""
        return y[:, self.live]


def padded(inputs: ScanInputs) -> PaddedCall:
    """The kernel's call of a padded case (see the module docstring)."""
    cu = inputs.cu_seqlens.tolist()
    pads = inputs.pad_after.tolist()
    device = inputs.x.device
    index, seq_idx, bounds, live = [], [], [0], []
    for s, (start, end) in enumerate(zip(cu[:-1], cu[1:])):
        live += range(len(index), len(index) + end - start)
        index += range(start, end)
        index += [start + k % (end - start) for k in range(pads[s])]  # the sequence's first tokens again
        seq_idx += [s] * (end - start) + [PAD] * pads[s]
        bounds.append(len(index))
    rows = torch.tensor(index, dtype=torch.int64, device=device)
    tokens = {name: getattr(inputs, name)[:, rows].contiguous() for name in PER_TOKEN
              if getattr(inputs, name) is not None}
    row = replace(inputs, **tokens, cu_seqlens=torch.tensor(bounds, dtype=torch.int32, device=device),
                  pad_after=None)
    return PaddedCall(row, torch.tensor([seq_idx], dtype=torch.int32, device=device),
                      torch.tensor(live, dtype=torch.int64, device=device))
