"""A chunk scan (the torch baseline) whose output passes through the autotuned copy of copy.py: correct
under the copy's first config, missing the last element of y under its second (BLOCK=32)."""

from ssmcheck.scan.adapter import torch_kernel
from tests.tuned_kernels.copy import copy


def chunk_scan(x, dt, A, B, C, chunk_size, **kwargs):
    result = torch_kernel(x, dt, A, B, C, chunk_size, **kwargs)
    y, *states = result if isinstance(result, tuple) else (result,)  # y alone without the return flags
    copied = copy(y.flatten().float()).view_as(y).to(y.dtype)
    return (copied, *states) if states else copied
