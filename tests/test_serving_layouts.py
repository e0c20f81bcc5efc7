"""Inputs shaped as serving engines pass them (issue #16): the strided regime's fused in_proj views, the
offsets they carry past 2**31 at real widths, and y past fp16's range (large-output, saturation)."""

from pathlib import Path

import pytest
import torch
from cli_invoke import invoke, planted_bug_cases
from layout_kernels import WRAP_BITS

from ssmcheck.core.formats import saturate
from ssmcheck.core.models import lookup
from ssmcheck.core.tensors import laid_out_as, whole_storage
from ssmcheck.ops.chunk_scan.chunk import chunk_scan_combined
from ssmcheck.ops.chunk_scan.naive import scan_recurrent
from ssmcheck.scan.adapter import resolve
from ssmcheck.scan.inputs import ScanShape
from ssmcheck.scan.regimes import CACHE_LAYERS, REGIMES, STRIDED_SPARE_TOKENS, in_proj_columns
from ssmcheck.scan.spec import ScanCase

LAYOUT = str(Path(__file__).with_name("layout_kernels.py"))
# 2 heads x 16, dstate 8, one group: 82 elements per in_proj token, 32 per contiguous x token.
TINY = ["--nheads", "2", "--headdim", "16", "--dstate", "8", "--ngroups", "1"]
FP16_MAX = 65504.0


def _shape(batch=2, seqlen=128, chunk_size=32):
    return ScanShape(batch, seqlen, 2, 16, 8, 1, chunk_size)


def test_strided_inputs_are_views_into_one_in_proj_buffer_in_mamba2_order():
    inputs = REGIMES["strided"].generate(_shape(), torch.bfloat16, seed=11)
    width = 2 * 32 + 2 * 8 + 2
    assert sum(in_proj_columns(_shape()).values()) == width
    storage = inputs.x.untyped_storage().data_ptr()
    # [z | x | B | C | dt] per token: each view starts where the previous block ends, one row stride apart.
    starts = {"z": 0, "x": 32, "B": 64, "C": 72, "dt": 80}
    for name, start in starts.items():
        view = getattr(inputs, name)
        assert view.untyped_storage().data_ptr() == storage and view.storage_offset() == start
        # Rows (seqlen + STRIDED_SPARE_TOKENS) tokens apart: the buffer holds spare tokens a row, NaN.
        assert view.stride()[:2] == ((128 + STRIDED_SPARE_TOKENS) * width, width) and view.stride()[-1] == 1
        assert not view.is_contiguous()
        assert view.dtype == torch.bfloat16 and bool(torch.isfinite(view).all()) and bool(view.abs().sum() > 0)
    assert inputs.A.is_contiguous() and inputs.D.is_contiguous() and inputs.dt_bias is not None


@pytest.mark.parametrize("seed", [0, 7, 31])
def test_strided_clamps_a_quarter_of_its_tokens_from_above_only(seed):
    # A model's time_step_limit (0, max) in batch mode: the one batch-mode dt_limit without a lower end.
    inputs = REGIMES["strided"].generate(_shape(), torch.bfloat16, seed=seed)
    low, high = inputs.dt_limit
    step_dt = torch.nn.functional.softplus(inputs.dt.double() + inputs.dt_bias.double())
    assert low == 0.0 and 0.0 < high < float("inf") and f"dt clamped to {inputs.dt_limit}" in inputs.note
    assert 0.2 < float((step_dt > high).double().mean()) < 0.3


def test_moving_strided_inputs_keeps_their_strides_and_one_buffer():
    inputs = REGIMES["strided"].generate(_shape(), torch.float16, seed=12)
    moved = inputs.to("meta")
    for name in ("x", "z", "B", "C", "dt"):
        before, after = getattr(inputs, name), getattr(moved, name)
        assert after.device.type == "meta"
        assert (after.shape, after.stride(), after.storage_offset()) == (
            before.shape, before.stride(), before.storage_offset())
    assert moved.A.device.type == "meta" and moved.A.is_contiguous()


def test_the_adapter_hands_the_kernel_the_views_themselves():
    inputs = REGIMES["strided"].generate(_shape(), torch.float32, seed=13)
    case = ScanCase("builtin", "strided", "fp32", 32, 128, 2, 2, 16, 8, 1, "fp32", "nearest", None, 13)
    args, kwargs = resolve("builtin", interpreter=True).arguments(inputs, case)
    assert args[0] is inputs.x and args[1] is inputs.dt and args[3] is inputs.B and args[4] is inputs.C
    assert kwargs["z"] is inputs.z


