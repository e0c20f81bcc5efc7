"""core.fences: a kernel's floating-point inputs between NaN, so that a read or a write past one shows."""

import math
from pathlib import Path

import pytest
import torch
from cli_invoke import invoke
from hypothesis import given, settings
from hypothesis import strategies as st

from ssmcheck import api
from ssmcheck.core import outside
from ssmcheck.core.fences import ALIGN, Fenced

BROKEN = Path(__file__).with_name("broken_scan_kernels.py")
BROKEN_UPDATE = Path(__file__).with_name("broken_state_update_kernels.py")
SMALL = dict(regime="normal", dtype="fp32", chunk_size="64", batch="2", nheads="2", headdim="16", dstate="16",
             ngroups="1")


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 5), cols=st.integers(1, 40), offset=st.integers(0, 7), seed=st.integers(0, 2**31 - 1),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64]),
       nan_fences=st.sampled_from([None, (), ("left",), ("right",), ("other",)]))
def test_copies_keep_values_strides_and_shared_storage_between_nan_fences(rows, cols, offset, seed, dtype,
                                                                          nan_fences):
    g = torch.Generator().manual_seed(seed)
    buffer = torch.randn(offset + rows * (cols + 3), generator=g).to(dtype)
    left = buffer[offset:].as_strided((rows, cols), (cols + 3, 1))  # views into one buffer, as `strided` builds
    right = buffer[offset:].as_strided((rows, 3), (cols + 3, 1), offset + cols)
    index = torch.arange(rows, dtype=torch.int32)
    fenced = Fenced({"left": left, "right": right, "index": index, "none": None}, nan_fences)
    copies = fenced.tensors
    for name, original in (("left", left), ("right", right)):
        assert torch.equal(copies[name], original) and copies[name].stride() == original.stride()
    assert copies["left"].untyped_storage().data_ptr() == copies["right"].untyped_storage().data_ptr()
    assert copies["left"].untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr()
    assert torch.equal(copies["index"], index) and copies["index"].data_ptr() != index.data_ptr()
    assert copies["none"] is None
    whole = torch.empty(0, dtype=dtype).set_(copies["left"].untyped_storage())
    fence = copies["left"].storage_offset() - left.storage_offset()
    assert fence >= buffer.numel() and fence % ALIGN == 0 and whole.numel() == 2 * fence + buffer.numel()
    edges = torch.cat([whole[:fence], whole[fence + buffer.numel():]])
    # One storage, one fence value: NaN when any view of it is named (None names all), else 0.
    nan = nan_fences is None or bool({"left", "right"} & set(nan_fences))
    assert bool(edges.isnan().all()) if nan else bool((edges == 0).all())
    assert fenced.changed() is None and fenced.breached() is None


def test_writes_into_an_input_and_into_its_fence_are_told_apart():
    x = torch.randn(4, 8)
    fenced = Fenced({"x": x, "y": torch.randn(3)})
    fenced.tensors["x"][1, 2] += 1
    assert (fenced.changed(), fenced.breached()) == ("x", None)
    fenced = Fenced({"x": x, "y": torch.randn(3)})
    torch.empty(0).set_(fenced.tensors["y"].untyped_storage())[0] = math.pi  # just before y
    assert (fenced.changed(), fenced.breached()) == (None, "y")


def test_a_chunk_state_that_reads_past_a_partial_last_chunk_makes_the_last_rows_state_nonfinite():
    report = api.scan(kernel=f"{BROKEN}:unmasked_last_chunk", seqlen="200,256", **SMALL)
    partial, whole = report.cases
    assert whole.status == "pass", whole.message  # 256 = 4 chunks of 64: nothing read past x
    assert partial.status == "nonfinite", partial.message
    # y reads nothing past the sequence; the last row's read leaves x, row 0's lands in row 1 (finite)
    where = partial.data["first_nonfinite"]
    assert (where["output"], where["sequence"], where["count"], where["inputs_finite"]) == (
        "final_states", 1, 2 * 16 * 16, True), where


