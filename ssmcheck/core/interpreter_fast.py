"""Shortcuts through the front end of Triton's interpreter, for tile ops that need none of its work.

Under TRITON_INTERPRET every tile op of a kernel goes through Triton's semantic layer
(type promotion, casts, broadcasting) before numpy computes it; on a CPU scan that layer,
not numpy, is most of the kernels' time. Most binary ops need little of it: two tiles of
one dtype and shape, a tile and a scalar, two tiles of one rank. Here:
- the promotion of a binary op is decided once per pair of operand types (memoised, by
  Triton's own rule; a pair whose promotion raises is never kept) and a cast made only
  where Triton makes one;
- a broadcast compares shapes as Python lists of ints, where Triton compares its own
  tuples of constexprs; a tile's new axis is numpy's reshape, as numpy's expand_dims makes it;
- constexprs are unwrapped and plain dtypes compared by their exact class first;
- a patched builtin calls the builtin's own function, past a wrapper that only checks the
  argument the patch always passes.
Anything else takes Triton's own path, so every result and every error is Triton's
(the default CPU scan's results are the same, bit for bit: benchmarks/RESULTS.md).

`install` puts them on the interpreter's semantic object (compiled kernels have their
own) and on triton.language's helpers; `core.runtime.mend_interpreter` calls it, under
TRITON_INTERPRET only. A Triton whose parts are not of the shapes checked is left as it is.
"""

from __future__ import annotations

import inspect

# The Python numbers Triton's checks take as scalars (numbers.Number, less the types no kernel passes).
_NUMBERS = frozenset((int, float, bool))
_CHECKING = ["self", "lhs", "rhs", "allow_lhs_ptr", "allow_rhs_ptr", "arithmetic_check", "div_or_mod"]


def install() -> None:
    """Put the shortcuts in place (each once; each where its part of Triton has the shape checked)."""
    import triton.language as tl  # noqa: PLC0415
    from triton.runtime import interpreter  # noqa: PLC0415

    _semantic_shortcuts(interpreter, tl)
    _unwrap_by_class(tl.core)
    _dtype_equality_by_class(tl.core)
    _builtins_called_directly(interpreter, tl.core)


def _semantic_shortcuts(interpreter, tl) -> None:
    """Binary ops' promotion and broadcast, and expand_dims, on the interpreter's semantic object."""
    semantic = getattr(interpreter, "interpreter_semantic", None)
    if semantic is None or "binary_op_type_checking_impl" in vars(semantic):
        return
    checking = getattr(type(semantic), "binary_op_type_checking_impl", None)
    broadcast = getattr(type(semantic), "broadcast_impl_value", None)
    if checking is None or broadcast is None or list(inspect.signature(checking).parameters) != _CHECKING:
        return
    get_block_ty = getattr(getattr(interpreter, "interpreter_builder", None), "get_block_ty", None)
    if get_block_ty is None or not isinstance(get_block_ty(tl.float32, [2]), tl.block_type):
        return  # a splat's IR type would not be a block type (broadcast_fast)
    tensor, block_type = tl.core.tensor, tl.core.block_type

    def broadcast_fast(self, lhs, rhs):
        """Triton's broadcast_impl_value for tiles of one rank and for a tile with a scalar (a splat), on Python
        lists of ints where Triton compares its own tuples; anything else (and any error) Triton's own."""
        lhs_ty, rhs_ty = lhs.type, rhs.type
        lhs_block, rhs_block = lhs_ty.__class__ is block_type, rhs_ty.__class__ is block_type
        if lhs_block and rhs_block:
            if lhs_ty.shape is rhs_ty.shape:
                return lhs, rhs
            lhs_shape, rhs_shape = lhs_ty.shape.values, rhs_ty.shape.values
            if lhs_shape == rhs_shape:
                return lhs, rhs
            if len(lhs_shape) != len(rhs_shape):
                return broadcast(self, lhs, rhs)
            shape = []
            for left, right in zip(lhs_shape, rhs_shape):
                if left == 1:
                    shape.append(right)
                elif right == 1 or right == left:
                    shape.append(left)
                else:
                    return broadcast(self, lhs, rhs)
            if lhs_shape != shape:
                lhs = self.tensor(self.builder.create_broadcast(lhs.handle, shape), block_type(lhs_ty.scalar, shape))
            if rhs_shape != shape:
                rhs = self.tensor(self.builder.create_broadcast(rhs.handle, shape), block_type(rhs_ty.scalar, shape))
            return lhs, rhs
        if lhs_block or rhs_block:
            if lhs_block and not rhs_ty.is_block():
                # The splat's type is its own IR type here: the interpreter's builder makes an equal block type.
                splat_ty = lhs_ty.with_element_ty(rhs_ty.scalar)
                return lhs, self.tensor(self.builder.create_splat(splat_ty, rhs.handle), splat_ty)
            if rhs_block and not lhs_ty.is_block():
                splat_ty = rhs_ty.with_element_ty(lhs_ty.scalar)
                return self.tensor(self.builder.create_splat(splat_ty, lhs.handle), splat_ty), rhs
            return broadcast(self, lhs, rhs)
        if lhs_ty.is_block() or rhs_ty.is_block():
            return broadcast(self, lhs, rhs)
        return lhs, rhs

    # Python numbers take the shortcut where Triton converts them in the methods it is given here (Triton 3.9
    # does; 3.6 converts them inside the check, and they take its own path).
    numbers = _NUMBERS if all(hasattr(semantic, name) for name in ("to_tensor_type", "_cast_to_computation_type")) \
        else frozenset()
    # (lhs dtype, lhs is a number, rhs dtype, rhs is a number, div_or_mod) of non-pointer operands -> the
    # computation type (Triton's, decided once; a key whose promotion raises is never kept).
    promotions: dict = {}

    def converted(self, value, is_number: bool, value_ty, to):
        """`value` as an operand of computation type `to` (None: no promotion): Triton's conversions."""
        if is_number:  # range checks and the constant, every time: they depend on the value
            return self.to_tensor(value) if to is None else self._cast_to_computation_type(value, to)
        return value if to is None or value_ty == to else self.cast(value, to)

    def fast_checking(self, lhs, rhs, allow_lhs_ptr=False, allow_rhs_ptr=False, arithmetic_check=True,
                      div_or_mod=False):
        lhs_class, rhs_class = lhs.__class__, rhs.__class__
        lhs_number, rhs_number = lhs_class in numbers, rhs_class in numbers
        if not (lhs_number or lhs_class is tensor) or not (rhs_number or rhs_class is tensor):
            return checking(self, lhs, rhs, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check, div_or_mod)
        lhs_ty = self.to_tensor_type(lhs) if lhs_number else lhs.dtype
        rhs_ty = self.to_tensor_type(rhs) if rhs_number else rhs.dtype
        to = None
        if lhs_ty.is_ptr() or rhs_ty.is_ptr():  # no promotion with a pointer (pointer types are not hashable)
            self.check_ptr_type_impl(lhs_ty, rhs_ty, allow_lhs_ptr)
            self.check_ptr_type_impl(rhs_ty, lhs_ty, allow_rhs_ptr)
        elif arithmetic_check:
            key = (lhs_ty, lhs_number, rhs_ty, rhs_number, div_or_mod)
            to = promotions.get(key)
            if to is None:
                to = promotions[key] = self.computation_type_impl(lhs_ty, lhs_number, rhs_ty, rhs_number, div_or_mod)
        return broadcast_fast(self, converted(self, lhs, lhs_number, lhs_ty, to),
                              converted(self, rhs, rhs_number, rhs_ty, to))

    expand_dims = type(semantic).expand_dims
    handle = interpreter.TensorHandle

    def expand_dims_fast(self, input, axis):  # noqa: A002  (Triton's name)
        """Triton's expand_dims of a tile by an int axis, the shape as a list of ints, the data reshaped as
        numpy's expand_dims reshapes it; anything else Triton's own."""
        ty = input.type
        if ty.__class__ is not block_type or axis.__class__ is not int or not 0 <= axis <= len(ty.shape.values):
            return expand_dims(self, input, axis)
        shape = list(ty.shape.values)
        shape.insert(axis, 1)
        data = input.handle.data
        expanded = handle(data.reshape(data.shape[:axis] + (1,) + data.shape[axis:]), input.handle.dtype.scalar)
        return self.tensor(expanded, block_type(ty.scalar, shape))

    semantic.binary_op_type_checking_impl = fast_checking.__get__(semantic)
    semantic.broadcast_impl_value = broadcast_fast.__get__(semantic)
    semantic.expand_dims = expand_dims_fast.__get__(semantic)


