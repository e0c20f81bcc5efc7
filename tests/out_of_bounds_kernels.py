"""Kernels whose Triton programs reach outside their tensors, for core.accesses (used as
`--kernel tests/out_of_bounds_kernels.py:NAME` on the CPU, where Triton runs them through its interpreter).

Each computes the right results (the same-precision baseline) and then runs a program with a bound written wrong,
whose stray lanes touch memory past a tensor: what a GPU might survive, fault on or corrupt another tensor with.
"""

import torch
import triton
import triton.language as tl

from ssmcheck.ops.chunk_scan.baseline import scan_baseline

# _rescale_unmasked's block of elements: y's last block runs past its end where y holds no whole number of them.
BLOCK = 512


@triton.jit
def _rescale_unmasked(y_ptr, n, BLOCK: tl.constexpr):
    """y *= 1, in blocks of BLOCK, the bound `n` forgotten: the last block stores past y (the values it loaded)."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offsets, tl.load(y_ptr + offsets, mask=offsets < n) * 1.0)


@triton.jit
def _row_maxima(state_ptr, maxima_ptr, dstate, row_stride, BLOCK: tl.constexpr):
    """Each state row's largest magnitude, the row at row * row_stride."""
    row = tl.program_id(0)
    n = tl.arange(0, BLOCK)
    values = tl.load(state_ptr + row * row_stride + n, mask=n < dstate, other=0.0).to(tl.float32)
    tl.store(maxima_ptr + row, tl.max(tl.abs(values), 0))


def stores_past_y(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                  cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
                  return_varlen_states=False):
    """Right y and states; then y rescaled in place by a program whose last block stores past y's end."""
    out = scan_baseline(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                        cu_seqlens=cu_seqlens, dt_softplus=dt_softplus, dt_limit=dt_limit)
    y = out.y.contiguous()
    if y.numel() % BLOCK:  # (a whole number of blocks stays inside)
        _rescale_unmasked[(triton.cdiv(y.numel(), BLOCK),)](y, y.numel(), BLOCK=BLOCK)
    extra = ([out.final_states] if return_final_states else []) + ([out.varlen_states] if return_varlen_states else [])
    return (y, *extra) if extra else y


def reads_rows_at_a_heads_stride(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """The right step in fp32, rounded to nearest; then each state row's largest magnitude, for nothing, read at
    row * headdim * dstate (a head's stride written for a row's): past the state for all but its first rows."""
    dt = dt.float() + (dt_bias.float() if dt_bias is not None else 0.0)
    dt = torch.nn.functional.softplus(dt) if dt_softplus else dt
    heads_per_group = state.shape[1] // B.shape[1]
    Bh, Ch = (t.float().repeat_interleave(heads_per_group, dim=1)[:, :, None, :] for t in (B, C))
    new = state.float() * torch.exp(dt[..., None] * A.float()) + (dt * x.float())[..., None] * Bh
    out = (new * Ch).sum(-1) + (D.float() * x.float() if D is not None else 0.0)
    out = out * torch.nn.functional.silu(z.float()) if z is not None else out
    state.copy_(new.to(state.dtype))
    headdim, dstate = state.shape[-2:]
    rows = state.numel() // dstate
    maxima = torch.empty(rows, device=state.device)
    _row_maxima[(rows,)](state, maxima, dstate, headdim * dstate, BLOCK=triton.next_power_of_2(dstate))
    return out.to(x.dtype)