def test_a_kernel_that_writes_past_its_input_is_an_error():
    report = api.scan(kernel=f"{BROKEN}:writes_past_x", seqlen="200", **SMALL)
    [case] = report.cases
    assert case.status == "error" and "wrote outside its input x" in case.message, case.message


def test_a_kernel_that_changes_seq_idx_is_an_error():
    # seq_idx is an input like the others: an engine passes the same one to every layer's call.
    report = api.scan(kernel=f"{BROKEN}:seq_idx_clamped_in_place", seqlen="200", **{**SMALL, "regime": "normal,ragged"})
    batch, varlen = report.cases
    assert batch.status == "pass", batch.message  # no seq_idx in batch mode
    assert varlen.status == "error" and "wrote into its input seq_idx" in varlen.message, varlen.message


@pytest.mark.parametrize(("kernel", "options", "expected"), [
    # the SSM part's call (without D and z) returns y in the buffer of the case's own call's y
    ("y_in_a_kept_buffer", {}, "its y lies in the memory of the y an earlier call returned"),
    # a second call with the return flags: --repeat's
    ("final_states_in_a_kept_buffer", {"repeat": 2}, "its states lie in the memory of the states an earlier call"),
])
def test_an_output_returned_again_in_a_kept_buffer_is_an_error(kernel, options, expected):
    report = api.scan(kernel=f"{BROKEN}:{kernel}", seqlen="200", **SMALL, **options)
    assert report.cases and all(c.status == "error" for c in report.cases), [c.message for c in report.cases]
    assert all(expected in c.message and "each call overwrites the last one's output" in c.message
               for c in report.cases), report.cases[0].message


def test_zero_fences_keep_their_value_and_report_writes_into_them():
    x, y = torch.randn(4, 8), torch.randn(3)
    fenced = Fenced({"x": x, "y": y}, nan_fences=("y",))
    around = {name: torch.empty(0).set_(fenced.tensors[name].untyped_storage()) for name in ("x", "y")}
    fence = fenced.tensors["x"].storage_offset()
    assert (around["x"][:fence] == 0).all() and (around["x"][fence + x.numel():] == 0).all()
    assert around["y"][:fence].isnan().all() and fenced.breached() is None
    around["x"][-1] = 1.0
    assert fenced.breached() == "x"


def test_a_nonfinite_case_read_from_a_fence_names_the_input_read_past():
    report = api.scan(kernel=f"{BROKEN}:unmasked_last_chunk", seqlen="200", **SMALL)
    [case] = report.cases
    assert case.status == "nonfinite" and "reads outside its input x:" in case.message, case.message
    assert case.data["reads_outside"] == [["x"]]
    result, _ = invoke("scan", "--kernel", f"{BROKEN}:unmasked_last_chunk", "--seqlen", "200",
                       *[f"--{k.replace('_', '-')}={v}" for k, v in SMALL.items()], terminal_width=200)
    assert result.exit_code == 3 and "state s1 h0 p0 n0 (past x)" in result.output, result.output


def test_a_read_past_x_in_the_call_without_d_is_nonfinite_in_the_ssm_part_and_attributed():
    report = api.scan(kernel=f"{BROKEN}:unmasked_without_d", seqlen="200", **SMALL)
    [case] = report.cases
    assert case.status == "nonfinite", case.message  # a NaN in the SSM part is no finite error of it
    where = case.data["first_nonfinite"]
    assert (where["output"], where["sequence"], where["token"], where["inputs_finite"]) == ("ssm_y", 1, 199, True)
    assert case.data["reads_outside"] == [["x"]] and "the SSM part C·h" in case.message, case.message


def test_nonfinite_values_a_kernel_makes_itself_are_not_blamed_on_the_fences():
    report = api.scan(kernel=f"{BROKEN}:nan_in_partial_last_chunk", seqlen="200", **SMALL)
    [case] = report.cases
    assert case.status == "nonfinite" and case.data["reads_outside"] is None, case.message
    assert "reads outside" not in case.message


