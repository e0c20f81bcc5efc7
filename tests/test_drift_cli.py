"""`ssmcheck drift` as users and CI run it: every exit code, usage errors, the JSON report, --plot, output.

Runs use `--kernel torch`, the broken kernels of tests/broken_state_update_kernels.py
(plain PyTorch: fast) or, for the smoke preset, the built-in Triton kernel.
"""

import re
import sys
from pathlib import Path

import pytest
from cli_invoke import assert_usage_error, invoke, planted_bug_cases

from ssmcheck.core import runtime
from ssmcheck.drift.independence import LAG_EXCESS, LAG_Z
from ssmcheck.drift.regimes import DRIFT_REGIMES
from ssmcheck.drift.stats import FLUSH_MIN_STORES

BROKEN = str(Path(__file__).with_name("broken_state_update_kernels.py"))
TINY = ["--nheads", "2", "--headdim", "8", "--dstate", "8", "--steps", "24"]

def drift(*args, json_path=None):
    """Run `ssmcheck drift ARGS` (with --json when given); return (result, report or None)."""
    return invoke("drift", *args, json_path=json_path)


def test_a_kernel_with_d_and_dt_bias_before_z_is_called_by_name_and_passes(tmp_path):
    """vLLM's selective_state_update takes D and dt_bias before z, where mamba's takes D, z, dt_bias: given by
    position in mamba's order, a correct kernel of vLLM's order read dt_bias as its gate. By name it passes every
    case, with a gate (`untied`) and with D and dt_bias None (`optional-none`)."""
    kernel = str(Path(__file__).with_name("signature_kernels.py")) + ":state_update_in_vllms_order"
    result, report = drift("--kernel", kernel, "--regime", "normal,untied,no-softplus,optional-none",
                           json_path=tmp_path / "v.json")
    assert result.exit_code == 0, result.output
    assert {c["params"]["regime"] for c in report["cases"] if c["status"] == "pass"} == {
        "normal", "untied", "no-softplus", "optional-none"}


def test_a_kernel_without_a_gate_runs_every_case_without_one(tmp_path):
    """A state update with no z keyword is not passed z=None: every regime but `untied` (Mamba1's call, gated)
    passes, and `untied` is skipped, naming z."""
    kernel = str(Path(__file__).with_name("signature_kernels.py")) + ":state_update_without_a_gate"
    result, report = drift("--kernel", kernel, "--regime", "normal,untied,optional-none", "--rounding", "nearest",
                           json_path=tmp_path / "g.json")
    assert result.exit_code == 0, result.output
    for case in report["cases"]:
        if case["params"]["regime"] == "untied":
            assert case["status"] == "skipped" and "takes no z keyword, which untied cases pass" in case["message"]
        else:
            assert case["status"] == "pass", case


def test_the_default_preset_catches_a_loop_bound_right_only_for_whole_blocks(tmp_path):
    """A state update that never touches the state columns of a partial last block of 16 passes every case
    whose dstate is a multiple of 16, and fails the default preset's cases of widths that fill no block."""
    _, report = drift("--kernel", f"{BROKEN}:whole_dstate_blocks", "--preset", "default", json_path=tmp_path / "w.json")
    ran = [c for c in report["cases"] if c["status"] != "skipped"]
    failed = [c for c in ran if c["status"] != "pass"]
    assert all(c["status"] == "pass" for c in ran if c["params"]["dstate"] % 16 == 0)
    assert failed and all(c["status"] == "fail" and c["params"]["dstate"] % 16 for c in failed)
    assert {(c["params"]["state_dtype"], c["params"]["rounding"]) for c in failed} == {
        (dtype, rounding) for dtype in ("fp16", "bf16") for rounding in ("nearest", "stochastic")}


def test_the_default_preset_catches_a_dstate_block_capped_at_128(tmp_path):
    """A state update whose block of state columns stops at 128, with no loop past it, passes every case of
    dstate <= 128 and fails the default preset's cases of dstate 256, in both rounding modes."""
    _, report = drift("--kernel", f"{BROKEN}:dstate_capped_at_128", "--preset", "default",
                      json_path=tmp_path / "d.json")
    wide = planted_bug_cases(report, lambda p: p["dstate"] > 128)
    assert {c["params"]["rounding"] for c in wide} == {"nearest", "stochastic"}
    assert all(c["status"] == "fail" for c in wide)


def test_the_default_preset_catches_a_softplus_without_its_threshold(tmp_path):
    """A state update whose softplus is log1p(exp(.)) with no linear branch past 20 passes every regime whose dt stays
    below exp's overflow, and is non-finite in `dt-extreme` in every state dtype and rounding mode (its fp32 case
    too)."""
    _, report = drift("--kernel", f"{BROKEN}:softplus_without_threshold", "--preset", "default",
                      json_path=tmp_path / "s.json")
    extreme = planted_bug_cases(report, lambda p: p["regime"] == "dt-extreme")
    assert len(extreme) == 5 and all(c["status"] == "nonfinite" for c in extreme)


def test_the_default_preset_catches_a_kernel_that_reads_one_parameter_per_head(tmp_path):
    """A state update that takes A, dt, D and dt_bias at channel 0 of each head (right for Mamba2's stride-0
    views) passes every regime but `untied` and `no-softplus` (D per channel), and fails those in every state dtype
    and rounding mode (and untied's fp32 case)."""
    _, report = drift("--kernel", f"{BROKEN}:per_head_parameters", "--preset", "default", json_path=tmp_path / "u.json")
    per_channel = planted_bug_cases(report, lambda p: p["regime"] in ("untied", "no-softplus"))
    assert len(per_channel) == 9 and all(c["status"] == "fail" for c in per_channel)


@pytest.mark.parametrize(("kernel", "regimes"), [("softplus_regardless", ("no-softplus", "small-dt")),
                                                ("bias_only_with_softplus", ("no-softplus",))])
def test_the_default_preset_catches_a_kernel_wrong_without_a_softplus(tmp_path, kernel, regimes):
    """A state update that takes a softplus dt_softplus did not ask for, or adds dt_bias only inside one, is right
    wherever a serving engine calls it (a softplus asked for): it passes every regime but `no-softplus` (and
    `small-dt`, the other regime without a softplus, which passes no dt_bias), and fails that one in every state dtype
    and rounding mode."""
    _, report = drift("--kernel", f"{BROKEN}:{kernel}", "--preset", "default", json_path=tmp_path / "s.json")
    plain = planted_bug_cases(report, lambda p: p["regime"] in regimes)
    assert len(plain) == 4 + ("small-dt" in regimes) and all(c["status"] == "fail" for c in plain), \
        [c["message"] for c in plain]


def test_the_default_preset_catches_a_kernel_that_adds_the_skip_after_the_gate(tmp_path):
    """A state update that computes C . state * silu(z) + D * x (the skip outside the gate) is right without a
    gate, so it passes every regime but `untied`, `dt-bias-none` and the half-precision inputs' into an fp32 state
    (gated since the sixty-third session), the ones that pass z with D, and fails those in every state dtype and
    rounding mode they run, on their output."""
    _, report = drift("--kernel", f"{BROKEN}:skip_after_gate", "--preset", "default", json_path=tmp_path / "z.json")
    gated = planted_bug_cases(report, lambda p: p["regime"] in ("untied", "dt-bias-none") or (
        p["regime"] in ("bf16-inputs", "fp16-inputs") and p["state_dtype"] == "fp32"))
    assert len(gated) == 8 and all(c["status"] == "fail" and "output error" in c["message"] for c in gated)


@pytest.mark.parametrize(("kernel", "reached", "count"), [
    ("interleaved_groups", lambda p: p["ngroups"] > 1 and p["nheads"] > p["ngroups"], 7),
    # h // ngroups is h's group where ngroups ** 2 == nheads (4 heads in 2), and group 0 where each head has its own
    ("groups_by_ngroups", lambda p: p["ngroups"] > 1 and p["ngroups"] ** 2 != p["nheads"], 9),
])
def test_the_default_preset_catches_a_head_read_from_the_wrong_group(kernel, reached, count, tmp_path):
    """A state update that reads head h's B and C from group h % ngroups, or h // ngroups (not h // heads per
    group), passes every case with one group, and fails the default preset's cases of 6 heads in 3 groups and of
    80 in 8; h % ngroups also the half-precision inputs' fp32 cases of 4 heads in 2 groups (where h // ngroups is
    right), h // ngroups the 2 heads in 2 groups of dstate 256 (fp16 and bf16)."""
    _, report = drift("--kernel", f"{BROKEN}:{kernel}", "--preset", "default", json_path=tmp_path / "g.json")
    grouped = planted_bug_cases(report, reached)
    assert len(grouped) == count and all(c["status"] == "fail" for c in grouped)


