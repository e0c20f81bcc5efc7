"""The padded-slot check of `drift` (drift.slots): a state pool larger than the batch, permuted slots and
pad rows, on the CPU through the Triton interpreter."""

from __future__ import annotations

import pytest
import slot_kernels
import torch
from cli_invoke import case_decoding, invoke
from hypothesis import given, settings
from hypothesis import strategies as st

import ssmcheck
from ssmcheck.drift import adapter as drift_adapter
from ssmcheck.drift.slots import PAD_ROWS, SPARE_SLOTS

KERNELS = "tests/slot_kernels.py"
# One regime, one short decode, a batch of 3 among 5 rows, on the session's device: seconds on the CPU.
SMALL = dict(preset="smoke", regime=["normal"], state_dtype=["fp16"], rounding=["nearest"], steps=2,
             batch=[3], nheads=[2], headdim=[8], dstate=[16])


def _case(kernel: str, **options) -> dict:
    report = ssmcheck.drift(kernel=kernel, **{**SMALL, **options}).to_json()
    (case,) = report["cases"]
    return case


def test_a_correct_kernel_with_slots_passes_every_slot_check():
    case = _case(f"{KERNELS}:slots_correct")
    slots = case["slots"]
    assert case["status"] == "pass", case["message"]
    assert [slots[name]["status"] for name in ("live", "untouched", "pad_out")] == ["pass"] * 3
    assert slots["pad_slot_id"] == -1 and slots["pool"] == 3 + PAD_ROWS + SPARE_SLOTS
    assert len(slots["pad_rows"]) == PAD_ROWS and all(slots["slots"][r] == -1 for r in slots["pad_rows"])
    live = [s for r, s in enumerate(slots["slots"]) if r not in slots["pad_rows"]]
    assert len(set(live)) == 3 and slots["live"]["rows"] == 3
    assert slots["pad_out"]["outputs"] == "zeros"
    assert slots["untouched"]["changed"] == [] and slots["untouched"]["checked"] == slots["pool"] + 2 - 3
    assert slots["untouched"]["past_out"] == []


@pytest.mark.parametrize("seed", [0, 5, 11])
def test_a_pad_row_that_writes_slot_0_is_caught_and_the_slot_named(seed):
    # Slot 0 is never a live row's: there a pad row's write would race that row's own store, and on a GPU the
    # row's store may land last (seed 5 had slot 0 live, and passed on the H200).
    case = _case(f"{KERNELS}:pad_clamped_to_slot_0", seed=seed)
    slots = case["slots"]
    assert 0 not in [s for r, s in enumerate(slots["slots"]) if r not in slots["pad_rows"]]
    assert case["status"] == "fail" and slots["untouched"]["status"] == "fail"
    assert slots["untouched"]["changed"] == [0] and "slot 0 (no row's)" in slots["untouched"]["message"]
    # In the ends layout a live row sits on slot 0, where the pad rows' writes land: only there may it fail.
    ends = "live rows on the pool's first and last slots, int64 slot indices)"
    assert slots["live"]["status"] == "pass" or ends in slots["live"]["message"]


@pytest.mark.parametrize("seed", [0, 5])
def test_a_pad_row_wrapped_around_to_the_last_slot_is_caught(seed):
    case = _case(f"{KERNELS}:pad_wrapped_to_the_last_slot", seed=seed)
    slots = case["slots"]
    last = slots["pool"] - 1
    assert case["status"] == "fail" and slots["untouched"]["changed"] == [last]
    assert f"slot {last} (no row's)" in case["message"], case["message"]


def test_the_ends_layout_puts_live_rows_on_the_first_and_last_slots():
    for kernel, batch in (("slots_correct", 3), ("slots_correct", 1)):
        case = _case(f"{KERNELS}:{kernel}", batch=[batch])
        ends = case["slots"]["ends"]
        live = [s for r, s in enumerate(ends["slots"]) if r not in ends["pad_rows"]]
        assert ends["placement"] == "ends" and len(live) == max(batch, 2) == len(set(live)) == len(ends["slots"])
        assert ends["pad_rows"] == [] and -1 not in ends["slots"]
        assert {0, ends["pool"] - 1} <= set(live) and ends["pool"] == len(ends["slots"]) + SPARE_SLOTS
        assert case["status"] == "pass", case["message"]


