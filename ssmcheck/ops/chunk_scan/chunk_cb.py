"""Stage 4: C·Bᵀ within each chunk, per group (shared by the group's heads)."""

import torch
import triton
import triton.language as tl

from ssmcheck.ops.host import next_power_of_2

from .layout import ChunkTable
from .numerics import mma, operand, program_coords


# The group count only maps heads to groups: its equality to 1 is not worth a variant of its own. The chunk
# size only counts tiles and strides cb, so it is a run-time value too: chunk sizes that share the tiles
# (min(chunk size, 64)) share one compiled variant.
@triton.jit(do_not_specialize=["ngroups"])
def _chunk_cb_kernel(
    C_ptr, B_ptr, chunk_token_ptr, chunk_len_ptr, cb_ptr,
    ngroups, dstate, chunk_size, stride_c_tok, stride_c_group, stride_c_state,
    stride_b_tok, stride_b_group, stride_b_state,
    MM_DTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    kb, mb, g, c = program_coords(pid, chunk_size // BLOCK_K, chunk_size // BLOCK_M, ngroups)
    tok0 = tl.load(chunk_token_ptr + c).to(tl.int64)  # 64-bit token offsets: see chunk_state's bases
    n = tl.load(chunk_len_ptr + c)
    m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    k = kb * BLOCK_K + tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    # Tiles wholly above the diagonal stay zero: no matmul there.
    if kb * BLOCK_K < (mb + 1) * BLOCK_M:
        for d0 in range(0, dstate, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            cm = tl.load(C_ptr + (tok0 + m)[:, None] * stride_c_tok + g * stride_c_group
                         + d[None, :] * stride_c_state,
                         mask=(m[:, None] < n) & (d[None, :] < dstate), other=0.0)
            bk = tl.load(B_ptr + (tok0 + k)[None, :] * stride_b_tok + g * stride_b_group
                         + d[:, None] * stride_b_state,
                         mask=(k[None, :] < n) & (d[:, None] < dstate), other=0.0)
            acc = mma(operand(cm, MM_DTYPE), operand(bk, MM_DTYPE), acc)
        # Causal: zero above the diagonal, so that the output stage needs no mask of its own (chunk_output).
        acc = tl.where(k[None, :] <= m[:, None], acc, 0.0)
    tl.store(cb_ptr + ((tl.cast(c, tl.int64) * ngroups + g) * chunk_size + m[:, None]) * chunk_size + k[None, :], acc)


def default_config(dstate: int, chunk_size: int, interpret: bool = False) -> dict:
    """Best of the block configurations measured on the H200 (benchmarks/RESULTS.md); in the
    interpreter, whole-chunk tiles: it runs the programs one after
    another and each tile op is one numpy call, so fewer, larger programs run faster (the default
    preset's kernel time fell about 4x), and no register or shared-memory limit binds there."""
    if interpret:
        return dict(BLOCK_M=chunk_size, BLOCK_K=chunk_size, BLOCK_D=max(16, next_power_of_2(dstate)),
                    num_warps=4, num_stages=1)
    return dict(BLOCK_M=min(chunk_size, 64), BLOCK_K=min(chunk_size, 64),
                BLOCK_D=max(16, min(next_power_of_2(dstate), 64)), num_warps=4, num_stages=3)


def chunk_cb(C, B, mm_dtype, table: ChunkTable, interpret: bool, config: dict | None = None, alloc=torch.empty):
    """C, B (ntok, ngroups, dstate) -> CB (nchunks, ngroups, chunk_size, chunk_size) fp32, allocated by
    `alloc`; rows/columns past a chunk's end are zero, and so is every entry above the diagonal (k > m)."""
    ngroups, dstate = C.shape[1], C.shape[2]
    cs = table.chunk_size
    cfg = {**default_config(dstate, cs, interpret), **(config or {})}
    cb = alloc((table.nchunks, ngroups, cs, cs), device=C.device, dtype=torch.float32)
    grid = (table.nchunks * ngroups * (cs // cfg["BLOCK_M"]) * (cs // cfg["BLOCK_K"]),)
    _chunk_cb_kernel[grid](
        C, B, table.chunk_token, table.chunk_len, cb,
        ngroups, dstate, cs, *C.stride(), *B.stride(),
        MM_DTYPE=mm_dtype, **cfg,
    )
    return cb