def test_reads_outside_names_each_storage_whose_nan_fences_alone_make_the_outputs_nonfinite():
    storages = [("x", "B", "C", "dt"), ("A",), ("D",)]

    def reads_past(*read, together=False):
        def call(nan_fences):  # NaN where the storages it reads past keep their NaN fences (None: all do)
            fenced = {n for names in storages for n in names} if nan_fences is None else set(nan_fences)
            bad = set(read) <= fenced if together else not fenced.isdisjoint(read)
            return torch.full((2,), math.nan if bad else 1.0), torch.ones(3)
        return call

    assert outside.reads_outside(reads_past("B", "D"), storages) == [("x", "B", "C", "dt"), ("D",)]
    assert "outside the buffer holding x/B/C/dt and its input D:" in outside.describe([("x", "B", "C", "dt"), ("D",)])
    assert outside.reads_outside(reads_past("A", "D", together=True), storages) == []  # NaN only with both fenced
    assert "no single input's NaN fences" in outside.describe([])
    own = lambda nan_fences: (torch.ones(2), torch.full((3,), math.inf))  # noqa: E731 (non-finite with any fences)
    assert outside.reads_outside(own, storages) is None
    calls = []

    def once(nan_fences):  # non-finite the first time only: not reproduced, so not attributed
        calls.append(nan_fences)
        return torch.ones(2), torch.ones(3)

    assert outside.reads_outside(once, storages) is None and calls == [None]


def test_a_state_update_that_reads_past_c_is_nonfinite_at_its_first_step():
    options = dict(regime="normal", state_dtype="fp16", batch="2", nheads="4", ngroups="2", headdim="8", steps=8,
                   trials=1)
    report = api.drift(kernel=f"{BROKEN_UPDATE}:unmasked_c_block", dstate="40,48", **options)
    partial, whole = report.cases
    assert whole.status == "pass", whole.message  # 48 = 3 blocks of 16: nothing read past C
    assert partial.status == "nonfinite", partial.message
    where = partial.data["first_nonfinite"]
    # The first step's inputs are fenced: the last row's last group (heads 2 and 3) reads the fence.
    assert (where["output"], where["step"], where["batch"], where["head"]) == ("out", 1, 1, 2), where
    assert where["reads_outside"] == [["C"]] and "reads outside its input C:" in partial.message, partial.message


def test_a_state_update_whose_own_values_overflow_is_not_blamed_on_the_fences():
    # Step 7 (fenced: runs of 16 steps or fewer check every step) stores inf in the state: the kernel's own.
    report = api.drift(kernel=f"{BROKEN_UPDATE}:inf_at_one_element", regime="normal", state_dtype="fp16",
                       rounding="nearest", batch="3", nheads="2", headdim="8", dstate="16", steps=8, trials=1)
    [case] = report.cases
    assert case.status == "nonfinite", case.message
    assert case.data["first_nonfinite"]["reads_outside"] is None and "reads outside" not in case.message


def test_a_state_update_that_writes_past_an_input_is_an_error():
    report = api.drift(kernel=f"{BROKEN_UPDATE}:writes_past_x", regime="normal", state_dtype="fp16", batch="2",
                       nheads="2", headdim="8", dstate="16", steps=4, trials=1)
    [case] = report.cases
    assert case.status == "error" and "wrote outside its input x" in case.message, case.message


def test_a_state_update_that_reads_past_its_state_is_nonfinite_and_one_writing_past_it_an_error():
    options = dict(regime="normal", state_dtype="fp16", rounding="nearest", batch="2", nheads="2", headdim="8",
                   steps=8, trials=1)
    partial, whole = api.drift(kernel=f"{BROKEN_UPDATE}:unmasked_state_tail", dstate="40,48", **options).cases
    assert whole.status == "pass", whole.message
    assert partial.status == "nonfinite", partial.message
    where = partial.data["first_nonfinite"]
    assert (where["output"], where["step"], where["batch"], where["head"]) == ("out", 1, 1, 1), where
    assert where["reads_outside"] == [["state"]], partial.message
    [case] = api.drift(kernel=f"{BROKEN_UPDATE}:writes_past_state", dstate="16", **options).cases
    assert case.status == "error" and "wrote outside its state" in case.message, case.message

