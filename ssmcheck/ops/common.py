"""What the chunk scan and the state update share: whether Triton interprets, and softplus in Triton."""

import os

import triton
import triton.language as tl


def interpreting() -> bool:
    """Whether Triton runs kernels through its interpreter: TRITON_INTERPRET read as Triton reads it
    (1, true, on, yes or y, in any case).

    What a kernel entry point's `interpret=None` stands for.
    """
    return os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes", "y")


@triton.jit
def log1p(u):
    # Accurate for tiny u too (Goldberg's trick): log(1+u) * u / ((1+u) - 1).
    w = 1.0 + u
    return tl.where(w == 1.0, u, tl.log(w) * (u / (w - 1.0)))


@triton.jit
def softplus(v):
    return tl.maximum(v, 0.0) + log1p(tl.exp(-tl.abs(v)))
