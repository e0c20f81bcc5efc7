"""The rounding bias of an output stored in fp16/bf16 (core.output_bias), accumulated over segments
(scan.measure.BiasSum) and judged in a scan case (scan.verdict)."""

import math
from pathlib import Path

import pytest
import torch
from cli_invoke import invoke
from hypothesis import given, settings
from hypothesis import strategies as st

from ssmcheck.core.formats import ulp
from ssmcheck.core.output_bias import OutputBias, bias_message, is_biased, moment_sums, output_bias, signed_ulp_errors
from ssmcheck.core.status import Status
from ssmcheck.core.tolerance import Tolerance
from ssmcheck.ops.rounding.naive import round_to
from ssmcheck.scan import measure
from ssmcheck.scan.results import Comparison, ErrorStats
from ssmcheck.scan.verdict import judge

NARROW = [torch.bfloat16, torch.float16]
ELEMENTS = 4096
BROKEN = str(Path(__file__).with_name("broken_scan_kernels.py"))


def _exact(seed: int, count: int = ELEMENTS) -> torch.Tensor:
    """Fresh float64 values of either sign, magnitudes in [2**-8, 2**8] (normal in fp16 and bf16), never zero."""
    g = torch.Generator().manual_seed(seed)
    magnitude = torch.exp2(torch.empty(count, dtype=torch.float64).uniform_(-8, 8, generator=g))
    return torch.where(torch.rand(count, generator=g) < 0.5, -magnitude, magnitude)


def _stored(exact: torch.Tensor, dtype: torch.dtype, rounding: str) -> torch.Tensor:
    """`exact` stored in `dtype` to nearest, toward zero, away from zero or toward -inf."""
    nearest = round_to(exact, dtype, "nearest")
    moved = nearest.double().abs() - exact.abs()  # > 0: to nearest went away from zero
    if rounding == "toward zero":
        return torch.where(moved > 0, torch.nextafter(nearest, torch.zeros_like(nearest)), nearest)
    if rounding == "toward -inf":
        return torch.where(nearest.double() > exact, torch.nextafter(nearest, torch.full_like(nearest, -math.inf)),
                           nearest)
    if rounding == "away from zero":
        away = torch.full_like(nearest, math.inf).copysign(nearest)
        return torch.where(moved < 0, torch.nextafter(nearest, away), nearest)
    return nearest


def _bias(exact: torch.Tensor, dtype: torch.dtype, rounding: str) -> OutputBias:
    stored = _stored(exact, dtype, rounding)
    return output_bias(moment_sums(signed_ulp_errors(stored, exact, dtype), exact), dtype)


def test_signed_errors_count_toward_zero_negative_for_either_sign():
    eps = ulp(torch.tensor([1.0], dtype=torch.float64), torch.bfloat16).item()
    # below 1 the ulp is eps / 2: 1 - eps / 8 stored as 1 is a quarter ulp away from zero
    exact = torch.tensor([1 + eps / 4, -1 - eps / 4, 1 - eps / 8, 1.0, 0.0, 1.0], dtype=torch.float64)
    stored = torch.tensor([1.0, -1.0, 1.0, 1 + 3 * eps, 0.0, math.nan])
    errors = signed_ulp_errors(stored, exact, torch.bfloat16)
    assert errors[:5].tolist() == [-0.25, -0.25, 0.25, 3.0, 0.0] and math.isnan(errors[5])


def _sums(errors: list[float], signs: list[float] | None = None) -> torch.Tensor:
    """moment_sums of `errors` at exact values of `signs` (all positive where None)."""
    return moment_sums(torch.tensor(errors), torch.tensor(signs or [1.0] * len(errors)))


