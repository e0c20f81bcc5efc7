"""The same-precision baseline chunk scan: the SSD form in the kernel's dtype with the
peers' usual fp32 accumulation choices, i.e. the error a straightforward
implementation makes, which the tolerance rule (DESIGN §3) scales.

Keyword options give the reduced-precision variants a failing kernel's error is
compared with (scan.precision): matmul operands at fewer bits (TF32), and matmul
accumulation in fp16. State storage is `state_dtype`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ssmcheck.ops.naive import NO_DT_LIMIT
from ssmcheck.ops.rounding.naive import round_to, stochastic_draws

from .naive import Arithmetic, ScanOutput, SSDStream, scan_ssd

# TF32 (tensor-core "fp32" matmuls): fp32's exponent range, 10 fraction bits.
TF32_BITS = 10
# Products summed exactly (in fp32) per step before an fp16/bf16 accumulator rounds: one k-step of an mma.
ACCUMULATION_STEP = 16


def truncate_mantissa(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Float32 `x` with its fraction cut to `bits` bits (0..23), i.e. rounded toward zero, fp32's
    exponent range kept: the 23 - bits low bits of the pattern are cleared.

    This is how tensor cores take fp32 registers as TF32 operands (bits=10): Triton's fp32 tl.dot
    on an H200 matched operands truncated this way to 1e-7 relative, and missed operands rounded
    to nearest by 1e-3 (the project's device notes, 2026-11-30). Truncation errs twice as much
    as rounding to nearest and always toward zero, so its products are biased low by about
    2**-10 and a TF32 matmul's error does not average out. Subnormals keep fp32's spacing scaled
    by 2**(23 - bits); NaN and inf pass through (clearing a NaN's low bits could make it inf);
    the sign is kept (-0.0 too).
    """
    if x.dtype != torch.float32:
        raise ValueError(f"truncate_mantissa takes float32, got {x.dtype}")
    if not 0 <= bits <= 23:
        raise ValueError(f"bits must be in 0..23 (float32 has 23 fraction bits), got {bits}")
    drop = 23 - bits
    if drop == 0:
        return x.clone()
    truncated = (x.contiguous().view(torch.int32) & ~((1 << drop) - 1)).view(torch.float32)
    return torch.where(torch.isfinite(x), truncated, x)


def matmul_accumulating(a: torch.Tensor, b: torch.Tensor, accumulate: torch.dtype,
                        step: int = ACCUMULATION_STEP) -> torch.Tensor:
    """a @ b (float32) with the running sum held in `accumulate`: each `step` products along k
    are summed in float32, added to the accumulator and rounded into `accumulate` (so the
    result is rounded at every step, as an fp16 mma accumulator is). Returned in float32."""
    acc = None
    for k in range(0, a.shape[-1], step):
        part = torch.matmul(a[..., k : k + step], b[..., k : k + step, :])
        acc = part.to(accumulate) if acc is None else (acc.to(torch.float32) + part).to(accumulate)
    if acc is None:  # k = 0: an empty sum
        return torch.matmul(a, b)
    return acc.to(torch.float32)


@dataclass(frozen=True)
class _ReducedArithmetic(Arithmetic):
    """The baseline's arithmetic with narrower matmuls: operands rounded to x.dtype (`operand`) and
    then truncated to `operand_bits` fraction bits (None: not), products summed in float32 when `compute`
    is float32, else by `matmul_accumulating` into `compute` (fp16/bf16 accumulation)."""

    operand_bits: int | None = None

    def _operand(self, t: torch.Tensor) -> torch.Tensor:
        t = t.to(self.operand).to(torch.float32)
        return t if self.operand_bits is None else truncate_mantissa(t, self.operand_bits)

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a, b = self._operand(a), self._operand(b)
        if self.compute == torch.float32:
            return torch.matmul(a, b)
        return matmul_accumulating(a, b, self.compute).to(self.compute)