def test_long_reads_its_initial_states_from_one_layers_slice_of_a_state_cache():
    inputs = REGIMES["long"].generate(_shape(seqlen=256), torch.bfloat16, seed=14)
    states = inputs.initial_states
    state = 2 * 16 * 8
    # Rows CACHE_LAYERS states apart, each state contiguous, the last layer's: the first layer's drawn too.
    assert states.stride() == (CACHE_LAYERS * state, 16 * 8, 8, 1) and states.storage_offset() == state
    cache = whole_storage(states)
    assert cache.numel() == 2 * CACHE_LAYERS * state and bool(torch.isfinite(cache).all())
    assert bool((cache.view(2, CACHE_LAYERS, state)[:, 0] != 0).all())
    assert inputs.D.shape == (2, 16)
    moved = inputs.to("meta").initial_states
    assert (moved.stride(), moved.storage_offset()) == (states.stride(), states.storage_offset())


def test_initial_states_rounded_to_a_cache_dtype_keep_their_layout():
    states = REGIMES["long"].generate(_shape(seqlen=256), torch.float32, seed=15).initial_states
    rounded = laid_out_as(states, states.to(torch.bfloat16).to(states.dtype))
    assert (rounded.stride(), rounded.storage_offset()) == (states.stride(), states.storage_offset())
    assert torch.equal(rounded, states.to(torch.bfloat16).float()) and not torch.equal(rounded, states)
    assert rounded.untyped_storage().data_ptr() != states.untyped_storage().data_ptr()
    # The rest of the cache (the other layer's states) is the original's.
    layers = [whole_storage(t).view(2, CACHE_LAYERS, -1)[:, 0] for t in (states, rounded)]
    assert torch.equal(*layers)


@pytest.mark.parametrize(("kernel", "reached", "count"), [
    # one row's state is read right from its own start, whatever the strides: rows past the first are not
    # and aligned-initial-state's packed initial states, a layer's slice of a state cache (since the sixtieth session)
    ("initial_states_read_as_contiguous", lambda p: p["regime"] in ("long", "continuation") and p["batch"] > 1
     or p["regime"] == "aligned-initial-state", 5),
    # and decay-extreme's 6, the batch-mode regime with D per channel and no gate (since the fifty-second session)
    ("batch_mode_d_per_head", lambda p: p["regime"] in ("long", "continuation", "decay-extreme"), 13),
])
def test_the_default_preset_fails_a_kernel_reading_a_cache_slice_or_a_per_channel_d_wrongly(kernel, reached, count,
                                                                                            tmp_path):
    """Each kernel is right but for a strided initial_states (read as contiguous) or a per-channel D in batch
    mode (read per head): `long` and `continuation` (its inputs) alone have the first, they and `decay-extreme` the
    second, and the default cases that reach each fail."""
    result, report = invoke("scan", "--kernel", f"{LAYOUT}:{kernel}", "--preset", "default",
                            json_path=tmp_path / "r.json")
    assert result.exit_code == 1, result.output
    failed = planted_bug_cases(report, reached)
    assert len(failed) == count and all(c["status"] == "fail" for c in failed), [c["id"] for c in failed]


def test_conv_output_puts_x_b_c_channel_major_in_a_conv_buffer_and_z_dt_in_the_in_proj_buffer():
    shape = _shape(seqlen=50)
    inputs = REGIMES["conv-output"].generate(shape, torch.bfloat16, seed=16)
    values = REGIMES["normal"].generate(shape, torch.bfloat16, seed=16)
    width, channels = 2 * 32 + 2 * 8 + 2, 32 + 2 * 8
    conv = {"x": (0, (channels * 50, 1, 16 * 50, 50)), "B": (32 * 50, (channels * 50, 1, 8 * 50, 50)),
            "C": (40 * 50, (channels * 50, 1, 8 * 50, 50))}
    in_proj = {"z": (0, (50 * width, width, 16, 1)), "dt": (80, (50 * width, width, 1))}
    for names, storage in ((conv, inputs.x.untyped_storage()), (in_proj, inputs.z.untyped_storage())):
        for name, (offset, strides) in names.items():
            view = getattr(inputs, name)
            assert view.untyped_storage().data_ptr() == storage.data_ptr(), name
            assert (view.storage_offset(), view.stride()) == (offset, strides), name
            assert torch.equal(view, getattr(values, name)), name  # normal's values, laid out anew
    assert inputs.x.untyped_storage().data_ptr() != inputs.z.untyped_storage().data_ptr()
    # The in_proj buffer's xBC columns: the values before the conv (x, B, C negated), every element finite.
    before = whole_storage(inputs.z).view(2, 50, width)
    assert torch.equal(before[..., 32:64].view(2, 50, 2, 16), -values.x) and bool(torch.isfinite(before).all())
    moved = inputs.to("meta")
    for name in ("x", "z", "B", "C", "dt"):
        assert getattr(moved, name).stride() == getattr(inputs, name).stride()


