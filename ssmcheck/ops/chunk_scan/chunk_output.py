"""Stage 5: each chunk's output.

y_m = sum_{k<=m} (C_m·B_k) exp(dA_m - dA_k) dt_k x_k      (intra-chunk, causal)
    + exp(dA_m) C_m · state_in                            (the chunk's incoming state)
    + D x_m, then y_m * silu(z_m).

One program owns BLOCK_ROWS rows of one (chunk, head, headdim block) and walks
them BLOCK_M at a time, reading and rounding the incoming state once.

The inner loop is the stage's time (ncu on the H200: instruction-bound), so it does
per score only what the score needs:
- causality comes from C·Bᵀ, which chunk_cb zeroes above the diagonal: no compare and
  select per score (they were 63 of the loop's 361 SASS instructions). A non-causal
  score is then 0 · decay · dt_k = 0, the decay clamped into [0, 1]: a non-finite dt_k
  (or x_k, as in any tensor-core product) of a later token can reach the rows of its
  own BLOCK_K column block, which finite inputs never meet;
- the decays' base-2 logs arrive as fp32 (hi, lo) pairs (dt_cumsum writes them beside the fp64
  cumulative sums), not as fp64 to scale and split per column block.
Together: 361 -> 253 SASS instructions per loop iteration (benchmarks/sass_loop.py), the stage
0.530 -> 0.374 ms at 16k tokens on the H200 (benchmarks/RESULTS.md, 2026-12-01).
"""

import triton
import triton.language as tl

from ssmcheck.ops.host import cdiv, next_power_of_2
from ssmcheck.ops.rounding.stochastic import round_saturating, triton_dtype

from .layout import ChunkTable
from .numerics import decay2, mma, operand, program_coords


