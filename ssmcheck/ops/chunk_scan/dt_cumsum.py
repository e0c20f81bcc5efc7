"""Stage 1: dt processing (dt_bias, softplus, dt_limit) and the cumulative log-decay per chunk.

The log-decays are kept twice: in fp64 (the chunk states' weights and the passing read them), and as base-2
logs split into fp32 (hi, lo) pairs for the output stage's inner loop (chunk_output.py says why). Written
by this kernel, the pairs cost no launch of their own: a short prefill's time is the host's.
"""

import torch
import triton
import triton.language as tl

from ssmcheck.ops.common import softplus
from ssmcheck.ops.host import cdiv

from .layout import ChunkTable
from .numerics import LOG2E, split


# dt_bias, softplus and dt_limit are run-time flags and BLOCK_H follows the chunk size alone: as constexprs they
# multiplied the variants Triton compiles per chunk size and dtype by up to 8 x 4 (in the default scan on a fresh
# machine, compiling is most of the time), for a kernel whose time is its launch.
@triton.jit
def _dt_cumsum_kernel(
    dt_ptr, A_ptr, dt_bias_ptr, chunk_token_ptr, chunk_len_ptr, dt_out_ptr, dA_cs_ptr, pairs_ptr,
    nheads, stride_dt_tok, stride_dt_head, dt_min, dt_max, has_bias, softplus_dt, has_limit,
    CHUNK: tl.constexpr, BLOCK_H: tl.constexpr,
):
    # 64-bit: the output offset (c * nheads + h) * CHUNK counts tokens x heads, past 2**31 from 2**31 / nheads
    # tokens (16.8M at 128 heads) in int32; token offsets into dt are 64-bit through tok0.
    c = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    t = tl.arange(0, CHUNK)
    tok0 = tl.load(chunk_token_ptr + c).to(tl.int64)
    n = tl.load(chunk_len_ptr + c)
    hv = h < nheads
    valid = (t[:, None] < n) & hv[None, :]
    dt = tl.load(dt_ptr + (tok0 + t)[:, None] * stride_dt_tok + h[None, :] * stride_dt_head,
                 mask=valid, other=0.0).to(tl.float32)
    if has_bias:
        dt += tl.load(dt_bias_ptr + h, mask=hv, other=0.0).to(tl.float32)[None, :]
    if softplus_dt:
        dt = softplus(dt)
    if has_limit:
        dt = tl.minimum(tl.maximum(dt, dt_min), dt_max)
    # Padding past the chunk's end gets dt = 0, so the cumsum stays flat there and
    # its last entry is the log-decay over the whole (possibly short) chunk.
    dt = tl.where(valid, dt, 0.0)
    A = tl.load(A_ptr + h, mask=hv, other=0.0).to(tl.float32)
    # Summed in fp64: the decay between tokens k < m is exp(dA_cs[m] - dA_cs[k]), and when
    # the sums are huge (|A| dt large) an fp32 difference loses the small segments, even the
    # exact zero of a dt = 0 token (a parallel scan rounds neighbours differently).
    dA_cs = tl.cumsum((dt * A[None, :]).to(tl.float64), axis=0)
    out = (c * nheads + h[None, :]) * CHUNK + t[:, None]
    tl.store(dt_out_ptr + out, dt, mask=hv[None, :])
    tl.store(dA_cs_ptr + out, dA_cs, mask=hv[None, :])
    # (hi, lo) of the base-2 logs, scaled in fp64: row (c, h) holds CHUNK his, then CHUNK los.
    hi, lo = split(dA_cs * LOG2E)
    pair = (c * nheads + h[None, :]) * (2 * CHUNK) + t[:, None]
    tl.store(pairs_ptr + pair, hi, mask=hv[None, :])
    tl.store(pairs_ptr + pair + CHUNK, lo, mask=hv[None, :])


def dt_cumsum(dt, A, dt_bias, dt_softplus, dt_limit, table: ChunkTable, alloc=torch.empty):
    """dt (ntok, nheads) -> (dt processed (fp32), cumulative dt*A (fp64)), each (nchunks, nheads, chunk_size),
    and the cumulative sums as fp32 (hi, lo) pairs of base-2 logs (nchunks, nheads, 2, chunk_size), [..., 0, :]
    the his (numerics.split). `alloc` (torch.empty's signature) allocates the results."""
    nheads = dt.shape[1]
    shape = (table.nchunks, nheads, table.chunk_size)
    dt_out = alloc(shape, device=dt.device, dtype=torch.float32)
    dA_cs = alloc(shape, device=dt.device, dtype=torch.float64)
    pairs = alloc((table.nchunks, nheads, 2, table.chunk_size), device=dt.device, dtype=torch.float32)
    has_limit = tuple(dt_limit) != (0.0, float("inf"))
    # 1024 (token, head) pairs a program, heads past nheads masked: larger tiles took longer to compile (0.46 s at
    # chunk 256 against 0.65 s for 2048 pairs, offline for sm_90); the benchmark's 16k and 64k times did not move.
    block_h = 1024 // table.chunk_size
    grid = (table.nchunks, cdiv(nheads, block_h))
    _dt_cumsum_kernel[grid](
        dt, A, dt_bias if dt_bias is not None else A, table.chunk_token, table.chunk_len, dt_out, dA_cs, pairs,
        nheads, dt.stride(0), dt.stride(1), float(dt_limit[0]), float(dt_limit[1]),
        dt_bias is not None, bool(dt_softplus), has_limit,
        CHUNK=table.chunk_size, BLOCK_H=block_h, num_warps=4,
    )
    return dt_out, dA_cs, pairs
