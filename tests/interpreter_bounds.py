"""Every memory access of a Triton kernel run by the interpreter, checked against its launch's tensor arguments.

On a GPU a load or store outside every allocation may fault (an illegal address: sticky, the process's CUDA context
is lost for every later case); in Triton's interpreter the same access reads or writes host memory silently, and a
NaN fence (core.fences) shows it only where the value reaches a result. Inside `bounds_checked`, each launch
records the byte ranges of its tensor arguments' storages, and every load and store, of the lanes its mask lets
through (a masked-off lane touches no memory, on a GPU either), must lie inside one of them; a lane that does not
is recorded and masked off, so that the interpreter neither reads nor writes memory it does not own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from triton.runtime import interpreter


@dataclass
class Accesses:
    """What `bounds_checked` saw: the interpreted launches, and one line per access outside every argument's storage
    (kernel, load or store, how many elements)."""

    launches: int = 0
    outside: list[str] = field(default_factory=list)


@contextmanager
def bounds_checked() -> Iterator[Accesses]:
    """While inside, interpreted launches check their accesses (Accesses)."""
    ranges: list[tuple[int, int]] = []  # the running launch's argument storages: [start, end) in bytes
    kernel = [""]
    seen = Accesses()
    executor, builder = interpreter.GridExecutor, interpreter.InterpreterBuilder
    init, load, store = executor._init_args_hst, builder.create_masked_load, builder.create_masked_store

    def init_args(self, args_dev, kwargs):
        args_hst, kwargs_hst = init(self, args_dev, kwargs)
        ranges.clear()
        seen.launches += 1
        kernel[0] = getattr(self.fn, "__name__", str(self.fn))
        for arg in [*args_hst, *kwargs_hst.values()]:
            if hasattr(arg, "untyped_storage"):
                storage = arg.untyped_storage()
                ranges.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
        return args_hst, kwargs_hst

    def inside_only(access: str, ptrs, mask):
        """`mask` with the lanes outside every argument turned off (recorded): the interpreter then leaves them
        alone, where it would read or write whatever memory lies there, or crash."""
        size = np.dtype(interpreter._get_np_dtype(ptrs.get_element_ty())).itemsize
        addresses = ptrs.data.astype(np.uint64)
        inside = np.zeros(addresses.shape, dtype=bool)
        for start, end in ranges:
            inside |= (addresses >= start) & (addresses + size <= end)
        lanes = np.broadcast_to(mask.data, addresses.shape)
        if (lanes & ~inside).any():
            seen.outside.append(f"{kernel[0]}: {access} of {int((lanes & ~inside).sum())} element(s) outside every "
                                "argument")
        return interpreter.TensorHandle(lanes & inside, mask.dtype)

    def checked_load(self, ptrs, mask, other, *args):
        return load(self, ptrs, inside_only("load", ptrs, mask), other, *args)

    def checked_store(self, ptrs, value, mask, *args):
        return store(self, ptrs, value, inside_only("store", ptrs, mask), *args)

    executor._init_args_hst, builder.create_masked_load, builder.create_masked_store = (
        init_args, checked_load, checked_store)
    try:
        yield seen
    finally:
        executor._init_args_hst, builder.create_masked_load, builder.create_masked_store = init, load, store
