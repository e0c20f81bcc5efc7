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

from ssmcheck.core import interpreter_fast

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


def interpreting() -> bool:
    """Whether Triton runs kernels through its interpreter: TRITON_INTERPRET read as Triton reads it
    (1, true, on, yes or y, in any case).

    What a kernel entry point's `interpret=None` stands for.
    """
    return os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes", "y")


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
        device = "cuda" if torch.cuda.is_available() and not interpreting() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise DeviceError("device 'cuda' requested but torch sees no CUDA GPU")
    want_interpreter = device == "cpu"
    if "triton" in sys.modules:
        if interpreting() != want_interpreter:
            mode = "interpreter" if interpreting() else "compiled"
            raise DeviceError(
                f"triton was already imported in {mode} mode; cannot switch to device {device!r}"
            )
    elif want_interpreter:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)

    import triton  # noqa: PLC0415  (deliberately late: see module docstring)

    if want_interpreter:
        mend_interpreter()
    gpu = None
    if device == "cuda":
        from ssmcheck.core import compile_claims  # noqa: PLC0415 (imports triton: after the mode is set)

        compile_claims.install()
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


def mend_interpreter() -> None:
    """Patch Triton's interpreter where it is slow or computes what no GPU computes (each patch once; a Triton
    without the patched part is left as it is). `configure("cpu")` calls it, and so does importing
    ssmcheck.ops under TRITON_INTERPRET: the built-in kernels' bf16 conversions and dots rely on it."""
    _skip_interpreter_overflow_checks()
    _patch_language_once_per_launch()
    _cache_interpreter_dtypes()
    _memoise_tile_types()
    _bf16_as_on_the_gpu()
    _bool_arguments_as_int1()
    _scalars_as_indices()
    _all_ones_of_unsigned_types()
    interpreter_fast.install()


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


def _memoise_tile_types() -> None:
    """Memoise what Triton's tile type and tile constructors derive from a shape.

    Every tile op of an interpreted kernel builds a `block_type` and a `tensor`, and each construction
    validates the shape, formats a name and builds Triton tuples of constexprs from it: a third of a CPU
    scan's time. The first construction for a shape (and element type) runs Triton's own constructor and
    keeps the attributes it derived from the shape; later ones share them: Triton tuples, constexprs, numbers
    and strings, which Triton never changes in place (a Triton whose constructor derives a list is not
    memoised for it). A Triton whose constructors take other parameters is left as it is."""
    import inspect  # noqa: PLC0415

    import triton.language as tl  # noqa: PLC0415

    block_type, tensor, constexpr = tl.core.block_type, tl.core.tensor, tl.core.constexpr
    block_init, tensor_init = block_type.__init__, tensor.__init__
    if getattr(block_init, "memoised", False):
        return
    if (list(inspect.signature(block_init).parameters) != ["self", "element_ty", "shape"]
            or list(inspect.signature(tensor_init).parameters) != ["self", "handle", "type"]):
        return
    blocks = {}  # (element type's name, shape) -> the block type's other attributes, or False: not shared
    tensors = {}  # shape (or block type's name) -> a tensor's attributes but its handle, type and dtype, or False

    def shareable(attributes: dict):
        return False if any(isinstance(v, (list, dict, set)) for v in attributes.values()) else attributes

    def memoised_block_init(self, element_ty, shape):
        try:
            key = (str(element_ty), tuple(s.value if isinstance(s, constexpr) else s for s in shape))
            derived = blocks.get(key)
        except TypeError:  # not a shape of hashable entries: Triton's constructor says what is wrong with it
            key = derived = None
        if derived is None or derived is False:
            block_init(self, element_ty, shape)
            if key is not None and derived is None:
                blocks[key] = shareable({k: v for k, v in vars(self).items() if k != "element_ty"})
            return
        self.element_ty = element_ty
        self.__dict__.update(derived)

    def memoised_tensor_init(self, handle, type):  # noqa: A002  (Triton's name)
        if type.__class__ is block_type:
            key = type.name  # its shape and element type, formatted once per block type
        else:
            key = tuple(type.shape) if type.is_block() else ()
        derived = tensors.get(key)
        if derived is None or derived is False:
            tensor_init(self, handle, type)
            if derived is None:
                tensors[key] = shareable({k: v for k, v in vars(self).items() if k not in ("handle", "type", "dtype")})
            return
        self.handle, self.type, self.dtype = handle, type, type.scalar
        self.__dict__.update(derived)

    memoised_block_init.memoised = True
    memoised_block_init.original, memoised_tensor_init.original = block_init, tensor_init  # for tests
    block_type.__init__, tensor.__init__ = memoised_block_init, memoised_tensor_init


