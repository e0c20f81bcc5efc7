"""A correct chunk scan that takes its time: for interrupting a sweep between cases (tests/test_ci_gate.py)."""

import time

from ssmcheck.scan.adapter import torch_kernel


def slow_scan(*args, **kwargs):
    time.sleep(0.4)
    return torch_kernel(*args, **kwargs)
