"""Reference math shared by the chunk-scan and state-update references (torch only).

Conventions follow state-spaces/mamba: dt += dt_bias, softplus if asked, clamp to
dt_limit only when it is not (0, inf); head h reads group h // (nheads // ngroups);
D is (nheads,) or (nheads, headdim); y *= silu(z).
"""

from __future__ import annotations

import math

import torch

NO_DT_LIMIT = (0.0, math.inf)


def softplus(v: torch.Tensor) -> torch.Tensor:
    """log(1 + exp(v)) without overflow or cancellation, for any v."""
    return torch.clamp(v, min=0) + torch.log1p(torch.exp(-v.abs()))


def process_dt(dt, dt_bias, dt_softplus, dt_limit, dtype) -> torch.Tensor:
    """dt + dt_bias, softplus, then the dt_limit clamp (only when a limit is set), in `dtype`.

    dt is (..., nheads); dt_bias is (nheads,).
    """
    dt = dt.to(dtype)
    if dt_bias is not None:
        dt = dt + dt_bias.to(dtype)
    if dt_softplus:
        dt = softplus(dt)
    if tuple(dt_limit) != NO_DT_LIMIT:
        dt = torch.clamp(dt, dt_limit[0], dt_limit[1])
    return dt


def heads_of_groups(t: torch.Tensor, nheads: int, dim: int = -2) -> torch.Tensor:
    """Repeat the group axis `dim` of t (B or C, (..., ngroups, dstate) by default) to nheads:
    head h reads group h // (nheads // ngroups)."""
    ngroups = t.shape[dim]
    if nheads % ngroups:
        raise ValueError(f"nheads ({nheads}) must be a multiple of ngroups ({ngroups})")
    # output_size: without it, CUDA reads the size back from the device (no CUDA graph can hold that).
    return t.repeat_interleave(nheads // ngroups, dim=dim, output_size=nheads)


def skip_and_gate(y, x, D, z, dtype) -> torch.Tensor:
    """y + D*x, then y * silu(z); y, x, z (..., nheads, headdim); D (nheads,) or (nheads, headdim)."""
    if D is not None:
        Dd = D.to(dtype)
        y = y + (Dd[:, None] if Dd.dim() == 1 else Dd) * x.to(dtype)
    if z is not None:
        y = y * torch.nn.functional.silu(z.to(dtype))
    return y
