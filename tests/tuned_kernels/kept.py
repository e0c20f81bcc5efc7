"""A chunk scan (scan.py's) whose copy is launched as vLLM 0.33's launcher launches its autotuned kernels: the
autotuner's choice is kept per key at a key's first launch, and later launches of that key call the function
with the kept config directly, past the autotuner. A config pinned after the first (--configs all) never runs."""

import triton

from ssmcheck.scan.adapter import torch_kernel
from tests.tuned_kernels.copy import _copy_kernel

KEPT: dict = {}


def _launch(kernel, grid, **kwargs):
    key = (kwargs["n"],)
    config = KEPT.get(key)
    if config is None:
        kernel[grid](**kwargs)
        KEPT[key] = kernel.best_config
        return
    kernel.fn[grid](**kwargs, **config.all_kwargs())


def chunk_scan(x, dt, A, B, C, chunk_size, **kwargs):
    import torch

    result = torch_kernel(x, dt, A, B, C, chunk_size, **kwargs)
    y, *states = result if isinstance(result, tuple) else (result,)
    flat = y.flatten().float()
    out = torch.full_like(flat, float("nan"))
    _launch(_copy_kernel, lambda meta: (triton.cdiv(flat.numel(), meta["BLOCK"]),), src=flat, dst=out, n=flat.numel())
    copied = out.view_as(y).to(y.dtype)
    return (copied, *states) if states else copied
