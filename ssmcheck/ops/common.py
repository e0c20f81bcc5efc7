"""What the chunk scan and the state update share in Triton: softplus."""

import triton
import triton.language as tl


@triton.jit
def log1p(u):
    # Accurate for tiny u too (Goldberg's trick): log(1+u) * u / ((1+u) - 1).
    w = 1.0 + u
    return tl.where(w == 1.0, u, tl.log(w) * (u / (w - 1.0)))


@triton.jit
def softplus(v):
    return tl.maximum(v, 0.0) + log1p(tl.exp(-tl.abs(v)))
