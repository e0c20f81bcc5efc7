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
bitcast (the pattern is already the rounded value; a conversion would round it
again).

Random bits come from Philox (`tl.randint4x`) keyed by the seed, with the
element index as the counter. Philox costs far more than a memory-bound
kernel's other arithmetic per element, so `stochastic_round_pairs` gives each
element 16 bits, one call per eight elements: exact into bf16, and into fp16
wherever the 16 bits decide. fp16 normals take a fixed 13-bit field, as bf16
does; only a tile holding a value below 2**-14 pays for the variable one. The
rare tile where the 16 bits do not decide (a tie below 2**-17, or a value
below 2**-24) is rounded again by `stochastic_round_exact`, each draw
continued from a second stream; a NaN stays NaN by a select.

Hardware SR (`cvt.rs.{f16,bf16}x2.f32`) exists only on sm_100 and later;
`check_rounding` refuses it anywhere else with an explanation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ssmcheck.core.formats import DTYPES, ROUNDINGS
from ssmcheck.ops import interpreting
from ssmcheck.ops.host import cdiv

ROUNDING_IMPLS = ("software", "hardware")
HARDWARE_SR_CAPABILITY = (10, 0)
# Philox4x32 with 7 rounds is the fewest that pass TestU01's BigCrush (Salmon et al., "Parallel random
# numbers: as easy as 1, 2, 3", SC 2011, who add 3 as a safety margin in their default of 10). The state
# update's SR into bf16 at batch 256 on the H200: 1.22x round to nearest at 7, 1.37x at 10
# (benchmarks/RESULTS.md); the SR tests pass at both. `philox_rounds` / `--philox-rounds 10` restores the margin.
DEFAULT_PHILOX_ROUNDS = 7

# fp16's smallest normal magnitude: below it the grid stays 2**-24 and fp16 drops more than 13 bits.
FP16_MIN_NORMAL = tl.constexpr(2.0**-14)
FP16_MIN_NORMAL_DOUBLED = tl.constexpr(0x38800000 << 1)  # its fp32 bit pattern shifted left by one
# Below 2**-17 the 16 bits may tie (the draw needs more); below 2**-24, fp16's smallest subnormal, they never decide.
FP16_TIES_BELOW_DOUBLED = tl.constexpr(0x37000000 << 1)  # 2**-17's pattern shifted left by one
FP16_MIN_SUBNORMAL_DOUBLED = tl.constexpr(0x33800000 << 1)  # 2**-24's

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
    check_seed(seed)
    if rounding_impl == "hardware":
        reason = hardware_sr_unavailable(interpret=interpret)
        if reason is not None:
            raise ValueError(reason)


def check_seed(seed) -> None:
    """Raise ValueError unless `seed` is an integer Philox key in [0, 2**63)."""
    if not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}")


@triton.jit
def round_saturating(x, DTYPE: tl.constexpr):
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
        return round_nearest(tl.where(finite_big, big, tl.where(finite_small, -big, x)), DTYPE)


@triton.jit
def _bf16_from_upper_half(bits):
    """The bf16 whose bits are the upper half of fp32 bit pattern `bits` (exact, everywhere)."""
    return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def round_nearest(x, DTYPE: tl.constexpr):
    """fp32 block -> DTYPE, round to nearest even (overflow to inf, NaN kept). (In the interpreter the
    launchers mend Triton's bf16 conversion first: core.runtime.mend_interpreter.)"""
    if DTYPE == tl.float32:
        return x
    else:
        return x.to(DTYPE)