def test_the_default_preset_catches_parameters_read_for_blocks_of_8_heads(tmp_path):
    """A state update whose head h takes head h % 8's A, D and dt_bias passes every case of 8 heads or fewer, and
    fails the default preset's case of 40 heads."""
    _, report = drift("--kernel", f"{BROKEN}:parameters_of_head_mod_8", "--preset", "default",
                      json_path=tmp_path / "h.json")
    many = planted_bug_cases(report, lambda p: p["nheads"] > 8)
    assert len(many) == 1 and many[0]["status"] == "fail"


def test_the_default_preset_catches_what_only_an_fp32_state_shows(tmp_path):
    """A state update that reads per-channel parameters for a first block of 64 channels only (right for tied
    parameters and up to 64 channels; an error an fp16 or bf16 state's own rounding hides) passes every case but
    `untied`'s fp32 one at 72 channels a head, and fails that one."""
    _, report = drift("--kernel", f"{BROKEN}:parameters_of_first_64_channels", "--preset", "default", "--regime",
                      "untied", json_path=tmp_path / "c.json")
    (wide,) = planted_bug_cases(report, lambda p: p["state_dtype"] == "fp32")
    assert wide["params"]["headdim"] == 72 and wide["status"] == "fail", wide["message"]
    assert "output error" in wide["message"]


def test_the_default_preset_catches_a_gate_in_fp16(tmp_path):
    """A state update that takes the gate's silu in fp16 errs in its output by fp16's rounding of the gate: in the
    fp16 and bf16 states' cases within what their drift lets the output's error against the reference show, so
    judged there against the exact output of the step from its own state; it fails every `untied` case (the
    preset's one gated regime)."""
    _, report = drift("--kernel", f"{BROKEN}:gate_in_fp16", "--preset", "default", "--regime", "untied",
                      json_path=tmp_path / "c.json")
    gated = planted_bug_cases(report, lambda p: True)
    assert len(gated) == 5 and all(c["status"] == "fail" and "output error" in c["message"] for c in gated)
    assert all("against the exact output of the step from its own state" in c["message"] for c in gated
               if c["params"]["state_dtype"] != "fp32")


@pytest.mark.parametrize("kernel", ["softplus_in_inputs_dtype", "update_in_inputs_dtype"])
def test_the_default_preset_catches_arithmetic_in_the_inputs_dtype(kernel, tmp_path):
    """A state update that takes dt's softplus, or forms dt*x*B, in its inputs' dtype passes every float32-input
    case (right there) and fails `bf16-inputs` (a bf16 model's activations) into an fp32 and an fp16 state, and
    `fp16-inputs` (an fp16 model's) into an fp32 state."""
    _, report = drift("--kernel", f"{BROKEN}:{kernel}", "--preset", "default", json_path=tmp_path / "i.json")
    activations = planted_bug_cases(report, lambda p: p["regime"] in ("bf16-inputs", "fp16-inputs"))
    assert len(activations) == 4 and all(c["status"] == "fail" for c in activations)
    assert {(c["params"]["regime"], c["params"]["state_dtype"]) for c in activations} == {
        ("bf16-inputs", "fp32"), ("bf16-inputs", "fp16"), ("fp16-inputs", "fp32")}


def test_the_default_preset_catches_a_branch_for_fp16_inputs_only(tmp_path):
    """A state update whose branch for fp16 activations forms dt*x*B in fp16 passes every float32- and bf16-input
    case and fails `fp16-inputs` (an fp16-served model's activations, into an fp32 state)."""
    _, report = drift("--kernel", f"{BROKEN}:update_in_half_for_fp16_inputs", "--preset", "default",
                      json_path=tmp_path / "h.json")
    (case,) = planted_bug_cases(report, lambda p: p["regime"] == "fp16-inputs")
    assert case["status"] == "fail" and case["params"]["state_dtype"] == "fp32", case["message"]


@pytest.mark.parametrize(("kernel", "regimes", "count"), [
    ("softplus_only_with_a_bias", ("optional-none", "dt-bias-none"), 2),  # the regimes without dt_bias
    ("skip_term_from_x_without_D", ("optional-none", "gate-without-d"), 2),  # the regimes without D
])
def test_the_default_preset_catches_a_path_without_D_or_dt_bias(kernel, regimes, count, tmp_path):
    """A state update that takes dt's softplus only with a bias, or reads its skip term from a placeholder where D
    is None, passes every case given dt_bias, or D, and fails the cases of the regimes that leave it out:
    `optional-none` (both) and `dt-bias-none` (dt_bias), or `optional-none` and `gate-without-d` (D)."""
    _, report = drift("--kernel", f"{BROKEN}:{kernel}", "--preset", "default", json_path=tmp_path / "o.json")
    cases = planted_bug_cases(report, lambda p: p["regime"] in regimes)
    assert len(cases) == count and {c["params"]["regime"] for c in cases} == set(regimes)
    for case in cases:
        assert case["status"] in ("fail", "nonfinite"), case["message"]  # (a raw dt, mostly negative, grows the state)


def test_the_default_preset_catches_a_stochastic_rounding_that_never_rounds_up_into_the_next_binade(tmp_path):
    """A stochastic rounding into fp16 that drops every round-up carrying into the exponent holds the elements of
    `stagnation` that start just below 2 there: its fp16 stochastic cases (dstate 128 and 16) are biased, and every
    other case passes."""
    _, report = drift("--kernel", f"{BROKEN}:sr_never_into_the_next_binade", "--preset", "default",
                      json_path=tmp_path / "n.json")
    cases = planted_bug_cases(report, lambda p: p["regime"] == "stagnation" and p["state_dtype"] == "fp16"
                              and p["rounding"] == "stochastic")
    assert len(cases) == 2
    for case in cases:
        assert case["status"] == "fail" and case["message"].startswith("biased: mean rounding error -"), \
            case["message"]


def test_a_kernel_that_rewrites_its_slot_indices_is_an_error_of_every_case(tmp_path):
    """A state update right in every call that clamps the caller's state_batch_indices in place (an engine passes
    one index tensor to every layer) errs in every case's slot check, naming the input."""
    result, report = drift("--kernel", f"{BROKEN}:slot_indices_clamped_in_place", "--preset", "default",
                           json_path=tmp_path / "c.json")
    assert result.exit_code == 4
    assert {c["status"] for c in report["cases"]} == {"error"}
    assert all("the kernel wrote into its input state_batch_indices" in c["message"] for c in report["cases"])


def test_the_default_preset_catches_round_to_nearest_in_padded_batches(tmp_path):
    """A state update whose path for a batch holding pad rows rounds to nearest whatever it is told passes every
    round-to-nearest case and fails every stochastic one, in the independence check through slot indices and a pad
    row, but `dt-extreme`'s (its check's step stores values the state dtype holds exactly: no draw moves them, and
    the check cannot tell)."""
    _, report = drift("--kernel", f"{BROKEN}:nearest_in_padded_batches", "--preset", "default",
                      json_path=tmp_path / "p.json")
    stochastic = planted_bug_cases(report, lambda p: p["rounding"] == "stochastic" and p["regime"] != "dt-extreme")
    assert len(stochastic) > 10
    for case in stochastic:
        assert case["status"] == "fail" and case["independence"]["message"].startswith(
            "random bits (called with a slot per row and a pad row, state_batch_indices): "), case["id"]


def test_the_default_preset_catches_a_launch_config_of_large_batches_right_only_at_whole_channel_blocks(tmp_path):
    """A state update that, from 8 rows on, tiles channels in blocks of 32 over a grid rounded down never advances a
    partial last block: it passes every case of fewer rows and fails the 36-row case at 72 channels a head."""
    _, report = drift("--kernel", f"{BROKEN}:channels_in_blocks_of_32_from_8_rows", "--preset", "default",
                      json_path=tmp_path / "b.json")
    (case,) = planted_bug_cases(report, lambda p: p["batch"] >= 8)
    assert case["status"] == "fail" and case["params"]["headdim"] % 32, case["message"]


