"""`ssmcheck scan` and `ssmcheck regimes` as users and CI run them: statuses, locations, exit codes, JSON.

Most runs use `--kernel torch` (the baseline as the kernel) or broken wrappers of it
(tests/broken_scan_kernels.py) at tiny widths; a few run the built-in Triton kernel.
"""

import collections
import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_invoke import assert_usage_error, case_inputs, invoke, planted_bug_cases

from ssmcheck.core import runtime
from ssmcheck.drift.regimes import DRIFT_REGIMES
from ssmcheck.scan.inputs import ScanShape
from ssmcheck.scan.regimes import REGIMES

BROKEN = str(Path(__file__).with_name("broken_scan_kernels.py"))
SLOTS = str(Path(__file__).with_name("slot_kernels.py"))
TINY = ["--nheads", "2", "--headdim", "16", "--dstate", "8", "--ngroups", "1"]

def scan(*args, json_path=None):
    """Run `ssmcheck scan ARGS` (with --json when given); return (result, report or None)."""
    return invoke("scan", *args, json_path=json_path)


def test_torch_kernel_passes_the_smoke_preset(tmp_path):
    result, report = scan("--preset", "smoke", "--kernel", "torch", json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert "13 cases: 13 pass" in result.stdout and "exit code 0" in result.stdout
    assert f"device {runtime.environment().device}" in result.stdout and "torch" in result.stdout  # the environment, above the table
    assert report["exit_code"] == 0 and report["summary"]["pass"] == len(report["cases"]) == 13


def test_a_kernel_of_an_older_signature_runs_the_cases_that_need_none_of_its_missing_keywords(tmp_path):
    """A chunk scan without cu_seqlens, return_varlen_states and dt_limit (mamba's before packed sequences) is not
    passed them where a case leaves them unset: the batch cases without a dt_limit pass, and each case that sets one
    is skipped, naming the keyword."""
    kernel = str(Path(__file__).with_name("signature_kernels.py")) + ":chunk_scan_before_varlen"
    result, report = scan("--preset", "smoke", "--kernel", kernel, json_path=tmp_path / "o.json")
    assert result.exit_code == 0, result.output
    by_regime = {c["params"]["regime"]: c for c in report["cases"]}
    varlen = {"ragged", "aligned", "initial-state", "aligned-initial-state"}
    limited = {"large-magnitude", "long", "large-output", "strided"}
    for regime, case in by_regime.items():
        if regime in varlen | limited:
            keyword = "cu_seqlens" if regime in varlen else "dt_limit"
            assert case["status"] == "skipped" and f"takes no {keyword}" in case["message"], case
        else:
            assert case["status"] == "pass", case
    assert len(by_regime) - len(varlen | limited) == 5


def test_builtin_kernel_passes_the_smoke_preset():
    result, _ = scan("--preset", "smoke", "--quiet")
    assert result.exit_code == 0, result.output
    assert "13 pass" in result.stdout
    assert result.stdout.count("\n") == 1, result.stdout  # all pass: the summary line alone


def test_quiet_lists_each_failing_case_before_the_summary_line():
    result, report = scan("--kernel", f"{BROKEN}:y_alone_without_d", "--regime", "ragged,normal", "--dtype",
                          "bf16", "--seqlen", "100", "--chunk-size", "32", "--batch", "3", *TINY, "--quiet")
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 3, result.stdout  # both cases fail, each on its call for y alone
    assert lines[0].startswith("fail ragged-bf16-c32-L100-b3-") and ": the call without the return flags" in lines[0]
    assert lines[1].startswith("fail normal-bf16-c32-L100-b3-") and ": the call without the return flags" in lines[1]
    assert lines[2].startswith("2 cases: 0 pass, 2 fail")


def test_builtin_kernel_with_rounded_states_and_an_fp32_reference(tmp_path):
    result, report = scan("--regime", "ragged", "--dtype", "bf16", "--batch", "3", "--seqlen", "40", "--chunk-size",
                          "16", "--state-dtype", "fp16", "--rounding", "nearest,stochastic", "--reference", "fp32",
                          *TINY, json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert [(c["params"]["state_dtype"], c["params"]["rounding"]) for c in report["cases"]] == [
        ("fp16", "nearest"), ("fp16", "stochastic")]
    assert report["settings"]["reference"] == "fp32"


def test_json_report_has_the_stable_keys(tmp_path):
    _, report = scan("--kernel", "torch", "--regime", "normal,long", "--seqlen", "40", "--chunk-size", "16",
                     "--dtype", "bf16", "--batch", "1", *TINY, json_path=tmp_path / "r.json")
    assert {"tool", "version", "command", "environment", "cases", "summary", "exit_code"} <= set(report)
    assert report["tool"] == "ssmcheck" and report["command"] == "scan"
    assert {"device", "torch", "triton", "interpreter"} <= set(report["environment"])
    assert set(report["summary"]) == {"pass", "fail", "nonfinite", "error", "skipped"}
    ran, skipped = report["cases"]
    assert {"id", "status", "message", "seconds", "params", "error", "first_nonfinite", "drift"} <= set(ran)
    assert {"kernel", "dtype", "chunk_size", "seqlen", "batch", "nheads", "headdim", "dstate", "ngroups", "regime",
            "seed", "state_dtype", "rounding"} <= set(ran["params"])
    assert {"y_max_rel", "y_max_abs", "state_max_rel", "baseline_y_max_rel", "ratio"} <= set(ran["error"])
    assert set(ran["drift"]) == {"per_chunk", "growth"} and len(ran["drift"]["per_chunk"]) == 3
    assert ran["status"] == "pass" and ran["error"]["ratio"] == 1.0 and ran["first_nonfinite"] is None
    assert set(ran["error"]["y_bias"]) == {"dtype", "count", "mean_ulp", "z", "beyond", "mean_up_ulp", "z_up"}
    assert ran["error"]["y_bias"]["dtype"] == "bf16"
    assert ran["error"]["y_bias"] == ran["error"]["baseline_y_bias"]  # the torch kernel is the baseline
    assert ran["error"]["state_bias"] is ran["error"]["baseline_state_bias"] is None  # fp32 states
    assert skipped["status"] == "skipped" and "8 chunks" in skipped["message"]
    assert skipped["error"]["y_max_rel"] is None and skipped["drift"] == {"per_chunk": [], "growth": None}
    assert skipped["error"]["y_bias"] is skipped["error"]["baseline_y_bias"] is None
    assert skipped["error"]["state_bias"] is skipped["error"]["baseline_state_bias"] is None


def test_nan_in_a_partial_last_chunk_is_nonfinite_at_its_first_token(tmp_path):
    result, report = scan("--kernel", f"{BROKEN}:nan_in_partial_last_chunk", "--regime", "normal", "--dtype", "fp32",
                          "--seqlen", "100", "--chunk-size", "32", "--batch", "2", *TINY,
                          json_path=tmp_path / "r.json")
    assert result.exit_code == 3, result.output
    (case,) = report["cases"]
    assert case["status"] == "nonfinite"
    # tokens 96..99 form the partial last chunk (chunk 3); NaN from offset 2, head 1, in both rows
    assert case["first_nonfinite"] == {
        "output": "y", "sequence": 0, "token": 98, "chunk": 3, "head": 1, "channel": 0, "state_index": None,
        "count": 2 * 2 * 16, "tokens": 4, "chunks": 2, "inputs_finite": True,
    }
    assert "s0 t98 c3 h1 p0" in result.stdout
    assert "sequence 0 token 98 (chunk 3) head 1 channel 0" in case["message"]


def test_an_error_compounding_from_chunk_to_chunk_names_the_earliest_chunk_over_the_limit(tmp_path):
    # The worst group is the last chunk's; where the error starts is chunk 1 (0.1% there, the fp32 limit ~1e-5).
    result, report = scan("--kernel", f"{BROKEN}:compounding_per_chunk", "--regime", "normal", "--dtype", "fp32",
                          "--seqlen", "160", "--chunk-size", "32", "--batch", "1", *TINY, json_path=tmp_path / "r.json")
    assert result.exit_code == 1, result.output
    (case,) = report["cases"]
    assert case["error"]["y_worst_group"]["chunk"] == 4, case["error"]["y_worst_group"]
    assert re.search(r"; the earliest y group over the group limit [0-9.e-]+: sequence 0 chunk 1 head \d "
                     r"\(error 0\.001", case["message"]), case["message"]


def test_a_kernel_that_computes_y_alone_on_another_path_fails_where_that_call_is_judged(tmp_path):
    # The call for y alone with D and z (no return flags) is judged beside the case's own in bf16 cases with
    # sequences or initial states, and in bf16 and fp32 batch-mode ones with D and z (the training forward's call);
    # the kernel's flagged call is right, so the fp32 case with sequences passes.
    result, report = scan("--kernel", f"{BROKEN}:y_alone_without_d", "--regime", "ragged,normal", "--dtype",
                          "fp32,bf16", "--seqlen", "100", "--chunk-size", "32", "--batch", "3", *TINY,
                          json_path=tmp_path / "r.json")
    assert result.exit_code == 1, result.output
    status = {(c["params"]["regime"], c["params"]["dtype"]): c["status"] for c in report["cases"]}
    assert status == {("ragged", "fp32"): "pass", ("ragged", "bf16"): "fail", ("normal", "fp32"): "fail",
                      ("normal", "bf16"): "fail"}, status
    failed = next(c for c in report["cases"] if c["status"] == "fail" and c["params"]["regime"] == "ragged")
    assert re.fullmatch(r"the call without the return flags \(as a training forward, or a prefill that keeps no "
                        r"state, makes it\) returned y [0-9.]+ off the timed call's, whose own error is [0-9.e-]+ "
                        r"\(limit [0-9.e-]+\): a path taken without the return flags that computes y otherwise",
                        failed["message"]), failed["message"]


def test_nan_in_the_final_state_is_located_by_sequence_head_channel_and_state(tmp_path):
    result, report = scan("--kernel", f"{BROKEN}:nan_final_state", "--regime", "ragged", "--dtype", "fp16",
                          "--seqlen", "30", "--chunk-size", "16", "--batch", "3", *TINY, json_path=tmp_path / "r.json")
    assert result.exit_code == 3
    (case,) = report["cases"]
    assert case["first_nonfinite"]["output"] == "final_states"
    assert {k: case["first_nonfinite"][k] for k in ("sequence", "head", "channel", "state_index", "count")} == {
        "sequence": 2, "head": 0, "channel": 3, "state_index": 5, "count": 1}
    assert case["first_nonfinite_state"] == case["first_nonfinite"]


def test_a_wrong_final_state_is_located_by_sequence_head_channel_and_state(tmp_path):
    result, report = scan("--kernel", f"{BROKEN}:final_state_element_doubled", "--regime", "initial-state",
                          "--dtype", "fp32", "--seqlen", "30", "--chunk-size", "16", "--batch", "3", *TINY,
                          json_path=tmp_path / "r.json")
    assert result.exit_code == 1, result.output
    (case,) = report["cases"]
    assert case["status"] == "fail" and case["first_nonfinite"] is None
    assert case["error"]["state_worst"] == [2, 1, 2, 4]
    assert case["message"].startswith("states error") and "y error" not in case["message"]
    assert f"(largest |Δ| {case['error']['state_max_abs']:.3g} at sequence 2 head 1 channel 2 state 4)" in case[
        "message"]


def test_states_returned_in_another_order_are_named_as_other_sequences_states(tmp_path):
    result, report = scan("--kernel", f"{BROKEN}:varlen_states_reversed", "--regime", "initial-state,normal",
                          "--dtype", "fp32", "--seqlen", "30", "--chunk-size", "16", "--batch", "3", *TINY,
                          json_path=tmp_path / "r.json")
    assert result.exit_code == 1, result.output
    statuses = {c["params"]["regime"]: c for c in report["cases"]}
    assert statuses["normal"]["status"] == "pass"  # batch mode: no varlen states to reverse
    varlen = statuses["initial-state"]
    assert varlen["status"] == "fail" and varlen["message"].startswith("states error")
    assert ("states returned for other sequences: the state of sequence 0 is sequence 2's, 2 is sequence 0's"
            in varlen["message"])


def test_a_state_leaking_across_varlen_boundaries_fails_only_where_there_are_boundaries(tmp_path):
    result, report = scan("--kernel", f"{BROKEN}:leaky_varlen", "--regime", "ragged,normal", "--dtype", "bf16",
                          "--seqlen", "40", "--chunk-size", "16", "--batch", "1,4", *TINY,
                          json_path=tmp_path / "r.json")
    assert result.exit_code == 1, result.output
    statuses = {(c["params"]["regime"], c["params"]["batch"]): c["status"] for c in report["cases"]}
    assert statuses == {("ragged", 1): "pass", ("ragged", 4): "fail", ("normal", 1): "pass", ("normal", 4): "pass"}
    failed = next(c for c in report["cases"] if c["status"] == "fail")
    assert failed["message"].startswith("y error") and "states" not in failed["message"]
    assert failed["error"]["ratio"] > 10 and failed["first_nonfinite"] is None

    # Where the error is: the case's inputs again, and y in float64 with and without the boundaries.
    p = failed["params"]
    shape = ScanShape(p["batch"], p["seqlen"], p["nheads"], p["headdim"], p["dstate"], p["ngroups"], p["chunk_size"])
    inputs = REGIMES["ragged"].generate(shape, torch.bfloat16, p["seed"])
    cu = inputs.cu_seqlens.tolist()
    lengths = [b - a for a, b in itertools.pairwise(cu)]
    assert f"varlen: {len(lengths)} sequences of {', '.join(map(str, lengths))} tokens" in failed["inputs"]
    leak = (_y_float64(inputs, starts={0}) - _y_float64(inputs, starts=set(cu[:-1]))).abs()
    assert leak[: cu[1]].max() == 0  # nothing precedes the first sequence
    row, token, head, channel = failed["error"]["y_worst"]
    assert row == 0 and cu[1] <= token < cu[-1]  # in a sequence after the first
    # the worst element is where the leak is largest, and the leak is its error
    assert leak[token, head, channel] >= 0.9 * leak.max()
    assert abs(failed["error"]["y_max_abs"] - leak[token, head, channel]) < 0.05 * failed["error"]["y_max_abs"]


def _y_float64(inputs, starts):
    """y (tokens, nheads, headdim) of a ragged case's one packed row in float64, token by token, the
    state reset to zero at each token in `starts` (ragged: no z, no initial states, dt limited above only)."""
    assert inputs.z is None and inputs.initial_states is None and inputs.dt_limit[0] == 0.0
    assert inputs.dt_softplus
    x, dt, B, C = (t[0].double() for t in (inputs.x, inputs.dt, inputs.B, inputs.C))
    A, D, dt_bias = inputs.A.double(), inputs.D.double(), inputs.dt_bias.double()  # D: (nheads, headdim)
    heads_per_group = x.shape[1] // B.shape[1]
    state = torch.zeros(x.shape[1], x.shape[2], B.shape[2], dtype=torch.float64)
    ys = []
    for t in range(x.shape[0]):
        if t in starts:
            state = torch.zeros_like(state)
        step = torch.nn.functional.softplus(dt[t] + dt_bias).clamp(max=inputs.dt_limit[1])  # (nheads,)
        Bt, Ct = (v[t].repeat_interleave(heads_per_group, 0)[:, None, :] for v in (B, C))
        state = state * torch.exp(step * A)[:, None, None] + (step[:, None] * x[t])[..., None] * Bt
        ys.append((state * Ct).sum(-1) + D * x[t])
    return torch.stack(ys)


def test_an_error_a_little_too_large_fails_and_the_factor_decides(tmp_path):
    args = ("--kernel", f"{BROKEN}:slightly_inaccurate", "--regime", "normal", "--dtype", "bf16", "--seqlen", "64",
            "--chunk-size", "32", "--batch", "2", *TINY)
    result, report = scan(*args, json_path=tmp_path / "a.json")
    assert result.exit_code == 1, result.output
    (case,) = report["cases"]
    assert case["status"] == "fail" and 2.5 < case["error"]["ratio"] < 4
    assert case["error"]["y_max_rel"] > case["error"]["y_limit"]
    assert scan(*args, "--tol-factor", "4")[0].exit_code == 0
    assert scan(*args, "--rtol", "1e-2")[0].exit_code == 0
    assert scan(*args, "--rtol", "1e-3")[0].exit_code == 1


def test_the_floor_is_added_to_the_allowed_error(tmp_path):
    args = ("--kernel", f"{BROKEN}:slightly_inaccurate", "--regime", "normal", "--dtype", "bf16", "--seqlen", "64",
            "--chunk-size", "32", "--batch", "2", *TINY)
    result, strict = scan(*args, "--floor", "0", json_path=tmp_path / "strict.json")
    assert result.exit_code == 1, result.output
    (case,) = strict["cases"]
    assert case["status"] == "fail" and case["error"]["y_max_rel"] > case["error"]["y_limit"]
    # A floor above the error itself lets the same kernel pass; the limit grows by exactly the floor.
    result, loose = scan(*args, "--floor", "0.5", json_path=tmp_path / "loose.json")
    assert result.exit_code == 0, result.output
    (case_loose,) = loose["cases"]
    assert case_loose["status"] == "pass" and loose["settings"]["floor"] == 0.5
    assert case_loose["error"]["y_limit"] == pytest.approx(case["error"]["y_limit"] + 0.5)
    assert case["error"]["y_max_rel"] < 0.5


MIXED_KERNEL = """
from ssmcheck.ops.chunk_scan.baseline import scan_baseline


def broken(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
           cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
           return_varlen_states=False):
    # chunk 16: y 1% off (fail); chunk 32: raises (error); chunk 64: NaN in y (nonfinite); else correct.
    if chunk_size == 32:
        raise RuntimeError("mixed kernel: raised on purpose")
    out = scan_baseline(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                        cu_seqlens=cu_seqlens, dt_softplus=dt_softplus, dt_limit=dt_limit)
    y = out.y.clone()
    if chunk_size == 16:
        y = y * 1.01
    elif chunk_size == 64:
        y[0, 0, 0, 0] = float("nan")
    extra = ([out.final_states] if return_final_states else []) + ([out.varlen_states] if return_varlen_states else [])
    return (y, *extra) if extra else y
"""


def test_exit_code_severity_is_nonfinite_then_error_then_tolerance_in_one_run(tmp_path):
    kernel = tmp_path / "mixed_kernel.py"
    kernel.write_text(MIXED_KERNEL)
    args = ("--kernel", f"{kernel}:broken", "--regime", "normal", "--dtype", "fp32", "--seqlen", "64",
            "--chunk-size", "16,32,64,8", "--batch", "1", *TINY)
    result, report = scan(*args, json_path=tmp_path / "r.json")
    statuses = {c["params"]["chunk_size"]: c["status"] for c in report["cases"]}
    assert statuses == {16: "fail", 32: "error", 64: "nonfinite", 8: "pass"}
    assert result.exit_code == 3 and report["exit_code"] == 3, result.output  # nonfinite beats error and fail
    # The same mix without the nonfinite status counting: error (4) beats fail (1).
    assert scan(*args, "--fail-on", "error,tolerance")[0].exit_code == 4
    assert scan(*args, "--fail-on", "tolerance")[0].exit_code == 1
    assert scan(*args, "--fail-on", "nonfinite,tolerance")[0].exit_code == 3


def test_a_raising_kernel_errors_that_case_and_the_others_still_run(tmp_path):
    result, report = scan("--kernel", f"{BROKEN}:raises_at_chunk_256", "--regime", "normal", "--dtype", "fp16",
                          "--seqlen", "300", "--chunk-size", "64,256", "--batch", "1", *TINY,
                          json_path=tmp_path / "r.json")
    assert result.exit_code == 4
    by_chunk = {c["params"]["chunk_size"]: c for c in report["cases"]}
    assert by_chunk[64]["status"] == "pass"
    assert by_chunk[256]["status"] == "error"
    assert by_chunk[256]["message"].startswith("RuntimeError: out of resource: shared memory")
    assert "out of resource" in result.stdout


def test_fail_on_chooses_which_statuses_fail_the_run():
    nan = ("--kernel", f"{BROKEN}:nan_in_partial_last_chunk", "--regime", "normal", "--dtype", "fp32", "--seqlen",
           "40", "--chunk-size", "16", "--batch", "1", *TINY)
    assert scan(*nan)[0].exit_code == 3
    assert scan(*nan, "--fail-on", "tolerance,error")[0].exit_code == 0
    raises = ("--kernel", f"{BROKEN}:raises_at_chunk_256", "--regime", "normal", "--dtype", "fp32", "--seqlen", "40",
              "--chunk-size", "256", "--batch", "1", *TINY)
    assert scan(*raises, "--fail-on", "nonfinite")[0].exit_code == 0
    assert scan(*raises, "--fail-on", "error")[0].exit_code == 4


def test_nothing_ran_exits_5_with_the_skip_reasons():
    result, _ = scan("--kernel", "torch", "--regime", "normal", "--nheads", "3", "--ngroups", "2", "--dtype", "fp32")
    assert result.exit_code == 5
    assert "nheads 3 is not a multiple of ngroups 2" in result.stdout


def test_state_dtype_is_a_declaration_for_kernels_without_state_keywords(tmp_path):
    """--state-dtype on the command line declares how such a kernel stores its states (judged so);
    a preset's list declares nothing, and stochastic rounding cannot be declared: both are skipped."""
    args = ("--regime", "normal", "--dtype", "bf16", "--seqlen", "32", "--chunk-size", "16", "--batch", "1", *TINY)
    kernel = f"{BROKEN}:raises_at_chunk_256"  # correct below chunk 256, no state keywords
    result, report = scan("--kernel", kernel, *args, "--state-dtype", "fp32,bf16", json_path=tmp_path / "a.json")
    assert result.exit_code == 0, result.output
    assert [(c["status"], c["state_storage"]) for c in report["cases"]] == [("pass", "fp32"), ("pass", "bf16")]
    _, report = scan("--kernel", kernel, *args, "--state-dtype", "bf16", "--rounding", "stochastic",
                     json_path=tmp_path / "b.json")
    assert report["cases"][0]["status"] == "skipped"
    preset = tmp_path / "p.toml"
    preset.write_text('[scan]\nstate_dtype = ["bf16"]\n')
    _, report = scan("--kernel", kernel, "--preset", preset, *args, json_path=tmp_path / "c.json")
    (case,) = report["cases"]
    assert case["status"] == "skipped" and "declare how it stores them with --state-dtype" in case["message"]
    _, report = scan("--kernel", "torch", *args, "--state-dtype", "fp32,bf16", json_path=tmp_path / "d.json")
    assert [c["status"] for c in report["cases"]] == ["pass", "pass"]


def test_the_states_a_kernel_returns_say_how_it_stores_them(tmp_path):
    """A correct kernel that keeps its states in bf16 (vLLM's way) is judged against a baseline that
    stores them so, not against fp32 states: no case may fail because of that storage."""
    result, report = scan("--kernel", f"{BROKEN}:states_in_input_dtype", "--preset", "smoke",
                          json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert {c["state_storage"] for c in report["cases"]} == {"bf16"}


def test_model_widths_run_and_are_reported(tmp_path):
    result, report = scan("--kernel", "torch", "--model", "Nemotron-H-8B", "--regime", "normal", "--dtype", "bf16",
                          "--seqlen", "6", "--batch", "1", json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    params = report["cases"][0]["params"]
    assert (params["nheads"], params["headdim"], params["dstate"], params["ngroups"], params["chunk_size"]) == (
        128, 64, 128, 8, 128)


def test_quiet_prints_only_the_summary():
    result, _ = scan("--kernel", "torch", "--preset", "smoke", "--quiet")
    assert result.exit_code == 0
    assert result.stdout.strip().splitlines() == [result.stdout.strip()]
    assert result.stdout.startswith("13 cases: 13 pass") and result.stderr == ""


@pytest.mark.parametrize("args, named", [
    (["--dtype", "fp8"], "--dtype"),
    (["--chunk-size", "0"], "--chunk-size"),
    (["--seqlen", "ten"], "--seqlen"),
    (["--regime", "chaos"], "--regime"),
    (["--tol-factor", "abc"], "--tol-factor"),
    (["--tol-factor", "-2"], "--tol-factor"),
    (["--model", "gpt-2"], "--model"),
    (["--model", "mamba2-130m", "--nheads", "4"], "--nheads"),
    (["--preset", "nope"], "--preset"),
    (["--kernel", "no_such_module_xyz:fn"], "--kernel"),
    (["--kernel", "builtin2"], "--kernel"),
    (["--reference", "fp16"], "--reference"),
    (["--fail-on", "warnings"], "--fail-on"),
    (["--device", "tpu"], "--device"),
    (["--json", "/no/such/dir/report.json"], "--json"),
    (["--seed", "x"], "--seed"),
    (["--bogus"], "--bogus"),
    (["--rtol", "-1"], "--rtol"),
    (["--rtol", "0"], "--rtol"),
    (["--batch", "0"], "--batch"),
    (["--state-dtype", "fp8"], "--state-dtype"),
    (["--rounding", "up"], "--rounding"),
    (["--floor", "-1"], "--floor"),
    (["--floor", "inf"], "--floor"),
    (["--tol-factor", "inf"], "--tol-factor"),
    (["--tol-factor", "nan"], "--tol-factor"),
])
def test_bad_options_are_one_line_usage_errors(args, named):
    result, _ = invoke("scan", *args)
    assert_usage_error(result, named)
    assert "Traceback" not in result.stderr


def test_regimes_lists_and_explains_scan_and_drift_regimes():
    result, _ = invoke("regimes")
    assert result.exit_code == 0
    for name, regime in REGIMES.items():
        assert name in result.stdout and regime.explanation[:30] in result.stdout
    assert "drift regimes" in result.stdout
    for name, explanation in DRIFT_REGIMES.items():
        assert name in result.stdout and explanation[:30] in result.stdout


def test_help_documents_options_regimes_and_exit_codes():
    result, _ = invoke("scan", "--help", terminal_width=200)
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    for option in ("--kernel", "--preset", "--chunk-size", "--seqlen", "--dtype", "--batch", "--nheads",
                   "--headdim", "--dstate", "--ngroups", "--model", "--regime", "--state-dtype", "--rounding",
                   "--reference", "--tol-factor", "--floor", "--rtol", "--seed", "--fail-on", "--json", "--quiet",
                   "--device"):
        assert option in text
    assert all(name in text for name in REGIMES)
    assert "Exit codes" in text and "5 nothing ran" in text
    # Brackets are text, not markup that swallows them.
    assert "[tool.ssmcheck.scan] preset" in text and "([z | x | B | C | dt] per token" in text


def test_python_dash_m_runs_the_scan():
    run = subprocess.run(
        [sys.executable, "-m", "ssmcheck", "scan", "--kernel", "torch", "--preset", "smoke", "--quiet"],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parent.parent,
    )
    assert run.returncode == 0, run.stderr
    assert "13 cases: 13 pass" in run.stdout


def test_cumsum_cancel_catches_an_unguarded_tree_order_cumsum_that_dyadic_regimes_miss(tmp_path):
    """The decays across zero-dt runs must be exactly 1 although the cumulative sums reach ~1e9."""
    widths = ("--chunk-size", "64", "--seqlen", "200", "--batch", "2", "--nheads", "4", "--headdim", "16",
              "--dstate", "16", "--ngroups", "2", "--dtype", "fp32,bf16,fp16")
    kernel = f"{BROKEN}:unguarded_tree_cumsum"
    _, report = scan("--kernel", kernel, "--regime", "cumsum-cancel,decay-extreme,normal", *widths,
                     json_path=tmp_path / "broken.json")
    by_regime = {}
    for case in report["cases"]:
        by_regime.setdefault(case["params"]["regime"], set()).add(case["status"])
    assert by_regime["cumsum-cancel"] <= {"fail", "nonfinite"}
    assert by_regime["decay-extreme"] == by_regime["normal"] == {"pass"}
    result, report = scan("--kernel", "builtin", "--regime", "cumsum-cancel", *widths, json_path=tmp_path / "b.json")
    assert result.exit_code == 0, result.output


def test_local_errors_are_judged_where_they_live(tmp_path):
    """A 2% error confined to the partial last chunk of each sequence (bf16 only) fails every ragged bf16
    case of the default preset that runs, through y's worst (sequence, chunk, head) group; a 1% error in
    C·h alone, under the larger D·x, fails every bf16 normal case through the SSM part."""
    _, report = scan("--kernel", f"{BROKEN}:partial_chunk_2pct_bf16", "--preset", "default",
                     json_path=tmp_path / "p.json")
    ragged_bf16 = [c for c in report["cases"] if c["params"]["regime"] == "ragged" and c["params"]["dtype"] == "bf16"
                   and c["status"] != "skipped"]
    assert ragged_bf16 and all(c["status"] == "fail" and "y in sequence" in c["message"] for c in ragged_bf16)
    assert all(c["status"] == "pass" for c in report["cases"] if c["params"]["dtype"] != "bf16"
               and c["status"] != "skipped")
    _, report = scan("--kernel", f"{BROKEN}:ssm_part_1pct", "--preset", "default", json_path=tmp_path / "s.json")
    normal_bf16 = [c for c in report["cases"] if c["params"]["regime"] == "normal" and c["params"]["dtype"] == "bf16"]
    assert normal_bf16 and all(c["status"] == "fail" and "SSM part C·h error" in c["message"] for c in normal_bf16)
    assert all(c["error"]["ssm_ratio"] > 2 for c in normal_bf16)


def test_the_default_preset_catches_a_loop_bound_right_only_for_whole_blocks(tmp_path):
    """A kernel that drops the state columns of a partial last block of 16 passes every case whose dstate is
    a multiple of 16, and fails the default preset's cases of widths that fill no block, in every dtype."""
    _, report = scan("--kernel", f"{BROKEN}:whole_dstate_blocks", "--preset", "default", json_path=tmp_path / "w.json")
    ran = [c for c in report["cases"] if c["status"] != "skipped"]
    failed = [c for c in ran if c["status"] != "pass"]
    assert all(c["status"] == "pass" for c in ran if c["params"]["dstate"] % 16 == 0)
    assert failed and all(c["status"] == "fail" and c["params"]["dstate"] % 16 for c in failed)
    assert {c["params"]["dtype"] for c in failed} == {"fp32", "bf16", "fp16"}


def test_the_default_preset_catches_a_state_carried_into_a_sequence_that_starts_a_chunk(tmp_path):
    """A kernel that resets the carried state only where seq_idx changes inside a chunk passes every case whose
    sequence boundaries fall mid-chunk (ragged's, and every batch-mode case), and fails the default preset's
    `aligned` and `aligned-initial-state` cases at both chunk sizes, located at chunk 0 of the sequence it leaks
    into."""
    _, report = scan("--kernel", f"{BROKEN}:no_reset_at_chunk_start", "--preset", "default",
                     json_path=tmp_path / "a.json")
    aligned = planted_bug_cases(report, lambda p: p["regime"] in ("aligned", "aligned-initial-state"))
    assert sorted(c["params"]["chunk_size"] for c in aligned) == [64, 64, 256, 256]
    assert all(c["status"] == "fail" and " chunk 0 head " in c["message"] for c in aligned)


def test_the_default_preset_catches_every_batch_row_started_from_row_0s_initial_state(tmp_path):
    """A kernel that starts every batch row from the first row's initial state passes every varlen and one-row
    case, and fails the default preset's `long` cases of 2 rows (512 and 520 tokens) and `continuation`'s (40)."""
    _, report = scan("--kernel", f"{BROKEN}:initial_state_of_row_0", "--preset", "default",
                     json_path=tmp_path / "i.json")
    rows = planted_bug_cases(report, lambda p: p["regime"] in ("long", "continuation") and p["batch"] > 1)
    # wrong from the row's first chunk
    assert len(rows) == 3 and all(c["status"] == "fail" and " chunk 0 head " in c["message"] for c in rows)


def test_the_default_preset_catches_a_state_carried_through_32_chunks_at_most(tmp_path):
    """A kernel whose batch-mode state passing stops after 32 chunks passes every case of 32 chunks or fewer (and
    the packed ones), and fails the default preset's `long` case of 130 chunks, located past chunk 32."""
    _, report = scan("--kernel", f"{BROKEN}:state_carried_32_chunks", "--preset", "default",
                     json_path=tmp_path / "c.json")
    many = planted_bug_cases(report, lambda p: -(-p["seqlen"] // p["chunk_size"]) > 32 and not _is_varlen(p))
    assert len(many) == 1 and many[0]["status"] == "fail"
    assert many[0]["error"]["y_worst_group"]["chunk"] >= 32


def test_the_default_preset_catches_dt_bias_dropped_without_softplus(tmp_path):
    """A kernel that adds dt_bias only along with its softplus passes every case that asks for a softplus, and
    fails `large-magnitude` and `large-output` (dt + dt_bias, no softplus) in every dtype they run; in
    `decay-extreme` (dt - 1 with a dt_bias of 1; and `decay-extreme-packed`) its zero-dt tokens decay by exp(|A|):
    non-finite."""
    _, report = scan("--kernel", f"{BROKEN}:dt_bias_only_with_softplus", "--preset", "default",
                     json_path=tmp_path / "b.json")
    raw = planted_bug_cases(report, lambda p: p["regime"] in ("large-magnitude", "large-output", "decay-extreme",
                                                              "decay-extreme-packed"))
    assert {c["params"]["dtype"] for c in raw} == {"fp32", "bf16", "fp16"}
    assert all(c["status"] == ("nonfinite" if c["params"]["regime"].startswith("decay-extreme") else "fail")
               for c in raw)


def test_the_default_preset_catches_dt_bias_dropped_without_softplus_or_dt_limit(tmp_path):
    """A kernel that adds dt_bias only where it also takes a softplus or clamps to a dt_limit passes every other
    case and is non-finite in `decay-extreme`, the one regime with a bias and neither, in every dtype (and in
    `decay-extreme-packed`)."""
    _, report = scan("--kernel", f"{BROKEN}:dt_bias_only_where_dt_is_processed", "--preset", "default",
                     json_path=tmp_path / "p.json")
    bare = planted_bug_cases(report, lambda p: p["regime"].startswith("decay-extreme"))
    assert {c["params"]["dtype"] for c in bare} == {"fp32", "bf16", "fp16"}
    assert all(c["status"] == "nonfinite" for c in bare)


def test_the_default_preset_catches_a_dt_limit_clamped_at_one_end(tmp_path):
    """A kernel that applies only dt_limit's upper end fails every case with a dt_limit whose lower end clamps
    tokens (`long`, `continuation` and `initial-state`, both ends in every head; `aligned`, its lower end alone;
    `large-magnitude` and `large-output`) and no other (`large-magnitude`'s case of one token a row clamps no token at the lower end:
    its 8 values of dt + dt_bias lie above it)."""
    _, report = scan("--kernel", f"{BROKEN}:dt_limit_upper_only", "--preset", "default",
                     json_path=tmp_path / "l.json")
    limited = planted_bug_cases(report, lambda p: p["regime"] in ("long", "continuation", "initial-state", "aligned",
                                                                  "large-magnitude", "large-output")
                                and p["seqlen"] > 1)
    assert len(limited) == 23 and all(c["status"] == "fail" for c in limited)


@pytest.mark.parametrize(("kernel", "reached", "count"), [
    ("parameters_of_head_mod_8", lambda p: p["nheads"] > 8, 3),
    ("per_channel_skip_after_gate", lambda p: p["regime"] in ("aligned", "long", "continuation"), 9),
    ("dt_limit_only_with_softplus", lambda p: p["regime"] in ("large-magnitude", "large-output", "aligned"), 7),
    ("initial_state_lost_at_chunk_start", lambda p: p["regime"] == "aligned-initial-state", 2),
    ("later_dstate_blocks_in_group_0", lambda p: p["dstate"] > 128 and p["ngroups"] > 1, 2),
    ("channels_masked_by_dstate", lambda p: p["headdim"] > p["dstate"], 10),
    ("initial_state_head_stride_squared", lambda p: p["headdim"] != p["dstate"]
     and ("initial-state" in p["regime"] or p["regime"] in ("long", "conv-output-varlen")), 11),
    ("rows_joined_at_whole_chunks", lambda p: p["regime"] in ("normal", "long") and p["batch"] > 1
     and p["seqlen"] % p["chunk_size"] == 0, 3),
    ("skip_past_16_heads_in_bf16", lambda p: p["nheads"] > 16, 1),
    ("initial_states_mod_4", lambda p: "initial-state" in p["regime"] and p["batch"] > 4, 5),
    # ragged's 9 sequences in 6 chunks and 16 in 2, initial-state's 4 in one chunk and 3 in under one; by their seeds'
    # draws also ragged's bf16 cases of 4 (chunk 64 and 128) and initial-state's fp16 of 5 and bf16 of 5 at chunk 256
    ("one_reset_per_chunk", lambda p: _two_mid_chunk_starts_in_a_chunk(_sequence_bounds(p), p["chunk_size"]), 9),
    ("varlen_carried_16_chunks", lambda p: _longest_sequence(_sequence_bounds(p)) > 16 * p["chunk_size"], 1),
    ("varlen_group_of_head_by_ngroups", lambda p: _is_varlen(p) and p["ngroups"] > 1
     and p["ngroups"] ** 2 != p["nheads"], 2),
    ("chunk_128_cb_block_dropped", lambda p: p["chunk_size"] == 128, 2),
    ("initial_states_dropped_at_whole_chunks", lambda p: p["regime"] == "long" and p["batch"] > 1
     and p["seqlen"] % p["chunk_size"] == 0, 1),
    # the SSM part's call asks for y alone (no return flags): every case from initial states that has D or z
    ("initial_states_only_with_returned_states", lambda p: p["regime"] in ("initial-state", "aligned-initial-state",
                                                                          "long", "continuation",
                                                                          "conv-output-varlen"), 20),
    # dt-extreme (and packed), and initial-state: the one varlen regime with a gate and no D
    ("gate_only_with_d", lambda p: p["regime"] in ("dt-extreme", "dt-extreme-packed", "initial-state"), 14),
    ("dt_limit_only_with_a_lower_end", lambda p: p["regime"] in ("ragged", "strided"), 14),
    # strided's (0, max): the one batch-mode dt_limit without a lower end
    ("batch_dt_limit_only_with_a_lower_end", lambda p: p["regime"] == "strided", 3),
    ("softplus_always_in_varlen", lambda p: p["regime"] in ("aligned", "decay-extreme-packed"), 3),
    # initial-state's 3 sequences in 36 tokens, and continuation's batch rows of 40 tokens at chunk 64
    ("initial_states_dropped_under_a_chunk", lambda p: case_inputs(p).initial_states is not None
     and (p["batch"] * p["seqlen"] if _is_varlen(p) else p["seqlen"]) < p["chunk_size"], 2),
    ("sequences_past_8_merged", lambda p: _is_varlen(p) and p["batch"] > 8, 3),
    ("one_token_prefill_without_dt_limit", lambda p: p["seqlen"] == 1, 1),
    ("varlen_dt_limit_upper_only", lambda p: p["regime"] in ("initial-state", "aligned"), 12),
    # the call for y alone in bf16 and fp32 batch-mode cases with D and z and no initial states
    # (scan.run.judges_y_alone)
    ("training_forward_gate_before_skip", lambda p: p["regime"] in ("normal", "strided", "conv-output")
     and p["dtype"] in ("bf16", "fp32"), 20),
    ("short_prefill_sigmoid_gate", lambda p: not _is_varlen(p) and 1 < p["seqlen"] < p["chunk_size"]
     and p["regime"] in ("normal", "continuation"), 3),
    ("microbatches_share_a_gate", lambda p: not _is_varlen(p) and p["batch"] > 2 and p["regime"] == "normal", 2),
    ("group_of_head_within_block_of_32", lambda p: p["nheads"] > 32 and p["ngroups"] > 1, 1),
    ("dt_limit_skipped_past_softplus_threshold", lambda p: p["regime"] == "ragged", 11),
    ("varlen_gate_read_as_contiguous", lambda p: p["regime"] == "conv-output-varlen", 1),
    # aligned's (0.008, inf): the one dt_limit without an upper end
    ("dt_limit_only_with_a_finite_upper_end", lambda p: p["regime"] == "aligned", 2),
    # decay-extreme: the one batch-mode regime with a per-channel D and no gate
    ("per_channel_d_read_per_head_without_a_gate", lambda p: p["regime"] == "decay-extreme", 6),
    # initial-state at chunk 256, the one case of mid-chunk starts from initial states at a chunk past 64 tokens:
    # its sequence from token 41 has tokens 64..255 of chunk 0
    ("initial_state_only_in_its_start_block", lambda p: p["regime"] == "initial-state" and p["chunk_size"] > 64, 1),
    ("fp32_state_blocks_stuck_at_the_first", lambda p: p["dtype"] == "fp32" and p["dstate"] > 64, 2),
    # the call for y alone in fp32 batch-mode cases with D and z and no initial states (scan.run.judges_y_alone)
    ("training_forward_in_tf32", lambda p: p["regime"] in ("normal", "strided", "conv-output")
     and p["dtype"] == "fp32", 8),
    # ragged's 16 sequences in 2 chunks alone
    ("four_sequence_pieces_a_chunk",
     lambda p: _most_sequences_in_a_chunk(_sequence_bounds(p), p["chunk_size"]) > 4, 1),
    # a headdim that is no power of two, from initial states: initial-state's 24 x 16 and long's two of 2 rows
    ("initial_state_head_offset_of_a_padded_headdim", lambda p: p["headdim"] & (p["headdim"] - 1)
     and case_inputs(p).initial_states is not None, 3),
    # aligned: the one packed regime with dt processed already, under a dt_limit
    ("varlen_dt_limit_only_with_softplus", lambda p: p["regime"] == "aligned", 2),
    # normal's 193 tokens at chunk 64 (bf16 and fp32) and long's 2065 at chunk 16
    ("last_token_chunk_undecayed_in_the_final_state", lambda p: p["seqlen"] % p["chunk_size"] == 1 and p["seqlen"] > 1
     and not _is_varlen(p), 3),
    # every case of a 16-bit y (its mean signed error near -1/2 ulp; 8 of them over the norm-wise limit too)
    ("y_stored_toward_zero", lambda p: p["dtype"] in ("bf16", "fp16"), 60),
    # the same cases: rounded down, its mean signed along y cancels over y's two signs; toward +inf it is -1/2 ulp
    ("y_stored_toward_minus_inf", lambda p: p["dtype"] in ("bf16", "fp16"), 60),
    # every case of fp16/bf16 final states (their mean signed error near -1/2 ulp), but an fp16 state from bf16 inputs
    # to nearest (ragged's), where the baseline's own arithmetic errs by over an fp16 ulp in 70% of the elements
    ("final_states_stored_toward_zero", lambda p: p["state_dtype"] in ("bf16", "fp16")
     and not (p["state_dtype"], p["dtype"], p["rounding"]) == ("fp16", "bf16", "nearest"), 5),
    # bf16 packed rows of several sequences without pad tokens at chunk 64 and up (the call with both flags; the
    # kernel takes no state options, so its cases store states as by default) whose last sequence is
    # under 300 tokens: a longer one decays the earlier sequences' state (and a dropped initial one) out of its own, as
    # decay-extreme-packed's huge decays do in any length
    ("final_state_of_the_whole_row", lambda p: p["dtype"] == "bf16" and _last_sequence_after_others(p) < 300
     and p["regime"] != "decay-extreme-packed", 14),
    # long's 130 chunks of 16
    ("state_carried_128_chunks", lambda p: not _is_varlen(p) and p["seqlen"] > 128 * p["chunk_size"], 1),
    # ragged's 9 sequences at dstate 40, the one varlen case whose state fills no block of 16
    ("varlen_states_of_whole_dstate_blocks", lambda p: _is_varlen(p) and p["dstate"] % 16, 1),
    # normal's 16 heads of 16 channels, with D per head
    ("d_per_channel_by_its_length", lambda p: p["nheads"] == p["headdim"], 1),
    # the fourth red-team round's (sixtieth session): conv-output-varlen's initial states of 6 heads x 16 x 96
    ("initial_state_masked_by_headdim", lambda p: p["regime"] == "conv-output-varlen", 1),
    ("initial_state_block_offset_missing", lambda p: p["regime"] == "conv-output-varlen", 1),
    # initial states of a head count no power of two, of several sequences: conv-output-varlen's 6 heads and
    # initial-state's 9 (since the sixty-third session)
    ("initial_state_sequence_stride_of_padded_heads", lambda p: p["nheads"] & (p["nheads"] - 1)
     and _sequences_from_initial_states(p) > 1, 2),
    # aligned-initial-state's initial states, one layer's slice of a state cache
    ("varlen_initial_states_read_as_contiguous", lambda p: p["regime"] == "aligned-initial-state", 2),
    ("heads_past_64_never_cumsummed", lambda p: p["nheads"] > 64, 1),
    ("tf32_past_dstate_128_in_fp32", lambda p: p["dstate"] > 128 and p["dtype"] == "fp32", 1),
    # normal's five rows of whole chunks, at chunk 64 and 128
    ("batch_rows_past_4_gated_by_row_mod_4", lambda p: not _is_varlen(p) and p["batch"] > 4, 2),
    ("chunk_32_cb_block_dropped", lambda p: p["chunk_size"] == 32, 3),
    ("varlen_states_of_16_sequences_a_program", lambda p: _is_varlen(p) and p["batch"] > 16, 1),
], ids=["24-heads", "gated-per-channel-D", "dt-limit-without-softplus", "aligned-initial-states",
        "dstate-blocks-in-groups", "headdim-past-dstate", "initial-state-stride", "rows-of-whole-chunks",
        "heads-past-16-in-fp16", "initial-states-past-4", "three-sequences-in-a-chunk", "varlen-past-16-chunks",
        "varlen-groups-by-ngroups", "chunk-128-cb-block", "initial-states-at-whole-chunks",
        "initial-states-only-with-returned-states", "gate-without-d",
        "dt-limit-without-lower-end", "batch-dt-limit-without-lower-end",
        "varlen-processed-dt", "initial-states-under-a-chunk", "sequences-past-8", "one-token-prefill",
        "varlen-dt-limit-lower-end", "training-forward", "prefill-under-a-chunk", "micro-batches",
        "groups-past-32-heads", "dt-limit-in-softplus-linear-branch", "varlen-gate-from-in-proj",
        "dt-limit-without-upper-end", "per-channel-D-without-a-gate", "initial-state-past-its-start-block",
        "fp32-dstate-blocks", "training-forward-in-fp32", "sequences-past-4-in-a-chunk", "initial-state-padded-headdim",
        "varlen-processed-dt-limit", "one-token-last-chunk-state", "y-stored-toward-zero", "y-stored-toward-minus-inf",
        "final-states-stored-toward-zero", "varlen-final-state-of-the-row", "past-128-chunks",
        "varlen-states-of-a-partial-dstate-block", "per-head-D-as-long-as-headdim", "initial-state-masked-by-headdim",
        "initial-state-in-blocks-of-1024", "initial-states-of-padded-heads", "varlen-initial-states-as-contiguous",
        "heads-past-64", "tf32-past-dstate-128", "rows-past-4", "chunk-32-cb-block", "varlen-states-past-16"])
def test_the_default_preset_reaches_each_planted_bug_in_the_cases_built_for_it(kernel, reached, count, tmp_path):
    """Each kernel is wrong only where its condition holds: more than 8 heads, a per-channel D under a gate, a
    dt_limit without softplus, an initial state for a sequence that starts a chunk, dstate past 128 in several
    groups, headdim past dstate, initial states of heads wider than their states, several rows of whole chunks,
    more than 16 heads in a dtype finer than bf16, initial states of more than 4 sequences, a chunk where a third
    sequence starts, a packed sequence of more than 16 chunks, packed sequences of 6 heads in 3 groups, chunk 128,
    batch-mode initial states of whole chunks, initial states in a call for y alone, a gate without D (batch mode
    and packed), a dt_limit
    without a lower end (packed, and in batch mode), packed sequences with dt processed already, packed sequences from initial states in under
    one chunk, more than 8 packed sequences, a prefill of one token, a packed dt_limit with a lower end, the training
    forward's call for y alone with D and z, a batch-mode prompt under one chunk, more than two batch rows, more than
    32 heads in several groups, a raw dt past softplus's threshold under a dt_limit, packed sequences whose gate is a
    view into the in_proj output, a dt_limit without an upper end, a per-channel D without a gate in batch mode, a
    sequence from an initial state starting mid-chunk at a chunk past 64 tokens, fp32 inputs past dstate 64, the
    training forward's call for y alone in fp32, more than 4 packed sequences in a chunk, initial states at a headdim
    that is no power of two, a packed dt_limit on dt processed already, a batch-mode final state whose last chunk is
    one token, a y stored in fp16 or bf16 (toward zero, toward -inf), final states stored in fp16 or bf16, a packed row's final state (both flags),
    more than 128 chunks, packed sequences' states of a dstate that fills no block of 16, a per-head D as long as a
    head has channels; initial states of heads narrower than their states, of more than 1024 elements a head, of a head
    count no power of two, and packed ones from a layer's slice of a state cache; more than 64 heads; fp32 inputs past
    dstate 128; more than 4 batch rows; chunk 32; more than 16 packed sequences. The default preset has cases for each
    (and every other case passes)."""
    _, report = scan("--kernel", f"{BROKEN}:{kernel}", "--preset", "default", json_path=tmp_path / "k.json")
    cases = planted_bug_cases(report, reached)
    assert len(cases) == count and all(c["status"] == "fail" for c in cases), [c["id"] for c in cases]


@pytest.mark.parametrize(("kernel", "reached", "status"), [
    # initial-state's nine sequences at 9 heads in 3 groups of 64 channels
    ("initial_states_of_the_first_channel_block", lambda p: p["regime"] == "initial-state" and p["headdim"] > 32,
     "fail"),
    ("varlen_gate_of_the_first_channel_block", lambda p: p["regime"] == "initial-state" and p["headdim"] > 32, "fail"),
    ("varlen_dt_of_a_block_of_8_heads", lambda p: _is_varlen(p) and p["nheads"] > 8, "fail"),
    ("varlen_group_of_a_head_by_a_power_of_two", lambda p: _is_varlen(p) and p["nheads"] // p["ngroups"] == 3,
     "fail"),
    ("varlen_initial_states_of_8_sequences", lambda p: p["regime"] == "initial-state" and p["batch"] > 8, "fail"),
    # ragged at dstate 256, its 2200 tokens at chunk 16, normal's 136 heads
    ("varlen_states_of_the_first_128_state_indices", lambda p: _is_varlen(p) and p["dstate"] > 128, "fail"),
    ("varlen_passing_of_128_pieces", lambda p: _is_varlen(p) and p["batch"] * p["seqlen"] > 128 * p["chunk_size"],
     "fail"),
    ("parameters_of_a_block_of_128_heads", lambda p: p["nheads"] > 128, "fail"),
], ids=["initial-states-in-blocks-of-32-channels", "varlen-gate-in-blocks-of-32-channels", "varlen-dt-of-8-heads",
        "varlen-groups-by-a-power-of-two", "varlen-initial-states-of-8-sequences", "varlen-states-past-dstate-128",
        "varlen-passing-past-128-pieces", "parameters-past-128-heads"])
def test_the_default_preset_reaches_each_fifth_red_team_scan_bug_in_the_case_built_for_it(kernel, reached, status,
                                                                                          tmp_path):
    """The fifth red-team round's chunk scans (sixty-third session), each wrong only past a width the preset reached
    nowhere before it: initial states or a varlen gate read in blocks of 32 channels without the block's offset, a
    varlen dt pass over 8 heads, a varlen head-to-group map through a power of two, the initial states of a block of 8
    packed sequences, varlen states stored for 128 state indices, varlen state passing over 128 chunk pieces, the
    parameters of a block of 128 heads. One case fails each, and every other case passes."""
    _, report = scan("--kernel", f"{BROKEN}:{kernel}", "--preset", "default", json_path=tmp_path / "k.json")
    cases = planted_bug_cases(report, reached)
    assert [c["status"] for c in cases] == [status], [c["id"] for c in cases]


def test_c_laid_out_apart_from_b_catches_c_read_with_bs_strides(tmp_path):
    """`ragged` (packed) and `large-magnitude` (batch rows) pass C as a view into a buffer of its own, its token rows
    ending in NaN, where B is contiguous: a kernel that reads C through B's strides is non-finite in every case of
    both (its reads reach the padding), and fails no other case, where C and B share a layout."""
    _, report = scan("--kernel", f"{BROKEN}:c_read_with_b_strides", "--preset", "default",
                     json_path=tmp_path / "c.json")
    cases = planted_bug_cases(report, lambda p: p["regime"] in ("ragged", "large-magnitude"))
    assert len(cases) == 15 and all(c["status"] == "nonfinite" for c in cases), [c["id"] for c in cases]
    assert all("C a view into a buffer" in c["inputs"] for c in cases)


def test_ragged_passes_int64_indices_that_a_kernel_reading_int32_words_misreads_and_a_refusal_runs_on_int32(tmp_path):
    """`ragged` passes cu_seqlens and seq_idx as int64 (torch.cumsum's dtype), every other regime as int32 (engines'):
    a kernel that reads cu_seqlens through an int32 pointer leaves tokens unwritten there alone. One that refuses
    int64 (raises) is run on int32 and passes, the refusal in the case's inputs; one whose check of the words it
    read raises would be taken so too: it returns nothing wrong."""
    regimes = ["--regime", "ragged,aligned,initial-state", "--preset", "smoke"]
    _, report = scan("--kernel", f"{BROKEN}:cu_seqlens_read_as_int32", *regimes, json_path=tmp_path / "m.json")
    (case,) = planted_bug_cases(report, lambda p: p["regime"] == "ragged")
    assert case["status"] == "nonfinite" and "cu_seqlens and seq_idx int64" in case["inputs"], case["message"]
    result, report = scan("--kernel", f"{BROKEN}:cu_seqlens_int32_only", *regimes, json_path=tmp_path / "r.json")
    assert result.exit_code == 0 and [c["status"] for c in report["cases"]] == ["pass"] * 3, result.output
    noted = [c["inputs"] for c in report["cases"] if "refused" in c["inputs"]]
    assert "int32 indices (1): the kernel refused int64 cu_seqlens and seq_idx (TypeError: " in result.stdout
    assert len(noted) == 1 and "; the kernel refused int64 cu_seqlens and seq_idx (TypeError: cu_seqlens must be " \
        "int32, got torch.int64 (raised at " in noted[0] and noted[0].endswith("), so int32"), noted


def test_a_kernel_that_exits_on_int64_indices_errs_and_is_not_taken_for_a_refusal(tmp_path):
    """Only the kernel's own exception is a refusal that sends the case to int32: an exit (like a program outside its
    memory, or a wrong output) is the case's error."""
    _, report = scan("--kernel", f"{BROKEN}:exits_on_int64_indices", "--regime", "ragged,aligned", "--preset", "smoke",
                     json_path=tmp_path / "e.json")
    (case,) = planted_bug_cases(report, lambda p: p["regime"] == "ragged")
    assert case["status"] == "error" and "sys.exit" in case["message"], case["message"]
    assert "refused" not in case["inputs"]


def test_gates_in_silus_tail_catch_a_silu_through_exp(tmp_path):
    """`initial-state` draws half its gate's values in 12..100: a kernel that takes silu(z) as z exp(z) / (1 + exp(z))
    is NaN past z = 88.7 (inf / inf), in every case of the regime, and right in every other case (unit-normal gates)."""
    _, report = scan("--kernel", f"{BROKEN}:silu_through_exp", "--preset", "default", json_path=tmp_path / "s.json")
    cases = planted_bug_cases(report, lambda p: p["regime"] == "initial-state")
    assert len(cases) == 10 and all(c["status"] == "nonfinite" for c in cases), [c["id"] for c in cases]


def test_strided_rows_hold_spare_tokens_that_a_row_offset_from_seqlen_reads(tmp_path):
    """A kernel that takes dt's row stride as seqlen times its token stride is right wherever rows lie end to end;
    `strided`'s buffer holds NaN spare tokens past each row's call, so its three cases read them, non-finite from row
    1's first token on, and no other case fails."""
    _, report = scan("--kernel", f"{BROKEN}:dt_rows_seqlen_tokens_apart", "--preset", "default",
                     json_path=tmp_path / "d.json")
    cases = planted_bug_cases(report, lambda p: p["regime"] == "strided")
    assert [c["status"] for c in cases] == ["nonfinite"] * 3, [c["id"] for c in cases]
    assert all(c["first_nonfinite"]["sequence"] == 1 and c["first_nonfinite"]["token"] == 0 for c in cases)


def test_padded_makes_vllms_call_with_a_per_head_d_and_no_gate(tmp_path):
    """`padded` passes D per head and no gate, as vLLM's mixer calls its varlen scan: a varlen epilogue of its own for
    that call reading every head's D as head 0's fails its three cases; the other varlen regimes (a gate, or D per
    channel) pass."""
    _, report = scan("--kernel", f"{SLOTS}:varlen_head_d_of_head_0_without_a_gate", "--regime", "padded,ragged,aligned",
                     json_path=tmp_path / "p.json")
    cases = planted_bug_cases(report, lambda p: p["regime"] == "padded")
    assert [c["status"] for c in cases] == ["fail"] * 3, [c["id"] for c in cases]
    assert all("D per head and no gate" in c["inputs"] for c in cases)


def _sequence_bounds(p) -> list[int]:
    """cu_seqlens of the case `p` names (a report's params), its inputs generated again; [] in batch mode."""
    cu_seqlens = case_inputs(p).cu_seqlens
    return [] if cu_seqlens is None else cu_seqlens.tolist()


def _last_sequence_after_others(p) -> float:
    """The length of the last sequence of a packed row of several without pad tokens; infinite for any other case."""
    inputs = case_inputs(p)
    if not inputs.varlen or inputs.pad_after is not None or inputs.nsequences < 2:
        return float("inf")
    bounds = inputs.cu_seqlens.tolist()
    return bounds[-1] - bounds[-2]


def _sequences_from_initial_states(p) -> int:
    """How many initial states (sequences, or batch rows) the case `p` names passes; 0 without them."""
    initial_states = case_inputs(p).initial_states
    return 0 if initial_states is None else initial_states.shape[0]


def _is_varlen(p) -> bool:
    return bool(_sequence_bounds(p))


def _two_mid_chunk_starts_in_a_chunk(bounds: list[int], chunk_size: int) -> bool:
    chunks = [start // chunk_size for start in bounds[1:-1] if start % chunk_size]
    return len(chunks) > len(set(chunks))


def _most_sequences_in_a_chunk(bounds: list[int], chunk_size: int) -> int:
    pieces = collections.Counter()  # sequences with tokens in each chunk
    for start, end in itertools.pairwise(bounds):
        pieces.update(range(start // chunk_size, -(-end // chunk_size)))
    return max(pieces.values(), default=0)


def _longest_sequence(bounds: list[int]) -> int:
    return max((end - start for start, end in itertools.pairwise(bounds)), default=0)


def test_the_default_preset_catches_varlen_states_stored_at_a_headdim_stride(tmp_path):
    """A kernel that stores (sequence, head, channel, state) of its varlen states at a row stride of headdim, not
    dstate, into a buffer it allocates uninitialised passes every case of headdim == dstate and batch mode, and is
    non-finite (the rows' gaps) in every varlen case of heads wider than their states: `initial-state` at 32 x 16,
    one sequence and five, in every dtype, and at 24 x 16, three sequences, and 64 x 16, nine, in bf16; where heads are narrower than
    their states (`ragged` at 64 x 128 and at 16 x 40, `conv-output-varlen` at 16 x 96) the rows overlap and leave the
    buffer's end unwritten, non-finite too."""
    _, report = scan("--kernel", f"{BROKEN}:varlen_states_stride_typo", "--preset", "default",
                     json_path=tmp_path / "v.json")
    wide = planted_bug_cases(report, lambda p: p["headdim"] != p["dstate"] and _sequence_bounds(p))
    gaps = [c for c in wide if c["params"]["headdim"] > c["params"]["dstate"]]
    overlaps = [c for c in wide if c["params"]["headdim"] < c["params"]["dstate"]]
    assert sorted((c["params"]["regime"], c["status"]) for c in overlaps) == [
        ("conv-output-varlen", "nonfinite"), *[("ragged", "nonfinite")] * 2]
    assert len(gaps) == 8 and {c["params"]["regime"] for c in gaps} == {"initial-state"}
    for case in gaps:
        assert case["status"] == "nonfinite" and case["first_nonfinite"]["output"] == "final_states"
        # row (0, 0, 0) is stored in place; (0, 0, 1) at a stride of 32 (24) leaves channel 1 unwritten
        assert [case["first_nonfinite"][k] for k in ("sequence", "head", "channel", "state_index")] == [0, 0, 1, 0]
        assert case["error"]["y_max_rel"] == case["error"]["baseline_y_max_rel"]  # y is right


def test_the_default_preset_catches_channel_blocks_that_all_compute_the_first(tmp_path):
    """A kernel whose every block of 64 channels computes the first one passes every case of headdim <= 64, and
    fails the default preset's 128-channel heads, in bf16 and fp32."""
    _, report = scan("--kernel", f"{BROKEN}:one_headdim_block", "--preset", "default", json_path=tmp_path / "h.json")
    wide = planted_bug_cases(report, lambda p: p["headdim"] > 64)
    assert len(wide) == 2 and all(c["status"] == "fail" for c in wide)


def test_the_default_preset_catches_a_dstate_block_capped_at_128(tmp_path):
    """A kernel whose block of state indices stops at 128, with no loop past it, passes every case of dstate <= 128
    and fails the default preset's cases of dstate 256 (3 heads in bf16 and fp32, `ragged`'s packed sequences at 64
    channels a head)."""
    _, report = scan("--kernel", f"{BROKEN}:dstate_capped_at_128", "--preset", "default", json_path=tmp_path / "d.json")
    wide = planted_bug_cases(report, lambda p: p["dstate"] > 128)
    assert len(wide) == 3 and all(c["status"] == "fail" for c in wide)


def test_the_default_preset_catches_heads_taken_in_pairs(tmp_path):
    """A kernel whose programs take heads two at a time (nheads // 2 programs) never computes the last of an odd
    head count: it passes every case of an even count and fails the default preset's cases of 3 heads (bf16, fp32),
    initial-state's 9 and the single heads of long's and ragged's chunk-16 cases, naming the last head."""
    _, report = scan("--kernel", f"{BROKEN}:heads_in_pairs", "--preset", "default", json_path=tmp_path / "p.json")
    odd = planted_bug_cases(report, lambda p: p["nheads"] % 2)
    assert sorted(c["params"]["nheads"] for c in odd) == [1, 1, 3, 3, 9]
    assert all(c["status"] == "fail" and f" head {c['params']['nheads'] - 1} " in c["message"] for c in odd)


def test_the_default_preset_catches_a_softplus_without_its_threshold(tmp_path):
    """A kernel whose softplus is log1p(exp(.)) with no linear branch past 20 passes every regime whose raw dt stays
    below exp's overflow, and is non-finite in `dt-extreme` in every dtype and in `dt-extreme-packed`."""
    _, report = scan("--kernel", f"{BROKEN}:softplus_without_threshold", "--preset", "default",
                     json_path=tmp_path / "s.json")
    extreme = planted_bug_cases(report, lambda p: p["regime"].startswith("dt-extreme"))
    assert len(extreme) == 4 and all(c["status"] == "nonfinite" for c in extreme)


def test_the_default_preset_catches_a_softplus_whose_exp_overflows_as_fp16(tmp_path):
    """A kernel whose softplus takes its exp in fp16 for fp16 inputs (inf past 11.09) but its linear branch past 20
    passes every case but the fp16 ones of `dt-extreme` and `dt-extreme-packed`, whose odd heads' raw dt of 12..20
    lies between the two: y is non-finite from head 1 on, every input finite."""
    _, report = scan("--kernel", f"{BROKEN}:softplus_exp_overflowing_as_fp16", "--preset", "default",
                     json_path=tmp_path / "s.json")
    band = planted_bug_cases(report, lambda p: p["regime"].startswith("dt-extreme") and p["dtype"] == "fp16")
    assert len(band) == 2
    for case in band:
        assert case["status"] == "nonfinite" and " head 1 " in case["message"] and "inputs finite" in case["message"]


def test_the_default_preset_catches_a_varlen_softplus_taken_only_with_a_bias(tmp_path):
    """A kernel whose varlen path takes the softplus only where dt_bias is given fails `initial-state`, the one varlen
    regime with a softplus and no dt_bias at trained ranges, in its 10 cases, and is non-finite in `dt-extreme-packed`
    (no dt_bias either: its raw dt of -23..-40, taken as the step's dt, grows the state by exp(|A| dt))."""
    _, report = scan("--kernel", f"{BROKEN}:softplus_only_with_a_bias_in_varlen", "--preset", "default",
                     json_path=tmp_path / "v.json")
    cases = planted_bug_cases(report, lambda p: p["regime"] in ("initial-state", "dt-extreme-packed"))
    assert sorted((c["params"]["regime"], c["status"]) for c in cases) == [
        ("dt-extreme-packed", "nonfinite"), *[("initial-state", "fail")] * 10], [c["id"] for c in cases]


@pytest.mark.parametrize(("kernel", "regimes"), [
    ("varlen_decays_masked_after_exp", ("decay-extreme-packed", "dt-extreme-packed")),
    ("varlen_decays_in_factors", ("decay-extreme-packed", "dt-extreme-packed")),
    ("varlen_softplus_without_threshold", ("dt-extreme-packed",)),
])
def test_the_default_preset_reaches_a_varlen_path_of_its_own_for_extreme_values(kernel, regimes, tmp_path):
    """A kernel right in batch mode whose varlen path masks a chunk's decays after their exp (inf * 0), takes them in
    factors exp(cum_i) * exp(-cum_j), or takes a softplus without its linear branch passes every case but those of the
    extreme regimes packed as sequences (`decay-extreme-packed`, `dt-extreme-packed`), and is non-finite there, every
    input finite."""
    _, report = scan("--kernel", f"{BROKEN}:{kernel}", "--preset", "default", json_path=tmp_path / "x.json")
    cases = planted_bug_cases(report, lambda p: p["regime"] in regimes)
    assert len(cases) == len(regimes), [c["id"] for c in cases]
    assert all(c["status"] == "nonfinite" and "inputs finite" in c["message"] for c in cases), \
        [c["message"] for c in cases]


def test_a_tf32_kernel_is_named_as_such_and_passes_with_allow_tf32(tmp_path):
    args = ("--kernel", f"{BROKEN}:tf32_matmuls", "--regime", "normal,ragged", "--dtype", "fp32", "--chunk-size", "32",
            "--seqlen", "96", "--batch", "2", "--nheads", "2", "--headdim", "16", "--dstate", "16", "--ngroups", "1")
    result, report = scan(*args, json_path=tmp_path / "r.json")
    assert result.exit_code == 1
    for case in report["cases"]:
        assert case["status"] == "fail" and "consistent with TF32 matmuls" in case["message"]
        assert case["error"]["precision"]["closest_precision"] == "tf32 matmuls"
        assert case["error"]["precision"]["in_place"] is True
    result, report = scan(*args, "--allow-tf32", json_path=tmp_path / "t.json")
    assert result.exit_code == 0, result.output
    assert report["settings"]["allow_tf32"] is True and "judged against TF32" in result.stdout
    preset = tmp_path / "p.toml"
    preset.write_text('[scan]\nallow_tf32 = "yes"\n')
    assert_usage_error(scan("--preset", preset)[0], "allow_tf32")


def test_a_bug_erring_as_much_as_a_precision_is_not_called_consistent_with_it(tmp_path):
    """A final state one token early errs as little as bf16 storage in `large-magnitude` and `large-output`
    (its states error within 4x of that baseline's); its states are not where that baseline's round, so
    no failing case of the default preset is called consistent with a precision."""
    _, report = scan("--kernel", f"{BROKEN}:final_state_one_token_early", "--preset", "default",
                     json_path=tmp_path / "r.json")
    failed = [c for c in report["cases"] if c["status"] == "fail"]
    assert failed and all("consistent with" not in c["message"] for c in failed)
    assert all(c["error"]["precision"]["in_place"] is not True for c in failed)
    sized = [c for c in failed if c["error"]["precision"]["closest_precision"] is not None]
    assert sized, "no case errs as much as a precision: the test no longer tests size against place"
    for case in sized:
        assert case["error"]["precision"]["in_place"] is False
        assert "but not where it rounds: the kernel's" in case["message"], case["message"]


def test_a_real_bug_is_not_explained_by_reduced_precision(tmp_path):
    _, report = scan("--kernel", f"{BROKEN}:ssm_part_1pct", "--preset", "smoke", "--regime", "normal",
                     "--dtype", "fp32", json_path=tmp_path / "r.json")
    (case,) = report["cases"]
    assert case["status"] == "fail" and case["error"]["precision"]["closest_precision"] is None
    assert "unexplained by reduced precision" in case["message"]


def test_repeat_finds_a_race_and_passes_the_builtin_kernel(tmp_path):
    args = ("--preset", "smoke", "--regime", "normal,decay-extreme", "--repeat", "3")
    result, report = scan("--kernel", f"{BROKEN}:racy_partial_read", *args, json_path=tmp_path / "r.json")
    assert result.exit_code == 1
    for case in report["cases"]:
        assert case["status"] == "fail"
        assert re.match(r"nondeterministic: runs 1 and [23] differ in y at sequence 0, token 16, head 0 "
                        r"\(max \|Δ\| = \S+ over 3 runs\)$", case["message"]), case["message"]
        assert case["repeat"]["runs"] == 3 and case["repeat"]["identical"] is False
    # Declared nondeterministic, the spread is judged like an error: this one is small enough to pass.
    _, report = scan("--kernel", f"{BROKEN}:racy_partial_read", *args, "--allow-nondeterministic",
                     json_path=tmp_path / "a.json")
    assert {c["status"] for c in report["cases"]} == {"pass"}
    result, report = scan("--kernel", "builtin", "--preset", "smoke", "--repeat", "3", json_path=tmp_path / "b.json")
    assert result.exit_code == 0, result.output
    assert all(c["repeat"]["identical"] for c in report["cases"])


# tests/tuned_kernels: the last element of y is never written under the copy's BLOCK=32 config only.
TUNED_SCAN = f"{Path(__file__).parent / 'tuned_kernels' / 'scan.py'}:chunk_scan"


def _statuses_by_config(report: dict) -> dict[int, set[str]]:
    statuses = {}
    for case in report["cases"]:
        statuses.setdefault(case["params"]["config"]["index"], set()).add(case["status"])
    return statuses


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's first-config rule; the GPU test follows")
def test_configs_all_flags_the_one_autotune_config_with_the_bug(tmp_path):
    """tests/tuned_kernels: the last element of y is never written under the copy's BLOCK=32 config only.
    In the interpreter, which cannot autotune, `auto` runs each autotuned function's first config."""
    args = ("--kernel", TUNED_SCAN, "--preset", "smoke", "--regime", "normal,ragged")
    result, report = scan(*args, json_path=tmp_path / "auto.json")
    assert result.exit_code == 0, result.output
    assert "configs: the first of each (tests.tuned_kernels.copy._copy_kernel (2 configs))" in result.stdout
    result, report = scan(*args, "--configs", "all", json_path=tmp_path / "all.json")
    assert result.exit_code == 3
    assert _statuses_by_config(report) == {0: {"pass"}, 1: {"nonfinite"}}
    bad = next(c for c in report["cases"] if c["status"] == "nonfinite")
    assert bad["id"].endswith("-cfg-_copy_kernel-1")
    assert bad["params"]["config"] == {"function": "_copy_kernel", "index": 1, "kwargs": {"BLOCK": 32},
                                       "num_warps": 2, "num_stages": 3}
    assert "_copy_kernel config 1 (BLOCK=32, num_stages=3, num_warps=2): nonfinite in 2/2 cases" in result.stdout


@pytest.mark.gpu
def test_configs_all_flags_the_one_autotune_config_with_the_bug_on_a_gpu(tmp_path):
    """On a GPU `auto` is the autotuner's pick after benchmarking: the slow, buggy BLOCK=32 loses."""
    args = ("--kernel", TUNED_SCAN, "--preset", "smoke", "--regime", "normal,ragged", "--device", "cuda")
    result, _ = scan(*args, json_path=tmp_path / "auto.json")
    assert result.exit_code == 0, result.output
    result, report = scan(*args, "--configs", "all", json_path=tmp_path / "all.json")
    assert result.exit_code == 3
    assert _statuses_by_config(report) == {0: {"pass"}, 1: {"nonfinite"}}
    assert "_copy_kernel config 1 (BLOCK=32, num_stages=3, num_warps=2): nonfinite in 2/2 cases" in result.stdout
