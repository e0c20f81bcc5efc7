"""drift.follow as one Triton kernel: the float64 side of a decode step in a single launch.

torch.compile makes `follow` about 10 kernels a step, and costs every process a dynamo trace of 0.3-0.7 s per
compile group even where inductor's caches hold the code (20.7 s of the default GPU drift's 58.6 s warm;
benchmarks/RESULTS.md, forty-second session); Triton's own disk cache loads a variant of this kernel in
milliseconds. It computes what `follow` computes, element for element, from the same arguments: the three
float64 recurrences (reference, baseline, the exact update of the kernel's previous state), their three outputs, the
baseline's rounding (round_to: to nearest through float32 rounded to odd; stochastic against the caller's
`uniform` draws), the per-row store sums (stats.store_sums) and the non-finite flag. Arithmetic is left
uncontracted (no FMA), as the eager references compute it. It shares no code with the references: a candidate
for `Follower`, which would check it against the eager step as it checks torch.compile's
(`benchmarks/drift_step.py --steps compiled,triton` times it beside the compiled step).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ssmcheck.core.formats import FORMATS, own_subnormals, subnormal_range
from ssmcheck.drift import stats
from ssmcheck.ops import interpreting

# Elements of a program's tile (rows of headdim x dstate padded to a power of two).
TILE = 1024


def follow_triton(*, ref, baseline, before, after, out, x, dt, z, A, B, C, D, dt_bias, sums, tripped, uniform,
                  dt_softplus: bool, dtype: torch.dtype,
                  rounding: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """drift.follow's step, its arguments and results alike (the state's leading axes: batch, heads)."""
    batch, nheads, headdim, dstate = ref.shape
    if ref.numel() >= 2**31:  # its offsets are int32 products (Follower then tries the next fast step)
        raise ValueError(f"a state of {ref.numel()} elements: the Triton step indexes at most 2**31 - 1")
    ngroups = B.shape[1]
    fmt = FORMATS[dtype]
    ref_out = torch.empty((batch, nheads, headdim), dtype=torch.float64, device=ref.device)
    baseline_out = torch.empty_like(ref_out)
    exact_out = torch.empty_like(ref_out)
    block_n = triton.next_power_of_2(dstate)
    block_p = min(triton.next_power_of_2(headdim), max(1, TILE // block_n))
    stochastic = rounding == "stochastic"
    smallest, normal = subnormal_range(dtype)
    gate = z if z is not None else x  # (unread without a gate; likewise the draws to nearest)
    draws = uniform if stochastic else ref
    grid = (batch * nheads, triton.cdiv(headdim, block_p))
    _follow_kernel[grid](
        ref, baseline, before, after, out, x, dt, gate, A, B, C, D, dt_bias, sums, tripped, draws, ref_out,
        baseline_out, exact_out,
        *ref.stride(), *baseline.stride(), *before.stride(), *after.stride(), *out.stride(), *x.stride(),
        *dt.stride(), *gate.stride(), *A.stride(), *B.stride(), *C.stride(), *D.stride(),
        *dt_bias.stride(), *sums.stride(), *tripped.stride(), *draws.stride(),
        nheads, headdim, dstate, nheads // ngroups,
        DT_SOFTPLUS=dt_softplus, HAS_Z=z is not None, STOCHASTIC=stochastic, NARROW=dtype != torch.float32,
        EMIN=fmt.emin, MANTISSA_BITS=fmt.mantissa_bits, OVERFLOW=2.0 ** (fmt.emax + 1),
        SUBNORMALS=own_subnormals(dtype), SMALLEST=smallest, NORMAL=normal, RADIUS=stats.ROUNDING_RADIUS[rounding],
        ARITHMETIC_REL=stats.ARITHMETIC_REL, DT_ABS=stats.DT_ABS, FLOAT32_TINY=stats.FLOAT32_TINY,
        INTERPRETED=interpreting(),
        BLOCK_P=block_p, BLOCK_N=block_n, enable_fp_fusion=False)
    return ref_out, baseline_out, exact_out


@triton.jit
def _finite(v):
    return (v - v) == 0  # as core.tensors.finite


@triton.jit
def _power_of_two(e):
    """2**e as float64, for int64 e in float64's normal range."""
    return ((e + 1023) << 52).to(tl.float64, bitcast=True)


