"""NaN in every tensor a kernel under test allocates uninitialised, so that an element it never writes shows.

ssmcheck fills the outputs it passes a kernel (vLLM's `out`, the state update's `out`) with NaN itself. A
kernel that allocates its own (torch.empty and kin) gets whatever the memory held: zeros, an earlier tensor,
or its own previous call's output, which hides an element it leaves unwritten (and, under --repeat, one it
writes only sometimes); an intermediate it reads before writing goes unseen the same way. PyTorch fills
torch.empty, empty_like, empty_strided, empty_permuted and the new elements of resize_ with NaN (integers:
their maximum, booleans: True) while deterministic algorithms are on and
torch.utils.deterministic.fill_uninitialized_memory is set. `uninitialised_as_nan` sets both for the call
and restores them after. Deterministic mode is set warn_only, so that torch operations without a
deterministic implementation still run (their warnings dropped); torch operations in the kernel's Python
wrapper take their deterministic implementations where they have one, Triton code is unaffected (and so is
code torch.compile made: inductor keeps its own flag, left alone here). On the CPU and on CUDA alike, and
inside CUDA graph capture (the fill is captured with the allocation).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.utils.deterministic

# torch._C's setter, not torch.use_deterministic_algorithms: that one first imports torch._inductor.config
# (all of torch._dynamo and inductor, 2 s a process on a 2-core CPU) to set a flag that only torch.compile'd
# code reads, where the fill is all this needs. The setter is private (in torch since 1.8): a torch without
# it gets the public one, and its import once a process.
_set_deterministic = getattr(torch._C, "_set_deterministic_algorithms", None) or torch.use_deterministic_algorithms


@contextmanager
def uninitialised_as_nan() -> Iterator[None]:
    """Within: tensors allocated uninitialised are NaN-filled; on leaving, the caller's settings are back."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    _set_deterministic(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        with warnings.catch_warnings():
            # "... does not have a deterministic implementation, but you set ... warn_only=True" and cuBLAS's
            # "... this operation is not deterministic because it uses CuBLAS": the kernel's own business.
            warnings.filterwarnings("ignore", message="(?s).*deterministic", category=UserWarning)
            yield
    finally:
        _set_deterministic(enabled, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill
