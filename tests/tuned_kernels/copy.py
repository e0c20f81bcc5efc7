"""`copy(x)` copies a vector through an autotuned Triton kernel with two configs.

Under BLOCK=32 the tail mask is off by one element, so the last element is never written (it stays
NaN): a bug that only one config has. BLOCK=32 is also slow (it reads its block again and again), so
a GPU's autotuner picks BLOCK=16 and the autotuner's pick passes, as on a machine whose pick hides a
config's bug.
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
    values = tl.load(src + offsets, mask=mask)
    if BLOCK == 32:
        for _ in range(256):  # volatile loads: the compiler may not drop them; max(v, v) is v
            values = tl.maximum(values, tl.load(src + offsets, mask=mask, volatile=True))
    tl.store(dst + offsets, values, mask=mask)


def copy(x: torch.Tensor) -> torch.Tensor:
    out = torch.full_like(x, float("nan"))
    _copy_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, out, x.numel())
    return out