def test_int64_slot_indices_read_as_int32_fail_in_the_ends_layout_and_a_refusal_of_them_runs_it_on_int32(tmp_path):
    """The ends layout passes int64 slot indices, the others int32 as engines pass them: a kernel that reads them
    through an int32 pointer takes row 0's high word, slot 0, for row 1's slot there and leaves a live row's slot
    behind; one that refuses int64 (raises) runs the layout on int32 and passes, the refusal recorded."""
    case = _case(f"{KERNELS}:slot_indices_read_as_int32")
    slots = case["slots"]
    assert slots["slot_indices"] == "int32" and slots["ends"]["slot_indices"] == "int64"
    assert case["status"] == "fail" and slots["live"]["status"] == "fail", case["message"]
    assert slots["live"]["message"].startswith(
        "slots (a full batch, no pad rows, live rows on the pool's first and last slots, int64 slot indices): slot "
    ), slots["live"]["message"]
    # As a user runs it (SMALL's options on the command line), for the note under the table too.
    result, report = invoke("drift", "--kernel", f"{KERNELS}:slot_indices_int32_only", "--preset", "smoke",
                            "--regime", "normal", "--state-dtype", "fp16", "--rounding", "nearest", "--steps", "2",
                            "--batch", "3", "--nheads", "2", "--headdim", "8", "--dstate", "16",
                            json_path=tmp_path / "refusing.json")
    assert "int32 slot indices (1): the slot check's ends layout ran on int32, the kernel having refused int64: " \
           "TypeError: state_batch_indices must be int32, got torch.int64" in result.stdout, result.stdout
    (refusing,) = report["cases"]
    ends = refusing["slots"]["ends"]
    assert refusing["status"] == "pass", refusing["message"]
    assert ends["slot_indices"] == "int32" and "state_batch_indices must be int32, got torch.int64" in ends["refused"]
    assert "refused" not in refusing["slots"] and "refused" not in _case(f"{KERNELS}:slots_correct")["slots"]["ends"]
    # An exit is no refusal: the ends layout's checks err, and nothing runs on int32 in its place.
    exiting = _case(f"{KERNELS}:slot_indices_int64_exit")
    ends = exiting["slots"]["ends"]
    assert exiting["status"] == "error" and exiting["slots"]["live"]["status"] == "error", exiting["message"]
    assert "sys.exit" in exiting["slots"]["live"]["message"] and "refused" not in ends and ends["slot_indices"] == "int64"


@pytest.mark.parametrize("kernel", ["slot_0_taken_for_a_pad", "last_slot_out_of_bounds"])
@pytest.mark.parametrize("seed", [0, 3])
def test_a_live_row_on_an_end_of_the_pool_left_behind_fails(kernel, seed):
    # The inner layout never puts a live row on either end, so only the ends layout can see these.
    case = _case(f"{KERNELS}:{kernel}", seed=seed)
    slots = case["slots"]
    ends = slots["ends"]
    end = 0 if kernel == "slot_0_taken_for_a_pad" else ends["pool"] - 1
    row = ends["slots"].index(end)
    assert case["status"] == "fail" and slots["live"]["status"] == "fail", case["message"]
    assert slots["live"]["message"].startswith(
        "slots (a full batch, no pad rows, live rows on the pool's first and last slots, int64 slot indices): "
        f"slot {end} (row {row}): its state kept every bit "
        "(the row skipped, as a pad row is, or its store sent to another slot): state error "), case["message"]
    assert slots["untouched"]["status"] == slots["pad_out"]["status"] == "pass"


def test_out_left_unwritten_is_an_error_though_the_return_value_is_right():
    # An engine reads the out it passed: the decode judges that one (drift.adapter), as the slot check does, and
    # names the tensor returned beside it. 48 elements: 3 rows of 2 heads x 8 channels.
    case = _case(f"{KERNELS}:out_returned_not_written")
    assert case["status"] == "error", case["message"]
    assert "it returned its output in a tensor of its own and left 48 of the 48 elements of the out it was " \
           "given unwritten (trial 0, step 1)" in case["message"], case["message"]


