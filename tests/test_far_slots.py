"""The far-slot check of a drift case (drift.far_slots): rows on slots past FAR_ELEMENTS elements of the pool,
where a slot offset formed in 32-bit integers wraps back onto another slot. On the CPU at a wrap of 2**14
elements (a planted kernel wraps there); at 2**32 on a GPU."""

from __future__ import annotations

import pytest
import slot_kernels
import torch
from cli_invoke import case_decoding

import ssmcheck
from ssmcheck.drift import far_slots
from ssmcheck.drift.table import _slots

KERNELS = "tests/slot_kernels.py"
# 2 x 8 x 16 = 256 elements a slot: slot 64 is the first at 2**14; the rows take slots 66 and 67 (far_slots.LEAD),
# which wrap to 2 and 3.
SMALL = dict(preset="smoke", regime=["normal"], state_dtype=["fp16"], rounding=["nearest"], steps=2,
             batch=[3], nheads=[2], headdim=[8], dstate=[16])


def _case(kernel: str, **options) -> dict:
    (case,) = ssmcheck.drift(kernel=f"{KERNELS}:{kernel}", **{**SMALL, **options}).to_json()["cases"]
    return case


@pytest.fixture
def wrap_at_2_14(monkeypatch):
    monkeypatch.setattr(far_slots, "FAR_ELEMENTS", slot_kernels.WRAP_ELEMENTS)


@pytest.mark.parametrize("state_dtype", ["fp16", "fp32"])
def test_a_kernel_with_wide_offsets_passes(wrap_at_2_14, state_dtype):
    case = _case("slots_correct", state_dtype=[state_dtype])
    far = case["slots"]["far_slot"]
    assert case["status"] == "pass" and far["status"] == "pass", case["message"]
    assert far["slots"] == [66, 67] and far["pool_slots"] == 68 and far["written"] == []
    assert far["worst"]["state_rel"] <= far["worst"]["limit"]


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_offsets_that_wrap_write_another_slot_and_fail(wrap_at_2_14, rounding):
    case = _case("slot_offsets_wrapping", rounding=[rounding])
    assert case["status"] == "fail" and case["slots"]["far_slot"]["status"] == "fail", case["message"]
    assert ("slots past 2**32 elements: the step wrote slot 2 (no row's) and 1 more: row 0's slot 66 lies 16,896 "
            "elements in, 512 modulo 16,384 (its offset formed in 32-bit integers)") in case["message"]
    assert case["slots"]["far_slot"]["written"] == [2, 3]
    # The padded-slot check's pool is small: its offsets never wrap, and its checks pass.
    assert [case["slots"][name]["status"] for name in ("live", "untouched", "pad_out")] == ["pass"] * 3


def test_a_row_stored_at_its_batch_index_is_told_from_a_wrapped_offset(wrap_at_2_14):
    """A batch with no pad row (the far-slot check's) stored at the rows' batch indices, 0 and 1: the rows lie LEAD
    slots past the first far slot, so that a wrapped offset lands on 2 and 3, and the message names the batch index.
    A case whose trial decodes without slot indices: through them it stops at the decode's own finding (test_slots)."""
    case = case_decoding(_case, "rows_at_their_batch_index_without_pads", False)
    far = case["slots"]["far_slot"]
    assert case["status"] == "fail" and far["status"] == "fail" and far["written"] == [0, 1], case["message"]
    assert ("slots past 2**32 elements: the step wrote slot 0 (no row's) and 1 more: row 0's index in the batch (a "
            "row's state stored at its batch index, not at its slot)") in case["message"]
    # The padded-slot check's ends layout has no pad rows either: it fails there too, on the CPU as well.
    assert [case["slots"][name]["status"] for name in ("live", "untouched", "pad_out")] == ["fail", "fail", "pass"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's run: on a GPU this process's Triton is compiled, "
                    "and the far-slot check runs (the tests above)")
def test_on_the_cpu_a_pool_past_2_32_elements_is_not_made():
    case = _case("slots_correct", device="cpu")
    assert case["status"] == "pass" and "far_slot" not in case["slots"]


def test_the_far_slot_check_shows_in_the_slots_column(wrap_at_2_14):
    report = ssmcheck.drift(kernel=f"{KERNELS}:slot_offsets_wrapping", **SMALL)
    assert _slots(report.results[0]).split()[-1] == "f✗"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_builtin_kernel_passes_past_2_32_elements_on_the_gpu():
    """At the real 2**32: a pool of 8 GiB of fp16 states (16 GiB of fp32), the built-in kernel's int64 offsets."""
    for state_dtype in ("fp16", "fp32"):
        case = _case("slots_correct", state_dtype=[state_dtype], device="cuda")
        far = case["slots"]["far_slot"]
        assert case["status"] == "pass" and far["status"] in ("pass", "skipped"), case["message"]
        if far["status"] == "pass":
            first = far["slots"][0] - far_slots.LEAD
            assert first * 256 >= 2**32 > (first - 1) * 256