@pytest.mark.parametrize(("kernel", "reached", "count"), [
    ("rows_in_tiles_of_16", lambda p: p["batch"] > 16, 1),
    ("heads_in_blocks_of_32", lambda p: p["nheads"] > 32, 1),
])
def test_the_default_preset_catches_a_grid_that_drops_a_partial_last_block_of_rows_or_heads(kernel, reached, count,
                                                                                             tmp_path):
    """A state update that takes rows in tiles of 16 (from 16 rows on), or heads in blocks of 32 (past 32), over a
    grid rounded down never advances a partial last tile or block: it passes every case of fewer, and fails the
    36-row case (two whole tiles and 4 rows), or the case of 80 heads on its drift. (The random-bits check's step of 36 heads, a 6-head case's,
    leaves 4 heads where they were: into a bf16 state of 40 state indices that showed as bits alike at a distance, at
    dstate 36, since the sixtieth session, it no longer does: the unchanged heads are too few an excess there.)"""
    _, report = drift("--kernel", f"{BROKEN}:{kernel}", "--preset", "default", json_path=tmp_path / "g.json")
    cases = planted_bug_cases(report, reached)
    assert len(cases) == count and all(c["status"] == "fail" for c in cases), [c["id"] for c in cases]
    (case,) = [c for c in cases if c["params"]["rounding"] == "nearest"]
    assert "state drift" in case["message"], case["message"]


def test_the_default_preset_catches_a_gate_read_at_head_0s_offset(tmp_path):
    """A state update that gates every head with head 0's z is right with one head and without a gate: it passes
    every case but `untied`'s fp32 one, `dt-bias-none`'s and the half-precision inputs' fp32 ones (the preset's gates
    over 2 heads or 4), and fails those on their output."""
    _, report = drift("--kernel", f"{BROKEN}:gate_of_head_0", "--preset", "default", json_path=tmp_path / "z.json")
    cases = planted_bug_cases(report, lambda p: p["regime"] in ("untied", "dt-bias-none", "bf16-inputs",
                                                                "fp16-inputs") and p["nheads"] > 1)
    assert len(cases) == 4
    for case in cases:
        assert case["status"] == "fail" and "output error" in case["message"], case["message"]
        assert case["params"]["state_dtype"] == "fp32"


def test_the_default_preset_catches_a_skip_term_flag_taken_from_dt_bias(tmp_path):
    """A state update that adds D * x only where dt_bias is given is right wherever both are passed or both left out:
    it fails `dt-bias-none` and `small-dt` alone (D passed, dt_bias not), on their output."""
    _, report = drift("--kernel", f"{BROKEN}:skip_term_flag_from_dt_bias", "--preset", "default",
                      json_path=tmp_path / "d.json")
    cases = planted_bug_cases(report, lambda p: p["regime"] in ("dt-bias-none", "small-dt"))
    assert len(cases) == 2
    for case in cases:
        assert case["status"] == "fail" and "output error" in case["message"], case["message"]


def test_the_default_preset_catches_d_read_with_dt_bias_strides(tmp_path):
    """A state update that reads D through dt_bias's strides is right wherever they have the same strides: it fails
    `no-softplus` alone (D per channel, dt_bias per head), on its output."""
    _, report = drift("--kernel", f"{BROKEN}:d_read_with_dt_bias_strides", "--preset", "default",
                      json_path=tmp_path / "s.json")
    cases = planted_bug_cases(report, lambda p: p["regime"] == "no-softplus")
    assert len(cases) == 4, [c["id"] for c in cases]  # fp16 and bf16, both rounding modes
    assert all(c["status"] == "fail" and "output error" in c["message"] for c in cases), [c["message"] for c in cases]


def test_the_default_preset_catches_a_path_for_narrow_states_that_rounds_to_nearest(tmp_path):
    """A state update whose path for dstate <= 16 rounds to nearest whatever it is asked passes every case of a wider
    state and every one to nearest, and fails `stagnation`'s stochastic cases of dstate 16 (fp16, and bf16 since the
    sixtieth session) as biased."""
    _, report = drift("--kernel", f"{BROKEN}:narrow_states_round_to_nearest", "--preset", "default",
                      json_path=tmp_path / "n.json")
    cases = planted_bug_cases(report, lambda p: p["dstate"] <= 16 and p["rounding"] == "stochastic")
    assert len(cases) == 2
    for case in cases:
        assert case["status"] == "fail" and case["message"].startswith("biased: mean rounding error -"), \
            case["message"]


def test_the_default_preset_catches_bf16_stores_truncated_past_128_state_indices(tmp_path):
    """A state update whose loop past the first 128 state indices truncates its bf16 stores passes every fp16 case
    and every one of dstate <= 128, and fails the bf16 cases of dstate 256 in both rounding modes."""
    _, report = drift("--kernel", f"{BROKEN}:bf16_truncated_past_128_state_indices", "--preset", "default",
                      json_path=tmp_path / "t.json")
    wide = planted_bug_cases(report, lambda p: p["dstate"] > 128 and p["state_dtype"] == "bf16")
    assert len(wide) == 2 and all(c["status"] == "fail" for c in wide), [c["message"] for c in wide]
    assert {c["params"]["rounding"] for c in wide} == {"nearest", "stochastic"}


def test_the_default_preset_catches_an_output_stored_toward_zero(tmp_path):
    """A state update that stores its bf16/fp16 output truncated toward zero errs by at most an ulp, within twice the
    baseline's error here and there: its mean signed error, -1/2 ulp, fails every case of a narrow output (the
    `bf16-inputs` and `fp16-inputs` cases), and only those."""
    _, report = drift("--kernel", f"{BROKEN}:out_stored_toward_zero", "--preset", "default",
                      json_path=tmp_path / "o.json")
    narrow = planted_bug_cases(report, lambda p: p["regime"] in ("bf16-inputs", "fp16-inputs"))
    assert len(narrow) == 4
    for case in narrow:
        assert case["status"] == "fail" and case["message"].startswith("output stored with a bias: mean signed error -0."), \
            case["message"]
        assert -0.6 < case["output_bias"]["mean_ulp"] < -0.4 and abs(case["baseline"]["output_bias"]["mean_ulp"]) < 0.1


def test_the_default_preset_catches_an_output_stored_toward_minus_inf(tmp_path):
    """A state update that stores its bf16/fp16 output rounding down errs toward zero for positive outputs and away
    from it for negative ones: along the values its mean cancels; signed toward +inf it is -1/2 ulp, which fails every
    case of a narrow output, and only those."""
    _, report = drift("--kernel", f"{BROKEN}:out_stored_toward_minus_inf", "--preset", "default",
                      json_path=tmp_path / "m.json")
    narrow = planted_bug_cases(report, lambda p: p["regime"] in ("bf16-inputs", "fp16-inputs"))
    assert len(narrow) == 4
    for case in narrow:
        assert case["status"] == "fail", case["message"]
        assert "output stored with a bias: mean error signed toward +inf -0." in case["message"], case["message"]
        assert "rounded toward -inf, not to nearest" in case["message"]
        bias = case["output_bias"]
        assert -0.6 < bias["mean_up_ulp"] < -0.4 and abs(bias["mean_ulp"]) < 0.25, bias
        assert abs(case["baseline"]["output_bias"]["mean_up_ulp"]) < 0.1


def test_the_default_preset_catches_an_output_of_the_stored_state(tmp_path):
    """A state update whose output is C·h of the state it stored (rounded), not of its fp32 state, errs by the state's
    rounding in every output, within what the drift before the step lets the output's error against the reference
    show: judged against the exact output of the step from its own state, it fails every case of an fp16 or bf16
    state (an fp32 state is what it stores) and only those, but `bf16-inputs`' fp16 states, whose bf16 output's own
    rounding is coarser than the state's."""
    _, report = drift("--kernel", f"{BROKEN}:out_of_the_stored_state", "--preset", "default",
                      json_path=tmp_path / "s.json")
    narrow = planted_bug_cases(report, lambda p: p["state_dtype"] in ("fp16", "bf16") and p["regime"] != "bf16-inputs")
    assert len(narrow) == 46 and all(c["status"] == "fail" for c in narrow)
    for case in narrow:
        assert "against the exact output of the step from its own state" in case["message"], case["message"]


