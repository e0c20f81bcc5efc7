"""Tensor facts the adapters share."""

from __future__ import annotations

import torch

_SAME_SIZE_INTS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN equals the same NaN): what 'unchanged' means for a kernel's input."""
    if a.is_floating_point():
        a, b = a.view(_SAME_SIZE_INTS[a.element_size()]), b.view(_SAME_SIZE_INTS[b.element_size()])
    return torch.equal(a, b)