@triton.jit
def _floor_log2(magnitude):
    """floor(log2(magnitude)) of a positive normal float64 (from its exponent bits; -1023 for zero or subnormals)."""
    return ((magnitude.to(tl.int64, bitcast=True) >> 52) & 0x7FF) - 1023


@triton.jit
def _round_nearest(v, NARROW: tl.constexpr):
    """float64 -> float32, the first half of rounding into the storage dtype to nearest even (rounding.naive.round_to,
    "nearest"): for fp16/bf16 rounded to odd, so that the caller's conversion into them rounds correctly (nothing
    is rounded twice); for an fp32 state to nearest, the whole rounding."""
    y = v.to(tl.float32)
    if NARROW:
        back = y.to(tl.float64)
        truncated = y.to(tl.int32, bitcast=True) - (tl.abs(back) > tl.abs(v)).to(tl.int32)
        y = (truncated | (back != v).to(tl.int32)).to(tl.float32, bitcast=True)
    return y


@triton.jit
def _round_stochastic(v, u, EMIN: tl.constexpr, MANTISSA_BITS: tl.constexpr, OVERFLOW: tl.constexpr):
    """float64 v rounded to one of its two neighbours in the storage dtype, up where u < the fraction between them
    (rounding.naive.rounded_by_exponents), as float64."""
    ok = _finite(v)
    magnitude = tl.where(ok, tl.abs(v), 0.0)
    exponent = tl.maximum(_floor_log2(magnitude), EMIN)
    spacing = _power_of_two(exponent - MANTISSA_BITS)
    scaled = magnitude / spacing
    lower = tl.floor(scaled)
    rounded = (lower + (u < scaled - lower).to(tl.float64)) * spacing
    rounded = tl.where(rounded >= OVERFLOW, float("inf"), rounded)
    sign = (v.to(tl.int64, bitcast=True) >> 63) << 63  # the sign bit alone
    signed = (rounded.to(tl.int64, bitcast=True) | sign).to(tl.float64, bitcast=True)
    return tl.where(ok, signed, v)


@triton.jit
def _store_spacing(exact, EMIN: tl.constexpr, MANTISSA_BITS: tl.constexpr):
    """core.formats.ulp: the storage dtype's spacing at each exact value (at 0, the smallest subnormal)."""
    exponent = tl.where(exact == 0, EMIN, tl.maximum(_floor_log2(tl.abs(exact)), EMIN))
    return _power_of_two(exponent - MANTISSA_BITS)


