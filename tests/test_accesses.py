"""core.accesses: a kernel's Triton programs, in the interpreter, kept to their launch's tensors; and a kernel whose
program reaches outside them is its case's error, as a user runs it (tests/out_of_bounds_kernels.py)."""

from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from cli_invoke import invoke

from ssmcheck.core.accesses import checked_accesses
from ssmcheck.core.guard import KernelOutsideMemory, guarded_call

pytestmark = pytest.mark.cpu  # the interpreter's

OUT_OF_BOUNDS = str(Path(__file__).with_name("out_of_bounds_kernels.py"))


@triton.jit
def _double(x_ptr, out_ptr, n, BLOCK: tl.constexpr, MASKED: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    if MASKED:
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) * 2, mask=offsets < n)
    else:  # the mask forgotten: a block of 16 over 10 elements loads and stores 6 past each tensor
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) * 2)


def _doubled(masked: bool):
    x = torch.randn(10, generator=torch.Generator().manual_seed(4))
    out = torch.full((10,), float("nan"))
    _double[(1,)](x, out, 10, BLOCK=16, MASKED=masked)
    return x, out


def test_a_masked_program_stays_inside():
    with checked_accesses() as seen:
        x, out = _doubled(masked=True)
    assert seen.launches == 1 and seen.outside() is None
    torch.testing.assert_close(out, x * 2)


def test_a_forgotten_mask_is_counted_and_kept_from_memory():
    with checked_accesses() as seen:
        x, out = _doubled(masked=False)
    assert seen.loads_outside == {"_double": 6} and seen.stores_outside == {"_double": 6}
    assert seen.outside() == (
        "the kernel's Triton program _double stored 6 element(s) outside every tensor of its launch (on a GPU: "
        "another allocation overwritten, or a fault); loaded 6 element(s) outside every tensor of its launch (on a "
        "GPU: whatever lies there, or a fault); ssmcheck masked them off in Triton's interpreter")
    torch.testing.assert_close(out, x * 2)  # the lanes inside ran as asked; those outside touched nothing


def test_views_of_one_storage_may_reach_each_other():
    """What a launch owns is its tensors' storages: a view's neighbours in its buffer are not outside (NaN fences,
    core.fences, tell those reads apart)."""
    buffer = torch.randn(32, generator=torch.Generator().manual_seed(5))
    out = torch.full((32,), float("nan"))
    with checked_accesses() as seen:
        _double[(1,)](buffer[:10], out[:10], 10, BLOCK=16, MASKED=False)
    assert seen.outside() is None
    torch.testing.assert_close(out[:16], buffer[:16] * 2)


def test_outside_the_context_launches_are_not_checked_and_contexts_nest():
    with pytest.raises(KeyboardInterrupt), checked_accesses() as left:
        raise KeyboardInterrupt
    _doubled(masked=True)
    with checked_accesses() as outer:
        _doubled(masked=True)
        with checked_accesses() as inner:
            _doubled(masked=False)
        _doubled(masked=True)
    assert left.launches == 0 and (outer.launches, inner.launches) == (2, 1)
    assert outer.outside() is None and inner.stores_outside == {"_double": 6}


def test_a_guarded_call_that_reached_outside_raises_what_it_did():
    with pytest.raises(KernelOutsideMemory, match="program _double stored 6 element"):
        guarded_call(_doubled, (False,), {}, None)
    x, out = guarded_call(_doubled, (True,), {}, None)
    torch.testing.assert_close(out, x * 2)


def test_a_scan_kernel_storing_past_y_errs_each_case_and_names_the_program(tmp_path):
    result, report = invoke("scan", "--kernel", f"{OUT_OF_BOUNDS}:stores_past_y", "--preset", "smoke",
                            "--regime", "normal,ragged", json_path=tmp_path / "r.json")
    assert result.exit_code == 4, result.output
    assert {case["status"] for case in report["cases"]} == {"error"}
    for case in report["cases"]:
        assert case["message"].startswith("the kernel's Triton program _rescale_unmasked stored "), case["message"]


def test_a_drift_kernel_reading_past_its_state_errs_at_the_first_step(tmp_path):
    result, report = invoke("drift", "--kernel", f"{OUT_OF_BOUNDS}:reads_rows_at_a_heads_stride", "--preset",
                            "smoke", json_path=tmp_path / "r.json")
    assert result.exit_code == 4, result.output
    for case in report["cases"]:
        assert case["status"] == "error"
        assert "program _row_maxima loaded " in case["message"] and "(trial 0, step 1)" in case["message"]
