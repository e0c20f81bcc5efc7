"""The chunk-scan kernel under test, behind one adapter: what it can do, how it is called, what it returned.

`builtin` is ssmcheck's Triton kernel, `torch` the same-precision baseline run
as a kernel, anything else a `MODULE:FUNCTION` or `file.py:FUNCTION` with the
state-spaces/mamba `mamba_chunk_scan_combined` signature (DESIGN §2).

The adapter owns:
- capability discovery: whether the kernel takes our state_dtype/rounding/seed
  keywords (named in its signature), and which chunk sizes it supports;
- the call, with the mamba signature, under guards: what the kernel prints is captured
  (core.capture), and a kernel calling sys.exit or raising KeyboardInterrupt raises
  KernelExit, one case's error rather than the end of the tool;
- output validation: a tuple (out, states) of the promised shapes, dtypes and
  device, and the inputs unchanged after the call. Anything else raises
  KernelOutputError with one line saying what was expected and what came back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ssmcheck.core.callables import kernel_name, keywords, load_callable
from ssmcheck.core.capture import Transcript, captured_stdout
from ssmcheck.core.formats import DTYPES, dtype_name
from ssmcheck.core.tensors import same_bits
from ssmcheck.scan.inputs import ScanInputs
from ssmcheck.scan.spec import ScanCase

BUILTIN, TORCH = "builtin", "torch"
# Keywords beyond the mamba signature: how the chunk states are stored.
STATE_OPTIONS = ("state_dtype", "rounding", "seed")


class KernelOutputError(RuntimeError):
    """The kernel returned something other than the mamba signature promises, or changed its inputs."""


class KernelExit(RuntimeError):
    """The kernel raised SystemExit or KeyboardInterrupt; the message is the whole description."""


@dataclass(frozen=True)
class ScanAdapter:
    name: str  # as given to --kernel
    fn: Callable
    takes_state_options: bool  # accepts state_dtype=, rounding=, seed=
    chunk_sizes: tuple[int, ...] | None = None  # the chunk sizes it supports (None: any)
    chunk_size_rule: str = ""  # those in words, for skip reasons
    options: dict = field(default_factory=dict)  # further keywords of every call (builtin: interpret)

    def skip_reason(self, case: ScanCase) -> str | None:
        """Why this kernel cannot run `case` (None: it can)."""
        if self.chunk_sizes is not None and case.chunk_size not in self.chunk_sizes:
            return f"{self.chunk_size_rule}, not {case.chunk_size}"
        if not self.takes_state_options and (case.state_dtype, case.rounding) != ("fp32", "nearest"):
            return (
                f"{self.name} takes no state_dtype/rounding/seed keywords, so it cannot store "
                f"{case.state_dtype} states with {case.rounding} rounding"
            )
        return None

    def call(self, inputs: ScanInputs, case: ScanCase,
             transcript: Transcript | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the kernel on `inputs`; return (y, states): final states per row, or per sequence for varlen.

        What the kernel prints goes to `transcript` (discarded without one). Raises what the
        kernel raised, KernelExit for SystemExit and KeyboardInterrupt, KernelOutputError.
        """
        extra = dict(self.options)
        state_dtype = DTYPES[case.state_dtype]
        if self.takes_state_options:
            extra.update(state_dtype=state_dtype, rounding=case.rounding, seed=case.seed)
        before = _snapshot(inputs)
        # Exactly these two, not BaseException: a user's Ctrl-C arrives as the CLI's own
        # exception (core.execution.Interrupted) and must end the sweep, not this case.
        try:
            with captured_stdout(transcript if transcript is not None else Transcript()):
                result = self.fn(
                    inputs.x, inputs.dt, inputs.A, inputs.B, inputs.C, case.chunk_size, **inputs.kwargs(),
                    seq_idx=inputs.seq_idx, return_final_states=not inputs.varlen,
                    return_varlen_states=inputs.varlen, **extra,
                )
        except SystemExit as exc:
            raise KernelExit(f"SystemExit: {exc.code} (the kernel called sys.exit)") from exc
        except KeyboardInterrupt as exc:
            raise KernelExit("KeyboardInterrupt raised by the kernel") from exc
        y, states = _unpack(result)
        x = inputs.x
        state_shape = (inputs.nsequences, *x.shape[2:], inputs.B.shape[-1])
        _check_tensor("y", y, tuple(x.shape), (x.dtype,), x.device, "x's dtype")
        storage = (state_dtype,) if self.takes_state_options else tuple(DTYPES.values())
        why = "the requested --state-dtype" if self.takes_state_options else "a storage format"
        _check_tensor("states", states, state_shape, storage, x.device, why)
        _check_unchanged(before, inputs)
        return y, states


