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

A non-finite result is then either the kernel's own (an overflow, a division by zero) or a read past an
input. Fences of zeros tell them apart: `nan_fences` names the inputs whose storages keep NaN fences, the
others' are 0 (core.outside makes a non-finite call again so).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection

import torch

from ssmcheck.core.tensors import bits, whole_storage

# Elements of fence on each side of a storage: as many as the storage holds, at most FENCE_BYTES (a chunk of 256
# tokens of Mamba2-2.7B's fused in_proj row in bf16 is 5.4 MB), rounded up to ALIGN elements so that the
# data keeps the alignment Triton specialises pointers on.
FENCE_BYTES = 16 << 20
ALIGN = 64


def storages(tensors: dict[str, torch.Tensor | None]) -> list[tuple[str, ...]]:
    """The names of the tensors that get fences, grouped by the storage they share (in `tensors`' order)."""
    groups: dict[tuple, list[str]] = {}
    for name, t in tensors.items():
        if _fenced(t):
            groups.setdefault(_key(t), []).append(name)
    return [tuple(names) for names in groups.values()]


def _fenced(t: torch.Tensor | None) -> bool:
    return t is not None and t.is_floating_point() and t.untyped_storage().nbytes() % t.element_size() == 0


def _key(t: torch.Tensor) -> tuple:
    return t.untyped_storage().data_ptr(), t.dtype


@functools.cache
def _pattern(value: float, dtype: torch.dtype) -> int:
    """The bit pattern of `value` in `dtype`, as the integer `bits` makes of it (computed on the host)."""
    return bits(torch.full((), value, dtype=dtype)).item()


class Fenced:
    """Fenced copies of a call's tensors (`tensors`: name -> copy, None kept) and the buffers that hold them.

    `nan_fences`: the names whose storages are fenced with NaN (None: all); the other storages' fences are 0.
    """

    def __init__(self, originals: dict[str, torch.Tensor | None], nan_fences: Collection[str] | None = None):
        self.originals = originals
        # (address, dtype) -> (buffer, fence length, the names sharing it, the fence's bit pattern)
        self._buffers: dict[tuple, tuple[torch.Tensor, int, tuple[str, ...], int]] = {}
        for names in storages(originals):
            t = originals[names[0]]
            nan = nan_fences is None or not set(names).isdisjoint(nan_fences)
            self._buffers[_key(t)] = self._buffer(t, names, math.nan if nan else 0.0)
        self.tensors = {name: self._copy(t) for name, t in originals.items()}

    @staticmethod
    def _buffer(t: torch.Tensor, names: tuple[str, ...], value: float) -> tuple:
        storage = whole_storage(t)
        n = storage.numel()
        fence = -(-min(n, FENCE_BYTES // t.element_size()) // ALIGN) * ALIGN
        buffer = torch.full((fence + n + fence,), value, dtype=t.dtype, device=t.device)
        buffer[fence:fence + n] = storage
        return buffer, fence, names, _pattern(value, t.dtype)

    def _copy(self, t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        if not _fenced(t):
            return t.clone()
        buffer, fence, _, _ = self._buffers[_key(t)]
        return buffer.as_strided(t.shape, t.stride(), t.storage_offset() + fence)

    def changed(self) -> str | None:
        """The first input whose copy the call changed (bit for bit), or None."""
        return self._written()[0]

    def breached(self) -> str | None:
        """The first input (of those sharing a storage, the first named) whose fences the call wrote, or None."""
        return self._written(inputs=False)[1]

    def violation(self) -> str | None:
        """What the call did to its inputs that it must not, in one line (a write into one, or past one), or
        None."""
        changed, breached = self._written()
        if changed is not None:
            return f"the kernel wrote into its input {changed}: inputs must be left unchanged"
        if breached is not None:
            return (f"the kernel wrote outside its input {breached}: into the NaN fence ssmcheck puts either side of "
                    "each input's memory")
        return None

    def _written(self, inputs: bool = True) -> tuple[str | None, str | None]:
        """(changed, breached), every input (without `inputs`, none: changed is None) and fence compared on the
        device and read back in one transfer: a check after every call of a case, so one wait for the device per
        call, not one per tensor."""
        names = [name for name, t in self.originals.items() if t is not None] if inputs else []
        flags = [(bits(self.originals[name]) != bits(self.tensors[name])).any() for name in names]
        buffers = list(self._buffers.values())
        for buffer, fence, _, fill in buffers:
            # Both fences as one view: the first `fence` elements, and as many from numel - fence on.
            edges = buffer.as_strided((2, fence), (buffer.numel() - fence, 1))
            flags.append((bits(edges) != fill).any())
        if not flags:
            return None, None
        device = flags[0].device
        found = torch.stack([flag if flag.device == device else flag.to(device) for flag in flags]).tolist()
        changed = next((name for name, flag in zip(names, found) if flag), None)
        breached = next((entry[2][0] for entry, flag in zip(buffers, found[len(names):]) if flag), None)
        return changed, breached
