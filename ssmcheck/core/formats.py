"""The floating-point formats ssmcheck speaks of, written down once.

Dtype names as the options spell them, each storage format's fraction bits and
exponent range, the spacing (ulp) of a format at a value, and the rounding modes
a state can be stored with. A leaf module (torch only): the references in
`ops/` read it too, so it imports nothing of the application.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Option spelling -> torch dtype (in the order help texts list them).
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DTYPE_NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in DTYPES.items()}

# How a value is stored into a narrower format: round to nearest even, or stochastically.
ROUNDINGS = ("nearest", "stochastic")


@dataclass(frozen=True)
class Format:
    mantissa_bits: int  # stored fraction bits: the ulp of 1.0 is 2**-mantissa_bits
    emin: int  # exponent of the smallest normal
    emax: int  # exponent of the largest finite value


FORMATS: dict[torch.dtype, Format] = {
    torch.float16: Format(10, -14, 15),
    torch.bfloat16: Format(7, -126, 127),
    torch.float32: Format(23, -126, 127),
}


def dtype_name(dtype: torch.dtype) -> str:
    """fp32/fp16/bf16 for a storage dtype, else torch's own name (e.g. 'torch.float64')."""
    return DTYPE_NAMES.get(dtype, str(dtype))


def own_subnormals(dtype: torch.dtype) -> bool:
    """Whether `dtype`'s subnormals lie above float32's smallest normal (fp16's do), where only a store into
    `dtype` makes a value subnormal. bf16's and fp32's are float32's own, below 1.2e-38, which a kernel's float32
    arithmetic may already flush (a compiler's flush-to-zero mode) before any store."""
    return FORMATS[dtype].emin > FORMATS[torch.float32].emin


def subnormal_range(dtype: torch.dtype) -> tuple[float, float]:
    """(smallest subnormal, smallest normal) of `dtype`: its subnormals are the magnitudes in [lo, hi)."""
    fmt = FORMATS[dtype]
    return 2.0 ** (fmt.emin - fmt.mantissa_bits), 2.0 ** fmt.emin


def eps(dtype: torch.dtype) -> float:
    """The ulp of 1.0 in `dtype`."""
    return 2.0 ** -FORMATS[dtype].mantissa_bits


def ulp(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of `dtype` at each of `values` (float64; at 0, the smallest subnormal)."""
    fmt = FORMATS[dtype]
    _, exponent = torch.frexp(values.abs())  # |v| = m * 2**exponent, m in [0.5, 1); 0 for v = 0
    exponent = torch.where(values == 0, fmt.emin, torch.clamp(exponent.to(torch.int64) - 1, min=fmt.emin))
    return torch.ldexp(torch.ones_like(values, dtype=torch.float64), exponent - fmt.mantissa_bits)


def saturate(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`values`, in their own dtype, with every finite value beyond `dtype`'s largest finite value set to
    that value (its sign kept); inf and NaN unchanged.

    What an output stored in `dtype` holds of a finite result past its range, before rounding: the
    closest value the format has. Plain round-to-nearest stores inf there instead, and the next
    layer then sees a non-finite value made from finite inputs; so the references judge y saturated,
    the built-in kernels store it so (ops.rounding.stochastic.round_saturating), and a kernel that
    stores inf shows as non-finite. inf and NaN come from the arithmetic itself, not from narrowing
    it, so they stay visible.
    """
    # No finite value lies past its own format's largest one (and a bound past it would not convert).
    big = min(torch.finfo(dtype).max, torch.finfo(values.dtype).max)
    return torch.where(torch.isfinite(values), values.clamp(-big, big), values)