def test_the_default_preset_catches_a_gate_applied_only_with_the_skip_term(tmp_path):
    """A state update that gates its output only inside its branch for D is right wherever D is passed or z is not:
    it fails `gate-without-d` alone, on its output."""
    _, report = drift("--kernel", f"{BROKEN}:gate_only_with_the_skip_term", "--preset", "default",
                      json_path=tmp_path / "g.json")
    (case,) = planted_bug_cases(report, lambda p: p["regime"] == "gate-without-d")
    assert case["status"] == "fail" and case["message"].startswith("output error"), case["message"]


def test_the_default_preset_catches_a_silu_through_exp(tmp_path):
    """A state update that takes silu(z) as z exp(z) / (1 + exp(z)) is right for every unit-normal gate and NaN (inf /
    inf) past z = 88.7: `gate-without-d` draws half its gate's values in 12..100, and its one case is non-finite, at
    its output; no other case fails."""
    _, report = drift("--kernel", f"{BROKEN}:silu_through_exp", "--preset", "default", json_path=tmp_path / "s.json")
    (case,) = planted_bug_cases(report, lambda p: p["regime"] == "gate-without-d")
    assert case["status"] == "nonfinite" and case["first_nonfinite"]["output"] == "out", case["message"]


def test_the_default_preset_catches_a_bf16_output_rounded_through_fp16(tmp_path):
    """A state update that rounds a half-precision output through fp16 is right for fp16 inputs and for bf16 ones
    inside fp16's range: `bf16-inputs` scales C and D by 2**16, its output past 65504, and each of its cases is
    non-finite at its output (inf); no other case fails."""
    _, report = drift("--kernel", f"{BROKEN}:half_out_through_fp16", "--preset", "default",
                      json_path=tmp_path / "h.json")
    cases = planted_bug_cases(report, lambda p: p["regime"] == "bf16-inputs")
    assert len(cases) == 3 and all(c["status"] == "nonfinite" and c["first_nonfinite"]["output"] == "out"
                                   for c in cases), [c["message"] for c in cases]


def test_the_default_preset_catches_c_read_with_bs_strides(tmp_path):
    """A state update that reads C through B's strides is right wherever the two share a layout: `dt-bias-none`'s
    C has its batch rows further apart than B's, NaN between them, and its one case is non-finite at row 1's out (on
    a step whose inputs are not fenced: a fenced step passes each input whole); no other case fails."""
    _, report = drift("--kernel", f"{BROKEN}:c_read_with_b_strides", "--preset", "default",
                      json_path=tmp_path / "c.json")
    (case,) = planted_bug_cases(report, lambda p: p["regime"] == "dt-bias-none")
    assert case["status"] == "nonfinite" and case["first_nonfinite"]["batch"] == 1, case["message"]


def test_the_default_preset_catches_a_floor_on_the_processed_dt(tmp_path):
    """A state update that clamps the processed dt at 1e-6 from below moves a state whose step's dt is ~0 by less
    than an fp16 or bf16 state's rounding to nearest absorbs: it fails `dt-extreme` into an fp32 state, and its
    stochastic cases (whose stores lose no such step), and no other case but its fp16 one to nearest, where the
    1e-6 in dt (beyond the 2**-20 float32 arithmetic explains) moves a store near a tie past it (misrounded)."""
    _, report = drift("--kernel", f"{BROKEN}:dt_clamped_below_at_1e_6", "--preset", "default",
                      json_path=tmp_path / "f.json")
    extreme = planted_bug_cases(report, lambda p: p["regime"] == "dt-extreme"
                                and (p["rounding"] == "stochastic" or p["state_dtype"] in ("fp32", "fp16")))
    assert len(extreme) == 4 and all(c["status"] == "fail" for c in extreme)
    (fp32,) = [c for c in extreme if c["params"]["state_dtype"] == "fp32"]
    assert "state drift" in fp32["message"], fp32["message"]
    (near,) = [c for c in extreme if c["params"]["state_dtype"] == "fp16" and c["params"]["rounding"] == "nearest"]
    assert near["message"].startswith("misrounded: ") and near["misrounded_stores"]["count"] > 0


def test_the_default_preset_catches_random_bits_from_the_row_in_a_block_of_4(tmp_path):
    """A stochastic rounding whose offsets take the row within a block of 4 rounds rows 4 apart alike: every
    stochastic case fails in the independence check's step with every element alike (5 rows), naming the distance."""
    _, report = drift("--kernel", f"{BROKEN}:random_bits_from_the_row_in_a_block_of_4", "--preset", "default",
                      json_path=tmp_path / "r.json")
    stochastic = planted_bug_cases(report, lambda p: p["rounding"] == "stochastic")
    assert len(stochastic) == 24
    for case in stochastic:
        assert case["status"] == "fail" and case["message"].startswith("random bits: elements "), case["message"]
        assert "apart in the state (row +4, head +0, channel +0, state index +0)" in case["message"], case["message"]


def test_the_default_preset_catches_random_bits_from_the_head_mod_16(tmp_path):
    """A stochastic rounding whose offsets hold the head modulo 16 rounds heads 16 apart alike: stochastic cases fail
    in the independence check's step with every element alike (32 heads at least: half of a row's heads have a twin
    16 on, so pairs that far apart agree in excess of independent draws by (1 - a) / 2, a the draws' agreement),
    naming the distance, 16 heads. All but one: `untied`'s fp16 step, whose draws agree in 97% of pairs (its exact
    values lie 1.5% of the way between their neighbours), an excess of 1.5%, under LAG_EXCESS (z 53 all the same)."""
    _, report = drift("--kernel", f"{BROKEN}:random_bits_from_the_head_mod_16", "--preset", "default",
                      json_path=tmp_path / "h.json")
    stochastic = planted_bug_cases(report, lambda p: p["rounding"] == "stochastic")
    failed = [c for c in stochastic if c["status"] != "pass"]
    assert len(stochastic) == 24 and len(failed) == 23, [c["id"] for c in stochastic if c not in failed]
    for case in stochastic:
        lags = case["independence"]["lags"]
        _, _, channels, dstate = lags["widths"]
        assert lags["distance"] == 16 * channels * dstate and lags["z"] > LAG_Z, lags
        excess = (lags["agree"] - lags["expected"]) / lags["pairs"]
        assert (case in failed) == (excess >= LAG_EXCESS), lags
    for case in failed:
        assert "apart in the state (row +0, head +16, channel +0, state index +0)" in case["message"], case["message"]


def test_the_default_preset_catches_subnormals_flushed_or_rounded_as_normals(tmp_path):
    """A store that flushes fp16 subnormals to zero fails `subnormal`, and by name every fp16 case where at least a few
    stores have subnormal exact values (no rounding gives zero there), and as misrounded stores where fewer have
    them, while the bf16 and fp32 cases pass; a
    stochastic rounding written for normals (random bits below a normal's 10 fraction bits, lost below 2**-14)
    passes every case but `subnormal`'s."""
    _, report = drift("--kernel", f"{BROKEN}:flushes_subnormals", "--preset", "default", "--rounding", "nearest",
                      json_path=tmp_path / "f.json")
    fp16 = planted_bug_cases(report, lambda p: p["state_dtype"] == "fp16")
    failed = [c for c in fp16 if c["status"] != "pass"]
    assert "subnormal" in {c["params"]["regime"] for c in failed}
    for case in failed:
        assert case["status"] == "fail"
        if case["subnormal_stores"]["flushed"] >= FLUSH_MIN_STORES:
            assert case["message"].startswith("flushes subnormals to zero: "), case["message"]
        else:
            assert case["message"].startswith("misrounded: "), case["message"]
            assert case["misrounded_stores"]["count"] == case["subnormal_stores"]["flushed"] > 0
    (flushed,) = [c for c in failed if c["params"]["regime"] == "subnormal"]
    assert "state drift" in flushed["message"]
    assert flushed["subnormal_stores"]["flushed"] == flushed["subnormal_stores"]["subnormal"] > 1000
    assert all(c["subnormal_stores"]["flushed"] == 0 for c in report["cases"]
               if c["status"] == "pass" and c["params"]["state_dtype"] != "fp16")
    _, report = drift("--kernel", f"{BROKEN}:sr_normals_only", "--preset", "default", "--rounding", "stochastic",
                      json_path=tmp_path / "s.json")
    (normals_only,) = planted_bug_cases(report, lambda p: p["regime"] == "subnormal")
    assert normals_only["status"] == "fail"
    assert "twins along every axis" in normals_only["message"] and "do not reach them" in normals_only["message"]