def test_the_pool_is_paged_and_a_slot_stride_taken_for_the_states_size_is_caught():
    correct = _case(f"{KERNELS}:slots_correct")["slots"]["untouched"]
    # 2 heads x 8 x 16 = 256 elements a state, pages of 256 + 64.
    assert correct["slot_stride"] == 320 and correct["past_state"] == []
    case = _case(f"{KERNELS}:slot_stride_taken_as_the_states_size")
    untouched = case["slots"]["untouched"]
    assert case["status"] in ("fail", "nonfinite") and untouched["status"] == "fail", case["message"]
    assert untouched["past_state"], untouched
    assert "(the pool's slot stride is 320 elements, a state 256: a kernel that takes one for the other writes " \
           "there)" in untouched["message"], untouched["message"]
    assert case["slots"]["live"]["status"] != "pass"


def test_a_kernel_that_writes_the_out_it_is_given_and_returns_nothing_is_judged_on_that_out():
    # vLLM's convention: every call, the decode's steps too, gets a NaN-filled out, which is the step's output.
    case = _case(f"{KERNELS}:out_written_nothing_returned")
    assert case["status"] == "pass", case["message"]
    assert [case["slots"][name]["status"] for name in ("live", "untouched", "pad_out")] == ["pass"] * 3
    assert case["slots"]["pad_out"]["outputs"] == "zeros"


def test_an_out_written_in_part_by_a_kernel_that_returns_nothing_is_non_finite_where_it_was_left():
    # Two rows (batch 2): the decode's second row is never written, and stays ssmcheck's NaN.
    case = _case(f"{KERNELS}:out_written_for_the_first_row_only", batch=[2])
    assert case["status"] == "nonfinite", case["message"]
    assert case["first_nonfinite"]["output"] == "out" and case["first_nonfinite"]["batch"] == 1
    assert case["first_nonfinite"]["step"] == 1 and case["first_nonfinite"]["unwritten"] is True
    assert case["message"].startswith("non-finite out at step 1 (trial 0, batch 1, head 0, channel 0): left "
                                      "unwritten (the NaN ssmcheck filled the out it passed with)"), case["message"]


def test_a_kernel_told_its_pad_id_is_also_told_the_null_block_and_a_pad_test_by_sign_fails():
    correct = _case(f"{KERNELS}:slots_correct")
    null = correct["slots"]["null_slot"]
    assert null["pad_slot_id"] == 0 and null["placement"] == "null_slot" and correct["status"] == "pass"
    assert all(null["slots"][r] == 0 for r in null["pad_rows"]) and 0 not in [
        s for r, s in enumerate(null["slots"]) if r not in null["pad_rows"]]
    case = _case(f"{KERNELS}:pad_rows_found_by_sign")
    untouched = case["slots"]["untouched"]
    assert case["status"] == "fail" and untouched["status"] == "fail" and untouched["changed"] == [0], case["message"]
    assert untouched["message"].startswith("slots untouched (pad rows given slot id 0, a null block): the step "
                                           "wrote slot 0 (the pad slot)"), untouched["message"]
    # A kernel that takes no pad_slot_id keyword cannot be told another: no such layout.
    def without_the_keyword(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                            state_batch_indices=None, out=None):
        return slot_kernels.slots_correct(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices,
                                          out=out)

    (plain,) = ssmcheck.drift(kernel=without_the_keyword, **SMALL).to_json()["cases"]
    assert plain["status"] == "pass" and "ends" in plain["slots"] and "null_slot" not in plain["slots"]


