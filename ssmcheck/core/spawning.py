"""Starting a process with `spawn`, as workers and compiling helpers are: stopping signals held during the
start, and this process's main script hidden from the child. Imports neither torch nor triton (core.prestart
starts helpers before the command imports them)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from ssmcheck.core.execution import STOPPING_SIGNALS


def thread_environment(count: int) -> dict[str, str]:
    """The environment variables that hold a process of a GPU sweep to `count` CPU threads, read as it imports torch
    and inductor: torch's own (OMP_NUM_THREADS), and the subprocesses inductor compiles a graph's Triton kernels in
    (TORCHINDUCTOR_COMPILE_THREADS), started only once a graph is compiled (TORCH_WARM_POOL=0; by default inductor
    starts them as it is first called, to compile or not). Left at inductor's defaults, the sweep's process and its
    three helpers each started 16 such subprocesses on the H200's 16 cores, loaded or compiled: the default drift on
    fresh caches took 92.9 s so, 76.7 s without the pools started early and 83.0 s with 4 each (warm: 61.0, 57.3 and
    54.6 s; benchmarks/RESULTS.md, forty-second session)."""
    return {"OMP_NUM_THREADS": str(count), "TORCHINDUCTOR_COMPILE_THREADS": str(count), "TORCH_WARM_POOL": "0"}


@contextmanager
def cpu_threads(count: int | None) -> Iterator[None]:
    """Start processes with `count` CPU threads (`thread_environment`), read by a child as it imports torch. None,
    or an OMP_NUM_THREADS the user set, leaves the children theirs; so does any of the others the user set."""
    if count is None or "OMP_NUM_THREADS" in os.environ:
        yield
        return
    added = {name: value for name, value in thread_environment(count).items() if name not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


@contextmanager
def main_script_hidden() -> Iterator[None]:
    """Start a process without this process's main script. `spawn` runs the main script again in the child (as
    `__mp_main__`, so that what it defines unpickles there): a library user's script without an `if __name__ ==
    "__main__":` guard would run its sweep again in every worker and helper. Only a runner that holds what the
    script defines needs it (core.isolation._pickled); a package run with `-m` is never run again anyway."""
    main = sys.modules["__main__"]
    saved = {name: main.__dict__[name] for name in ("__file__", "__spec__") if name in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        for name in ("__file__", "__spec__"):
            main.__dict__.pop(name, None)
        main.__dict__.update(saved)


@contextmanager
def stopping_signals_blocked() -> Iterator[None]:
    """Block SIGINT and SIGTERM while a worker is started: the worker inherits the mask, so a signal
    during its start-up waits until it has set them to be ignored (they are the parent's to handle)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
