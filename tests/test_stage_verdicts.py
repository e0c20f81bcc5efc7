"""The verdict stages of both commands, as pure functions of measurements: no kernel runs here."""

from __future__ import annotations

import math

import torch

from ssmcheck.core.status import Status
from ssmcheck.core.tolerance import Tolerance
from ssmcheck.drift.results import Checkpoint, DriftRun, NonfiniteStep
from ssmcheck.drift.spec import build_cases as drift_cases
from ssmcheck.drift.spec import resolve as drift_settings
from ssmcheck.drift.stats import SignedErrorMoments, error_sums
from ssmcheck.drift.verdict import judge as judge_drift
from ssmcheck.scan.results import Comparison, ErrorStats, NonfiniteToken
from ssmcheck.scan.verdict import judge as judge_scan


def _comparison(y: float, states: float) -> Comparison:
    return Comparison(ErrorStats(y, 0.0, (0,)), ErrorStats(states, 0.0, (0,)))


BASELINE = _comparison(1e-3, 2e-3)


def test_scan_passes_within_factor_times_baseline_plus_floor():
    verdict = judge_scan(_comparison(2.0e-3, 4.0e-3), BASELINE, None, Tolerance())
    assert verdict.status is Status.PASS and verdict.message == ""
    assert verdict.limits == (2e-3 + 1e-5, 4e-3 + 1e-5)


def test_scan_fails_naming_each_output_beyond_its_limit_and_the_rule():
    verdict = judge_scan(_comparison(3e-3, 1e-3), BASELINE, None, Tolerance())
    assert verdict.status is Status.FAIL
    assert verdict.message == "y error 0.003 > limit 0.00201 (2 x baseline + 1e-05)"
    both = judge_scan(_comparison(3e-3, 9e-3), BASELINE, None, Tolerance(rtol=1e-3))
    assert both.message == "y error 0.003 > limit 0.001; states error 0.009 > limit 0.001 (rtol 0.001)"


def test_scan_nonfinite_wins_and_says_where_it_started():
    where = NonfiniteToken("y", sequence=1, token=70, chunk=1, head=2, channel=3, state_index=None, count=40,
                           tokens=10, chunks=1, inputs_finite=True)
    verdict = judge_scan(_comparison(math.nan, 1e-3), BASELINE, where, Tolerance())
    assert verdict.status is Status.NONFINITE
    assert verdict.message.startswith("y non-finite from sequence 1 token 70 (chunk 1) head 2 channel 3, inputs finite")


def test_scan_cannot_judge_against_a_nonfinite_baseline_unless_rtol():
    broken = _comparison(math.inf, 1e-3)
    assert judge_scan(_comparison(1e-3, 1e-3), broken, None, Tolerance()).status is Status.ERROR
    assert judge_scan(_comparison(1e-3, 1e-3), broken, None, Tolerance(rtol=1e-2)).status is Status.PASS


def _drift_case(rounding="nearest"):
    settings = drift_settings({"regime": "normal", "state_dtype": "fp16", "rounding": rounding, "steps": 4}, {}, "t")
    return drift_cases(settings, "k")[0]


def _run(errors, baseline, first_nonfinite=None, store_errors=None, step_out=(0.0, 0.0)) -> DriftRun:
    """Checkpoints at steps 1, 2, 4, 8 whose state and output errors are `errors` (the baseline's `baseline`), and
    whose outputs err by step_out's (kernel, baseline) against the exact step from their own states."""
    steps = [1, 2, 4, 8]
    return DriftRun(
        checkpoints=[Checkpoint(s, e, e, 0.0, step_out[0]) for s, e in zip(steps, errors)],
        baseline=[Checkpoint(s, b, b, 0.0, step_out[1]) for s, b in zip(steps, baseline)],
        store_errors=store_errors or SignedErrorMoments(), first_nonfinite=first_nonfinite, trials=1,
    )


def test_drift_passes_when_tracking_its_baseline_and_fails_where_it_leaves_it():
    base = [1e-3, 2e-3, 3e-3, 4e-3]
    ok = judge_drift(_drift_case(), _run([1e-3, 2e-3, 3e-3, 4e-3], base), Tolerance())
    assert ok.status is Status.PASS and ok.ratio == 1.0
    bad = judge_drift(_drift_case(), _run([1e-3, 2e-3, 3e-3, 5e-2], base), Tolerance())
    assert bad.status is Status.FAIL and "state drift 5.00e-02 > limit 8.01e-03 at step 8" in bad.message
    assert bad.crossing_step == 8 and bad.crossing_observed


def test_drift_fails_an_output_beyond_the_rule_against_the_exact_step_from_its_own_state():
    """An output whose own arithmetic errs (C·h of the rounded state, a gate in half precision) while its state
    tracks the baseline, and whose error against the reference hides within the drift's: judged against the exact
    output of its own state's step, by the tolerance rule against the baseline's (its rounding into the output
    dtype)."""
    base = [1e-3, 2e-3, 3e-3, 4e-3]
    fine = judge_drift(_drift_case(), _run(base, base, step_out=(2e-5, 1e-5)), Tolerance())
    assert fine.status is Status.PASS  # within 2 x 1e-5 + 1e-5
    bad = judge_drift(_drift_case(), _run(base, base, step_out=(1e-3, 1e-8)), Tolerance())
    assert bad.status is Status.FAIL
    assert bad.message == ("output error 1.00e-03 > limit 1.00e-05 against the exact output of the step from its own "
                           "state (rms over checkpoints): the output's own arithmetic, not the drift")


def test_drift_nonfinite_names_step_trial_and_element():
    where = NonfiniteStep("state", step=3, trial=1, batch=0, head=2, channel=5, state_index=7)
    verdict = judge_drift(_drift_case(), _run([1e-3] * 4, [1e-3] * 4, where), Tolerance())
    assert verdict.status is Status.NONFINITE
    assert verdict.message == "non-finite state at step 3 (trial 1, batch 0, head 2, channel 5, state index 7)"


def test_drift_bias_is_judged_for_stochastic_rounding_only():
    biased = SignedErrorMoments()
    errors = torch.full((10_000,), -0.25) + 0.01 * torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    biased.running(errors.device)[:3].add_(error_sums(errors))  # as a step adds its stores' errors
    base = [1e-3] * 4
    sr = judge_drift(_drift_case("stochastic"), _run(base, base, store_errors=biased), Tolerance())
    assert sr.status is Status.FAIL and sr.message.startswith("biased: mean rounding error -0.25 ulp per store")
    rn = judge_drift(_drift_case("nearest"), _run(base, base, store_errors=biased), Tolerance())
    assert rn.status is Status.PASS


def test_drift_stores_off_by_more_than_an_ulp_are_a_computation_error_not_a_rounding_bias():
    """A stochastic rounding errs by less than an ulp per store: stores 1.4 ulp off on average (a wrong parameter)
    are named as another value computed, not as a biased rounding."""
    off = SignedErrorMoments()
    errors = torch.full((10_000,), -1.37) + 0.3 * torch.randn(10_000, generator=torch.Generator().manual_seed(1))
    off.running(errors.device)[:3].add_(error_sums(errors))
    base = [1e-3] * 4
    verdict = judge_drift(_drift_case("stochastic"), _run(base, base, store_errors=off), Tolerance())
    assert verdict.status is Status.FAIL
    assert verdict.message.startswith("stores off by more than a rounding: mean error -1.37 ulp, rms 1.4")
    assert "biased" not in verdict.message
