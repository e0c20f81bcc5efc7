"""The same-precision baseline chunk scan: the SSD form in the kernel's dtype with the
peers' usual fp32 accumulation choices, i.e. the error a straightforward
implementation makes, which the tolerance rule (DESIGN §3) scales.
"""

from __future__ import annotations

import torch

from ssmcheck.ops.naive import NO_DT_LIMIT
from ssmcheck.ops.rounding.naive import round_to

from .naive import Arithmetic, ScanOutput, scan_ssd


def scan_baseline(
    x, dt, A, B, C, chunk_size, *, D=None, z=None, dt_bias=None, initial_states=None, cu_seqlens=None,
    dt_softplus=False, dt_limit=NO_DT_LIMIT, state_dtype=torch.float32, rounding="nearest", seed=0,
) -> ScanOutput:
    """The SSD form as a straightforward implementation in x.dtype computes it.

    dt and the cumulative log-decays in fp32 (differences clamped at 0 and masked
    before exp); every matmul operand rounded to x.dtype, products accumulated in
    fp32; states passed in fp32 and stored in state_dtype (rounded in `rounding`
    mode, stochastic draws from a generator seeded with `seed`); the stored
    incoming state rounded to x.dtype before C·state; y returned in x.dtype,
    states in state_dtype. Stochastic rounding into an fp32 state rounds nothing.
    Inputs and results as scan_recurrent's (naive.py).
    """
    generator = torch.Generator(device=x.device).manual_seed(seed)

    def store_state(s):
        return round_to(s.to(torch.float32), state_dtype, rounding, generator)

    arith = Arithmetic(torch.float32, x.dtype, store_state=store_state, exact_segments=False)
    out = scan_ssd(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus,
                   dt_limit, arith)
    out.y = out.y.to(x.dtype)
    return out
