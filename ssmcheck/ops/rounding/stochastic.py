"""Rounding fp32 values into a storage dtype inside Triton kernels: to nearest, or stochastically.

Stochastic rounding (SR) of x between its neighbours a < x < b returns b with
probability (x - a) / (b - a). The software path is exact: it spends as many
random bits as the conversion drops, so the probability is never quantised.

* bf16 drops 16 bits everywhere (bf16 shares fp32's exponent range, so its
  subnormals are fp32 bit patterns with the low 16 bits clear): add 16 random
  bits to the magnitude's bit pattern and clear them. A carry into the
  exponent gives the next binade, and past the largest finite value, inf.
* fp16 drops 13 bits for normals, 14..23 bits in its subnormal range (the
  grid there is fixed at 2**-24), and for |x| < 2**-24 the whole value: the
  neighbours are 0 and 2**-24, and the fraction |x| / 2**-24 can need up to
  125 bits. That case compares four 32-bit Philox words with the fraction,
  most significant word first.
* Overflow follows the reference's convention: above the largest finite value
  the upper neighbour is 2**(emax+1) (65536 for fp16), which converts to inf.
  NaN and inf pass through.

Every rounded value is computed as an fp32 bit pattern that is exactly
representable in the target dtype; a bf16 result is its upper half, taken by
bitcast, because Triton's interpreter converts fp32 -> bf16 wrongly (it
truncates, and garbles fp32 subnormals).

Random bits come from Philox (`tl.randint4x`) keyed by the seed, with the
element index as the counter. Philox costs far more than a memory-bound
kernel's other arithmetic per element, so `stochastic_round_x4` shares one
call (four 32-bit words) among four elements, and runs the exact comparison
the tiniest fp16 values need only in programs that hold such values; into
bf16, which drops 16 bits everywhere, `stochastic_round_bf16_x8` shares one
call among eight elements, half a word each.

Hardware SR (`cvt.rs.{f16,bf16}x2.f32`) exists only on sm_100 and later;
`check_rounding` refuses it anywhere else with an explanation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ssmcheck.core.formats import DTYPES, ROUNDINGS
from ssmcheck.ops.common import interpreting

ROUNDING_IMPLS = ("software", "hardware")
HARDWARE_SR_CAPABILITY = (10, 0)
DEFAULT_PHILOX_ROUNDS = 10

_TRITON_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def triton_dtype(dtype: torch.dtype):
    """The Triton dtype of a storage dtype."""
    return _TRITON_DTYPES[dtype]


def hardware_sr_unavailable(interpret: bool | None = None) -> str | None:
    """Why hardware SR cannot run here (the interpreter, or a CUDA device below sm_100), or None when it can.

    `interpret`: whether kernels run through Triton's interpreter (None: as TRITON_INTERPRET says);
    otherwise the current CUDA device is asked.
    """
    if interpret is None:
        interpret = interpreting()
    need = f"sm_{HARDWARE_SR_CAPABILITY[0]}{HARDWARE_SR_CAPABILITY[1]}"
    if interpret:
        return (
            f"hardware stochastic rounding (PTX cvt.rs) needs an NVIDIA GPU of {need} or newer; "
            "the Triton interpreter has none: use rounding_impl='software'"
        )
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < HARDWARE_SR_CAPABILITY:
        return (
            f"hardware stochastic rounding (PTX cvt.rs) needs {need} or newer; this device is "
            f"{torch.cuda.get_device_name()} (sm_{major}{minor}): use rounding_impl='software'"
        )
    return None


def check_rounding(dtype: torch.dtype, rounding: str, seed: int, philox_rounds: int, rounding_impl: str, *,
                   interpret: bool | None = None) -> None:
    """Raise ValueError, with a one-line reason, for a combination no kernel here can honour.

    `interpret` is for hardware SR, which the interpreter cannot run (None: as TRITON_INTERPRET says).
    """
    if dtype not in DTYPES.values():
        raise ValueError(f"storage dtype {dtype} is not supported: use float32, float16 or bfloat16")
    if rounding not in ROUNDINGS:
        raise ValueError(f"unknown rounding {rounding!r}: use one of {', '.join(ROUNDINGS)}")
    if rounding_impl not in ROUNDING_IMPLS:
        raise ValueError(f"unknown rounding_impl {rounding_impl!r}: use one of {', '.join(ROUNDING_IMPLS)}")
    if rounding == "nearest":
        return
    if dtype == torch.float32:
        raise ValueError("stochastic rounding into a float32 state is meaningless (nothing is rounded): "
                         "use rounding='nearest' or a float16/bfloat16 state")
    if not isinstance(philox_rounds, int) or philox_rounds < 1:
        raise ValueError(f"philox_rounds must be a positive integer, got {philox_rounds!r}")
    if not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}")
    if rounding_impl == "hardware":
        reason = hardware_sr_unavailable(interpret=interpret)
        if reason is not None:
            raise ValueError(reason)


@triton.jit
def round_saturating(x, DTYPE: tl.constexpr, INTERPRET: tl.constexpr):
    """fp32 block -> DTYPE as round_nearest, but a finite value past DTYPE's largest finite value becomes
    that value (sign kept) instead of inf; inf and NaN pass through (core.formats.saturate says why).
    For outputs, whose fp32 results may lie beyond fp16's range while the arithmetic is still finite."""
    if DTYPE == tl.float32:
        return x
    else:
        if DTYPE == tl.float16:
            big = 65504.0
        else:
            big = 3.3895313892515355e38  # bf16's largest finite value, (2 - 2**-7) * 2**127
        # Comparisons, not tl.minimum/maximum: they leave NaN alone, and inf is compared away from them.
        finite_big = (x > big) & (x != float("inf"))
        finite_small = (x < -big) & (x != float("-inf"))
        return round_nearest(tl.where(finite_big, big, tl.where(finite_small, -big, x)), DTYPE, INTERPRET)


