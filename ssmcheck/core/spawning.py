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


@contextmanager
def cpu_threads(count: int | None) -> Iterator[None]:
    """Start processes with `count` torch CPU threads: OMP_NUM_THREADS, which a child reads as it imports torch.
    None, or an OMP_NUM_THREADS the user set, leaves the children theirs."""
    if count is None or "OMP_NUM_THREADS" in os.environ:
        yield
        return
    os.environ["OMP_NUM_THREADS"] = str(count)
    try:
        yield
    finally:
        os.environ.pop("OMP_NUM_THREADS", None)


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
