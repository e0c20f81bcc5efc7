"""The chunk-scan kernel under test: resolving `--kernel` and calling it with the mamba signature.

`builtin` is ssmcheck's Triton kernel, `torch` the same-precision baseline run
as a kernel, anything else a `MODULE:FUNCTION` or `file.py:FUNCTION` with the
state-spaces/mamba `mamba_chunk_scan_combined` signature (DESIGN §2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ssmcheck.kernels import keywords, load_callable
from ssmcheck.regimes import ScanInputs

# Keywords beyond the mamba signature: how the chunk states are stored (issue #4).
STATE_OPTIONS = ("state_dtype", "rounding", "seed")


@dataclass(frozen=True)
class KernelUnderTest:
    name: str  # as given to --kernel
    fn: Callable
    takes_state_options: bool  # accepts state_dtype=, rounding=, seed=


def torch_kernel(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                 cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
                 return_varlen_states=False, *, state_dtype=torch.float32, rounding="nearest", seed=0):
    """The same-precision baseline behind the mamba signature (seq_idx is implied by cu_seqlens)."""
    from ssmcheck.ops.chunk_scan.naive import scan_baseline  # noqa: PLC0415

    out = scan_baseline(
        x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
        cu_seqlens=cu_seqlens, dt_softplus=dt_softplus, dt_limit=dt_limit, state_dtype=state_dtype,
        rounding=rounding, seed=seed,
    )
    extra = ([out.final_states] if return_final_states else []) + ([out.varlen_states] if return_varlen_states else [])
    return (out.y, *extra) if extra else out.y


def resolve(spec: str) -> KernelUnderTest:
    """Raises ssmcheck.kernels.KernelSpecError for a spec that names nothing callable."""
    if spec == "builtin":
        from ssmcheck.ops.chunk_scan.chunk import chunk_scan_combined  # noqa: PLC0415 (imports triton)

        fn = chunk_scan_combined
    elif spec == "torch":
        fn = torch_kernel
    else:
        fn = load_callable(spec)
    return KernelUnderTest(spec, fn, set(STATE_OPTIONS) <= keywords(fn))


class KernelOutputError(RuntimeError):
    """The kernel returned something other than the mamba signature promises."""


def call(kernel: KernelUnderTest, inputs: ScanInputs, chunk_size: int, state_dtype: torch.dtype,
         rounding: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the kernel; return (y, states): final states per row, or per sequence for varlen inputs."""
    extra = {}
    if kernel.takes_state_options:
        extra = dict(state_dtype=state_dtype, rounding=rounding, seed=seed)
    result = kernel.fn(
        inputs.x, inputs.dt, inputs.A, inputs.B, inputs.C, chunk_size, **inputs.kwargs(), seq_idx=inputs.seq_idx,
        return_final_states=not inputs.varlen, return_varlen_states=inputs.varlen, **extra,
    )
    if not (isinstance(result, tuple) and len(result) == 2 and all(isinstance(t, torch.Tensor) for t in result)):
        raise KernelOutputError(f"expected a tuple (out, states), got {type(result).__name__}")
    y, states = result
    nstates = inputs.nsequences
    expected = {"y": tuple(inputs.x.shape), "states": (nstates, *inputs.x.shape[2:], inputs.B.shape[-1])}
    for what, tensor in (("y", y), ("states", states)):
        if tuple(tensor.shape) != expected[what]:
            raise KernelOutputError(f"{what} has shape {tuple(tensor.shape)}, expected {expected[what]}")
    return y, states