def test_the_default_preset_catches_a_gate_read_as_if_contiguous(tmp_path):
    """A state update that reads z as if contiguous passes every case without a gate or of one row, and fails
    `untied` (Mamba1's call: z a view into each step's buffer, 2 rows) in every state dtype and rounding, and the
    half-precision inputs' 2-row cases (their z a view into one buffer per step)."""
    _, report = drift("--kernel", f"{BROKEN}:contiguous_gate", "--preset", "default", json_path=tmp_path / "z.json")
    untied = planted_bug_cases(report, lambda p: p["regime"] == "untied" or (
        p["regime"] in ("bf16-inputs", "fp16-inputs") and p["batch"] > 1))
    assert len(untied) == 7 and all(c["status"] == "fail" and "output error" in c["message"] for c in untied)


def test_the_default_preset_catches_a_gate_read_with_xs_strides(tmp_path):
    """A state update that reads z with x's strides passes every case where they are laid out alike, and fails
    `untied` (Mamba1's call: z half of a row of its own, x a column of the conv's output row) in every state dtype
    and rounding, and the half-precision inputs' 2-row cases: its second row's gate is read past z's memory, into
    the NaN fences of the step ssmcheck runs fenced, which names z."""
    _, report = drift("--kernel", f"{BROKEN}:z_read_with_x_strides", "--preset", "default",
                      json_path=tmp_path / "z.json")
    untied = planted_bug_cases(report, lambda p: p["regime"] == "untied" or (
        p["regime"] in ("bf16-inputs", "fp16-inputs") and p["batch"] > 1))
    assert len(untied) == 7
    for case in untied:
        assert case["status"] == "nonfinite" and "(trial 0, batch 1, " in case["message"], case["message"]
        assert "it reads outside its input z" in case["message"]


def test_a_sr_on_the_grid_of_its_round_to_nearest_is_misrounded(tmp_path):
    """Stochastic rounding whose spacing is taken at the value's round to nearest rounds a value just below a power
    of two between points two of its spacings apart: unbiased, so the bias test cannot see it, but its stores there
    are no rounding of the exact value. Every stochastic case of the normal regime fails, naming them; to nearest it
    passes."""
    _, report = drift("--kernel", f"{BROKEN}:sr_spacing_of_the_nearest_value", "--regime", "normal",
                      "--state-dtype", "fp16,bf16", "--rounding", "nearest,stochastic", *TINY, "--steps", "200",
                      json_path=tmp_path / "s.json")
    stochastic = planted_bug_cases(report, lambda p: p["rounding"] == "stochastic")
    assert len(stochastic) == 2
    for case in stochastic:
        assert case["status"] == "fail" and case["message"].startswith("misrounded: "), case
        assert "biased" not in case["message"] and case["misrounded_stores"]["count"] > 0
        assert case["misrounded_stores"]["most_at"] is not None


def test_a_sr_that_leans_toward_minus_inf_whatever_the_sign_is_biased(tmp_path):
    """8 random bits and a floor: 1/512 ulp toward -inf per store for either sign, which cancels along the values of
    a state of mixed signs (the bias test's own sign) and shows with each error signed toward +inf. 2M stores (1000
    steps of 16 x 128) put its z near -7; to nearest the kernel is right and passes."""
    _, report = drift("--kernel", f"{BROKEN}:sr_8_bits_toward_minus_inf", "--regime", "normal", "--state-dtype",
                      "fp16", "--rounding", "nearest,stochastic", "--nheads", "1", "--headdim", "16", "--dstate", "128",
                      "--steps", "1000", json_path=tmp_path / "m.json")
    (case,) = planted_bug_cases(report, lambda p: p["rounding"] == "stochastic")
    assert case["status"] == "fail" and case["message"].startswith("biased toward -inf: "), case["message"]
    assert case["store_bias_up"]["z"] < -4 and abs(case["bias_z"]) < 4


def test_the_default_preset_catches_every_row_read_at_row_0s_inputs(tmp_path):
    """A state update that advances every batch row with row 0's inputs passes every one-row case, and fails
    the default preset's cases of 2 rows (on the CPU the widths sub-sweep; on a GPU every case)."""
    _, report = drift("--kernel", f"{BROKEN}:inputs_of_row_0", "--preset", "default", json_path=tmp_path / "r.json")
    rows = planted_bug_cases(report, lambda p: p["batch"] > 1)
    assert rows and all(c["status"] == "fail" for c in rows)
    assert {(c["params"]["state_dtype"], c["params"]["rounding"]) for c in rows} == {
        (dtype, rounding) for dtype in ("fp16", "bf16") for rounding in ("nearest", "stochastic")} | {
        ("fp32", "nearest")}


def test_the_default_preset_catches_a_kernel_that_ignores_its_inputs_strides(tmp_path):
    """A state update that reads x, B and C as if contiguous passes every regime but `strided`, `untied` and the
    half-precision inputs' (views into one buffer per step, as vLLM's Mamba2 decode and Mamba1's decode pass them, at
    2 rows), and fails those in every state dtype and rounding at 2 rows; and `dt-bias-none`, whose C has NaN between
    its batch rows (since the sixty-fifth session), where it reads NaN at row 1: non-finite."""
    _, report = drift("--kernel", f"{BROKEN}:contiguous_inputs", "--preset", "default", json_path=tmp_path / "s.json")
    reached = planted_bug_cases(report, lambda p: p["regime"] in ("strided", "untied", "dt-bias-none")
                                or p["batch"] > 1 and p["regime"] in ("bf16-inputs", "fp16-inputs"))
    (apart,) = [c for c in reached if c["params"]["regime"] == "dt-bias-none"]
    views = [c for c in reached if c is not apart]
    assert len(views) == 11 and all(c["status"] == "fail" for c in views)
    assert apart["status"] == "nonfinite" and apart["first_nonfinite"]["batch"] == 1, apart["message"]


def test_the_default_preset_catches_a_kernel_that_updates_a_contiguous_copy_of_its_state(tmp_path):
    """A state update that stores into `state.contiguous()` loses every update of a state whose rows are not
    contiguous: `strided`'s, one layer's slice of a two-layer cache, at 2 rows (one row's slice is contiguous), in
    both state dtypes and roundings; every other case passes."""
    _, report = drift("--kernel", f"{BROKEN}:updates_a_contiguous_copy", "--preset", "default",
                      json_path=tmp_path / "s.json")
    sliced = planted_bug_cases(report, lambda p: p["regime"] == "strided" and p["batch"] > 1)
    assert len(sliced) == 4 and all(c["status"] == "fail" for c in sliced)


def test_builtin_kernel_passes_the_smoke_preset():
    result, _ = drift("--preset", "smoke")
    assert result.exit_code == 0, result.output
    assert "4 cases: 4 pass" in result.stdout and "exit code 0" in result.stdout
    assert "kernel builtin" in result.stdout and f"device {runtime.environment().device}" in result.stdout
    # both rounding modes of one configuration: a side-by-side line
    assert "stagnation-fp16-b1-h1x16n16g1: stochastic rounding:" in result.stdout
    assert "less drift at step 16" in result.stdout


def test_builtin_kernel_gates_its_output_in_the_untied_regime(tmp_path):
    """`untied` passes a gate z (Mamba1's call): the built-in kernel's gated output passes the lockstep and the
    slot check, both judged against float64 references given the same z."""
    result, report = drift("--regime", "untied", "--state-dtype", "bf16", json_path=tmp_path / "u.json")
    assert result.exit_code == 0, result.output
    # untied's two sub-sweeps in bf16 (a state dtype given keeps them: core.spec): 2 rows both ways, 72 channels
    assert len(report["cases"]) == 3 and all(c["status"] == "pass" for c in report["cases"])
    assert all(c["slots"]["live"]["worst"]["out_rel"] < 1e-5 for c in report["cases"])