@triton.jit
def _follow_kernel(
    ref_ptr, base_ptr, before_ptr, after_ptr, out_ptr, x_ptr, dt_ptr, z_ptr, A_ptr, B_ptr, C_ptr, D_ptr,
    bias_ptr, sums_ptr, tripped_ptr, u_ptr, ref_out_ptr, base_out_ptr, exact_out_ptr,
    s_rb, s_rh, s_rp, s_rn, s_bb, s_bh, s_bp, s_bn, s_fb, s_fh, s_fp, s_fn, s_ab, s_ah, s_ap, s_an,
    s_ob, s_oh, s_op, s_xb, s_xh, s_xp, s_db, s_dh, s_dp, s_zb, s_zh, s_zp, s_Ah, s_Ap, s_An,
    s_Bb, s_Bg, s_Bn, s_Cb, s_Cg, s_Cn, s_Dh, s_Dp, s_qh, s_qp,
    s_sk, s_sb, s_sh, s_sp, s_tb, s_th, s_tp, s_ub, s_uh, s_up, s_un,
    nheads, headdim, dstate, heads_per_group,
    DT_SOFTPLUS: tl.constexpr, HAS_Z: tl.constexpr, STOCHASTIC: tl.constexpr, NARROW: tl.constexpr,
    EMIN: tl.constexpr, MANTISSA_BITS: tl.constexpr, OVERFLOW: tl.constexpr, SUBNORMALS: tl.constexpr,
    SMALLEST: tl.constexpr, NORMAL: tl.constexpr, RADIUS: tl.constexpr, ARITHMETIC_REL: tl.constexpr,
    DT_ABS: tl.constexpr, FLOAT32_TINY: tl.constexpr, INTERPRETED: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    bh = tl.program_id(0)
    b = bh // nheads
    h = bh % nheads
    g = h // heads_per_group
    p = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
    n = tl.arange(0, BLOCK_N)
    row = p < headdim
    tile = row[:, None] & (n < dstate)[None, :]
    pc, nr = p[:, None], n[None, :]

    x = tl.load(x_ptr + b * s_xb + h * s_xh + p * s_xp, mask=row, other=0.0).to(tl.float64)
    dt = tl.load(dt_ptr + b * s_db + h * s_dh + p * s_dp, mask=row, other=0.0).to(tl.float64)
    dt = dt + tl.load(bias_ptr + h * s_qh + p * s_qp, mask=row, other=0.0)
    if DT_SOFTPLUS:
        # max(v, 0) + log1p(exp(-|v|)) (ops.naive.softplus); NaN stays NaN. On a GPU libdevice's log1p, as torch's
        # own; the interpreter has none: log(1 + t) * t / ((1 + t) - 1) there, accurate to a few ulps (Goldberg).
        t = tl.exp(-tl.abs(dt))
        if INTERPRETED:
            w = 1.0 + t
            log1p = tl.where(w == 1.0, t, tl.log(w) * t / (w - 1.0))
        else:
            log1p = libdevice.log1p(t)
        dt = tl.where(dt < 0, 0.0, dt) + log1p
    A = tl.load(A_ptr + h * s_Ah + pc * s_Ap + nr * s_An, mask=tile, other=0.0)
    decay = tl.exp(dt[:, None] * A)
    Bh = tl.load(B_ptr + b * s_Bb + g * s_Bg + n * s_Bn, mask=n < dstate, other=0.0).to(tl.float64)
    Ch = tl.load(C_ptr + b * s_Cb + g * s_Cg + n * s_Cn, mask=n < dstate, other=0.0).to(tl.float64)
    drive = (dt * x)[:, None] * Bh[None, :]

    ref = tl.load(ref_ptr + b * s_rb + h * s_rh + pc * s_rp + nr * s_rn, mask=tile, other=0.0)
    base = tl.load(base_ptr + b * s_bb + h * s_bh + pc * s_bp + nr * s_bn, mask=tile, other=0.0)
    before = tl.load(before_ptr + b * s_fb + h * s_fh + pc * s_fp + nr * s_fn, mask=tile, other=0.0).to(tl.float64)
    new_ref = ref * decay + drive
    new_base = base * decay + drive
    decayed = before * decay
    exact = decayed + drive

    skip = x * tl.load(D_ptr + h * s_Dh + p * s_Dp, mask=row, other=0.0)
    ref_y = tl.sum(tl.where(tile, new_ref * Ch[None, :], 0.0), 1) + skip
    base_y = tl.sum(tl.where(tile, new_base * Ch[None, :], 0.0), 1) + skip
    exact_y = tl.sum(tl.where(tile, exact * Ch[None, :], 0.0), 1) + skip
    if HAS_Z:
        zv = tl.load(z_ptr + b * s_zb + h * s_zh + p * s_zp, mask=row, other=0.0).to(tl.float64)
        gate = zv / (1.0 + tl.exp(-zv))  # silu
        ref_y = ref_y * gate
        base_y = base_y * gate
        exact_y = exact_y * gate
    tl.store(ref_out_ptr + bh * headdim + p, ref_y, mask=row)
    tl.store(base_out_ptr + bh * headdim + p, base_y, mask=row)
    tl.store(exact_out_ptr + bh * headdim + p, exact_y, mask=row)

    tl.store(ref_ptr + b * s_rb + h * s_rh + pc * s_rp + nr * s_rn, new_ref, mask=tile)
    if STOCHASTIC:
        u = tl.load(u_ptr + b * s_ub + h * s_uh + pc * s_up + nr * s_un, mask=tile, other=1.0)
        rounded = _round_stochastic(new_base, u, EMIN, MANTISSA_BITS, OVERFLOW)
    else:
        rounded = _round_nearest(new_base, NARROW)
        if NARROW:
            if MANTISSA_BITS == 10:
                rounded = rounded.to(tl.float16)
            else:
                rounded = rounded.to(tl.bfloat16)
        rounded = rounded.to(tl.float64)
    tl.store(base_ptr + b * s_bb + h * s_bh + pc * s_bp + nr * s_bn, rounded, mask=tile)

    # The kernel's store against the exact update of its own previous state (stats.store_sums), per row.
    stored = tl.load(after_ptr + b * s_ab + h * s_ah + pc * s_ap + nr * s_an, mask=tile, other=0.0).to(tl.float64)
    sign = (exact > 0).to(tl.float64) - (exact < 0).to(tl.float64)
    errors = sign * (stored - exact) / _store_spacing(exact, EMIN, MANTISSA_BITS)
    counted = _finite(errors) & tile
    kept = tl.where(counted, errors, 0.0)
    sums = sums_ptr + b * s_sb + h * s_sh + p * s_sp
    tl.store(sums, tl.load(sums, mask=row) + tl.sum(counted.to(tl.float64), 1), mask=row)
    tl.store(sums + s_sk, tl.load(sums + s_sk, mask=row) + tl.sum(kept, 1), mask=row)
    tl.store(sums + 2 * s_sk, tl.load(sums + 2 * s_sk, mask=row) + tl.sum(kept * kept, 1), mask=row)
    tl.store(sums + 6 * s_sk, tl.load(sums + 6 * s_sk, mask=row) + tl.sum(kept * sign, 1), mask=row)  # toward +inf
    if SUBNORMALS:
        magnitude = tl.abs(exact)
        subnormal = (magnitude >= SMALLEST) & (magnitude < NORMAL) & tile
        flushed = subnormal & (stored == 0)
        tl.store(sums + 3 * s_sk, tl.load(sums + 3 * s_sk, mask=row) + tl.sum(subnormal.to(tl.float64), 1), mask=row)
        tl.store(sums + 4 * s_sk, tl.load(sums + 4 * s_sk, mask=row) + tl.sum(flushed.to(tl.float64), 1), mask=row)
    # Misrounded: farther from the exact value than the rounding moves a value plus stats.store_allowance.
    xB = tl.abs(x)[:, None] * tl.abs(Bh)[None, :]
    allowance = (ARITHMETIC_REL * (tl.abs(decayed) + tl.abs(drive))
                 + DT_ABS * (1 + tl.abs(dt))[:, None] * (tl.abs(A) * tl.abs(decayed) + xB) + FLOAT32_TINY)
    # (stats.reach: the spacing between the store and its neighbour on the exact value's side)
    side = ((stored > exact).to(tl.float64) - (stored < exact).to(tl.float64)) * _store_spacing(stored, EMIN,
                                                                                                  MANTISSA_BITS) / 4
    spacing = _store_spacing(stored - side, EMIN, MANTISSA_BITS)
    misrounded = _finite(stored) & _finite(exact) & (tl.abs(stored - exact) > RADIUS * spacing + allowance) & tile
    tl.store(sums + 5 * s_sk, tl.load(sums + 5 * s_sk, mask=row) + tl.sum(misrounded.to(tl.float64), 1), mask=row)

    # Non-finite where the reference is finite: the state's stores, or the kernel's output.
    state_bad = tl.sum((~_finite(stored) & _finite(new_ref) & tile).to(tl.int32), 1) > 0
    out = tl.load(out_ptr + b * s_ob + h * s_oh + p * s_op, mask=row, other=0.0).to(tl.float64)
    out_bad = ~_finite(out) & _finite(ref_y)
    flag = tripped_ptr + b * s_tb + h * s_th + p * s_tp
    tl.store(flag, tl.load(flag, mask=row, other=0) | state_bad | out_bad, mask=row)