def test_moment_sums_skip_non_finite_errors_and_clip_and_count_those_past_an_ulp():
    sums = _sums([0.5, -1.0, math.nan, 0.25, 3.0], [1.0, -1.0, 1.0, -1.0, 1.0])
    # toward +inf: 0.5 + 1.0 - 0.25 + 1.0 (each clipped error times its value's sign)
    assert sums.dtype == torch.float64 and sums.tolist() == [4.0, 0.75, 0.25 + 1.0 + 0.0625 + 1.0, 1.0, 2.25]


def test_output_bias_mean_and_z():
    bias = output_bias(_sums([-1.0, 0.0]), torch.float16)
    # mean -0.5; sample variance 0.5; standard error sqrt(0.5 / 2) = 0.5
    assert (bias.dtype, bias.count, bias.mean, bias.z) == ("fp16", 2, -0.5, pytest.approx(-1.0))
    assert (bias.mean_up, bias.z_up) == (-0.5, pytest.approx(-1.0))  # positive values: toward +inf is along them
    assert bias.as_dict() == {"dtype": "fp16", "count": 2, "mean_ulp": -0.5, "z": bias.z, "beyond": 0,
                              "mean_up_ulp": -0.5, "z_up": bias.z_up}
    negative = output_bias(_sums([-1.0, 0.0], [-1.0, -1.0]), torch.float16)
    assert (negative.mean, negative.mean_up) == (-0.5, 0.5)
    constant = output_bias(_sums([-0.5] * 4), torch.bfloat16)
    assert constant.z == -math.inf and output_bias(_sums([0.0] * 4), torch.bfloat16).z == 0.0


def test_an_fp32_output_or_a_single_element_has_no_bias():
    assert output_bias(_sums([-1.0, 0.0]), torch.float32) is None
    assert output_bias(_sums([-1.0, math.nan]), torch.bfloat16) is None
    assert not is_biased(None)


def test_is_biased_needs_both_the_quarter_ulp_floor_and_z():
    assert is_biased(OutputBias("bf16", 1000, -0.3, -20.0))
    assert not is_biased(OutputBias("bf16", 1000, -0.3, -20.0), OutputBias("bf16", 1000, -0.1, -5.0))  # 0.2 off
    # toward +inf alone (mixed signs: along the values it cancels)
    assert is_biased(OutputBias("bf16", 1000, 0.01, 0.5, 0, -0.3, -20.0))
    assert not is_biased(OutputBias("bf16", 1000, 0.01, 0.5, 0, -0.3, -20.0),
                         OutputBias("bf16", 1000, 0.0, 0.0, 0, -0.1, -5.0))
    assert not is_biased(OutputBias("bf16", 10, -0.3, -7.9))
    assert not is_biased(OutputBias("bf16", 10**6, -0.2, -200.0))