def scan_baseline(
    x, dt, A, B, C, chunk_size, *, D=None, z=None, dt_bias=None, initial_states=None, cu_seqlens=None,
    dt_softplus=False, dt_limit=NO_DT_LIMIT, state_dtype=torch.float32, rounding="nearest", seed=0,
    matmul_operand_bits: int | None = None, accumulate: torch.dtype = torch.float32, record_stages: bool = False,
    state_weights: str = "B",
) -> ScanOutput:
    """The SSD form as a straightforward implementation in x.dtype computes it.

    dt and the cumulative log-decays in fp32 (differences clamped at 0 and masked
    before exp); every matmul operand rounded to x.dtype, products accumulated in
    fp32; states passed in fp32 and stored in state_dtype (rounded in `rounding`
    mode, stochastic draws from a generator seeded with `seed`); the stored
    incoming state rounded to x.dtype before C·state; y returned in x.dtype (saturated there:
    core.formats.saturate),
    states in state_dtype. Stochastic rounding into an fp32 state rounds nothing.
    Inputs and results as scan_recurrent's (naive.py).

    Reduced-precision variants (defaults: none, the above exactly):
    - matmul_operand_bits: every matmul operand, after its rounding to x.dtype, is
      truncated to this many fraction bits (toward zero, fp32's exponent range;
      TF32_BITS = 10 is TF32 as tensor cores read fp32 operands, truncate_mantissa). The result has min(bits, x.dtype's) bits: for
      fp16 (10) or bf16 (7) inputs, 10 bits change nothing. Emulated the same way on
      every device, so it does not depend on torch's allow_tf32 flags.
    - accumulate: the dtype everything is accumulated and computed in: float16 (or
      bfloat16) holds each matmul's running sum, rounded every ACCUMULATION_STEP
      products along k (matmul_accumulating: the same on every device, whatever
      cuBLAS's reduced-precision reductions do), and also does the elementwise work:
      dt, the cumulative log-decays and the decays, the state passed from chunk to
      chunk, D·x and the gate. That is a kernel computing in fp16 throughout; its
      cumulative sums of log-decays dominate its error (about 10x the fp16 baseline's
      at chunk 256). States are still stored in state_dtype.
    - state_weights: "B" (default) rounds B scaled by the tokens' weights in a chunk's state matmul, as
      mamba_ssm's and vLLM's kernels do; "x" rounds x scaled instead, as ssmcheck's own kernel does. At a few
      tokens a state the two roundings' errors can differ by more than 2x by chance (tests/test_chunk_scan.py).
    With `record_stages`, ScanOutput.stages holds the SSD form's intermediates (naive._ssd).
    """
    arith = _arithmetic(x, state_dtype, rounding, seed, matmul_operand_bits, accumulate, state_weights)
    return scan_ssd(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus,
                    dt_limit, arith, record_stages, y_dtype=x.dtype)


def baseline_stream(
    x, dt, A, B, C, chunk_size, *, D=None, z=None, dt_bias=None, initial_states=None, cu_seqlens=None,
    dt_softplus=False, dt_limit=NO_DT_LIMIT, state_dtype=torch.float32, rounding="nearest", seed=0,
    matmul_operand_bits: int | None = None, accumulate: torch.dtype = torch.float32,
) -> SSDStream:
    """`scan_baseline` one segment at a time (naive.SSDStream): the same figures, bit for bit."""
    arith = _arithmetic(x, state_dtype, rounding, seed, matmul_operand_bits, accumulate)
    return SSDStream(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit,
                     arith, y_dtype=x.dtype)


def _arithmetic(x, state_dtype, rounding, seed, matmul_operand_bits, accumulate, state_weights="B") -> Arithmetic:
    generator = torch.Generator(device=x.device).manual_seed(seed)

    def store_state(s, uniform=None):
        return round_to(s.to(torch.float32), state_dtype, rounding, generator, uniform)

    def state_draws(shape):  # what round_to draws for one state
        return stochastic_draws(shape, generator, x.device)

    draws = state_draws if rounding == "stochastic" and state_dtype != torch.float32 else None
    if matmul_operand_bits is None and accumulate == torch.float32:
        return Arithmetic(torch.float32, x.dtype, store_state=store_state, exact_segments=False,
                          state_weights=state_weights, state_draws=draws)
    if accumulate not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"accumulate must be float32, float16 or bfloat16, got {accumulate}")
    return _ReducedArithmetic(accumulate, x.dtype, store_state=store_state, exact_segments=False,
                              state_weights=state_weights, state_draws=draws, operand_bits=matmul_operand_bits)