def test_a_path_for_full_batches_that_drops_the_slots_fails_in_the_ends_layout():
    """The ends layout has no pad rows, as a CUDA-graph batch that is full. A kernel whose path for such a batch
    stores row b at slot b (its index in the batch) passes the padded layouts, and fails there: a row's slot at an
    end of the pool left behind, spares written. A trial that decodes through slot indices (rows on slots 1.., slot
    0 a NaN spare) reads that spare for row 0 and writes row 0's step there: on a GPU the spare's check names the
    write (an error), on the CPU, whose NaN arithmetic keeps the spare's payload, the row goes non-finite."""
    through = case_decoding(_case, f"{KERNELS}:rows_at_their_batch_index_without_pads", True)
    assert through["status"] in ("error", "nonfinite"), through["message"]
    assert through["message"].startswith(("the kernel wrote slot 0 of its state pool, which no row names (rows on "
                                          "slots 1..3 in state_batch_indices", "non-finite ")), through["message"]
    case = case_decoding(_case, f"{KERNELS}:rows_at_their_batch_index_without_pads", False)
    slots = case["slots"]
    assert case["status"] == "fail", case["message"]
    placed = "(a full batch, no pad rows, live rows on the pool's first and last slots, int64 slot indices)"
    assert slots["live"]["message"].startswith(f"slots {placed}: slot "), slots["live"]["message"]
    assert "pad rows [" not in slots["live"]["message"] and "pad rows [" not in slots["untouched"]["message"]
    assert slots["untouched"]["message"].startswith(f"slots untouched {placed}: the step wrote ")


def test_a_case_decoded_through_slot_indices_alone_also_calls_the_path_without_them():
    """A round-to-nearest case has one trial, which a coin sends through slot indices or not. A kernel wrong only on
    its path without them (the skip term left out) fails either way: decoded without them on its own verdict;
    decoded through them (its own verdict and slot checks pass) on a short trial without them, named as such."""
    kernel = f"{KERNELS}:skip_term_dropped_without_slots"
    plain = case_decoding(_case, kernel, False)
    assert plain["status"] == "fail" and "unslotted" not in plain["slots"], plain["message"]
    through = case_decoding(_case, kernel, True)
    unslotted = through["slots"]["unslotted"]
    assert through["status"] == "fail" and unslotted["status"] == "fail", through["message"]
    assert [through["slots"][name]["status"] for name in ("live", "untouched", "pad_out")] == ["pass"] * 3
    said = f"without slot indices (trial {unslotted['trial']}, 2 steps called without state_batch_indices): "
    assert unslotted["message"].startswith(said) and "output error" in unslotted["message"], unslotted["message"]
    assert through["message"] == unslotted["message"] and through["slotted_trials"] == [0]
    # the correct kernel passes the same check where its case decodes through slot indices
    correct = case_decoding(_case, f"{KERNELS}:slots_correct", True)
    assert correct["status"] == "pass" and correct["slots"]["unslotted"]["status"] == "pass", correct["message"]


def test_a_decode_that_errs_keeps_the_slot_checks_diagnosis():
    """A decode through slot indices that writes a spare slot errs; the slot checks still run after it, and the
    one that sees the same write (the inner layout's spare at slot 0) adds its clause and its figures."""
    case = case_decoding(_case, f"{KERNELS}:null_block_cleared", True)
    slots = case["slots"]
    assert case["status"] == "error" and case["checkpoints"] == [], case["message"]
    assert case["message"].startswith("the kernel wrote slot 0 of its state pool, which no row names"), case["message"]
    assert "; slots untouched: " in case["message"], case["message"]
    assert slots["untouched"]["status"] == "fail" and 0 in slots["untouched"]["changed"]
    # The ends layout's live row on slot 0 is cleared too: the live check fails there alone.
    assert "(a full batch, no pad rows, live rows on the pool's first and last slots, int64 slot indices)" in slots[
        "live"]["message"]
    # Decoded without slot indices, the case passes its own verdict and fails the same check alone.
    plain = case_decoding(_case, f"{KERNELS}:null_block_cleared", False)
    assert plain["status"] == "fail" and "slots untouched: " in plain["message"], plain["message"]


def test_a_kernel_that_raises_on_every_call_errs_once_without_slot_checks():
    # Its slot checks would each repeat the decode's error: they are left out.
    case = _case(f"{KERNELS}:raises_out_of_resources")
    assert case["status"] == "error" and case["slots"] is None
    assert case["message"].count("out of resources: shared memory") == 1, case["message"]


def test_pad_rows_left_unwritten_are_reported_not_failed():
    case = _case(f"{KERNELS}:pad_rows_left_unwritten")
    assert case["status"] == "pass", case["message"]
    assert case["slots"]["pad_out"] == {"status": "pass", "message": "", "outputs": "not written"}