@triton.jit
def _bf16_from_upper_half(bits):
    """The bf16 whose bits are the upper half of fp32 bit pattern `bits` (exact, everywhere)."""
    return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def round_nearest(x, DTYPE: tl.constexpr, INTERPRET: tl.constexpr):
    """fp32 block -> DTYPE, round to nearest even (overflow to inf, NaN kept)."""
    if DTYPE == tl.float32:
        return x
    elif (DTYPE == tl.bfloat16) and INTERPRET:
        # The interpreter's own conversion truncates: round the bit pattern instead.
        bits = x.to(tl.uint32, bitcast=True)
        rounded = bits + (0x7FFF + ((bits >> 16) & 1))
        # Keep NaN a NaN in the upper half: set the quiet bit.
        return _bf16_from_upper_half(tl.where(x != x, bits | 0x00400000, rounded))
    else:
        return x.to(DTYPE)


@triton.jit
def _add_and_truncate(magnitude, r0, DTYPE: tl.constexpr):
    """|x|'s bits rounded up with probability (dropped part) / 2**dropped, by adding `dropped` random bits.

    Exact for every magnitude except fp16's below 2**-24 (see _round_tiny_fp16).
    """
    if DTYPE == tl.bfloat16:
        mask = 0xFFFF
    else:
        exponent = (magnitude >> 23).to(tl.int32) - 127
        # 13 bits for fp16 normals; one more per binade below 2**-14, where the grid stays 2**-24.
        dropped = tl.minimum(tl.maximum(-1 - exponent, 13), 23).to(tl.uint32)
        mask = (tl.full(magnitude.shape, 1, tl.uint32) << dropped) - 1
    return (magnitude + (r0 & mask)) & ~mask


@triton.jit
def _round_tiny_fp16(x, magnitude, rounded, r0, r1, r2, r3):
    """`rounded`, with fp16 magnitudes below 2**-24 replaced by their SR: 0 or 2**-24 (as fp32 bits).

    Up iff U < |x| / 2**-24 for U uniform on 128 bits, compared word by word
    (the fraction needs at most 125 bits; r1..r3 matter only below 2**-33).
    """
    tiny = magnitude < 0x33800000
    # Most significant word first; `tied` while the draw equals the fraction so far.
    t = tl.where(tiny, tl.abs(x) * 16777216.0, 0.0) * 4294967296.0
    word = tl.floor(t)
    up = r0 < word.to(tl.uint32)
    tied = r0 == word.to(tl.uint32)
    t = (t - word) * 4294967296.0
    word = tl.floor(t)
    up = up | (tied & (r1 < word.to(tl.uint32)))
    tied = tied & (r1 == word.to(tl.uint32))
    t = (t - word) * 4294967296.0
    word = tl.floor(t)
    up = up | (tied & (r2 < word.to(tl.uint32)))
    tied = tied & (r2 == word.to(tl.uint32))
    up = up | (tied & (r3 < ((t - word) * 4294967296.0).to(tl.uint32)))
    return tl.where(tiny, tl.where(up, 0x33800000, 0), rounded)


