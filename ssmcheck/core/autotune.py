"""The autotune configs a kernel can run with: finding its autotuners, and pinning one config at a time.

Which config Triton's autotuner picks depends on the GPU, the Triton version and the shape, so a
bug that only one config has (the sm_90 wgmma race this project began from) can pass on one
machine and fail on another. To reach it, every `triton.runtime.Autotuner` reachable from the
kernel under test is found:

- in the module globals of the callable's module;
- in the modules that module imports, and the modules of the functions it imports, as long as
  they lie within the kernel's own package (its top-level package name), or, for a kernel loaded
  from a file, in the file's folder or below it.

An autotuner with a single config runs it without benchmarking, so pinning a config is setting
the autotuner's config list to that one config, and restoring the list afterwards. That is also
how an autotuned kernel runs in Triton's interpreter, which has no driver to benchmark with.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Tuned:
    """One autotuned function: where it was found, and its autotuner."""

    name: str  # the kernel function's name, e.g. _chunk_scan_fwd_kernel
    module: str  # the module whose global it is
    autotuner: object  # triton.runtime.Autotuner

    @property
    def configs(self) -> list:
        return list(self.autotuner.configs)


def describe(config) -> dict:
    """A triton.Config as plain data: its kwargs and launch options (num_ctas and maxnreg only when set)."""
    described = {"kwargs": dict(config.kwargs), "num_warps": config.num_warps, "num_stages": config.num_stages}
    if getattr(config, "num_ctas", 1) != 1:
        described["num_ctas"] = config.num_ctas
    if getattr(config, "maxnreg", None) is not None:
        described["maxnreg"] = config.maxnreg
    return described


def described_text(described: dict) -> str:
    """`BLOCK_SIZE_M=128, ..., num_warps=4, num_stages=3` from `describe`'s dict, for tables and
    summaries (other keys, such as a function name or an index, are left out)."""
    launch = [f"{k}={v}" for k, v in described.items() if k in ("num_warps", "num_stages", "num_ctas", "maxnreg")]
    return ", ".join([f"{k}={v}" for k, v in described["kwargs"].items()] + launch)


def find(fn: Callable) -> list[Tuned]:
    """Every autotuner reachable from `fn`'s module within its package, in a stable order (by module,
    then by name), each once."""
    from triton.runtime.autotuner import Autotuner  # noqa: PLC0415 (triton: only once the runtime is configured)

    start = inspect.getmodule(inspect.unwrap(fn))
    if start is None:
        return []
    package = start.__name__.partition(".")[0]
    folder = Path(start.__file__).resolve().parent if getattr(start, "__file__", None) else None

    def within(module) -> bool:
        if module.__name__.partition(".")[0] == package:
            return True
        path = getattr(module, "__file__", None)
        return folder is not None and path is not None and Path(path).resolve().is_relative_to(folder)

    found: dict[int, Tuned] = {}
    seen: set[str] = set()
    queue = [start]
    while queue:
        module = queue.pop(0)
        if module.__name__ in seen:
            continue
        seen.add(module.__name__)
        for attr, value in sorted(vars(module).items()):
            autotuner = _autotuner_in(value, Autotuner)
            if autotuner is not None:
                found.setdefault(id(autotuner), Tuned(attr, module.__name__, autotuner))
            follow = value if isinstance(value, types.ModuleType) else inspect.getmodule(value)
            if follow is not None and within(follow):
                queue.append(follow)
    return sorted(found.values(), key=lambda t: (t.module, t.name))


def _autotuner_in(value, autotuner_class):
    """The Autotuner a global holds, directly or under wrappers such as triton.heuristics (`.fn` chains)."""
    for _ in range(8):  # wrappers nest a few deep at most
        if isinstance(value, autotuner_class):
            return value
        value = getattr(value, "fn", None)
        if value is None:
            return None
    return None


@contextmanager
def pinned(choices: dict[Tuned, int]) -> Iterator[None]:
    """Run each autotuner in `choices` with only its config of that index; restore every list after."""
    saved = {tuned: tuned.autotuner.configs for tuned in choices}
    try:
        for tuned, index in choices.items():
            tuned.autotuner.configs = [saved[tuned][index]]
        yield
    finally:
        for tuned, configs in saved.items():
            tuned.autotuner.configs = configs
