"""A correct chunk scan that takes its time: for interrupting a sweep between cases (tests/test_ci_gate.py)."""

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
