"""A correct chunk scan that takes its time: for interrupting a sweep between cases (tests/test_ci_gate.py)."""

import ctypes
import os
import signal
import time

from ssmcheck.scan.adapter import torch_kernel


def slow_scan(*args, **kwargs):
    time.sleep(0.4)
    return torch_kernel(*args, **kwargs)


_COMPILED: set[tuple] = set()


def compiles_on_first_call(x, *args, **kwargs):
    """A correct chunk scan whose first call for each shape takes a second, as a GPU's compile and autotune do."""
    if tuple(x.shape) not in _COMPILED:
        _COMPILED.add(tuple(x.shape))
        time.sleep(1.0)
    return torch_kernel(x, *args, **kwargs)


def hangs_on_rank_1(*args, **kwargs):
    """A correct chunk scan, except on torchrun's rank 1, where it never returns (tests/test_ranks.py)."""
    if os.environ.get("RANK") == "1":
        time.sleep(3600)
    return torch_kernel(*args, **kwargs)


def takes_sigterm_over(*args, **kwargs):
    """slow_scan, whose first call sets SIGTERM's action in the C library to the default (terminate), as
    native code a kernel loads may (LLVM's one-shot handlers leave it so after one signal); Python still
    names its own handler."""
    if not _TAKEN:
        _TAKEN.append(True)
        ctypes.CDLL(None).signal(int(signal.SIGTERM), 0)  # SIG_DFL
    return slow_scan(*args, **kwargs)


_TAKEN: list[bool] = []