@triton.jit
def _add_and_truncate(bits, r0, DTYPE: tl.constexpr):
    """fp32 bit pattern `bits` rounded away from zero with probability (dropped part) / 2**dropped, by adding
    `dropped` random bits (the low bits of r0) to the pattern and, into fp16, clearing them; into bf16 the
    result's upper half is the value, its lower half is left as it is. The sign bit is never reached: the
    largest finite pattern plus 23 bits is at most NaN's, and NaN is `_finish`'s to keep.

    Exact for every value except fp16's below 2**-24 (see _round_tiny_fp16).
    """
    if DTYPE == tl.bfloat16:
        return bits + (r0 & 0xFFFF)
    else:
        exponent = ((bits >> 23) & 0xFF).to(tl.int32)  # biased
        # 13 bits for fp16 normals; one more per binade below 2**-14, where the grid stays 2**-24.
        dropped = tl.minimum(tl.maximum(126 - exponent, 13), 23).to(tl.uint32)
        mask = (tl.full(bits.shape, 1, tl.uint32) << dropped) - 1
        return (bits + (r0 & mask)) & ~mask


@triton.jit
def _round_tiny_fp16(x, bits, rounded, r0, r1, r2, r3):
    """`rounded`, with fp16 magnitudes below 2**-24 replaced by their SR: +-0 or +-2**-24 (as fp32 bits).

    Up iff U < |x| / 2**-24 for U uniform on 128 bits, compared word by word
    (the fraction needs at most 125 bits; r1..r3 matter only below 2**-33).
    """
    tiny = (bits & 0x7FFFFFFF) < 0x33800000
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
    return tl.where(tiny, tl.where(up, 0x33800000, 0) | (bits & 0x80000000), rounded)


@triton.jit
def _finish(x, rounded, DTYPE: tl.constexpr):
    """The DTYPE value of `rounded` (fp32 bits from `_add_and_truncate`) for fp32 x; NaN stays NaN."""
    if DTYPE == tl.bfloat16:
        # A NaN's pattern plus random bits may be anything: keep x's, its quiet bit set so that the upper
        # half is NaN too.
        return _bf16_from_upper_half(tl.where(x != x, x.to(tl.uint32, bitcast=True) | 0x00400000, rounded))
    else:
        # Exactly representable, or at least 65536 (the upper neighbour of the largest finite fp16), which
        # converts to inf.
        return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True)).to(DTYPE)


