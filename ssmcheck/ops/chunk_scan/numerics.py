"""Triton helpers shared by the chunk-scan stages: decay, matmul operands, program coordinates.

They carry the numerical choices (and the interpreter work-arounds of DESIGN §6)
in one place, so every stage rounds and guards the same way.
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e): exp(v) = exp2(v * LOG2E)


@triton.jit
def decay2(log2_decay, valid):
    """exp2 of a cumulative base-2 log-decay (difference) that is <= 0 in exact arithmetic.

    Masked entries get exp2(-inf) = 0 before any exp2 is taken, and fp32 rounding
    residue that made the exponent positive is clamped away, so this never
    overflows and never meets inf * 0. (In base 2: tiles of many decays take their
    logs scaled in fp64, before the split, which saves a multiply per element;
    on the GPU tl.exp is exp2 of its argument times log2(e) anyway.)
    """
    return tl.exp2(tl.where(valid, tl.minimum(log2_decay, 0.0), float("-inf")))


@triton.jit
def split(v):
    """fp64 -> (hi, lo) fp32 with hi + lo ~ v: differences of huge cumulative sums then keep
    their small values, (hi_a - hi_b) + (lo_a - lo_b), in fp32 tile arithmetic."""
    hi = v.to(tl.float32)
    return hi, (v - hi.to(tl.float64)).to(tl.float32)


@triton.jit
def operand(x, DTYPE: tl.constexpr):
    """A tl.dot operand holding x rounded to DTYPE (the matmul precision), to nearest even: what the tensor
    cores multiply. (In the interpreter, bf16 conversions and dots compute the GPU's values: the launchers
    mend Triton's interpreter first, core.runtime.mend_interpreter.)"""
    return x.to(DTYPE)


@triton.jit
def mma(a, b, acc):
    """acc + a @ b in fp32; fp32 operands multiply in IEEE fp32, never TF32."""
    if a.dtype == tl.float32:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def program_coords(pid, n0, n1, n2):
    """Program `pid` of a flat grid as (i0, i1, i2, rest): i0 (of n0) varies fastest, then i1, i2; rest slowest."""
    return pid % n0, (pid // n0) % n1, (pid // (n0 * n1)) % n2, pid // (n0 * n1 * n2)
