"""Chunk-scan kernels with exactly one wrong SSD stage, for the `scan --stages` tests.

Each is the built-in Triton kernel (ops/chunk_scan/chunk.py) with one of its five stage
functions replaced, and offers its stages as `ssd_stages`, as any MODULE:FUNCTION kernel can.
The other stages are the built-in ones, so every stage before the broken one is right, and
every stage after it inherits its error. Used as `--kernel tests/broken_stage_kernels.py:NAME`.

Where each one first goes wrong, in a batch without initial states (FIRST_WRONG):
- exclusive_cumsum: the cumulative decay, chunk 0 (every chunk);
- undecayed_state_passing: state passing, chunk 2 (chunk 1's incoming state is chunk 0's own
  state, which needs no decay);
- strict_cb_mask: C·Bᵀ, chunk 0 (the diagonal is masked away in every chunk);
- output_without_state: the output, chunk 1 (chunk 0's incoming state is zero);
- unwritten_chunk_state: the chunk states, chunk 0, non-finite where the stages' buffers are NaN-filled
  (the chunk's state is never written).
"""

import functools
from dataclasses import replace

import torch

from ssmcheck.ops.chunk_scan import chunk
from ssmcheck.ops.chunk_scan.numerics import LOG2E


def _exclusive_cumsum(dt, A, dt_bias, dt_softplus, dt_limit, table, alloc=torch.empty):
    """Each token's own dt·A left out of its cumulative sum (an off-by-one scan), in the fp64 sums and in the
    output stage's (hi, lo) base-2 pairs alike."""
    dt_proc, dA_cs, _ = chunk.dt_cumsum(dt, A, dt_bias, dt_softplus, dt_limit, table, alloc=alloc)
    dA_cs = dA_cs - (dt_proc * A.float()[None, :, None]).double()
    log2 = dA_cs * LOG2E.value
    hi = log2.float()
    return dt_proc, dA_cs, torch.stack([hi, (log2 - hi.double()).float()], dim=2)


def _undecayed_state_passing(local, dA_cs, *args, **kwargs):
    """States passed from chunk to chunk without the chunk's decay."""
    return chunk.state_passing(local, torch.zeros_like(dA_cs), *args, **kwargs)


def _strict_cb_mask(C, B, mm_dtype, table, interpret, config=None, alloc=torch.empty):
    """C·Bᵀ masked strictly below the diagonal: each token's own C·B term is lost."""
    cb = chunk.chunk_cb(C, B, mm_dtype, table, interpret, config, alloc=alloc)
    return cb * torch.ones(cb.shape[-2:], device=cb.device).tril(-1)


def _output_without_state(x, z, C, D, cb, dt_proc, log2_pairs, states, *args, **kwargs):
    """The output stage reads zero incoming states: only the intra-chunk part and D·x remain."""
    return chunk.chunk_output(x, z, C, D, cb, dt_proc, log2_pairs, torch.zeros_like(states), *args, **kwargs)


def _unwritten_chunk_state(x, B, dt_proc, dA_cs, mm_dtype, table, interpret, config=None, alloc=torch.empty):
    """Every chunk's state but the first one's written (a grid one program short)."""
    computed = chunk.chunk_state(x, B, dt_proc, dA_cs, mm_dtype, table, interpret, config)
    local = alloc(computed.shape, device=computed.device, dtype=computed.dtype)
    local[1:] = computed[1:]
    return local


def _kernel(**stage):
    """The built-in chunk scan with `stage` replaced, its stages offered as `ssd_stages`."""
    pipeline = replace(chunk.PIPELINE, **stage)
    fn = functools.partial(chunk.chunk_scan_combined, pipeline=pipeline)
    fn.ssd_stages = functools.partial(chunk.chunk_scan_stages, pipeline=pipeline)
    return fn


exclusive_cumsum = _kernel(dt_cumsum=_exclusive_cumsum)
undecayed_state_passing = _kernel(state_passing=_undecayed_state_passing)
strict_cb_mask = _kernel(chunk_cb=_strict_cb_mask)
output_without_state = _kernel(chunk_output=_output_without_state)
unwritten_chunk_state = _kernel(chunk_state=_unwritten_chunk_state)

# (stage, its label in messages, the chunk where it first goes wrong, how) per kernel; see the module docstring.
FIRST_WRONG = {
    "exclusive_cumsum": ("cumsum", "cumulative decay", 0, "out of tolerance"),
    "undecayed_state_passing": ("passed_states", "state passing", 2, "out of tolerance"),
    "strict_cb_mask": ("cb", "C·Bᵀ", 0, "out of tolerance"),
    "output_without_state": ("output", "output", 1, "out of tolerance"),
    "unwritten_chunk_state": ("chunk_states", "chunk states", 0, "nonfinite"),
}
