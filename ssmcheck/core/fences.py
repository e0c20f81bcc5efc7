"""A kernel's floating-point inputs between NaN fences, so that a read past either end of one shows.

A load without its mask (the last, partial chunk of a sequence read as a whole one; a state index past
dstate; chunk -1's state) reads whatever lies past the tensor: in a serving engine another tensor, which
may hold NaN or Inf, and in a test most often finite memory that hides the read. Each call gets copies of
its inputs, every storage in a buffer with NaN on both sides: such a read pulls NaN into the result, which
is then non-finite where the read lands. Views that share a storage (the `strided` regime's fused buffer)
share one fenced copy, with their strides and offsets; so a kernel that reads a view past its own columns
but inside the buffer still reads the neighbouring input's (finite) values. Integer tensors (cu_seqlens,
slot indices) are copied without fences: there is no NaN to read, and a garbage index would fault.

The originals stay as they were, so after the call they say whether the kernel wrote into an input
(`changed`) and the fences whether it wrote past one (`breached`).
"""

from __future__ import annotations

import math

import torch

from ssmcheck.core.guard import changed_input
from ssmcheck.core.tensors import bits

# Elements of fence on each side of a storage: as many as the storage holds, at most FENCE_BYTES (a chunk of 256
# tokens of Mamba2-2.7B's fused in_proj row in bf16 is 5.4 MB), rounded up to ALIGN elements so that the
# data keeps the alignment Triton specialises pointers on.
FENCE_BYTES = 16 << 20
ALIGN = 64


class Fenced:
    """Fenced copies of a call's tensors (`tensors`: name -> copy, None kept) and the buffers that hold them."""

    def __init__(self, originals: dict[str, torch.Tensor | None]):
        self.originals = originals
        self._buffers: dict[tuple, tuple[torch.Tensor, int, str]] = {}  # (address, dtype) -> (buffer, fence, name)
        self.tensors = {name: self._copy(name, t) for name, t in originals.items()}

    def _copy(self, name: str, t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        if not t.is_floating_point() or t.untyped_storage().nbytes() % t.element_size():
            return t.clone()
        key = (t.untyped_storage().data_ptr(), t.dtype)
        if key not in self._buffers:
            storage = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage())
            n = storage.numel()
            fence = -(-min(n, FENCE_BYTES // t.element_size()) // ALIGN) * ALIGN
            buffer = torch.full((fence + n + fence,), math.nan, dtype=t.dtype, device=t.device)
            buffer[fence:fence + n] = storage
            self._buffers[key] = (buffer, fence, name)
        buffer, fence, _ = self._buffers[key]
        return buffer.as_strided(t.shape, t.stride(), t.storage_offset() + fence)

    def changed(self) -> str | None:
        """The first input whose copy the call changed (bit for bit), or None."""
        return changed_input({name: t for name, t in self.originals.items() if t is not None}, self.tensors)

    def breached(self) -> str | None:
        """The first input (of those sharing a storage, the first named) whose fences the call wrote, or None."""
        for buffer, fence, name in self._buffers.values():
            nan = bits(torch.full((1,), math.nan, dtype=buffer.dtype, device=buffer.device))
            edges = torch.cat([buffer[:fence], buffer[buffer.numel() - fence:]])
            if not bool((bits(edges) == nan).all()):
                return name
        return None