@triton.jit
def _round_with_words(x, r0, r1, r2, r3, DTYPE: tl.constexpr):
    """Exact SR of an fp32 block into fp16/bf16 given four random 32-bit words per element."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = _add_and_truncate(bits, r0, DTYPE)
    if DTYPE == tl.float16:
        rounded = _round_tiny_fp16(x, bits, rounded, r0, r1, r2, r3)
    return _finish(x, rounded, DTYPE)


@triton.jit
def stochastic_round(x, seed, offsets, DTYPE: tl.constexpr, N_ROUNDS: tl.constexpr):
    """fp32 block -> DTYPE by exact software SR; one Philox call keyed by `seed` per element, counter `offsets`."""
    r0, r1, r2, r3 = tl.randint4x(seed, offsets, n_rounds=N_ROUNDS)
    return _round_with_words(x, r0, r1, r2, r3, DTYPE)


@triton.jit
def stochastic_round_hardware(x, words, DTYPE: tl.constexpr):
    """SR of an fp32 tile into DTYPE with cvt.rs (sm_100+), random words shaped like x: the instruction reads
    one per pair of elements. Callers have passed `check_rounding`: this PTX does not assemble below sm_100."""
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
def shared_words(seed, counters, like, N_ROUNDS: tl.constexpr):
    """The four 32-bit words of Philox(seed, counters), to be shared by several tiles shaped like `like`.

    (Where `like` is NaN the counter is 0 instead; a NaN stays NaN whatever the bits. This no-op makes the
    compiler lay the Philox arithmetic out like `like` instead of computing it in another layout and
    shuffling it through shared memory.)
    """
    return tl.randint4x(seed, tl.where(like == like, counters, 0), n_rounds=N_ROUNDS)


@triton.jit
def _pairs(x):
    """Tile (R, N) -> its even and its odd columns, (R, N // 2) each."""
    return tl.split(tl.reshape(x, (x.shape[0], x.shape[1] // 2, 2)))


@triton.jit
def stochastic_round_pairs(x, words, DTYPE: tl.constexpr):
    """Software SR of an fp32 tile (R, N) into fp16/bf16 with 16 random bits an element: elements (r, 2j)
    and (r, 2j + 1) take the low and the high half of words[r, j] (R, N // 2). Returns (rounded, redo).

    Exact into bf16, which drops 16 bits everywhere. fp16 drops 13 bits from its normals (and in its
    overflow range): the common case, rounded like bf16 with a fixed field, by the top 13 of the 16 bits.
    A NaN stays NaN (a select in the common case). A tile holding a nonzero magnitude below 2**-14 takes
    a branch that rounds those elements on fp16's fixed subnormal grid, 2**-24, with all 16 bits, which
    decide alone down to 2**-17. Below that the result is still exact unless the rest of the draw could
    change it (a tie: the 16 bits plus the fraction's top 16 are all ones, probability 2**-16) or the
    value is below 2**-24. `redo` says whether the tile holds such an element: the caller must then round
    the whole tile again with `stochastic_round_exact` and the same `words`, which continues each draw from
    a second stream.
    In every path the 16 bits are the top of the element's draw over the bits fp16 drops, so an element's
    result is the same function of its random bits whichever path rounds it: exact SR. The redo needs the
    unrounded values, so a kernel may do it after the rest of its work, from memory, holding no registers
    through the common path.
    """
    even, odd = _pairs(x)
    even_bits = even.to(tl.uint32, bitcast=True)
    odd_bits = odd.to(tl.uint32, bitcast=True)
    redo = False
    if DTYPE == tl.float16:
        # The smallest nonzero magnitude's bits doubled (the sign shifted out) less 2, in one unsigned min: zero
        # wraps to the top, NaN and inf lie above every finite value. It alone says which branch a tile takes, and
        # whether it holds a value below 2**-24; NaN is kept by a select, element by element, in every branch (a
        # reduction of its compare cost 35 more SASS instructions in the state update). Both branches round the
        # normals: computed before the branch, they would be live through it (the state update: 93 registers, not
        # 92, and 5% slower).
        smallest = tl.min((x.to(tl.uint32, bitcast=True) << 1) - 2)
        if smallest < FP16_MIN_NORMAL_DOUBLED - 2:
            even_out, even_tie = _fp16_below_normal(even, even_bits, _fp16_normal(even_bits, words), words)
            odd_out, odd_tie = _fp16_below_normal(odd, odd_bits, _fp16_normal(odd_bits, words >> 16), words >> 16)
            # Ties and values below 2**-24 need a nonzero magnitude below 2**-17: a tile without one (most tiles that
            # take this branch) has nothing to redo, and skips the ties' reduction.
            if smallest < FP16_TIES_BELOW_DOUBLED - 2:
                redo = (smallest < FP16_MIN_SUBNORMAL_DOUBLED - 2) | (tl.max((even_tie | odd_tie).to(tl.int32)) != 0)
        else:
            even_out = tl.where(even != even, even.to(tl.float16), _fp16_normal(even_bits, words))
            odd_out = tl.where(odd != odd, odd.to(tl.float16), _fp16_normal(odd_bits, words >> 16))
    else:
        even_out = _finish(even, _add_and_truncate(even_bits, words, DTYPE), DTYPE)
        odd_out = _finish(odd, _add_and_truncate(odd_bits, words >> 16, DTYPE), DTYPE)
    return tl.reshape(tl.join(even_out, odd_out), x.shape), redo


@triton.jit
def _fp16_normal(bits, r16):
    """fp32 bits (|x| >= 2**-14, or inf) into fp16 by the top 13 of r16's low 16 bits: added to the 13 bits
    fp16 drops and cleared. Exactly representable then, or at least 65536 (the upper neighbour of fp16's
    largest finite value), which converts to inf. (The 13 bits as `(r16 << 16) >> 19`: a shift and a shift-add
    on sm_90, where `(r16 >> 3) & 0x1FFF` took a shift, a bit-field extend and an add.)"""
    return ((bits + ((r16 << 16) >> 19)) & 0xFFFFE000).to(tl.float32, bitcast=True).to(tl.float16)


@triton.jit
def _fp16_below_normal(x, bits, normal, r16):
    """(fp16 tile, tie): `normal` (`_fp16_normal`'s result) where |x| >= 2**-14, NaN where x is NaN, elsewhere x
    rounded on fp16's subnormal grid 2**-24 by r16's low 16 bits as the top of the draw. `tie` where that may not
    be the exact result below 2**-17, the rest of the draw deciding; below 2**-24 it never is (the caller knows
    that from the tile's smallest magnitude)."""
    # |x| in units of 2**-40, 16 bits below the grid: exact from 2**-17 up, truncated below (where the
    # cut-off bits make a tie possible). Clamped first: the conversion must not overflow.
    scaled = (tl.minimum(tl.abs(x), FP16_MIN_NORMAL) * 1099511627776.0).to(tl.uint32)
    drawn = scaled + (r16 & 0xFFFF)
    # Up to 1024 units of 2**-24: an fp16 subnormal's bit pattern, or 2**-14's.
    rounded = ((drawn >> 16) | ((bits >> 16) & 0x8000)).to(tl.uint16).to(tl.float16, bitcast=True)
    tie = (tl.abs(x) < 0.00000762939453125) & ((drawn & 0xFFFF) == 0xFFFF)
    # NaN compares false: `normal`, whose added bits may have made it inf, then NaN again by the outer select.
    return tl.where(x != x, x.to(tl.float16), tl.where(tl.abs(x) < FP16_MIN_NORMAL, rounded, normal)), tie


@triton.jit
def _fp16_draw(bits, r16):
    """(d, the draw's 16 bits at the top of the d bits fp16 drops from `bits`): r16's low 16 bits, the lowest
    cut off where d < 16."""
    exponent = ((bits >> 23) & 0xFF).to(tl.int32)  # biased
    # 13 bits for fp16 normals; one more per binade below 2**-14, where the grid stays 2**-24.
    kept = tl.minimum(tl.maximum(exponent - 94, 9), 19).to(tl.uint32)  # 32 - d
    return 32 - kept, (r16 << 16) >> kept


@triton.jit
def stochastic_round_exact(x, r16, seed, counters, word, N_ROUNDS: tl.constexpr):
    """Software SR of an fp32 tile into fp16 that `stochastic_round_pairs` could not round: each element's
    draw continued from a second stream, the 128-bit comparison below 2**-24 included. r16 (x's shape):
    the 16 bits each element had (low bits). Word `word` (0..3) of Philox(key, counters) gives an element
    the rest of its draw (its low bits; below 2**-24 the whole draw, the other three words in turn behind
    it, so four tiles can share a call); the key is `seed` with its top bit set, which no seed has (seeds
    are below 2**63): a stream of its own."""
    r0, r1, r2, r3 = tl.randint4x(seed.to(tl.uint64) | 0x8000000000000000, counters, n_rounds=N_ROUNDS)
    w0 = tl.where(word == 0, r0, tl.where(word == 1, r1, tl.where(word == 2, r2, r3)))
    w1 = tl.where(word == 0, r1, tl.where(word == 1, r2, tl.where(word == 2, r3, r0)))
    w2 = tl.where(word == 0, r2, tl.where(word == 1, r3, tl.where(word == 2, r0, r1)))
    w3 = tl.where(word == 0, r3, tl.where(word == 1, r0, tl.where(word == 2, r1, r2)))
    return _fp16_continued(x, r16, w0, w1, w2, w3)


@triton.jit
def _fp16_continued(x, r16, w0, w1, w2, w3):
    """fp32 x into fp16 by the draw whose top 16 bits are r16's and whose lower bits are w0's low bits; below
    2**-24 by the 128-bit draw w0.w1.w2.w3 (w0 leading)."""
    bits = x.to(tl.uint32, bitcast=True)
    dropped, top = _fp16_draw(bits, r16)
    rounded = ((bits + top + (w0 & (0xFFFF >> (32 - dropped)))) >> dropped) << dropped
    return _finish(x, _round_tiny_fp16(x, bits, rounded, w0, w1, w2, w3), tl.float16)


@triton.jit
def round_to_storage(x, seed, offsets, DTYPE: tl.constexpr, STOCHASTIC: tl.constexpr,
                     N_ROUNDS: tl.constexpr):
    """fp32 block -> DTYPE: unchanged for fp32, else software SR or round to nearest even."""
    if DTYPE == tl.float32:
        return x
    elif STOCHASTIC:
        return stochastic_round(x, seed, offsets, DTYPE, N_ROUNDS)
    else:
        return round_nearest(x, DTYPE)


@triton.jit
def _round_part(x_ptr, out_ptr, n, block, part, words, seed, DTYPE: tl.constexpr, N_ROUNDS: tl.constexpr,
                HARDWARE: tl.constexpr, Q: tl.constexpr):
    # Part `part` of block `block`: Q consecutive elements, as a (1, Q) tile like a row group's.
    q = tl.arange(0, Q)[None, :]
    offsets = (block * 4 + part) * Q + q
    x = tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
    if HARDWARE:
        y = stochastic_round_hardware(x, words, DTYPE)
    else:
        y, redo = stochastic_round_pairs(x, words, DTYPE)
        if DTYPE == tl.float16:
            if redo:
                r16 = tl.reshape(tl.join(words, words >> 16), x.shape)  # each element's 16 bits
                y = stochastic_round_exact(x, r16, seed, block * Q + q, part, N_ROUNDS)
    tl.store(out_ptr + offsets, y, mask=offsets < n)


# A new seed every step must not mean a new compilation.
@triton.jit(do_not_specialize=["seed"])
def _stochastic_round_kernel(x_ptr, out_ptr, n, seed, DTYPE: tl.constexpr, N_ROUNDS: tl.constexpr,
                             HARDWARE: tl.constexpr, Q: tl.constexpr):
    # A block of four parts of Q consecutive elements sharing Philox calls, as the state update's row
    # groups share them: part k takes word k of each call. In software, elements 2j and 2j + 1 of a part
    # take the halves of call j's word (counter block * Q / 2 + j); with cvt.rs element j takes call j's
    # (block * Q + j).
    block = tl.program_id(0).to(tl.int64)
    if HARDWARE:
        w0, w1, w2, w3 = tl.randint4x(seed, block * Q + tl.arange(0, Q)[None, :], n_rounds=N_ROUNDS)
    else:
        w0, w1, w2, w3 = tl.randint4x(seed, block * (Q // 2) + tl.arange(0, Q // 2)[None, :], n_rounds=N_ROUNDS)
    _round_part(x_ptr, out_ptr, n, block, 0, w0, seed, DTYPE, N_ROUNDS, HARDWARE, Q)
    _round_part(x_ptr, out_ptr, n, block, 1, w1, seed, DTYPE, N_ROUNDS, HARDWARE, Q)
    _round_part(x_ptr, out_ptr, n, block, 2, w2, seed, DTYPE, N_ROUNDS, HARDWARE, Q)
    _round_part(x_ptr, out_ptr, n, block, 3, w3, seed, DTYPE, N_ROUNDS, HARDWARE, Q)


def stochastic_round_tensor(x: torch.Tensor, dtype: torch.dtype, seed: int, philox_rounds: int = DEFAULT_PHILOX_ROUNDS,
                            rounding_impl: str = "software", *, interpret: bool | None = None) -> torch.Tensor:
    """Stochastically round every element of an fp32 tensor into `dtype` (float16 or bfloat16).

    Blocks of 4096 elements (row-major) are split in four parts that share Philox calls, as the state
    update's row groups do.
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
    block = 4096
    _stochastic_round_kernel[(cdiv(n, block),)](x, out, n, seed, DTYPE=triton_dtype(dtype),
                                                       N_ROUNDS=philox_rounds, HARDWARE=rounding_impl == "hardware",
                                                       Q=block // 4)
    return out