@pytest.mark.parametrize(("kernel", "statuses"), [
    ("z_read_with_x_strides", {"conv-output": ["fail"], "conv-output-varlen": ["fail"]}),
    ("channels_read_as_contiguous", {"conv-output": ["fail"], "conv-output-varlen": ["fail"]}),
    # packed sequences are one row; strided's rows hold NaN spare tokens past the call's (its three dtypes read them);
    # large-magnitude's C is a view into a buffer with NaN columns past each token's C (scan.regimes._c_apart), and at
    # one token a row its size-1 token axis has the stride torch gives it (C's width), not the row's (past the NaN):
    # rows read seqlen such strides apart reach the NaN there, and only there
    ("rows_seqlen_tokens_apart", {"conv-output": ["fail"], "strided": ["nonfinite"] * 3,
                                  "large-magnitude": ["nonfinite", "pass", "pass", "pass"]}),
])
def test_the_default_preset_fails_a_kernel_taking_one_inputs_strides_for_another_where_layouts_differ(
        kernel, statuses, tmp_path):
    """Each kernel reads an input with a stride it was not passed (z with x's, a channel stride of 1, rows
    seqlen token strides apart): right wherever the inputs share one layout, so conv-output's cases alone fail
    (its batch-mode one, and the packed one where the bug is not about rows), and, for rows, strided's, whose
    buffer holds more tokens a row than the call's."""
    result, report = invoke("scan", "--kernel", f"{LAYOUT}:{kernel}", "--preset", "default",
                            json_path=tmp_path / "r.json")
    assert result.exit_code == (3 if "strided" in statuses else 1), result.output
    failed = planted_bug_cases(report, lambda p: p["regime"] in statuses)
    seen = {regime: sorted(c["status"] for c in failed if c["params"]["regime"] == regime) for regime in statuses}
    assert seen == statuses, [(c["id"], c["status"]) for c in failed]


def test_mamba2_2_7b_token_offsets_pass_2_31_at_203053_tokens():
    """The README's figure: Mamba2-2.7B's in_proj rows are 10576 elements, so a token's row offset passes
    2**31 - 1 from token 203,053 on (and the last token of a row of that many tokens starts past it)."""
    m = lookup("Mamba2-2.7B")
    width = sum(in_proj_columns(ScanShape(1, 1, m.nheads, m.headdim, m.dstate, m.ngroups, 256)).values())
    assert width == 2 * 80 * 64 + 2 * 128 + 80 == 10576
    assert 203_052 * width < 2**31 <= 203_053 * width
    # The tiny case of the planted kernel is to 2**(WRAP_BITS - 1) what 2.7B is to 2**31.
    assert 99 * 82 < 2 ** (WRAP_BITS - 1) <= 100 * 82