def _bf16_as_on_the_gpu() -> None:
    """Make the interpreter's bf16 conversions and bf16 `tl.dot` compute what an NVIDIA GPU computes.

    The interpreter stores bf16 as uint16 patterns. Its conversions go through a generic routine that turns
    bf16 subnormals into other values, truncates fp32 -> bf16 (the GPU rounds to nearest even), and takes
    some 300 us a 64 x 64 tile; its `tl.dot` multiplies bf16 operands as those integers. Here bf16 -> fp32 is
    the 16-bit shift (exact), fp32 -> bf16 rounds the pattern to nearest even (or cuts it, for
    fp_downcast_rounding="rtz"), NaN becoming 0x7FFF as `cvt.rn.bf16.f32` makes it, and a dot widens bf16
    operands exactly to fp32 and accumulates in the accumulator's dtype, as a tensor core does. So a user's
    bf16 kernel checked on the CPU computes the GPU's values (up to the order of a dot's sums). A Triton
    whose builder lacks these methods is left as it is."""
    import numpy as np  # noqa: PLC0415
    import triton.language as tl  # noqa: PLC0415
    from triton.runtime import interpreter  # noqa: PLC0415

    builder = type(getattr(interpreter, "interpreter_builder", None))
    cast = getattr(builder, "cast_impl", None)
    fp_to_fp = getattr(builder, "create_fp_to_fp", None)
    dot = getattr(builder, "create_dot", None)
    toward_zero = getattr(getattr(getattr(interpreter, "_ir", None), "ROUNDING_MODE", None), "RTZ", None)
    if None in (cast, fp_to_fp, dot, toward_zero) or getattr(cast, "bf16_as_on_the_gpu", False):
        return
    handle = interpreter.TensorHandle

    def widened(data):  # bf16 patterns -> fp32, exactly
        return (data.astype(np.uint32) << np.uint32(16)).view(np.float32)

    def narrowed(data, cut: bool):  # fp32 -> bf16 patterns
        bits = np.asarray(data, dtype=np.float32).view(np.uint32)
        if not cut:  # to nearest even; a finite value past bf16's largest rounds to inf
            bits = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
        return np.where(np.isnan(data), np.uint16(0x7FFF), (bits >> np.uint32(16)).astype(np.uint16))

    # Other arguments pass through as given: Triton versions differ in them.
    def cast_impl(self, src, dst_type, *rest, **options):
        if src.dtype.scalar == tl.bfloat16 and dst_type.scalar == tl.float32:
            return handle(widened(src.data), dst_type.scalar)
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return handle(narrowed(src.data, False), dst_type.scalar)
        return cast(self, src, dst_type, *rest, **options)

    def create_fp_to_fp(self, src, dst_type, rounding_mode, *rest, **options):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return handle(narrowed(src.data, rounding_mode == toward_zero), dst_type.scalar)
        return fp_to_fp(self, src, dst_type, rounding_mode, *rest, **options)

    def create_dot(self, a, b, d, *rest, **options):
        if a.dtype.scalar == tl.bfloat16 or b.dtype.scalar == tl.bfloat16:
            a_data, b_data = (widened(h.data) if h.dtype.scalar == tl.bfloat16 else h.data for h in (a, b))
            return handle(np.matmul(a_data, b_data, dtype=d.data.dtype) + d.data, d.dtype.scalar)
        return dot(self, a, b, d, *rest, **options)

    cast_impl.bf16_as_on_the_gpu = True
    builder.cast_impl, builder.create_fp_to_fp, builder.create_dot = cast_impl, create_fp_to_fp, create_dot


def _bool_arguments_as_int1() -> None:
    """Give a kernel's bool argument (the built-in kernels' run-time flags, such as has_d) to the interpreter as
    an int1 scalar of numpy bools, as Triton 3.9's interpreter does. Triton 3.6's treats a bool as any int: an
    int1 scalar holding int32 data, which its own size check refuses ("numpy data itemsize (32 bits) exceeds
    dtype primitive_bitwidth (1 bits)"), so every launch with a bool argument raised. A Triton whose
    interpreter has no `_implicit_cvt` is left as it is."""
    import numpy as np  # noqa: PLC0415
    import triton.language as tl  # noqa: PLC0415
    from triton.runtime import interpreter  # noqa: PLC0415

    convert = getattr(interpreter, "_implicit_cvt", None)
    if convert is None or getattr(convert, "bool_as_int1", False):
        return

    def bool_as_int1(arg):
        if arg.__class__ is bool:
            return tl.tensor(interpreter.TensorHandle(np.array([arg], dtype=np.bool_), tl.int1), tl.int1)
        return convert(arg)

    bool_as_int1.bool_as_int1 = True
    interpreter._implicit_cvt = bool_as_int1


def _scalars_as_indices() -> None:
    """Let a scalar loaded in a kernel be a Python index (`range(0, n, BLOCK)` with n from memory), as Triton 3.9's
    interpreter does: its `__index__` converts the scalar's one-element array after a squeeze. Triton 3.6's
    converts the array itself, which NumPy 2 refuses ("only 0-dimensional arrays can be converted to Python
    scalars"). Set after the interpreter's own tile patches, in the same scope (restored with them). A Triton
    whose interpreter has no `_patch_lang_tensor` is left as it is."""
    from triton.runtime import interpreter  # noqa: PLC0415

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "squeezed_index", False):
        return

    def squeezed_index(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    squeezed_index.squeezed_index = True
    interpreter._patch_lang_tensor = squeezed_index


def _all_ones_of_unsigned_types() -> None:
    """Make `~` of an unsigned tile (the stochastic rounding's masks) work under NumPy 2, as Triton 3.9's
    interpreter does: its all-ones constant of an unsigned type is the type's largest value. Triton 3.6's
    fills -1 into the unsigned array, which NumPy 2 refuses ("Python integer -1 out of bounds for uint32"). A
    Triton whose builder lacks the method is left as it is."""
    import numpy as np  # noqa: PLC0415
    from triton.runtime import interpreter  # noqa: PLC0415

    builder = type(getattr(interpreter, "interpreter_builder", None))
    all_ones = getattr(builder, "get_all_ones_value", None)
    if all_ones is None or getattr(all_ones, "unsigned_max", False):
        return

    def unsigned_max(self, type):  # noqa: A002  (Triton's name)
        np_type = interpreter._get_np_dtype(type)
        if np.issubdtype(np_type, np.unsignedinteger):
            return interpreter.TensorHandle(np.full(1, np.iinfo(np_type).max, dtype=np_type), type.scalar)
        return all_ones(self, type)

    unsigned_max.unsigned_max = True
    builder.get_all_ones_value = unsigned_max


def environment() -> Environment:
    """The environment chosen by `configure` (configuring with defaults if needed)."""
    return _configured if _configured is not None else configure()