def _unwrap_by_class(core) -> None:
    """`_unwrap_if_constexpr` (a million calls a heavy case, four isinstance checks each) decided by the exact
    class for constexprs and for values it returns as they are; lists and tuples as before. Semantic
    modules reach it through `core`, so the one attribute serves them all."""
    unwrap = core._unwrap_if_constexpr
    if getattr(unwrap, "by_class", False):
        return
    constexpr = core.constexpr
    kept = frozenset(c for c in (core.tensor, core.dtype, core.pointer_type, core.block_type, int, float, bool,
                                 str, type(None)) if not issubclass(c, (list, tuple, core.tuple, constexpr)))

    def by_class(o):
        cls = o.__class__
        if cls is constexpr:
            return o.value
        if cls in kept:
            return o
        return unwrap(o)

    by_class.by_class, by_class.original = True, unwrap  # the original, for tests
    core._unwrap_if_constexpr = by_class


def _dtype_equality_by_class(core) -> None:
    """`dtype.__eq__` between two plain dtypes (the promotions' and casts' compares) by name at once, as Triton
    compares them after unwrapping and an isinstance check; any other operand as before."""
    equal = core.dtype.__eq__
    if getattr(equal, "by_class", False):
        return
    plain = core.dtype

    def by_class(self, other):
        if other.__class__ is plain:
            return self.name == other.name
        return equal(self, other)

    by_class.by_class, by_class.original = True, equal  # the original, for tests
    core.dtype.__eq__ = by_class


def _builtins_called_directly(interpreter, core) -> None:
    """Each tile op's patched builtin calls the builtin's own function with the interpreter's semantic object:
    Triton's patch copies the keyword arguments into a new dict without `_semantic` and calls the builtin's
    wrapper, whose one job is to refuse a call without `_semantic`. A builtin of another shape is called
    through it as before. A Triton without `_patch_attr` of this signature is left as it is."""
    patch_attr = getattr(interpreter, "_patch_attr", None)
    if patch_attr is None or getattr(patch_attr, "direct", False):
        return
    if list(inspect.signature(patch_attr).parameters) != ["obj", "name", "member", "builder", "scope"]:
        return
    wrapper_code = core.builtin(lambda _semantic=None: None).__code__

    def direct(obj, name, member, builder, scope):
        call = member.__wrapped__ if getattr(member, "__code__", None) is wrapper_code else member
        semantic = interpreter.interpreter_semantic

        def patched(*args, **kwargs):
            kwargs["_semantic"] = semantic  # a fresh dict every call: replacing any `_semantic` passed
            return call(*args, **kwargs)

        scope.set_attr(obj, name, patched)

    direct.direct = True
    interpreter._patch_attr = direct