def test_builtin_kernel_passes_the_strided_regime(tmp_path):
    result, report = invoke("scan", "--regime", "strided", "--dtype", "fp32,fp16", "--seqlen", "128",
                            "--chunk-size", "32", "--batch", "2", *TINY, json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert [c["status"] for c in report["cases"]] == ["pass", "pass"]


def test_a_kernel_with_32_bit_token_offsets_fails_strided_and_passes_contiguous(tmp_path):
    kernel = f"{LAYOUT}:wrapped_token_offsets"
    args = ("--kernel", kernel, "--dtype", "fp32", "--seqlen", "128", "--chunk-size", "32", "--batch", "2", *TINY)
    result, report = invoke("scan", "--regime", "normal,strided", *args, json_path=tmp_path / "r.json")
    assert result.exit_code == 3, result.output
    normal, strided = report["cases"]
    assert normal["status"] == "pass"
    # Tokens 100..127 (chunk 3) are read from wrapped offsets, before the buffer: in the NaN fence ssmcheck puts
    # around each input (core.fences), so y is non-finite from chunk 3 on, its inputs finite.
    where = strided["first_nonfinite"]
    assert strided["status"] == "nonfinite" and (where["sequence"], where["chunk"]) == (0, 3), where
    assert "chunk 3" in strided["message"] and "inputs finite" in strided["message"]
    # With zeros in the fences y is finite: the NaN is read from before the fused buffer (core.outside).
    assert strided["reads_outside"] == [["x", "dt", "B", "C", "z"]], strided["message"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_large_output_pushes_y_past_fp16_while_states_stay_small(dtype):
    inputs = REGIMES["large-output"].generate(_shape(seqlen=100), dtype, seed=21)
    ref = scan_recurrent(inputs.x, inputs.dt, inputs.A, inputs.B, inputs.C, **inputs.kwargs())
    peak = float(ref.y.abs().max())
    assert 1.5 * FP16_MAX < peak < 3 * FP16_MAX
    assert 0.1 < float((ref.y.abs() > FP16_MAX).double().mean()) < 0.9  # some tokens past the range, some not
    assert float(ref.final_states.abs().max()) <= FP16_MAX / 64
    for t in (inputs.x, inputs.B, inputs.C, inputs.dt):
        assert bool(torch.isfinite(t).all()) and t.dtype == dtype


def test_saturate_clamps_finite_values_and_keeps_inf_and_nan():
    values = torch.tensor([1e5, -7e4, 65504.0, 3.0, float("inf"), float("-inf"), float("nan")], dtype=torch.float64)
    got = saturate(values, torch.float16)
    assert got[:6].tolist() == [FP16_MAX, -FP16_MAX, FP16_MAX, 3.0, float("inf"), float("-inf")]
    assert bool(got[6].isnan()) and got.dtype == torch.float64
    assert saturate(values[:4], torch.float32).tolist() == values[:4].tolist()
    # Values in a format narrower than the bound's (fp16 accumulations saturated to bf16) are left alone.
    narrow = torch.tensor([FP16_MAX, -3.0, float("inf")], dtype=torch.float16)
    assert saturate(narrow, torch.bfloat16).tolist() == narrow.tolist()


def test_builtin_kernel_stores_y_past_fp16_saturated(device):
    inputs = REGIMES["large-output"].generate(_shape(seqlen=100), torch.float16, seed=22)
    on = inputs.to(device)  # the built-in kernel runs where the session's Triton does (interpreter on the CPU)
    y = chunk_scan_combined(on.x, on.dt, on.A, on.B, on.C, 32, **on.kwargs()).cpu()
    ref = scan_recurrent(inputs.x, inputs.dt, inputs.A, inputs.B, inputs.C, **inputs.kwargs()).y
    assert bool(torch.isfinite(y).all())
    past = ref.abs() > 65520  # past 65504 by more than half an ulp: plain rounding gives inf there
    assert bool(past.any()) and bool((y[past].float() == FP16_MAX).all())


def test_builtin_and_baseline_pass_large_output_in_every_dtype(tmp_path):
    for kernel in ("builtin", "torch"):
        result, report = invoke("scan", "--kernel", kernel, "--regime", "large-output", "--dtype", "fp32,bf16,fp16",
                                "--seqlen", "100", "--chunk-size", "32", "--batch", "2", *TINY,
                                json_path=tmp_path / f"{kernel}.json")
        assert result.exit_code == 0, result.output
        assert [c["status"] for c in report["cases"]] == ["pass"] * 3


def test_a_kernel_storing_inf_past_fp16_is_nonfinite_at_the_first_such_token(tmp_path):
    result, report = invoke("scan", "--kernel", f"{LAYOUT}:unsaturated_fp16_output", "--regime", "large-output",
                            "--dtype", "fp16", "--seqlen", "100", "--chunk-size", "32", "--batch", "2", *TINY,
                            json_path=tmp_path / "r.json")
    assert result.exit_code == 3, result.output
    (case,) = report["cases"]
    assert case["status"] == "nonfinite"
    # Where the float64 y first passes fp16's range by more than half an ulp, in token order (rows of one
    # token before the next token).
    inputs = REGIMES["large-output"].generate(_shape(seqlen=100), torch.float16, seed=case["params"]["seed"])
    y = scan_recurrent(inputs.x, inputs.dt, inputs.A, inputs.B, inputs.C, **inputs.kwargs()).y
    past = y.abs() > 65520
    token = int(past.flatten(2).any(-1).any(0).nonzero()[0])
    row = int(past[:, token].flatten(1).any(-1).nonzero()[0])
    head, channel = divmod(int(past[row, token].flatten().nonzero()[0]), 16)
    found = case["first_nonfinite"]
    assert (found["output"], found["sequence"], found["token"], found["chunk"], found["head"], found["channel"]) == (
        "y", row, token, token // 32, head, channel)
    assert found["inputs_finite"] is True and found["count"] == int(past.sum())