FP16 = ["--state-dtype", "fp16"]


@pytest.mark.parametrize(
    "args, code",
    [
        (["--kernel", "torch", *FP16], 0),
        (["--kernel", f"{BROKEN}:truncating", "--regime", "normal", "--rounding", "nearest", *FP16], 1),
        (["--kernel", f"{BROKEN}:sr_3bit", "--regime", "stagnation", "--rounding", "stochastic", *FP16], 1),
        # truncation declared as stochastic rounding: biased
        (["--kernel", f"{BROKEN}:truncating", "--regime", "normal", "--rounding", "stochastic", *FP16], 1),
        (["--kernel", f"{BROKEN}:skips_last_head_store", "--regime", "normal", *FP16], 1),
        (["--kernel", f"{BROKEN}:forgets_decay", "--regime", "overflow", "--rounding", "nearest", *FP16], 3),
        (["--kernel", f"{BROKEN}:raises", "--regime", "normal", "--rounding", "nearest", *FP16], 4),
        # the most severe wins: non-finite (overflow) over a failure (normal)
        (["--kernel", f"{BROKEN}:forgets_decay", "--regime", "normal,overflow", "--rounding", "nearest", *FP16], 3),
        # --fail-on chooses which categories count
        (["--kernel", f"{BROKEN}:forgets_decay", "--regime", "overflow", "--rounding", "nearest", *FP16,
          "--fail-on", "tolerance,error"], 0),
        # nothing ran: stochastic rounding into an fp32 state is skipped, with the reason
        (["--kernel", "torch", "--state-dtype", "fp32", "--rounding", "stochastic"], 5),
    ],
)
def test_exit_codes(args, code):
    result, _ = drift(*args, *TINY)
    assert result.exit_code == code, result.output
    assert f"exit code {code}" in result.stdout


@pytest.mark.parametrize(
    "args, named",
    [
        (["--state-dtype", "fp8"], "--state-dtype"),
        (["--rounding", "up"], "--rounding"),
        (["--regime", "bogus"], "--regime"),
        (["--steps", "0"], "--steps"),
        (["--steps", "many"], "--steps"),
        (["--trials", "0"], "--trials"),
        (["--batch", "-1"], "--batch"),
        (["--tol-factor", "-1"], "--tol-factor"),
        (["--tol-factor", "inf"], "--tol-factor"),
        (["--rtol", "0"], "--rtol"),
        (["--rtol", "nan"], "--rtol"),
        (["--fail-on", "warnings"], "--fail-on"),
        (["--kernel", "no_such_module_xyz:fn"], "--kernel"),
        (["--kernel", f"{BROKEN}:no_such_fn"], "--kernel"),
        (["--preset", "nope"], "--preset"),
        (["--model", "mamba-9000"], "--model"),
        (["--model", "mamba2-130m", "--nheads", "2"], "--model"),
        (["--device", "tpu"], "--device"),
        (["--json", "/no/such/dir/r.json"], "--json"),
        (["--philox-rounds", "0"], "--philox-rounds"),
        (["--rounding-impl", "magic"], "--rounding-impl"),
        (["--rounding-impl", "hardware"], "--rounding-impl"),  # no sm_100+ here (and never on the CPU)
        (["--rounding-impl", "hardware", "--kernel", "torch"], "--rounding-impl"),
        (["--configs", "some"], "--configs"),
        (["--repeat", "0"], "--repeat"),
    ],
)
def test_bad_options_are_one_line_usage_errors(args, named):
    result, _ = drift(*args)
    assert_usage_error(result, named)