def test_pad_rows_written_with_garbage_fail():
    case = _case(f"{KERNELS}:pad_rows_write_nan")
    assert case["status"] == "fail"
    assert "pad rows' out: written non-finite" in case["message"]


def test_a_store_past_out_is_caught_and_the_row_named():
    # 3 live rows and 2 pad rows: the last block of 4 rows stores rows 5..7, and row 5 is the guard after out.
    case = _case(f"{KERNELS}:out_stored_in_blocks_of_4_rows")
    untouched = case["slots"]["untouched"]
    assert case["status"] == "fail" and untouched["status"] == "fail"
    assert untouched["past_out"] == [5] and untouched["changed"] == []
    assert "slots untouched: the step wrote out row 5 (past out's 5 rows)" in case["message"], case["message"]
    assert case["slots"]["live"]["status"] == case["slots"]["pad_out"]["status"] == "pass"


def test_an_input_read_past_its_end_in_the_slot_check_is_nan():
    # The slot check's inputs lie between NaN fences, as a decode step's do: a row read at its slot (past x for
    # the slots beyond the batch) is non-finite there, not the finite garbage that memory after x held.
    case = _case(f"{KERNELS}:x_read_at_the_slot")
    slots = case["slots"]
    beyond = [s for r, s in enumerate(slots["slots"]) if r not in slots["pad_rows"] and s >= len(slots["slots"])]
    assert beyond, slots["slots"]  # this seed puts a live row on a slot past the batch
    assert case["status"] == "nonfinite" and slots["live"]["status"] == "nonfinite", case["message"]


def test_a_kernel_without_slot_indices_gets_no_slot_check():
    case = _case("torch")
    assert case["status"] == "pass" and case["slots"] is None


def test_slot_capabilities_come_from_the_signature():
    correct = drift_adapter.resolve(f"{KERNELS}:slots_correct", 10, "software", True)
    assert (correct.pad_slot_id, correct.takes_pad_slot_id, correct.takes_out) == (-1, True, True)

    def mamba_like(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, state_batch_indices=None):
        return x

    plain = drift_adapter.resolve(mamba_like, 10, "software", True)
    assert (plain.pad_slot_id, plain.takes_pad_slot_id, plain.takes_out) == (-1, False, False)
    assert drift_adapter.resolve("builtin", 10, "software", True).pad_slot_id == -1


def test_builtin_pad_rows_touch_no_state_and_get_zero_out(device):
    from ssmcheck.ops.state_update.fused_recurrent import selective_state_update  # noqa: PLC0415

    g = torch.Generator().manual_seed(7)
    pool = torch.randn(4, 1, 4, 16, generator=g).to(device)
    x, dt = torch.randn(2, 1, 4, generator=g).to(device), torch.rand(2, 1, 4, generator=g).to(device)
    A = -torch.rand(1, 4, 16, generator=g).to(device)
    B, C = torch.randn(2, 1, 16, generator=g).to(device), torch.randn(2, 1, 16, generator=g).to(device)
    updated = pool.clone()
    out = selective_state_update(updated, x, dt, A, B, C, state_batch_indices=torch.tensor([-1, 2], device=device))
    assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.isfinite(out[1]).all()
    assert torch.equal(updated[[0, 1, 3]], pool[[0, 1, 3]]) and not torch.equal(updated[2], pool[2])


@settings(max_examples=100, deadline=None)
@given(count=st.integers(2, 6), spare=st.integers(0, 4), skip=st.sampled_from([None, -1, 0]), seed=st.integers(0, 99))
def test_end_slots_take_both_ends_and_distinct_slots(count, spare, skip, seed):
    from ssmcheck.core.pool import end_slots  # noqa: PLC0415

    size = count + spare + (1 if skip == 0 else 0)
    slots = end_slots(count, size, torch.Generator().manual_seed(seed), skip=skip)
    usable = [s for s in range(size) if s != skip]
    assert len(slots) == len(set(slots)) == count and set(slots) <= set(usable)
    assert {usable[0], usable[-1]} <= set(slots)
