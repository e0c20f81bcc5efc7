"""tests/interpreter_bounds.py: the check finds an access past its tensors, and only that."""

import pytest
import torch
import triton
import triton.language as tl

from interpreter_bounds import bounds_checked

pytestmark = pytest.mark.cpu  # the check is the interpreter's


@triton.jit
def _copy(x_ptr, out_ptr, n, BLOCK: tl.constexpr, MASKED: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    if MASKED:
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) * 2, mask=offsets < n)
    else:  # the mask forgotten: a block of 16 over 10 elements reads and writes 6 past each tensor
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) * 2)


def _copied(masked: bool):
    x = torch.randn(10, generator=torch.Generator().manual_seed(4))
    out = torch.full((10,), float("nan"))
    with bounds_checked() as seen:
        _copy[(1,)](x, out, 10, BLOCK=16, MASKED=masked)
    return seen, x, out


def test_a_masked_kernel_stays_inside():
    seen, x, out = _copied(masked=True)
    assert seen.launches == 1 and seen.outside == []
    torch.testing.assert_close(out, x * 2)


def test_a_forgotten_mask_is_found_for_the_load_and_the_store_and_kept_from_memory():
    seen, x, out = _copied(masked=False)
    assert seen.outside == ["_copy: load of 6 element(s) outside every argument",
                            "_copy: store of 6 element(s) outside every argument"]
    torch.testing.assert_close(out, x * 2)  # the lanes inside ran as asked; those outside touched nothing


def test_leaving_restores_the_interpreter():
    from triton.runtime import interpreter  # noqa: PLC0415

    before = (interpreter.GridExecutor._init_args_hst, interpreter.InterpreterBuilder.create_masked_load,
              interpreter.InterpreterBuilder.create_masked_store)
    with pytest.raises(KeyboardInterrupt), bounds_checked():
        raise KeyboardInterrupt
    assert (interpreter.GridExecutor._init_args_hst, interpreter.InterpreterBuilder.create_masked_load,
            interpreter.InterpreterBuilder.create_masked_store) == before