def test_json_report_has_the_stable_keys(tmp_path):
    result, report = drift("--kernel", "torch", "--regime", "stagnation", "--state-dtype", "fp16,fp32",
                           "--rounding", "nearest,stochastic", *TINY, json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert set(report) >= {"tool", "version", "command", "environment", "cases", "summary", "exit_code"}
    assert report["command"] == "drift" and report["exit_code"] == 0
    assert report["summary"] == {"pass": 3, "fail": 0, "nonfinite": 0, "error": 0, "skipped": 1}
    case_keys = {"id", "status", "message", "seconds", "params", "checkpoints", "growth_exponent", "bias_z",
                 "baseline", "ratio", "first_nonfinite", "output_bias"}
    param_keys = {"kernel", "state_dtype", "rounding", "regime", "steps", "batch", "nheads", "headdim", "dstate",
                  "ngroups", "seed", "trials"}
    for case in report["cases"]:
        assert set(case) >= case_keys and set(case["params"]) >= param_keys
    ran = [c for c in report["cases"] if c["status"] == "pass"]
    for case in ran:
        assert case["checkpoints"][0]["step"] == 1 and case["checkpoints"][-1]["step"] == 24
        assert all(set(p) == {"step", "state_rel", "out_rel", "bias", "step_out_rel"} for p in case["checkpoints"])
        assert set(case["baseline"]) >= {"checkpoints", "growth_exponent", "output_bias"}
        assert case["first_nonfinite"] is None and case["output_bias"] is None  # fp32 inputs: an fp32 output
    rn = next(c for c in ran if c["params"]["rounding"] == "nearest" and c["params"]["state_dtype"] == "fp16")
    sr = next(c for c in ran if c["params"]["rounding"] == "stochastic")
    assert rn["growth_exponent"] > 0.8 and sr["growth_exponent"] < 0.7  # stagnation vs noise
    assert sr["params"]["trials"] == 2 and rn["params"]["trials"] == 1
    [skipped] = [c for c in report["cases"] if c["status"] == "skipped"]
    assert "fp32" in skipped["message"] and skipped["checkpoints"] == []


def test_nonfinite_case_reports_its_location_in_json(tmp_path):
    _, report = drift("--kernel", f"{BROKEN}:forgets_decay", "--regime", "overflow", "--rounding", "nearest",
                      "--state-dtype", "fp16", *TINY, json_path=tmp_path / "r.json")
    [case] = report["cases"]
    assert case["status"] == "nonfinite" and case["message"].startswith("non-finite state at step")
    assert set(case["first_nonfinite"]) == {"output", "step", "trial", "batch", "head", "channel", "state_index",
                                            "reads_outside", "unwritten"}


def test_an_inf_stored_at_a_known_element_is_located_exactly_in_json(tmp_path):
    result, report = drift("--kernel", f"{BROKEN}:inf_at_one_element", "--regime", "normal", "--rounding",
                           "nearest,stochastic", "--state-dtype", "fp16", *TINY, "--batch", "3",
                           json_path=tmp_path / "r.json")
    assert result.exit_code == 3, result.output
    assert len(report["cases"]) == 2
    for case in report["cases"]:
        # broken_state_update_kernels: INF_STEP, INF_BATCH, INF_HEAD, INF_CHANNEL, INF_STATE_INDEX
        assert case["status"] == "nonfinite"
        assert case["first_nonfinite"] == {"output": "state", "step": 7, "trial": 0, "batch": 2, "head": 1,
                                           "channel": 3, "state_index": 5, "reads_outside": None,
                                           "unwritten": False}
        assert case["message"] == "non-finite state at step 7 (trial 0, batch 2, head 1, channel 3, state index 5)"
        assert case["checkpoints"][-1]["step"] == 7


@pytest.mark.parametrize("state_dtype", ["fp16", "bf16"])
def test_a_single_skipped_state_store_fails_in_both_modes(tmp_path, state_dtype):
    args = ("--regime", "overflow", "--rounding", "nearest,stochastic", "--state-dtype", state_dtype, *TINY)
    result, report = drift("--kernel", f"{BROKEN}:skips_one_store", *args, json_path=tmp_path / "r.json")
    assert result.exit_code == 1, result.output
    assert "exit code 1" in result.stdout
    assert [c["params"]["rounding"] for c in report["cases"]] == ["nearest", "stochastic"]
    for case in report["cases"]:
        assert case["status"] == "fail" and "state drift" in case["message"], case["message"]
        assert case["first_nonfinite"] is None and case["ratio"] > 4
    # the same kernel storing every step passes: the one skipped store is what fails
    control, _ = drift("--kernel", f"{BROKEN}:stores_every_step", *args)
    assert control.exit_code == 0, control.output


def test_quiet_prints_only_the_summary():
    result, _ = drift("--kernel", "torch", "--quiet", "--regime", "normal", "--state-dtype", "fp16", *TINY)
    assert result.exit_code == 0
    [line] = result.stdout.strip().splitlines()
    assert line.startswith("drift: 2 cases: 2 pass, 0 fail, 0 nonfinite, 0 error, 0 skipped in ")
    assert line.endswith("exit code 0")


def test_plot_without_matplotlib_is_a_clear_usage_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    result, _ = drift("--kernel", "torch", "--plot", tmp_path / "d.png")
    assert result.exit_code == 2
    assert result.stderr.strip() == "Error: --plot needs matplotlib, an optional extra: pip install ssmcheck[plot]"
    assert not (tmp_path / "d.png").exists()


def test_plot_draws_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    result, _ = drift("--kernel", "torch", "--regime", "stagnation,normal", "--state-dtype", "fp16", *TINY,
                      "--plot", tmp_path / "d.png")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "d.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_help_explains_regimes_and_exit_codes():
    result, _ = invoke("drift", "--help", terminal_width=200)
    assert result.exit_code == 0
    for name in DRIFT_REGIMES:
        assert name in result.stdout
    assert "Exit codes" in result.stdout and "biased" in result.stdout


def test_a_kernel_without_a_rounding_keyword_runs_only_what_is_declared(tmp_path):
    """A round-to-nearest kernel must not be judged as stochastic because a preset lists both modes."""
    plain = f"{BROKEN}:plain_nearest"  # correct, stores to nearest, has no rounding keyword
    result, report = drift("--kernel", plain, "--preset", "smoke", json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert {c["params"]["rounding"] for c in report["cases"]} == {"nearest"}
    assert report["settings"]["rounding"] == "declared"
    assert "less drift" not in result.stdout and "more drift" not in result.stdout
    # Declared on the command line, both modes run; still no comparison, as the kernel has one way only.
    result, report = drift("--kernel", plain, "--preset", "smoke", "--rounding", "nearest,stochastic",
                           json_path=tmp_path / "r2.json")
    assert {c["params"]["rounding"] for c in report["cases"]} == {"nearest", "stochastic"}
    assert "stochastic rounding:" not in result.stdout
    # The built-in kernel implements both: the preset's modes run and are compared.
    result, report = drift("--preset", "smoke", json_path=tmp_path / "r3.json")
    assert report["settings"]["rounding"] == "implemented by the kernel" and "stochastic rounding:" in result.stdout


def test_a_regimes_stochastic_only_sub_sweep_declares_nothing_either(tmp_path):
    """The default preset's stagnation case of dstate 16 is listed stochastic only: a kernel without a rounding keyword
    runs it to nearest (where it passes), not judged as a stochastic rounding it never claimed (a false alarm: biased)."""
    _, report = drift("--kernel", f"{BROKEN}:plain_nearest", "--preset", "default", "--regime", "stagnation",
                      json_path=tmp_path / "s.json")
    assert {(c["params"]["rounding"], c["params"]["dstate"], c["status"]) for c in report["cases"]} == {
        ("nearest", 128, "pass"), ("nearest", 16, "pass")}


def test_configs_all_flags_the_one_autotune_config_with_the_bug(tmp_path):
    """tests/tuned_kernels/state_update.py: the last element of out is never written under the copy's
    BLOCK=32 config only. `auto` runs, in the interpreter, each autotuned function's first config."""
    args = ("--kernel", "tests.tuned_kernels.state_update:state_update", "--regime", "normal",
            "--state-dtype", "fp16", "--rounding", "nearest", *TINY)
    result, report = drift(*args, json_path=tmp_path / "auto.json")
    assert result.exit_code == 0, result.output
    assert "configs: the first of each (tests.tuned_kernels.copy._copy_kernel (2 configs))" in result.stdout
    assert [c["params"]["config"] for c in report["cases"]] == [None]
    result, report = drift(*args, "--configs", "all", json_path=tmp_path / "all.json")
    assert result.exit_code == 3, result.output
    by_config = {c["params"]["config"]["index"]: c for c in report["cases"]}
    assert by_config[0]["status"] == "pass" and by_config[1]["status"] == "nonfinite"
    assert by_config[1]["id"].endswith("-cfg-_copy_kernel-1")
    assert by_config[1]["params"]["config"] == {"function": "_copy_kernel", "index": 1, "kwargs": {"BLOCK": 32},
                                                "num_warps": 2, "num_stages": 3}
    assert "non-finite out at step 1" in by_config[1]["message"]
    assert report["settings"]["configs"] == "all"
    assert "_copy_kernel config 1 (BLOCK=32, num_stages=3, num_warps=2): nonfinite in 1/1 cases" in result.stdout


def test_repeat_finds_a_race_that_one_run_passes(tmp_path):
    """racy_store stores one element a unit in the last place off on every third launch: in an fp32 state that is
    within what float32 arithmetic explains (an fp16 store so far off is misrounded), so one run per
    step passes; --repeat 3 runs every step three times from the same state and fails the case where
    the runs first differ; --allow-nondeterministic accepts it and records the spread."""
    args = ("--kernel", f"{BROKEN}:racy_store", "--regime", "normal", "--state-dtype", "fp32", *TINY)
    result, report = drift(*args, json_path=tmp_path / "once.json")
    assert result.exit_code == 0, result.output
    assert report["cases"][0]["repeat"] is None
    result, report = drift(*args, "--repeat", "3", json_path=tmp_path / "three.json")
    assert result.exit_code == 1, result.output
    (case,) = report["cases"]
    repeat = case["repeat"]
    assert repeat["runs"] == 3 and not repeat["identical"] and repeat["output"] == "state"
    assert (repeat["trial"], repeat["batch"], repeat["head"], repeat["channel"]) == (0, 0, 0, 0)
    assert repeat["step"] == 1 and repeat["run"] in (2, 3) and 0 < repeat["max_abs"] < 1e-2
    assert case["message"].startswith(f"nondeterministic: runs 1 and {repeat['run']} of trial 0, step 1 differ in state")
    result, report = drift(*args, "--repeat", "3", "--allow-nondeterministic", json_path=tmp_path / "allowed.json")
    assert result.exit_code == 0, result.output
    assert report["cases"][0]["repeat"]["identical"] is False
    assert report["settings"]["repeat"] == 3 and report["settings"]["allow_nondeterministic"] is True


def test_repeat_passes_the_builtin_kernel(tmp_path):
    result, report = drift("--kernel", "builtin", "--preset", "smoke", "--repeat", "2", json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    ran = [c for c in report["cases"] if c["status"] != "skipped"]
    assert ran and all(c["repeat"]["identical"] and c["repeat"]["runs"] == 2 for c in ran)


def test_a_short_stochastic_run_says_how_small_a_bias_it_could_see(tmp_path):
    """32 steps of one 16 x 128 head: ~4000 stores a trial, too few to see the 2**-10 ulp floor (z = 4 needs a
    mean of about 4 x 0.3 / sqrt(8000)), which the report says, with the figure in JSON."""
    result, report = drift("--regime", "normal", "--state-dtype", "fp16", "--steps", "32", "--nheads", "1",
                           "--headdim", "16", "--dstate", "128", json_path=tmp_path / "b.json")
    assert result.exit_code == 0, result.output
    by_rounding = {c["params"]["rounding"]: c for c in report["cases"]}
    assert by_rounding["nearest"]["bias_resolution_ulp"] is None
    resolution = by_rounding["stochastic"]["bias_resolution_ulp"]
    assert 2.0**-10 < resolution < 0.05, resolution
    assert re.search(r"bias resolution: 1 passing stochastic case could show a mean rounding error only from "
                     r"[0-9.]+-[0-9.]+ ulp per store \(\|z\| > 4 at their stores\), above the 0\.00098 ulp the test "
                     r"fails", result.output), result.output
    # Long enough, no such line: 4 trials of 1024 steps resolve below the floor.
    longer, report = drift("--regime", "normal", "--state-dtype", "fp16", "--rounding", "stochastic", "--steps",
                           "1024", "--trials", "4", "--nheads", "1", "--headdim", "16", "--dstate", "128",
                           "--kernel", "torch", json_path=tmp_path / "l.json")
    assert longer.exit_code == 0 and "bias resolution" not in longer.output, longer.output
    assert report["cases"][0]["bias_resolution_ulp"] < 2.0**-10


@pytest.mark.parametrize(("kernel", "regimes", "reached", "count"), [
    # the half-precision inputs' fp32 cases at 2 rows of 4 heads in 2 groups (views into one buffer per step)
    ("half_inputs_read_as_contiguous", "bf16-inputs,fp16-inputs,strided",
     lambda p: p["state_dtype"] == "fp32", 2),
    ("half_inputs_from_interleaved_groups", "bf16-inputs,fp16-inputs,strided", lambda p: p["state_dtype"] == "fp32", 2),
    ("half_inputs_b_c_of_row_0", "bf16-inputs,fp16-inputs,strided", lambda p: p["state_dtype"] == "fp32", 2),
    # dt-bias-none: tied parameters, D and a gate at 2 rows of 2 heads
    ("tied_path_gate_of_row_0", "dt-bias-none,untied,gate-without-d", lambda p: p["regime"] == "dt-bias-none", 1),
    ("tied_path_skip_after_gate", "dt-bias-none,untied,gate-without-d", lambda p: p["regime"] == "dt-bias-none", 1),
    ("dt_of_head_0_without_bias", "dt-bias-none,optional-none", lambda p: p["regime"] == "dt-bias-none", 1),
    # normal's widths of no multiple of 8 (headdim 20, dstate 36) and its 80 heads of 20 channels
    ("channels_in_whole_blocks_of_8", "normal", lambda p: p["headdim"] % 8, 5),
    ("dstate_in_vectors_of_8", "normal", lambda p: p["dstate"] % 8, 4),
    ("channels_in_blocks_of_16_from_64_programs", "normal", lambda p: p["batch"] * p["nheads"] >= 64, 2),
    ("parameters_of_head_mod_64", "normal", lambda p: p["nheads"] > 64, 1),
    ("skips_steps_with_dt_below_1e_4", "small-dt,normal,dt-extreme", lambda p: p["regime"] == "small-dt", 1),
    ("narrow_bf16_sr_bits_shared_along_a_row", "stagnation", lambda p: p["dstate"] <= 16 and p["state_dtype"] == "bf16",
     1),
], ids=["half-inputs-as-contiguous", "half-inputs-interleaved-groups", "half-inputs-b-c-of-row-0",
        "tied-gate-of-row-0", "tied-skip-after-gate", "dt-of-head-0-without-bias", "channels-in-blocks-of-8",
        "dstate-in-vectors-of-8", "channels-in-blocks-of-16-from-64-programs", "parameters-of-head-mod-64",
        "small-dt-as-padding", "narrow-bf16-sr-bits-along-a-row"])
def test_the_default_preset_reaches_each_fourth_red_team_bug_in_the_cases_built_for_it(kernel, regimes, reached, count,
                                                                                      tmp_path):
    """The fourth red-team round's state updates (sixtieth session), each wrong only where its condition holds: a path
    for half-precision inputs that reads them at offsets of its own (as if contiguous, a head's group as h % ngroups,
    row 0's B and C), a path for tied parameters with a gate and D (row 0's gate, the skip term after the gate), a
    branch without dt_bias that reads head 0's dt, channels or state indices in blocks or vectors of 8 with no partial
    one, a launch config from 64 programs with channel blocks of 16 and no partial one, parameters of head h % 64, a
    small dt taken for padding, a narrow bf16 state's random bits shared along a row. The default preset's regimes
    that reach each fail (the cases built for it) and the others named beside them pass."""
    _, report = drift("--kernel", f"{BROKEN}:{kernel}", "--preset", "default", "--regime", regimes,
                      json_path=tmp_path / "r.json")
    cases = planted_bug_cases(report, reached)
    assert len(cases) == count and all(c["status"] == "fail" for c in cases), [c["id"] for c in cases]


@pytest.mark.parametrize(("kernel", "regimes", "reached", "statuses"), [
    # strided's state, one layer's slice of a cache, at 2 heads: head 1 read in the other layer, written past the state
    ("state_head_stride_from_its_row_stride", "strided,normal", lambda p: p["regime"] == "strided",
     ["error", "error", "nonfinite", "nonfinite"]),
    # the half-precision inputs' regimes with a gate, their fp32 cases at 4 heads
    ("half_inputs_gate_of_head_0", "bf16-inputs,fp16-inputs,untied", lambda p: p["state_dtype"] == "fp32"
     and p["regime"] != "untied", ["fail", "fail"]),
    # normal's 36 rows of 2 heads at 72 channels
    ("large_batch_parameters_of_head_0", "normal", lambda p: p["batch"] >= 32, ["fail"]),
    ("tied_path_x_of_the_first_64_channels", "normal,untied", lambda p: p["headdim"] > 64 and p["regime"] == "normal",
     ["fail"]),
    # normal's dstate-256 case at 32 channels a head, both dtypes and modes
    ("narrow_blocks_past_dstate_128", "normal", lambda p: p["dstate"] > 128, ["fail"] * 4),
], ids=["state-head-stride-from-row-stride", "half-inputs-gate-of-head-0", "parameters-of-head-0-from-32-rows",
        "tied-x-in-blocks-of-64", "narrow-blocks-past-dstate-128"])
def test_the_default_preset_reaches_each_fifth_red_team_state_update_bug(kernel, regimes, reached, statuses, tmp_path):
    """The fifth red-team round's state updates (sixty-third session), each wrong only past a width or layout the
    preset reached nowhere before it: a head stride taken from a cache slice's row stride, a gate read at head 0 on
    the path for half-precision activations, head 0's parameters from 32 rows on, x read in blocks of 64 channels
    without the block's offset on the tied path, blocks of 16 channels of every 64 past dstate 128. The cases built
    for each fail (or are non-finite, or err writing past the state), and the others named beside them pass."""
    _, report = drift("--kernel", f"{BROKEN}:{kernel}", "--preset", "default", "--regime", regimes,
                      json_path=tmp_path / "r.json")
    cases = planted_bug_cases(report, reached)
    assert sorted(c["status"] for c in cases) == statuses, [(c["id"], c["status"]) for c in cases]


def test_random_bits_of_seed_plus_offset_fail_every_stochastic_case_on_consecutive_seeds(tmp_path):
    """Stochastic rounding whose bits hash seed + the element's offset is exact SR in every call, its bits its own
    along every axis: the calls whose seeds differ only in bit 0 (consecutive seeds) round alike one element apart,
    which the independence check finds in every stochastic case; to nearest it is right."""
    _, report = drift("--kernel", f"{BROKEN}:random_bits_of_seed_plus_offset", "--preset", "default", "--regime",
                      "normal,stagnation", json_path=tmp_path / "s.json")
    cases = planted_bug_cases(report, lambda p: p["rounding"] == "stochastic")
    assert len(cases) == 10 and all(c["status"] == "fail" for c in cases), [c["id"] for c in cases]
    for case in cases:
        assert case["message"].startswith("random bits: calls whose seeds differ only in bit 0 (consecutive seeds"), \
            case["message"]
        shift = case["independence"]["seed_shift"]
        assert abs(shift["shift"]) == 1 and shift["fails"] and shift["correlation"] > 0.4, shift


def test_a_stochastic_rounding_biased_on_the_slot_path_alone_fails_where_a_trial_decodes_through_slots(tmp_path):
    """A state update whose stochastic rounding draws 4 bits on its path for state_batch_indices alone (1/32 ulp
    toward +inf a store) passes the one-step slot check; the stochastic cases' trial that decodes through slot
    indices (one of two) drifts biased, and fails. To nearest it is right and passes."""
    _, report = drift("--kernel", f"{BROKEN}:slot_path_sr_with_4_bits", "--regime", "normal", "--state-dtype",
                      "fp16,bf16", "--rounding", "nearest,stochastic", "--nheads", "1", "--headdim", "16", "--dstate",
                      "32", "--steps", "300", json_path=tmp_path / "s.json")
    stochastic = planted_bug_cases(report, lambda p: p["rounding"] == "stochastic")
    assert len(stochastic) == 2
    for case in stochastic:
        assert len(case["slotted_trials"]) == 1 and case["params"]["trials"] == 2, case
        assert case["status"] == "fail" and case["message"].startswith("biased toward +inf: "), case["message"]
        assert case["slots"]["live"]["status"] == "pass"