@triton.jit
def _finish(bits, rounded, DTYPE: tl.constexpr):
    """The DTYPE value of rounded magnitude bits with the sign of fp32 bits `bits`; NaN stays NaN."""
    if DTYPE == tl.float16:
        # The upper neighbour of the largest finite fp16 is 65536, stored as inf.
        rounded = tl.where(rounded >= 0x47800000, 0x7F800000, rounded)
    result = tl.where((bits & 0x7FFFFFFF) > 0x7F800000, bits | 0x00400000, (bits & 0x80000000) | rounded)
    if DTYPE == tl.bfloat16:
        return _bf16_from_upper_half(result)
    else:
        return result.to(tl.float32, bitcast=True).to(DTYPE)


@triton.jit
def _round_with_words(x, r0, r1, r2, r3, DTYPE: tl.constexpr):
    """Exact SR of an fp32 block into fp16/bf16 given four random 32-bit words per element."""
    bits = x.to(tl.uint32, bitcast=True)
    magnitude = bits & 0x7FFFFFFF
    rounded = _add_and_truncate(magnitude, r0, DTYPE)
    if DTYPE == tl.float16:
        rounded = _round_tiny_fp16(x, magnitude, rounded, r0, r1, r2, r3)
    return _finish(bits, rounded, DTYPE)


@triton.jit
def stochastic_round(x, seed, offsets, DTYPE: tl.constexpr, N_ROUNDS: tl.constexpr):
    """fp32 block -> DTYPE by exact software SR; one Philox call keyed by `seed` per element, counter `offsets`."""
    r0, r1, r2, r3 = tl.randint4x(seed, offsets, n_rounds=N_ROUNDS)
    return _round_with_words(x, r0, r1, r2, r3, DTYPE)


@triton.jit
def _stochastic_round_hardware(x, words, DTYPE: tl.constexpr):
    # The sm_100+ instruction cvt.rs, one random word per pair of elements. Callers
    # have passed `check_rounding`: this PTX does not assemble below sm_100.
    if DTYPE == tl.float16:
        CVT: tl.constexpr = "cvt.rs.f16x2.f32"
    else:
        CVT: tl.constexpr = "cvt.rs.bf16x2.f32"
    return tl.inline_asm_elementwise(
        # d = {hi: convert(a), lo: convert(b)}: the pair's first element goes in the low half.
        asm=CVT + " $0, $2, $1, $3;",
        constraints="=r,r,r,r,r",
        args=[x, words],
        dtype=DTYPE.value,
        is_pure=True,
        pack=2,
    )


@triton.jit
def stochastic_round_x4(x0, x1, x2, x3, seed, counters, DTYPE: tl.constexpr, N_ROUNDS: tl.constexpr,
                        HARDWARE: tl.constexpr):
    """SR of four same-shaped fp32 tiles into DTYPE with one Philox call per position.

    Tile k takes word k of Philox(seed, counters). That word decides every
    value except fp16 values below 2**-24, whose exact comparison reads all
    four words (its own first); only a program holding such a value runs
    that comparison, so the common program pays one Philox call per four
    elements and a few integer operations per element. HARDWARE uses cvt.rs
    (sm_100+ only).
    """
    # (A no-op that makes the compiler lay the Philox arithmetic out like x0,
    # instead of computing it in another layout and shuffling it through shared memory.)
    counters = tl.where(x0 == x0, counters, 0)
    r0, r1, r2, r3 = tl.randint4x(seed, counters, n_rounds=N_ROUNDS)
    if HARDWARE:
        y0 = _stochastic_round_hardware(x0, r0, DTYPE)
        y1 = _stochastic_round_hardware(x1, r1, DTYPE)
        y2 = _stochastic_round_hardware(x2, r2, DTYPE)
        y3 = _stochastic_round_hardware(x3, r3, DTYPE)
    else:
        b0 = x0.to(tl.uint32, bitcast=True)
        b1 = x1.to(tl.uint32, bitcast=True)
        b2 = x2.to(tl.uint32, bitcast=True)
        b3 = x3.to(tl.uint32, bitcast=True)
        m0 = b0 & 0x7FFFFFFF
        m1 = b1 & 0x7FFFFFFF
        m2 = b2 & 0x7FFFFFFF
        m3 = b3 & 0x7FFFFFFF
        y0 = _add_and_truncate(m0, r0, DTYPE)
        y1 = _add_and_truncate(m1, r1, DTYPE)
        y2 = _add_and_truncate(m2, r2, DTYPE)
        y3 = _add_and_truncate(m3, r3, DTYPE)
        if DTYPE == tl.float16:
            # Any nonzero magnitude below 2**-24? (m - 1 wraps zero to the largest uint32.)
            smallest = tl.min(tl.minimum(tl.minimum(m0 - 1, m1 - 1), tl.minimum(m2 - 1, m3 - 1)))
            if smallest < 0x337FFFFF:
                # A tiny value's own word leads; the position's other three words supply
                # the lower 96 bits (read only when the leading words tie: p = 2**-32).
                y0 = _round_tiny_fp16(x0, m0, y0, r0, r1, r2, r3)
                y1 = _round_tiny_fp16(x1, m1, y1, r1, r2, r3, r0)
                y2 = _round_tiny_fp16(x2, m2, y2, r2, r3, r0, r1)
                y3 = _round_tiny_fp16(x3, m3, y3, r3, r0, r1, r2)
        y0 = _finish(b0, y0, DTYPE)
        y1 = _finish(b1, y1, DTYPE)
        y2 = _finish(b2, y2, DTYPE)
        y3 = _finish(b3, y3, DTYPE)
    return y0, y1, y2, y3


