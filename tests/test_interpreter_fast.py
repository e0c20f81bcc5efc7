"""The interpreter's shortcuts (core.interpreter_fast) give what Triton's own front end gives: the same result
types and bits, and the same errors, for operands drawn across dtypes, shapes, scalars and Python numbers."""

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.cpu  # the interpreter's objects: this process runs Triton interpreted

import triton  # noqa: E402  (after conftest configured the device)
import triton.language as tl  # noqa: E402
from triton.language.semantic import TritonSemantic  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

FAST = interpreter.interpreter_semantic
PLAIN = TritonSemantic(interpreter.interpreter_builder)  # Triton's own methods throughout

DTYPES = [tl.int1, tl.int8, tl.int32, tl.int64, tl.uint32, tl.float16, tl.bfloat16, tl.float32, tl.float64]
SHAPES = [(4,), (1,), (2, 4), (2, 1), (1, 4), (8, 2, 4), (1, 1, 4), (2,)]
NUMBERS = [0, 1, -3, 7, 2**31, 2**40, -(2**40), 2**63 + 5, 0.5, -2.25, 1e-40, 1e300, float("inf"), float("nan"), True]
BINARY = ["add", "sub", "mul", "truediv", "floordiv", "mod", "and_", "or_", "xor_", "less_than", "equal",
          "greater_equal", "minimum", "maximum"]


def test_the_shortcuts_are_in_place():
    # Otherwise every comparison below would compare Triton with itself.
    assert {"binary_op_type_checking_impl", "broadcast_impl_value", "expand_dims"} <= set(vars(FAST))
    assert tl.core._unwrap_if_constexpr.original is not tl.core._unwrap_if_constexpr
    assert tl.core.dtype.__eq__.original is not tl.core.dtype.__eq__


