"""Stage 2: each chunk's own state, fully parallel over chunks.

    local_c = sum_t exp(dA_last - dA_t) * dt_t * x_tᵀ ⊗ B_t     (headdim, dstate), fp32

the state the chunk would leave behind if it started from zero. The weights are
rounded with x to the matmul dtype (fp32 accumulation); the baseline rounds them with
B, the peers too. x's tile is the smaller one (headdim < dstate in Mamba2 models), and
B then goes from shared memory to the tensor cores as loaded: at the H200 benchmark's
widths 860 SASS instructions an MMA loop iteration instead of 966, 176 registers
instead of 242 (benchmarks/sass_loop.py). That alone did not change the time; the
pipelined 32-token tiles those registers leave room for did (default_config).
"""

import torch
import triton
import triton.language as tl

from ssmcheck.ops.host import cdiv, next_power_of_2

from .layout import ChunkTable
from .numerics import LOG2E, decay2, mma, operand, program_coords


# The group count only maps heads to groups: its equality to 1 is not worth a variant of its own. The chunk
# size is a stride of dA_cs and dt here, so it is a run-time value too: chunk sizes that share the tiles
# (BLOCK_T = min(chunk size, 32)) share one compiled variant.
@triton.jit(do_not_specialize=["ngroups"])
def _chunk_state_kernel(
    x_ptr, B_ptr, dt_ptr, dA_cs_ptr, chunk_token_ptr, chunk_len_ptr, local_ptr,
    nheads, ngroups, headdim, dstate, chunk_size,
    stride_x_tok, stride_x_head, stride_x_dim,
    stride_b_tok, stride_b_group, stride_b_state,
    MM_DTYPE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # Chunks vary slowest, so the programs of one chunk run together and share B in L2.
    pid = tl.program_id(0)
    nb, pb, h, c = program_coords(pid, tl.cdiv(dstate, BLOCK_N), tl.cdiv(headdim, BLOCK_P), nheads)
    c = c.to(tl.int64)
    g = h // (nheads // ngroups)
    tok0 = tl.load(chunk_token_ptr + c).to(tl.int64)
    n = tl.load(chunk_len_ptr + c)
    p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    d = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    pv = p < headdim
    dv = d < dstate
    # Scalar 64-bit bases, 32-bit offsets inside the chunk (fewer registers per tile). The bases must be
    # 64-bit: tok0 * stride_tok passes 2**31 from token 203,053 on when the inputs are views into a fused
    # in_proj buffer at Mamba2-2.7B widths (10576 elements per token); an offset inside a chunk stays below
    # chunk_size * stride_tok (2.7M there).
    x_chunk = x_ptr + tok0 * stride_x_tok + h * stride_x_head + p[:, None] * stride_x_dim
    b_chunk = B_ptr + tok0 * stride_b_tok + g * stride_b_group + d[None, :] * stride_b_state
    row = (c * nheads + h) * chunk_size
    dA_last = tl.load(dA_cs_ptr + row + chunk_size - 1)
    acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    for t0 in range(0, n, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        tv = t < n
        xt = tl.load(x_chunk + t[None, :] * stride_x_tok, mask=tv[None, :] & pv[:, None], other=0.0)
        bt = tl.load(b_chunk + t[:, None] * stride_b_tok, mask=tv[:, None] & dv[None, :], other=0.0)
        # Token t's weight: exp(dA_last - dA_t) * dt_t (the fp64 difference keeps small segments exact).
        w = decay2((dA_last - tl.load(dA_cs_ptr + row + t)).to(tl.float32) * LOG2E, tv) * tl.load(dt_ptr + row + t)
        acc = mma(operand(xt.to(tl.float32) * w[None, :], MM_DTYPE), operand(bt, MM_DTYPE), acc)
    out = local_ptr + (c * nheads + h) * headdim * dstate
    tl.store(out + p[:, None] * dstate + d[None, :], acc, mask=pv[:, None] & dv[None, :])


def default_config(headdim: int, dstate: int, chunk_size: int, interpret: bool = False) -> dict:
    """Block sizes and launch options: on a GPU the fastest of 48 configurations swept on the H200 with
    the weights on x (benchmarks/stage_configs.py; RESULTS.md, 2026-12-01: 0.81x the previous default at
    16k tokens, the fastest at 64k too);
    in the interpreter, whole-chunk tiles: it runs the programs one after
    another and each tile op is one numpy call, so fewer, larger programs run faster (the default
    preset's kernel time fell about 4x), and no register or shared-memory limit binds there."""
    if interpret:
        return dict(BLOCK_T=chunk_size, BLOCK_P=max(16, next_power_of_2(headdim)),
                    BLOCK_N=max(16, next_power_of_2(dstate)), num_warps=8, num_stages=1)
    return dict(BLOCK_T=min(chunk_size, 32), BLOCK_P=max(16, min(next_power_of_2(headdim), 64)),
                BLOCK_N=max(16, min(next_power_of_2(dstate), 128)), num_warps=4, num_stages=3)


def chunk_state(x, B, dt_proc, dA_cs, mm_dtype, table: ChunkTable, interpret: bool, config: dict | None = None,
                alloc=torch.empty):
    """x (ntok, nheads, headdim), B (ntok, ngroups, dstate) -> each chunk's own state,
    (nchunks, nheads, headdim, dstate) fp32, allocated by `alloc` (torch.empty's signature)."""
    _, nheads, headdim = x.shape
    ngroups, dstate = B.shape[1], B.shape[2]
    cfg = {**default_config(headdim, dstate, table.chunk_size, interpret), **(config or {})}
    local = alloc((table.nchunks, nheads, headdim, dstate), device=x.device, dtype=torch.float32)
    grid = (table.nchunks * nheads * cdiv(headdim, cfg["BLOCK_P"]) * cdiv(dstate, cfg["BLOCK_N"]),)
    _chunk_state_kernel[grid](
        x, B, dt_proc, dA_cs, table.chunk_token, table.chunk_len, local,
        nheads, ngroups, headdim, dstate, table.chunk_size, *x.stride(), *B.stride(),
        MM_DTYPE=mm_dtype, **cfg,
    )
    return local
