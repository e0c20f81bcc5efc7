"""A bitwise model of `stochastic_round_tensor`'s software SR, in Python integers: no Triton, no code shared.

Philox4x32 as Salmon et al. define it (the constants, and the key and counter layout `tl.randint4x` uses:
key = (seed low word, seed high word), counter = (offset low word, offset high word, 0, 0)), then the
documented draw of each element:
- blocks of 4 parts of Q elements; element q of part k takes half q % 2 (low, high) of word k of
  Philox(seed, block * Q / 2 + q // 2): 16 bits, r;
- those 16 bits are the top of a draw over the d bits the format drops (bf16: 16; fp16: 13 for normals, up
  to 23 below 2**-14, a draw of d < 16 bits is r's top d bits); the element rounds up (away from zero)
  iff the dropped bits plus the draw carry into the kept ones;
- fp16 only: where the 16 bits cannot decide (a tie), the draw continues with the low d - 16 bits of word
  k of Philox(seed | 2**63, block * Q + q); a magnitude below 2**-24 rounds up iff that call's words, word
  k leading and the others following in turn as a 128-bit number, are below |x| * 2**152.
Overflow: past the largest finite value the upper neighbour is 2**(emax + 1), which is inf.
"""

from __future__ import annotations

import math
import struct

MASK32 = 0xFFFFFFFF


def philox(seed: int, counter: int, rounds: int) -> tuple[int, int, int, int]:
    c0, c1, c2, c3 = counter & MASK32, (counter >> 32) & MASK32, 0, 0
    k0, k1 = seed & MASK32, (seed >> 32) & MASK32
    for _ in range(rounds):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & MASK32, (p0 >> 32) ^ c3 ^ k1, p0 & MASK32
        k0, k1 = (k0 + 0x9E3779B9) & MASK32, (k1 + 0xBB67AE85) & MASK32
    return c0, c1, c2, c3


def _bits32(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


def float32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def round_element(value: float, r16: int, continuation, fp16: bool, paths: dict) -> float:
    """SR of fp32 `value` with draw top bits r16; continuation() -> the four words of the second stream.
    Counts in `paths` the elements that took fp16's rare paths."""
    if math.isnan(value) or math.isinf(value):
        return value
    bits = _bits32(value)
    sign, magnitude = bits & 0x80000000, bits & 0x7FFFFFFF
    exponent = magnitude >> 23
    if fp16 and 0 < magnitude < 0x33800000:  # below 2**-24: neighbours 0 and 2**-24
        paths["below 2**-24"] = paths.get("below 2**-24", 0) + 1
        w = continuation()
        draw = (w[0] << 96) | (w[1] << 64) | (w[2] << 32) | w[3]
        up = draw < round(abs(value) * 2.0**152)  # exact: |value| * 2**149 is an integer
        return math.copysign(2.0**-24 if up else 0.0, -1.0 if sign else 1.0)
    dropped = min(max(126 - exponent, 13), 23) if fp16 else 16
    if dropped > 13 and fp16 and magnitude:
        paths["subnormal"] = paths.get("subnormal", 0) + 1
    fraction = magnitude & ((1 << dropped) - 1)
    if dropped <= 16:
        carry = fraction + (r16 >> (16 - dropped)) >= 1 << dropped
    else:
        top = r16 << (dropped - 16)
        if fraction + top + (1 << (dropped - 16)) - 1 < 1 << dropped:
            carry = False
        elif fraction + top >= 1 << dropped:
            carry = True
        else:  # a tie: the rest of the draw decides
            paths["tie"] = paths.get("tie", 0) + 1
            carry = fraction + top + (continuation()[0] & ((1 << (dropped - 16)) - 1)) >= 1 << dropped
    kept = (magnitude >> dropped) + carry
    result = float32(sign | (kept << dropped))
    limit = 65504.0 if fp16 else 3.3895313892515355e38
    return math.copysign(math.inf, result) if abs(result) > limit else result


def tensor_draw(seed: int, rounds: int, i: int, part: int = 1024):
    """(r16, continuation) of element i (row-major) as `stochastic_round_tensor` draws it, parts of `part`."""
    block, k, q = i // (4 * part), (i // part) % 4, i % part
    word = philox(seed, block * part // 2 + q // 2, rounds)[k]

    def continuation():
        w = philox(seed | 1 << 63, block * part + q, rounds)
        return w[k:] + w[:k]

    return (word >> (16 * (q % 2))) & 0xFFFF, continuation


def stochastic_round_list(values: list[float], seed: int, rounds: int, fp16: bool, part: int = 1024,
                          paths: dict | None = None) -> list[float]:
    """The model's SR of fp32 `values` (row-major), parts of `part` elements (stochastic_round_tensor: 1024);
    `paths`, if given, counts the elements that took fp16's rare paths."""
    paths = {} if paths is None else paths
    return [round_element(value, *tensor_draw(seed, rounds, i, part), fp16, paths) for i, value in enumerate(values)]


def state_update_draws(seed: int, rounds: int, shape: tuple[int, int, int, int], block_p: int, groups: int = 4):
    """{(slot, head, channel, column): (r16, continuation)} as the state update draws them (fused_recurrent.py):
    a program's `block_p` channels form `groups` row groups of R rows; element (r, n) of group k takes half
    n % 2 of word k of Philox(seed, flat index of group 0's (r, n - n % 2)), and continues from word k of
    Philox(seed | 2**63, flat index of group 0's (r, n)), the others behind it in turn."""
    slots, nheads, headdim, dstate = shape
    rows = block_p // groups
    draws = {}
    for slot in range(slots):
        for h in range(nheads):
            for p in range(headdim):
                k, r = (p % block_p) // rows, p % rows
                row0 = (slot * nheads + h) * headdim + p - p % block_p + r
                for n in range(dstate):
                    word = philox(seed, row0 * dstate + n - n % 2, rounds)[k]

                    def continuation(counter=row0 * dstate + n, k=k):
                        w = philox(seed | 1 << 63, counter, rounds)
                        return w[k:] + w[:k]

                    draws[slot, h, p, n] = ((word >> (16 * (n % 2))) & 0xFFFF, continuation)
    return draws