# Whether there are D and z is a run-time flag, and the group count is not specialised: each would otherwise double
# the variants Triton compiles (every scan case also calls the kernel without D and z for its SSM part; compiling
# is most of the default scan's time on a fresh machine: benchmarks/RESULTS.md, "fewer variants"). The flags
# guard only the epilogue. D per channel stays a constexpr: a per-channel load with a run-time stride kept its
# addresses live through the loop: 168 registers instead of 128 at Mamba2-2.7B widths (benchmarks/sass_loop.py), and
# the whole scan 1.37x slower at 64k tokens on the H200.
@triton.jit(do_not_specialize=["ngroups"])
def _chunk_output_kernel(
    x_ptr, z_ptr, C_ptr, D_ptr, cb_ptr, dt_ptr, log2_ptr, states_ptr, chunk_token_ptr, chunk_len_ptr, y_ptr,
    nheads, ngroups, headdim, dstate,
    stride_x_tok, stride_x_head, stride_x_dim,
    stride_z_tok, stride_z_head, stride_z_dim,
    stride_c_tok, stride_c_group, stride_c_state,
    stride_y_tok, stride_y_head, stride_y_dim,
    has_d, has_z, D_PER_CHANNEL: tl.constexpr,
    MM_DTYPE: tl.constexpr, OUT_DTYPE: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # Chunks vary slowest, so the programs of one chunk run together and share C and C·Bᵀ in L2.
    pid = tl.program_id(0)
    rb, pb, h, c = program_coords(pid, CHUNK // BLOCK_ROWS, tl.cdiv(headdim, BLOCK_P), nheads)
    c = c.to(tl.int64)
    g = h // (nheads // ngroups)
    tok0 = tl.load(chunk_token_ptr + c).to(tl.int64)
    n = tl.load(chunk_len_ptr + c)
    if rb * BLOCK_ROWS >= n:
        return
    p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    d = tl.arange(0, BLOCK_D)
    pv = p < headdim
    dv = d < dstate
    row = (c * nheads + h) * CHUNK
    hi_row = log2_ptr + 2 * row  # (hi, lo) of the chunk's cumulative log2-decays: CHUNK his, then CHUNK los

    # The incoming state, (dstate, headdim block), rounded to the matmul dtype once.
    state_base = states_ptr + (c * nheads + h) * headdim * dstate
    st = operand(tl.load(state_base + p[None, :] * dstate + d[:, None], mask=pv[None, :] & dv[:, None], other=0.0),
                 MM_DTYPE)
    if D_PER_CHANNEL:
        Dh = tl.load(D_ptr + h * headdim + p, mask=pv & has_d, other=0.0).to(tl.float32)[None, :]
    else:
        Dh = tl.load(D_ptr + h, mask=has_d, other=0.0).to(tl.float32)
    # Scalar 64-bit bases, 32-bit offsets inside the chunk (fewer registers per tile). The bases must be
    # 64-bit: tok0 * stride_tok passes 2**31 from token 203,053 on when the inputs are views into a fused
    # in_proj buffer at Mamba2-2.7B widths (10576 elements per token); an offset inside a chunk stays below
    # CHUNK * stride_tok (2.7M there).
    x_chunk = x_ptr + tok0 * stride_x_tok + h * stride_x_head
    c_chunk = C_ptr + tok0 * stride_c_tok + g * stride_c_group
    cb_chunk = cb_ptr + (c * ngroups + g) * CHUNK * CHUNK
    x_cols = p[None, :] * stride_x_dim

    for m0 in range(rb * BLOCK_ROWS, tl.minimum((rb + 1) * BLOCK_ROWS, n), BLOCK_M):
        m = m0 + tl.arange(0, BLOCK_M)
        mv = m < n
        hi_m = tl.load(hi_row + m)
        lo_m = tl.load(hi_row + CHUNK + m)
        # Incoming state: exp(dA_m) * C_m · state_inᵀ.
        cm = tl.load(c_chunk + m[:, None] * stride_c_tok + d[None, :] * stride_c_state,
                     mask=mv[:, None] & dv[None, :], other=0.0)
        acc = mma(operand(cm, MM_DTYPE), st, tl.zeros((BLOCK_M, BLOCK_P), dtype=tl.float32))
        acc = acc * decay2(hi_m, mv)[:, None]
        # Intra-chunk: (C·Bᵀ ∘ decay ∘ dt) · x, causal through C·Bᵀ (the module's docstring), the scores
        # rounded to the matmul dtype.
        for k0 in range(0, tl.minimum(m0 + BLOCK_M, n), BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            kv = k < n
            # Unmasked (so vectorised): chunk_cb writes every entry, zero past the chunk's end and above
            # the diagonal; dt_cumsum writes the whole chunk (flat past its end, dt 0 there).
            cb = tl.load(cb_chunk + m[:, None] * CHUNK + k[None, :])
            hi_k = tl.load(hi_row + k)
            lo_k = tl.load(hi_row + CHUNK + k)
            dt_k = tl.load(dt_ptr + row + k)
            log2_decay = (hi_m[:, None] - hi_k[None, :]) + (lo_m[:, None] - lo_k[None, :])
            scores = cb * decay2(log2_decay, True) * dt_k[None, :]
            xk = tl.load(x_chunk + k[:, None] * stride_x_tok + x_cols, mask=kv[:, None] & pv[None, :], other=0.0)
            acc = mma(operand(scores, MM_DTYPE), operand(xk, MM_DTYPE), acc)

        out_mask = mv[:, None] & pv[None, :]
        if has_d:
            xm = tl.load(x_chunk + m[:, None] * stride_x_tok + x_cols, mask=out_mask, other=0.0).to(tl.float32)
            acc += Dh * xm
        if has_z:
            zm = tl.load(z_ptr + tok0 * stride_z_tok + h * stride_z_head + m[:, None] * stride_z_tok
                         + p[None, :] * stride_z_dim, mask=out_mask, other=0.0).to(tl.float32)
            acc *= zm * tl.sigmoid(zm)
        # Saturated: a finite y past fp16's range is stored as 65504, never inf (core.formats.saturate).
        y_chunk = y_ptr + tok0 * stride_y_tok + h * stride_y_head
        tl.store(y_chunk + m[:, None] * stride_y_tok + p[None, :] * stride_y_dim,
                 round_saturating(acc, OUT_DTYPE), mask=out_mask)


def default_config(headdim: int, dstate: int, chunk_size: int, interpret: bool = False) -> dict:
    """Best of the block configurations measured on the H200 (benchmarks/RESULTS.md: the fastest of the whole
    grid of 120 at 16k within noise; Triton 3.6 miscompiles five others, those with BLOCK_K=64 BLOCK_P=32
    num_warps=4 num_stages=1: an out-of-range shared-memory address in their tl.dot, so a `config` is not safe
    because it compiles), but two pipeline stages where the sweep picked three: at Mamba2-2.7B widths that
    leaves 128 registers and 49.5 KB of shared memory a program, so four programs fit an SM where three did
    (135 registers, 62 KB), 3.6% faster at 64k (RESULTS "the output stage at two pipeline stages"); in the
    interpreter, whole-chunk tiles: it runs the programs one after
    another and each tile op is one numpy call, so fewer, larger programs run faster (the default
    preset's kernel time fell about 4x), and no register or shared-memory limit binds there."""
    if interpret:
        return dict(BLOCK_ROWS=chunk_size, BLOCK_M=chunk_size, BLOCK_K=chunk_size,
                    BLOCK_P=max(16, next_power_of_2(headdim)), num_warps=4, num_stages=1)
    return dict(BLOCK_ROWS=chunk_size, BLOCK_M=min(chunk_size, 64), BLOCK_K=min(chunk_size, 32),
                BLOCK_P=max(16, min(next_power_of_2(headdim), 64)), num_warps=4, num_stages=2)


def chunk_output(x, z, C, D, cb, dt_proc, log2_pairs, states, y, mm_dtype, table: ChunkTable, interpret: bool,
                 config: dict | None = None):
    """Writes y (ntok, nheads, headdim) in place: every token of every chunk. `log2_pairs`: dt_cumsum's
    (nchunks, nheads, 2, chunk_size) fp32 (hi, lo) base-2 cumulative log-decays."""
    _, nheads, headdim = x.shape
    ngroups, dstate = C.shape[1], C.shape[2]
    cs = table.chunk_size
    cfg = {**default_config(headdim, dstate, cs, interpret), **(config or {})}
    if not interpret and config is None and states.element_size() == 2:
        # 16-bit states take the default tiles to 134 registers (fp32's: 128), three programs an SM instead of four;
        # capped, the MMA loop grows 233 -> 248 SASS instructions (benchmarks/RESULTS.md, 46th session). Timed only
        # together with the passed states in the inputs' dtype (48th session: bf16 states 0.66x vLLM at 64k, main's
        # uncapped 0.73x); the cap alone is not.
        cfg["maxnreg"] = 128
    grid = (table.nchunks * nheads * cdiv(headdim, cfg["BLOCK_P"]) * (cs // cfg["BLOCK_ROWS"]),)
    # Stand-ins for a missing z and D (never read), of the dtypes they usually have (x's; fp32), so that a call
    # without them shares the variant of one with them.
    zz = z if z is not None else x
    _chunk_output_kernel[grid](
        x, zz, C, D if D is not None else dt_proc, cb, dt_proc, log2_pairs, states, table.chunk_token,
        table.chunk_len, y,
        nheads, ngroups, headdim, dstate,
        *x.stride(), *zz.stride(), *C.stride(), *y.stride(), D is not None, z is not None,
        D_PER_CHANNEL=D is not None and D.dim() == 2,
        MM_DTYPE=mm_dtype, OUT_DTYPE=triton_dtype(y.dtype), CHUNK=cs,
        BLOCK_D=max(16, next_power_of_2(dstate)), **cfg,
    )