def _unpack(result) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(result, tuple):
        raise KernelOutputError(f"expected a tuple (out, states), got {type(result).__name__}")
    if len(result) != 2:
        raise KernelOutputError(f"expected a tuple (out, states), got a tuple of {len(result)}")
    for what, value in zip(("out", "states"), result):
        if not isinstance(value, torch.Tensor):
            raise KernelOutputError(f"expected a tuple (out, states) of tensors, got {what} of type {type(value).__name__}")
    return result


def _check_tensor(what: str, tensor: torch.Tensor, shape: tuple, dtypes: tuple, device: torch.device,
                  why: str) -> None:
    if tuple(tensor.shape) != shape:
        raise KernelOutputError(f"{what} has shape {tuple(tensor.shape)}, expected {shape}")
    if tensor.dtype not in dtypes:
        expected = " or ".join(dtype_name(d) for d in dtypes)
        raise KernelOutputError(f"{what} has dtype {dtype_name(tensor.dtype)}, expected {expected} ({why})")
    if tensor.device != device:
        raise KernelOutputError(f"{what} is on {tensor.device}, expected {device} (where the inputs are)")


_INPUTS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states", "cu_seqlens")


def _snapshot(inputs: ScanInputs) -> dict[str, torch.Tensor]:
    return {name: getattr(inputs, name).clone() for name in _INPUTS if getattr(inputs, name) is not None}


def _check_unchanged(before: dict[str, torch.Tensor], inputs: ScanInputs) -> None:
    for name, copy in before.items():
        if not same_bits(copy, getattr(inputs, name)):
            raise KernelOutputError(f"the kernel wrote into its input {name}: inputs must be left unchanged")


def torch_kernel(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                 cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
                 return_varlen_states=False, *, state_dtype=torch.float32, rounding="nearest", seed=0):
    """The same-precision baseline behind the mamba signature (seq_idx is implied by cu_seqlens)."""
    from ssmcheck.ops.chunk_scan.baseline import scan_baseline  # noqa: PLC0415

    out = scan_baseline(
        x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
        cu_seqlens=cu_seqlens, dt_softplus=dt_softplus, dt_limit=dt_limit, state_dtype=state_dtype,
        rounding=rounding, seed=seed,
    )
    extra = ([out.final_states] if return_final_states else []) + ([out.varlen_states] if return_varlen_states else [])
    return (out.y, *extra) if extra else out.y


def resolve(spec: str | Callable, interpreter: bool) -> ScanAdapter:
    """The adapter of a --kernel value, or of a callable passed through the Python API. Raises
    core.callables.KernelSpecError for a spec that names nothing callable. `builtin` imports
    triton: configure the runtime first."""
    if spec == BUILTIN:
        from ssmcheck.ops.chunk_scan.chunk import CHUNK_SIZES, chunk_scan_combined  # noqa: PLC0415

        sizes = sorted(CHUNK_SIZES)
        return ScanAdapter(
            spec, chunk_scan_combined, takes_state_options=True, chunk_sizes=tuple(sizes),
            chunk_size_rule=f"the built-in kernel takes power-of-two chunk sizes {sizes[0]}..{sizes[-1]}",
            options={"interpret": interpreter},
        )
    if callable(spec):
        return ScanAdapter(kernel_name(spec), spec, set(STATE_OPTIONS) <= keywords(spec))
    fn = torch_kernel if spec == TORCH else load_callable(spec)
    return ScanAdapter(spec, fn, set(STATE_OPTIONS) <= keywords(fn))
