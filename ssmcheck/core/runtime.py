"""Where kernels run: compiled on a CUDA GPU, or through Triton's interpreter on the CPU.

Triton reads TRITON_INTERPRET when it is first imported, so the choice is made
once, here, before any kernel module (which imports triton) is loaded. Every
entry point (CLI, tests, benchmarks) calls `configure` first.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import asdict, dataclass

import torch

DEVICES = ("cpu", "cuda")


class DeviceError(ValueError):
    """The requested device cannot be used in this process."""


@dataclass(frozen=True)
class Environment:
    device: str  # "cpu" or "cuda"
    interpreter: bool  # kernels run through Triton's interpreter
    torch: str
    triton: str
    gpu: str | None  # e.g. "NVIDIA H200 (sm_90)"
    python: str

    def as_dict(self) -> dict:
        return asdict(self)


_configured: Environment | None = None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def configure(device: str | None = None) -> Environment:
    """Choose the device (CUDA when available unless `device` says otherwise).

    On the CPU, sets TRITON_INTERPRET=1 before triton is imported. Raises
    DeviceError for an unknown or unavailable device, or when triton was
    already imported in the other mode.
    """
    global _configured
    if device is not None and device not in DEVICES:
        raise DeviceError(f"unknown device {device!r}: choose one of {', '.join(DEVICES)}")
    if device is None:
        device = "cuda" if torch.cuda.is_available() and not _interpreting() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise DeviceError("device 'cuda' requested but torch sees no CUDA GPU")
    want_interpreter = device == "cpu"
    if "triton" in sys.modules:
        if _interpreting() != want_interpreter:
            mode = "interpreter" if _interpreting() else "compiled"
            raise DeviceError(
                f"triton was already imported in {mode} mode; cannot switch to device {device!r}"
            )
    elif want_interpreter:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)

    import triton  # noqa: PLC0415  (deliberately late: see module docstring)

    if want_interpreter:
        _skip_interpreter_overflow_checks()
        _patch_language_once_per_launch()
        _cache_interpreter_dtypes()
        _widen_bf16_exactly()
    gpu = None
    if device == "cuda":
        major, minor = torch.cuda.get_device_capability()
        gpu = f"{torch.cuda.get_device_name()} (sm_{major}{minor})"
    _configured = Environment(
        device=device,
        interpreter=want_interpreter,
        torch=torch.__version__,
        triton=triton.__version__,
        gpu=gpu,
        python=platform.python_version(),
    )
    return _configured


def _skip_interpreter_overflow_checks() -> None:
    """Turn off the interpreter's overflow check of every int32 add, sub and mul.

    Each checked op is redone in int64 and compared, a fifth of a CPU scan's time, for a device_assert
    that is a no-op unless TRITON_DEBUG is set (and compiled kernels do not check at all). The
    builder's options are a frozen dataclass of the interpreter module; a Triton without them is left
    as it is."""
    from dataclasses import replace  # noqa: PLC0415

    from triton.runtime import interpreter  # noqa: PLC0415

    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is not None and getattr(options, "sanitize_overflow", False):
        builder.options = replace(options, sanitize_overflow=False)


def _patch_language_once_per_launch() -> None:
    """Stop the interpreter from re-patching triton.language on every nested @triton.jit call.

    A launch patches the language modules its kernel sees and restores them when it ends; each call of
    a @triton.jit helper inside it patches them again (several hundred attributes, never restored: the
    values are the same), about a third of a CPU scan's kernel time where helpers nest (rounding).
    Within a launch, a helper whose language modules the launch already patched skips it; any other
    call patches as before. A Triton without `_patch_lang` is left as it is."""
    from triton.runtime import interpreter  # noqa: PLC0415

    patch = getattr(interpreter, "_patch_lang", None)
    if patch is None or getattr(patch, "once_per_launch", False):
        return
    import triton.language as tl  # noqa: PLC0415

    launch = {"scope": None, "langs": set()}  # the running launch's scope and the modules it patched

    def patch_once(fn):
        langs = {id(value) for value in fn.__globals__.values() if value is tl or value is tl.core}
        if launch["scope"] is not None:  # a helper called inside a launch
            if langs <= launch["langs"]:
                return launch["scope"]
            launch["langs"] |= langs
            return patch(fn)
        scope = patch(fn)
        restore = scope.restore

        def end_launch():
            launch["scope"], launch["langs"] = None, set()
            restore()

        scope.restore = end_launch
        launch["scope"], launch["langs"] = scope, langs
        return scope

    patch_once.once_per_launch = True
    interpreter._patch_lang = patch_once


def _cache_interpreter_dtypes() -> None:
    """Memoise the interpreter's lookup of the numpy dtype of a Triton type, by element type.

    `_get_np_dtype` builds a dict of some twenty numpy dtypes on every call, and nearly every tile op of an
    interpreted kernel calls it (about 5% of a CPU scan). The memo returns what the lookup returns (a block
    type's answer is its element type's, a pointer's is uint64 as before). A Triton without it is left as it
    is."""
    from triton.runtime import interpreter  # noqa: PLC0415

    lookup = getattr(interpreter, "_get_np_dtype", None)
    if lookup is None or getattr(lookup, "memoised", False):
        return
    import triton.language as tl  # noqa: PLC0415

    known = {}

    def memoised(tt_dtype):
        scalar = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        if isinstance(scalar, tl.pointer_type):
            return lookup(scalar)
        found = known.get(scalar)
        if found is None:
            found = known[scalar] = lookup(scalar)
        return found

    memoised.memoised = True
    memoised.lookup = lookup  # the original, for tests
    interpreter._get_np_dtype = memoised


def _widen_bf16_exactly() -> None:
    """Convert bf16 to fp32 in the interpreter by a 16-bit shift of the pattern, as the GPU does (exactly).

    The interpreter's generic float conversion takes some 300 us a 64 x 64 tile (every loaded bf16 operand
    of a CPU scan passes there: about a tenth of its time) and turns bf16 subnormals into wrong values
    (0x0001, 2**-133, becomes 0). A Triton whose builder has no `cast_impl` is left as it is."""
    import numpy as np  # noqa: PLC0415
    import triton.language as tl  # noqa: PLC0415
    from triton.runtime import interpreter  # noqa: PLC0415

    builder = type(getattr(interpreter, "interpreter_builder", None))
    cast = getattr(builder, "cast_impl", None)
    if cast is None or getattr(cast, "bf16_by_shift", False):
        return

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.bfloat16 and dst_type.scalar == tl.float32:  # bf16 is stored as uint16
            return interpreter.TensorHandle((src.data.astype(np.uint32) << np.uint32(16)).view(np.float32),
                                            dst_type.scalar)
        return cast(self, src, dst_type)

    cast_impl.bf16_by_shift = True
    builder.cast_impl = cast_impl


def environment() -> Environment:
    """The environment chosen by `configure` (configuring with defaults if needed)."""
    return _configured if _configured is not None else configure()
