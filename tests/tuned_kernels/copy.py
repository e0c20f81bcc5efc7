"""`copy(x)` copies a vector through an autotuned Triton kernel with two configs.

Under BLOCK=32 the tail mask is off by one element, so the last element is never written (it stays
NaN): a bug that only one config has.
"""

import torch
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 16}, num_warps=1), triton.Config({"BLOCK": 32}, num_warps=2)],
                 key=["n"])
@triton.jit
def _copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    limit = n - 1 if BLOCK == 32 else n  # the planted bug
    mask = offsets < limit
    tl.store(dst + offsets, tl.load(src + offsets, mask=mask), mask=mask)


def copy(x: torch.Tensor) -> torch.Tensor:
    out = torch.full_like(x, float("nan"))
    _copy_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, out, x.numel())
    return out
