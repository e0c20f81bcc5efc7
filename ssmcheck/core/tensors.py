"""Tensor facts, and moves between devices, that the adapters, inputs and measurements share."""

from __future__ import annotations

import torch

_SAME_SIZE_INTS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """A float tensor's bit patterns as integers of the same size (other tensors as they are)."""
    return t.view(_SAME_SIZE_INTS[t.element_size()]) if t.is_floating_point() else t


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN equals the same NaN): what 'unchanged' means for a kernel's input."""
    return torch.equal(bits(a), bits(b))


def finite(t: torch.Tensor) -> torch.Tensor:
    """torch.isfinite of a float tensor in two device operations, not four: t - t is exactly 0 where t is
    finite and NaN where it is inf or NaN (what a decode step run as a CUDA graph pays per operation)."""
    return (t - t) == 0


def nonfinite_mask(value: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Where `value` is inf or NaN although `truth` (its reference) is finite: a non-finite value the
    kernel made, not one it was handed."""
    return ~finite(value) & finite(truth)


def whole_storage(tensor: torch.Tensor) -> torch.Tensor:
    """Every element of `tensor`'s storage, read in its dtype, as a flat tensor (a view: no copy)."""
    return torch.empty(0, dtype=tensor.dtype, device=tensor.device).set_(tensor.untyped_storage())


def moved(tensor: torch.Tensor, device: str | torch.device, buffers: dict[tuple, torch.Tensor]) -> torch.Tensor:
    """`tensor` on `device`; a non-contiguous one as a view of its whole storage moved once (`buffers`,
    keyed by the storage's address and the dtype read from it, holds the moved storages as flat tensors)."""
    if tensor.is_contiguous():
        return tensor.to(device)
    storage = tensor.untyped_storage()
    key = (storage.data_ptr(), tensor.dtype)
    if key not in buffers:
        buffers[key] = whole_storage(tensor).to(device)
    return buffers[key].as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())


def laid_out_as(tensor: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """`values` (of tensor's shape) at tensor's strides and offset in a copy of tensor's whole storage: a
    non-contiguous view (a layer's slice of a cache) stays one, the rest of its storage as tensor's."""
    if tensor.is_contiguous():
        return values.contiguous()
    view = whole_storage(tensor).clone().as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())
    return view.copy_(values)