@triton.jit
def stochastic_round_bf16_x8(x0, x1, x2, x3, x4, x5, x6, x7, seed, counters, N_ROUNDS: tl.constexpr):
    """Software SR of eight same-shaped fp32 tiles into bf16 with one Philox call per position.

    bf16 drops 16 bits everywhere, so an element needs only 16 random bits: tiles 0-3 take the
    low halves of words 0-3 of Philox(seed, counters), tiles 4-7 their high halves
    (`_add_and_truncate` reads only the low 16 bits). One Philox call per eight elements:
    1.58-1.65x round to nearest at batch 256 on the H200, against 1.93x with a call per four
    (benchmarks/RESULTS.md). fp16 does not share a word this way: its subnormals
    drop up to 23 bits and its tiniest values need 128, and the branch that gives those programs
    whole words made the common fp16 program slower, not faster (3.58x against 2.56x on the H200).
    Nor did 16-bit draws for every fp16 element with exact tie-breaking (where the 16 bits equal a
    longer fraction's top 16, or below 2**-24, a second Philox stream decides): one branch over the
    eight tiles spilled 1 KiB a thread (11.8x), a branch per tile at one row per group ran 4.01x
    (commits 4f6f181, 9e77eff, reverted). fp16 keeps `stochastic_round_x4`.
    """
    # (A no-op that makes the compiler lay the Philox arithmetic out like x0; see stochastic_round_x4.)
    counters = tl.where(x0 == x0, counters, 0)
    r0, r1, r2, r3 = tl.randint4x(seed, counters, n_rounds=N_ROUNDS)
    b0 = x0.to(tl.uint32, bitcast=True)
    b1 = x1.to(tl.uint32, bitcast=True)
    b2 = x2.to(tl.uint32, bitcast=True)
    b3 = x3.to(tl.uint32, bitcast=True)
    b4 = x4.to(tl.uint32, bitcast=True)
    b5 = x5.to(tl.uint32, bitcast=True)
    b6 = x6.to(tl.uint32, bitcast=True)
    b7 = x7.to(tl.uint32, bitcast=True)
    y0 = _finish(b0, _add_and_truncate(b0 & 0x7FFFFFFF, r0, tl.bfloat16), tl.bfloat16)
    y1 = _finish(b1, _add_and_truncate(b1 & 0x7FFFFFFF, r1, tl.bfloat16), tl.bfloat16)
    y2 = _finish(b2, _add_and_truncate(b2 & 0x7FFFFFFF, r2, tl.bfloat16), tl.bfloat16)
    y3 = _finish(b3, _add_and_truncate(b3 & 0x7FFFFFFF, r3, tl.bfloat16), tl.bfloat16)
    y4 = _finish(b4, _add_and_truncate(b4 & 0x7FFFFFFF, r0 >> 16, tl.bfloat16), tl.bfloat16)
    y5 = _finish(b5, _add_and_truncate(b5 & 0x7FFFFFFF, r1 >> 16, tl.bfloat16), tl.bfloat16)
    y6 = _finish(b6, _add_and_truncate(b6 & 0x7FFFFFFF, r2 >> 16, tl.bfloat16), tl.bfloat16)
    y7 = _finish(b7, _add_and_truncate(b7 & 0x7FFFFFFF, r3 >> 16, tl.bfloat16), tl.bfloat16)
    return y0, y1, y2, y3, y4, y5, y6, y7


def shared_parts(dtype: torch.dtype, rounding_impl: str) -> int:
    """How many elements share one Philox call (one per part, or row group): 8 for software SR into bf16
    (`stochastic_round_bf16_x8`), else 4 (`stochastic_round_x4`)."""
    return 8 if dtype == torch.bfloat16 and rounding_impl == "software" else 4