def _data(dtype, shape, rng):
    """numpy data as the interpreter holds a tile (bf16 as uint16 patterns, int1 as bool), never all zeros."""
    if dtype == tl.int1:
        return rng.random(shape) < 0.5
    if dtype == tl.bfloat16:
        return (rng.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    if dtype.is_floating():
        return (rng.standard_normal(shape) * 3).astype(interpreter._get_np_dtype(dtype))
    return rng.integers(1, 100, shape).astype(interpreter._get_np_dtype(dtype))


@st.composite
def operands(draw):
    kind = draw(st.sampled_from(["tile", "scalar", "number", "pointer"]))
    if kind == "number":
        return draw(st.sampled_from(NUMBERS))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "pointer":
        shape = draw(st.sampled_from(SHAPES))
        data = (rng.integers(0, 2**20, shape) * 4).astype(np.uint64)
        ty = tl.pointer_type(tl.float32)
        return tl.tensor(interpreter.TensorHandle(data, ty), tl.block_type(ty, list(shape)))
    dtype = draw(st.sampled_from(DTYPES))
    if kind == "scalar":
        return tl.tensor(interpreter.TensorHandle(_data(dtype, (1,), rng), dtype), dtype)
    shape = draw(st.sampled_from(SHAPES))
    return tl.tensor(interpreter.TensorHandle(_data(dtype, shape, rng), dtype), tl.block_type(dtype, list(shape)))


def _outcome(call):
    """(result types, data) of a call, or its error's type and message."""
    try:
        with np.errstate(all="ignore"):
            out = call()
    except Exception as exc:  # noqa: BLE001 (the error is the outcome compared)
        return ("raised", type(exc).__name__, str(exc))
    results = out if isinstance(out, tuple) else (out,)
    return tuple((str(r.type), r.handle.data.dtype.str, np.asarray(r.handle.data).tobytes()) for r in results)


@settings(max_examples=400, deadline=None)
@given(operands(), operands(), st.sampled_from(BINARY))
def test_binary_ops_give_what_tritons_front_end_gives(lhs, rhs, op):
    if not isinstance(lhs, tl.tensor) and not isinstance(rhs, tl.tensor):
        lhs = tl.tensor(interpreter.TensorHandle(np.array([2], np.int32), tl.int32), tl.int32)
    args = (lhs, rhs, True) if op in ("add", "sub", "mul") else (lhs, rhs)
    assert _outcome(lambda: getattr(FAST, op)(*args)) == _outcome(lambda: getattr(PLAIN, op)(*args))


@settings(max_examples=300, deadline=None)
@given(operands(), operands(), st.booleans(), st.booleans(), st.booleans(), st.booleans())
def test_type_checking_gives_what_tritons_gives(lhs, rhs, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check,
                                                div_or_mod):
    flags = (allow_lhs_ptr, allow_rhs_ptr, arithmetic_check, div_or_mod)
    assert (_outcome(lambda: FAST.binary_op_type_checking_impl(lhs, rhs, *flags))
            == _outcome(lambda: PLAIN.binary_op_type_checking_impl(lhs, rhs, *flags)))


@settings(max_examples=150, deadline=None)
@given(operands(), st.integers(-1, 4))
def test_expand_dims_gives_what_tritons_gives(value, axis):
    assume(isinstance(value, tl.tensor))  # a Python number has no axes
    assert _outcome(lambda: FAST.expand_dims(value, axis)) == _outcome(lambda: PLAIN.expand_dims(value, axis))


def test_constexprs_unwrap_and_dtypes_compare_as_before():
    unwrap, original = tl.core._unwrap_if_constexpr, tl.core._unwrap_if_constexpr.original
    tile = tl.tensor(interpreter.TensorHandle(np.ones(4, np.float32), tl.float32), tl.block_type(tl.float32, [4]))
    values = [tl.constexpr(3), tl.constexpr(None), tl.constexpr(tl.float16), 3, 2.5, True, None, "rtz", tile,
              tl.float32, tl.pointer_type(tl.int8), tl.block_type(tl.int32, [2]), [tl.constexpr(1), 2],
              (tl.constexpr(1), (tl.constexpr(2),)), tl.core.tuple([tl.constexpr(4), 5])]
    for value in values:
        got, want = unwrap(value), original(value)
        assert type(got) is type(want) and repr(got) == repr(want), value
    equal, equal_before = tl.core.dtype.__eq__, tl.core.dtype.__eq__.original
    types = [*DTYPES, tl.pointer_type(tl.float32), tl.pointer_type(tl.float32, const=True),
             tl.block_type(tl.float32, [2])]
    others = [*types, tl.constexpr(tl.float32), tl.constexpr(3), 3, None, "fp32"]
    for a in DTYPES:
        for b in others:
            assert equal(a, b) == equal_before(a, b), (a, b)


@triton.jit
def _mixed(x_ptr, i_ptr, y_ptr, n, scale, BLOCK: tl.constexpr):
    # Scalars, Python numbers, promotions (int32 x int64, fp16 x fp32), broadcasts and a splat in one kernel.
    r = tl.arange(0, BLOCK)
    rows = r[:, None]
    cols = r[None, :]
    offsets = rows * BLOCK + cols
    mask = (offsets < n) & (cols >= 0)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    k = tl.load(i_ptr + r).to(tl.int64)
    y = x * scale + k[:, None] * 2 - (x.to(tl.float16) * 0.5) / 3 + (cols % 3 == 0)
    tl.store(y_ptr + offsets, tl.where(mask, y, float("nan")), mask=offsets < n + 4)


def test_a_kernel_through_the_shortcuts_computes_what_torch_computes():
    g = torch.Generator().manual_seed(11)
    block, n = 8, 60
    x = torch.randn(block * block, generator=g)
    i = torch.randint(-50, 50, (block,), generator=g, dtype=torch.int32)
    y = torch.full((block * block,), float("nan"))
    _mixed[(1,)](x, i, y, n, 1.5, BLOCK=block)
    rows, cols = torch.arange(block)[:, None], torch.arange(block)[None, :]
    # The kernel's ops in its order and dtypes (fp32, the int64 product converted, fp16 halved, then fp32).
    k2 = (i.long()[:, None] * 2).float()
    halved = (x.view(block, block).half() * 0.5).float() / 3
    want = ((x.view(block, block) * 1.5 + k2) - halved + (cols % 3 == 0).float()).flatten()
    live = (rows * block + cols).flatten() < n
    assert torch.equal(y[live], want[live])
    assert torch.isnan(y[~live]).all()