def test_bias_message_names_the_direction_and_the_baseline():
    toward = bias_message("y", OutputBias("bf16", 100, -0.5, -30.0, 12), OutputBias("bf16", 100, 0.001, 0.1, 3))
    assert toward.startswith("y stored with a bias: mean signed error -0.500 ulp of bf16 over 100 elements")
    assert "baseline's +0.001" in toward and "rounded toward zero" in toward
    away = bias_message("y", OutputBias("fp16", 100, 0.5, 30.0))
    # errors of a few ulps one way, clipped to about 1: no rounding averages that, the computation errs; and where
    # half of y errs so (a scale off in some chunks), its mean may be a rounding's but its share past an ulp is not
    baseline = OutputBias("bf16", 100, -0.01, -0.5, 4)
    scaled = bias_message("y", OutputBias("bf16", 100, 0.98, 300.0, 97), baseline)
    assert scaled.startswith("y errs one way: mean signed error +0.980") and "computation errs away from zero" in scaled
    half = bias_message("y", OutputBias("bf16", 100, 0.46, 40.0, 47), baseline)
    assert half.startswith("y errs one way") and "47% of them by more than an ulp (the baseline's 4%)" in half
    assert "rounded away from zero" in away and "baseline" not in away
    down = bias_message("y", OutputBias("bf16", 100, 0.01, 0.2, 12, -0.49, -30.0), OutputBias("bf16", 100, 0.0, 0.0, 3))
    assert down == ("y stored with a bias: mean error signed toward +inf -0.490 ulp of bf16 over 100 elements (z -30.0; "
                    "the same-precision baseline's +0.000): rounded toward -inf, not to nearest")


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(NARROW), st.integers(0, 2**31 - 1))
def test_stores_to_nearest_are_unbiased_and_stores_toward_or_away_from_zero_biased(dtype, seed):
    exact = _exact(seed)
    nearest = _bias(exact, dtype, "nearest")
    assert abs(nearest.mean) < 0.05 and not is_biased(nearest)
    assert abs(nearest.mean_up) < 0.05
    toward, away = _bias(exact, dtype, "toward zero"), _bias(exact, dtype, "away from zero")
    assert toward.mean == pytest.approx(-0.5, abs=0.05) and is_biased(toward, nearest)
    assert away.mean == pytest.approx(0.5, abs=0.05) and is_biased(away, nearest)
    # Down whatever the sign: along values of either sign (as many of each) it cancels; toward +inf it is -1/2.
    down = _bias(exact, dtype, "toward -inf")
    assert abs(down.mean) < 0.05 and down.mean_up == pytest.approx(-0.5, abs=0.05) and is_biased(down, nearest)
    assert "rounded toward -inf, not to nearest" in bias_message("y", down, nearest)


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(NARROW), st.integers(0, 2**31 - 1), st.lists(st.integers(1, ELEMENTS - 1), max_size=5))
def test_bias_sum_over_segments_equals_one_pass(dtype, seed, cuts):
    exact = _exact(seed)
    stored = _stored(exact, dtype, "toward zero")
    bounds = [0, *sorted(set(cuts)), ELEMENTS]
    segments = measure.BiasSum(dtype)
    for start, end in zip(bounds, bounds[1:]):
        segments.add(stored[start:end], exact[start:end])
    whole = measure.BiasSum(dtype).add(stored, exact).bias()
    assert segments.sums.dtype == torch.float64 and segments.sums.device == stored.device
    split = segments.bias()
    assert (split.dtype, split.count) == (whole.dtype, whole.count)
    assert split.mean == pytest.approx(whole.mean, rel=1e-12) and split.z == pytest.approx(whole.z, rel=1e-9)


def test_bias_sum_of_an_fp32_output_is_none():
    exact = _exact(0)
    assert measure.BiasSum(torch.float32).add(exact.float(), exact).bias() is None


def _comparison(y_bias: OutputBias | None, rel: float = 1e-3, states_bias: OutputBias | None = None) -> Comparison:
    stats = ErrorStats(rel, rel, (0, 0, 0, 0))
    return Comparison(stats, stats, y_bias=y_bias, states_bias=states_bias)


TOWARD = OutputBias("bf16", 25600, -0.47, -180.0)
NEAREST = OutputBias("bf16", 25600, 0.002, 0.6)


def test_judge_fails_a_biased_y_within_tolerance_and_adds_the_clause_to_failed_ones():
    tolerance = Tolerance()
    alone = judge(_comparison(TOWARD), _comparison(NEAREST), None, tolerance)
    assert alone.status is Status.FAIL and alone.message == bias_message("y", TOWARD, NEAREST)
    assert not alone.over_limit  # no question of precision: the run names no reduced precision for it
    both = judge(_comparison(TOWARD, rel=1e-2), _comparison(NEAREST), None, tolerance)
    assert both.message.startswith("y error") and both.message.endswith("; " + alone.message) and both.over_limit
    assert judge(_comparison(NEAREST), _comparison(NEAREST), None, tolerance).status is Status.PASS
    assert judge(_comparison(None), _comparison(None), None, tolerance).status is Status.PASS  # fp32 y


