"""A kernel's Triton programs, run by Triton's interpreter, kept to the memory of their launch's tensors.

On a GPU a load or store outside every allocation may fault (an illegal address, which also ends every later case
of the process) or read and overwrite another tensor; in the interpreter the same access reads or writes host
memory: garbage read, the heap corrupted, or the process killed by a segmentation fault, report and all. NaN fences
(core.fences) show a read past an input only where its value reaches a result, and a write past one only into
the fences.

Inside `checked_accesses`, each interpreted launch records the byte ranges of its tensor arguments' storages, and
every load and store, of the lanes its mask lets through (a masked-off lane touches no memory, on a GPU either),
must lie inside one of them: a lane that does not is recorded and masked off (a load gives the lane 0, a store
writes nothing), so that the program runs to its end without touching memory it was not given. Anywhere else
(compiled Triton, a Triton without this interpreter) it checks nothing.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from ssmcheck.core.runtime import interpreting


@dataclass
class Accesses:
    """What `checked_accesses` saw: the interpreted launches, and the elements each program loaded and stored
    outside every tensor of its launch ({program name: count})."""

    launches: int = 0
    loads_outside: dict[str, int] = field(default_factory=dict)
    stores_outside: dict[str, int] = field(default_factory=dict)

    def outside(self) -> str | None:
        """One line on what was accessed outside, or None."""
        parts = []
        for counts, verb, consequence in (
                (self.stores_outside, "stored", "another allocation overwritten, or a fault"),
                (self.loads_outside, "loaded", "whatever lies there, or a fault")):
            if counts:
                parts.append(f"{verb} {sum(counts.values())} element(s) outside every tensor of its launch (on a GPU: "
                             f"{consequence})")
        if not parts:
            return None
        programs = sorted({*self.stores_outside, *self.loads_outside})
        return f"the kernel's Triton program{'s' if len(programs) > 1 else ''} {', '.join(programs)} " + \
            "; ".join(parts) + "; ssmcheck masked them off in Triton's interpreter"


@contextmanager
def checked_accesses() -> Iterator[Accesses]:
    """While inside, interpreted Triton launches keep to their tensors' memory (the module's docstring); yields what
    they did (Accesses). Outside the interpreter, nothing is checked."""
    global _active
    seen = Accesses()
    if not interpreting() or not _installed():
        yield seen
        return
    outer, _active = _active, seen
    try:
        yield seen
    finally:
        _active = outer


# The record of the checked_accesses that launches now run inside (None: none, nothing checked). The interpreter's
# methods are wrapped once a process and stay so: patched and restored around every call, they would invalidate
# CPython's caches of attribute lookups on the interpreter's classes (its hot path) at each call. The default CPU
# drift took 101.0 s so against 94.0 s unchecked; wrapped once, 95.5 / 96.3 s against 92.4 / 98.0 s (forty-third
# session, this project's 2-core development machine).
_active: Accesses | None = None


@functools.cache
def _installed() -> bool:
    """Wrap the interpreter's launch set-up, loads and stores (once a process); False where this Triton's
    interpreter is laid out otherwise (nothing is checked then)."""
    try:
        from triton.runtime import interpreter  # noqa: PLC0415
        executor, builder = interpreter.GridExecutor, interpreter.InterpreterBuilder
        init, load, store = executor._init_args_hst, builder.create_masked_load, builder.create_masked_store
        np_dtype, handle = interpreter._get_np_dtype, interpreter.TensorHandle
    except (ImportError, AttributeError):
        return False
    launch = _Launch()

    def init_args(self, args_dev, kwargs):
        args_hst, kwargs_hst = init(self, args_dev, kwargs)
        if _active is not None:
            _active.launches += 1
            launch.begin(getattr(self.fn, "__name__", "?"), [*args_hst, *kwargs_hst.values()])
        return args_hst, kwargs_hst

    def inside_only(ptrs, mask, counts: dict):
        """`mask` with the lanes outside every tensor turned off (counted in `counts`)."""
        size = _itemsize(np_dtype, ptrs.get_element_ty())
        if launch.holds(int(ptrs.data.min()), int(ptrs.data.max()) + size):
            return mask  # every lane, masked or not, inside one storage: the common case, in two reductions
        lanes = np.broadcast_to(mask.data, ptrs.data.shape)
        outside = lanes & ~launch.inside(ptrs.data, size)
        if not outside.any():
            return mask
        counts[launch.program] = counts.get(launch.program, 0) + int(outside.sum())
        return handle(lanes & ~outside, mask.dtype)

    def checked_load(self, ptrs, mask, other, *args):
        if _active is not None:
            mask = inside_only(ptrs, mask, _active.loads_outside)
        return load(self, ptrs, mask, other, *args)

    def checked_store(self, ptrs, value, mask, *args):
        if _active is not None:
            mask = inside_only(ptrs, mask, _active.stores_outside)
        return store(self, ptrs, value, mask, *args)

    executor._init_args_hst, builder.create_masked_load, builder.create_masked_store = (
        init_args, checked_load, checked_store)
    return True


@functools.lru_cache(maxsize=64)
def _itemsize(np_dtype, element_type) -> int:
    """Bytes of one element of a pointer's Triton `element_type` (np_dtype: the interpreter's mapping)."""
    return np.dtype(np_dtype(element_type)).itemsize


class _Launch:
    """The running launch: its program's name, and its tensors' storages as byte ranges [start, end), sorted."""

    def __init__(self):
        self.program = "?"
        self.starts: list[int] = []
        self.ends: list[int] = []

    def begin(self, program: str, arguments: list) -> None:
        self.program = program
        ranges = {}
        for tensor in _tensors(arguments):
            storage = tensor.untyped_storage()
            ranges[storage.data_ptr()] = storage.data_ptr() + storage.nbytes()
        # Storages do not overlap: the one starting last at or before an address is the only one that may hold it.
        self.starts = sorted(ranges)
        self.ends = [ranges[s] for s in self.starts]

    def holds(self, start: int, end: int) -> bool:
        """Whether bytes [start, end) lie inside one of the launch's storages."""
        holder = bisect.bisect_right(self.starts, start) - 1
        return holder >= 0 and end <= self.ends[holder]

    def inside(self, addresses: np.ndarray, size: int) -> np.ndarray:
        """Whether each address's `size` bytes lie inside one of the launch's storages (`holds`, lane by lane)."""
        if not self.starts:
            return np.zeros(addresses.shape, dtype=bool)
        addresses = addresses.astype(np.uint64, copy=False)
        holder = np.searchsorted(np.array(self.starts, dtype=np.uint64), addresses, side="right") - 1
        ends = np.array(self.ends, dtype=np.uint64)[np.maximum(holder, 0)]
        return (holder >= 0) & (addresses + np.uint64(size) <= ends)


def _tensors(arguments) -> Iterator:
    """The tensors among a launch's arguments (inside tuples too; a tensor descriptor's base)."""
    for arg in arguments:
        if isinstance(arg, tuple):
            yield from _tensors(arg)
        elif hasattr(arg, "untyped_storage"):
            yield arg
        elif hasattr(getattr(arg, "base", None), "untyped_storage"):
            yield arg.base