@triton.jit
def round_to_storage(x, seed, offsets, DTYPE: tl.constexpr, STOCHASTIC: tl.constexpr,
                     N_ROUNDS: tl.constexpr, INTERPRET: tl.constexpr):
    """fp32 block -> DTYPE: unchanged for fp32, else software SR or round to nearest even."""
    if DTYPE == tl.float32:
        return x
    elif STOCHASTIC:
        return stochastic_round(x, seed, offsets, DTYPE, N_ROUNDS)
    else:
        return round_nearest(x, DTYPE, INTERPRET)


# A new seed every step must not mean a new compilation.
@triton.jit(do_not_specialize=["seed"])
def _stochastic_round_kernel(x_ptr, out_ptr, n, seed, DTYPE: tl.constexpr, N_ROUNDS: tl.constexpr,
                             HARDWARE: tl.constexpr, PARTS: tl.constexpr, Q: tl.constexpr):
    # A block of PARTS * Q consecutive elements in PARTS parts of Q sharing Philox calls, as the state
    # update's row groups share them.
    block = tl.program_id(0).to(tl.int64)
    q = tl.arange(0, Q)
    base = block * PARTS * Q + q
    x0 = tl.load(x_ptr + base, mask=base < n, other=0.0)
    x1 = tl.load(x_ptr + base + Q, mask=base + Q < n, other=0.0)
    x2 = tl.load(x_ptr + base + 2 * Q, mask=base + 2 * Q < n, other=0.0)
    x3 = tl.load(x_ptr + base + 3 * Q, mask=base + 3 * Q < n, other=0.0)
    if PARTS == 8:
        x4 = tl.load(x_ptr + base + 4 * Q, mask=base + 4 * Q < n, other=0.0)
        x5 = tl.load(x_ptr + base + 5 * Q, mask=base + 5 * Q < n, other=0.0)
        x6 = tl.load(x_ptr + base + 6 * Q, mask=base + 6 * Q < n, other=0.0)
        x7 = tl.load(x_ptr + base + 7 * Q, mask=base + 7 * Q < n, other=0.0)
        y0, y1, y2, y3, y4, y5, y6, y7 = stochastic_round_bf16_x8(x0, x1, x2, x3, x4, x5, x6, x7, seed,
                                                                  block * Q + q, N_ROUNDS)
        tl.store(out_ptr + base + 4 * Q, y4, mask=base + 4 * Q < n)
        tl.store(out_ptr + base + 5 * Q, y5, mask=base + 5 * Q < n)
        tl.store(out_ptr + base + 6 * Q, y6, mask=base + 6 * Q < n)
        tl.store(out_ptr + base + 7 * Q, y7, mask=base + 7 * Q < n)
    else:
        y0, y1, y2, y3 = stochastic_round_x4(x0, x1, x2, x3, seed, block * Q + q, DTYPE, N_ROUNDS, HARDWARE)
    tl.store(out_ptr + base, y0, mask=base < n)
    tl.store(out_ptr + base + Q, y1, mask=base + Q < n)
    tl.store(out_ptr + base + 2 * Q, y2, mask=base + 2 * Q < n)
    tl.store(out_ptr + base + 3 * Q, y3, mask=base + 3 * Q < n)


def stochastic_round_tensor(x: torch.Tensor, dtype: torch.dtype, seed: int, philox_rounds: int = DEFAULT_PHILOX_ROUNDS,
                            rounding_impl: str = "software", *, interpret: bool | None = None) -> torch.Tensor:
    """Stochastically round every element of an fp32 tensor into `dtype` (float16 or bfloat16).

    Blocks of 4096 elements (row-major) are split in parts that share Philox calls (`shared_parts`:
    eight for software SR into bf16, else four), as the state update's row groups do.
    `interpret`: whether Triton runs the kernel through its interpreter (None: as TRITON_INTERPRET says).
    """
    if x.dtype != torch.float32:
        raise ValueError(f"stochastic_round_tensor takes a float32 tensor, got {x.dtype}")
    check_rounding(dtype, "stochastic", seed, philox_rounds, rounding_impl, interpret=interpret)
    x = x.contiguous()
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    n = x.numel()
    if n == 0:
        return out
    block, parts = 4096, shared_parts(dtype, rounding_impl)
    _stochastic_round_kernel[(triton.cdiv(n, block),)](x, out, n, seed, DTYPE=triton_dtype(dtype),
                                                       N_ROUNDS=philox_rounds, HARDWARE=rounding_impl == "hardware",
                                                       PARTS=parts, Q=block // parts)
    return out