def test_judge_fails_biased_final_states_naming_the_declared_rounding():
    tolerance = Tolerance()
    for rounding, declared in (("nearest", "not to nearest"), ("stochastic", "not stochastically")):
        verdict = judge(_comparison(None, states_bias=TOWARD), _comparison(None, states_bias=NEAREST), None, tolerance,
                        rounding=rounding)
        assert verdict.status is Status.FAIL and not verdict.over_limit
        assert verdict.message == bias_message("final states", TOWARD, NEAREST, rounding)
        assert verdict.message.startswith("final states stored with a bias") and verdict.message.endswith(declared)
    # y's clause and the states' both, y's first; unbiased states pass
    both = judge(_comparison(TOWARD, states_bias=TOWARD), _comparison(NEAREST, states_bias=NEAREST), None, tolerance)
    assert both.message.startswith("y stored with a bias") and "; final states stored with a bias" in both.message
    assert judge(_comparison(None, states_bias=NEAREST), _comparison(None, states_bias=NEAREST), None,
                 tolerance).status is Status.PASS


def test_a_kernel_storing_its_final_states_toward_zero_fails_on_their_bias(tmp_path):
    """The planted kernel's bf16 and fp16 final states (from fp16 inputs) fail on their bias, the fp16 ones on it alone
    (within the norm-wise rule; the bf16 ones exceed it by 0.3%, by chance); fp32 states, stored as computed, pass and
    have no bias figure. y is the baseline's: no y clause."""
    _, report = invoke("scan", "--kernel", f"{BROKEN}:final_states_stored_toward_zero", "--regime", "ragged",
                       "--dtype", "fp16", "--state-dtype", "fp32,bf16,fp16", "--seqlen", "100", "--chunk-size", "32",
                       "--batch", "3", "--nheads", "4", "--headdim", "16", "--dstate", "16", "--ngroups", "2",
                       json_path=tmp_path / "s.json")
    by_dtype = {c["params"]["state_dtype"]: c for c in report["cases"]}
    assert by_dtype["fp32"]["status"] == "pass" and by_dtype["fp32"]["error"]["state_bias"] is None
    for dtype in ("bf16", "fp16"):
        case = by_dtype[dtype]
        assert case["status"] == "fail" and "final states stored with a bias" in case["message"], case["message"]
        assert "rounded toward zero, not to nearest" in case["message"] and "y stored" not in case["message"]
        kernel, base = case["error"]["state_bias"], case["error"]["baseline_state_bias"]
        assert kernel["dtype"] == base["dtype"] == dtype and kernel["mean_ulp"] < -0.25 and abs(base["mean_ulp"]) < 0.1
    alone = by_dtype["fp16"]
    assert alone["message"].startswith("final states stored with a bias") and alone["error"]["precision"] is None


def test_a_kernel_storing_y_toward_zero_fails_on_its_bias_alone(tmp_path):
    """At tiny widths the planted kernel's bf16 and fp16 y pass the norm-wise rule and fail on their bias; its fp32 y,
    stored as computed, passes."""
    _, report = invoke("scan", "--kernel", f"{BROKEN}:y_stored_toward_zero", "--regime", "normal",
                       "--dtype", "fp32,bf16,fp16", "--seqlen", "64", "--chunk-size", "16", "--batch", "2",
                       "--nheads", "2", "--headdim", "16", "--dstate", "8", "--ngroups", "1",
                       json_path=tmp_path / "b.json")
    by_dtype = {c["params"]["dtype"]: c for c in report["cases"]}
    assert by_dtype["fp32"]["status"] == "pass" and by_dtype["fp32"]["error"]["y_bias"] is None
    for dtype in ("bf16", "fp16"):
        case = by_dtype[dtype]
        assert case["status"] == "fail" and case["message"].startswith("y stored with a bias"), case["message"]
        assert case["error"]["y_bias"]["mean_ulp"] < -0.25 and abs(case["error"]["baseline_y_bias"]["mean_ulp"]) < 0.1
        assert "closest to" not in case["message"] and case["error"]["precision"] is None  # a bias, not a precision
