"""The verdict on one drift case, and the figures that summarise its drift.

- nonfinite: the kernel's state or output went NaN/Inf where the reference is finite;
- fail: with --repeat, a decode step whose runs from the same state differ bit for bit (unless the
  kernel is declared nondeterministic); stores that flush subnormals to zero (stats.flushes_subnormals: no
  rounding takes a value at or above the smallest subnormal to zero); misrounded stores (stats.store_sums: a store
  farther from the exact update of the kernel's own previous state than half an ulp to nearest, or an ulp
  stochastically, plus what float32 arithmetic explains, is no rounding of it); at some checkpoint the state drift
  exceeds the tolerance (tol_factor x the baseline's drift at that step + floor, or --rtol), or the output error
  pooled over the checkpoints exceeds the same rule against the baseline's, or,
  with stochastic rounding, the stores are biased (stats.is_biased; a bias whose stores err by more than
  an ulp on average, rms, is named a computation error instead: no rounding errs that much; or, where the errors
  along the values cancel, signed toward +inf: stats.leans_up_or_down), or the fp16/bf16
  output is stored with a bias (core.output_bias: its mean signed error at the checkpoints, against the exact
  output of the kernel's own state, a quarter ulp or more from the baseline's), or the output's error against that
  exact output exceeds the tolerance rule against the baseline's (its rounding into the output dtype);
- pass otherwise.
"""

from __future__ import annotations

import math

from ssmcheck.core import outside
from ssmcheck.core.formats import DTYPES, subnormal_range
from ssmcheck.core.output_bias import bias_clause
from ssmcheck.core.status import Status
from ssmcheck.core.tolerance import Tolerance, tolerance_limit, within_tolerance
from ssmcheck.drift.results import DriftRun, DriftVerdict, RepeatDifference, StoreErrors
from ssmcheck.drift.spec import DriftCase
from ssmcheck.drift.stats import crossing_step, flushes_subnormals, growth_exponent, is_biased, leans_up_or_down


def skipped_verdict(reason: str) -> DriftVerdict:
    return DriftVerdict(Status.SKIPPED, reason)


def error_verdict(message: str) -> DriftVerdict:
    return DriftVerdict(Status.ERROR, message)


def _worst_ratio(errors: list[float], baseline: list[float]) -> float | None:
    ratios = []
    for error, base in zip(errors, baseline):
        if not math.isfinite(error):
            ratios.append(math.inf)
        elif base > 0:
            ratios.append(error / base)
        elif error > 0:
            ratios.append(math.inf)
    return max(ratios) if ratios else None


def _rms(values: list[float]) -> float:
    return math.sqrt(sum(v * v for v in values) / len(values)) if values else 0.0


def nondeterminism_message(r: RepeatDifference) -> str:
    where = f"batch {r.batch}, head {r.head}, channel {r.channel}"
    return (f"nondeterministic: runs 1 and {r.run} of trial {r.trial}, step {r.step} differ in {r.output} "
            f"({where}; max |Δ| = {r.max_abs:.3g})")


def misrounded_clause(stores: StoreErrors, rounding: str) -> str:
    """The verdict's clause on stores that no rounding of the exact update of the kernel's own state gives."""
    reach = "half an ulp (to nearest)" if rounding == "nearest" else "an ulp (stochastic rounding: either neighbour)"
    where = ""
    if stores.misrounded_at is not None:
        batch, head, channel = stores.misrounded_at
        where = f"; most in batch {batch}, head {head}, channel {channel}"
    return (f"misrounded: {stores.misrounded} of {stores.count} stores lie farther than {reach} from the exact update "
            f"of the kernel's own previous state, beyond what float32 arithmetic explains{where}")


def judge(case: DriftCase, run: DriftRun, tolerance: Tolerance, allow_nondeterministic: bool = False) -> DriftVerdict:
    rule = {"tol_factor": tolerance.tol_factor, "floor": tolerance.floor, "rtol": tolerance.rtol}
    steps = [c.step for c in run.checkpoints]
    errors = [c.state_rel for c in run.checkpoints]
    baseline = [c.state_rel for c in run.baseline]
    limits = [tolerance_limit(b, **rule) for b in baseline]
    crossing, observed = crossing_step(steps, errors, limits)
    figures = {
        "ratio": _worst_ratio(errors, baseline),
        "growth_exponent": growth_exponent(steps, errors),
        "baseline_growth_exponent": growth_exponent(steps, baseline),
        "bias_z": run.store_errors.z,
        "store_bias_ulp": run.store_errors.mean,
        "bias_resolution_ulp": run.store_errors.resolution if case.rounding == "stochastic" else None,
        "crossing_step": crossing,
        "crossing_observed": observed,
    }

    # A race first: its differing runs are the cause of whatever else looks wrong.
    if run.repeat is not None and not run.repeat.identical and not allow_nondeterministic:
        return DriftVerdict(Status.FAIL, nondeterminism_message(run.repeat), **figures)

    where = run.first_nonfinite
    if where is not None:
        index = f"batch {where.batch}, head {where.head}, channel {where.channel}"
        if where.state_index is not None:
            index += f", state index {where.state_index}"
        message = f"non-finite {where.output} at step {where.step} (trial {where.trial}, {index})"
        if where.unwritten:
            message += ": left unwritten (the NaN ssmcheck filled the out it passed with)"
        if where.reads_outside is not None:
            message += f"; {outside.describe(where.reads_outside)}"
        return DriftVerdict(Status.NONFINITE, message, **figures)

    problems = []
    stores = run.store_errors
    if flushes_subnormals(stores.subnormal, stores.flushed):
        # Named first, and in place of the stores' bias or error size, which the flushed stores explain.
        smallest, normal = subnormal_range(DTYPES[case.state_dtype])
        problems.append(f"flushes subnormals to zero: {stores.flushed} of {stores.subnormal} stores whose exact value "
                        f"lay in {case.state_dtype}'s subnormal range ({smallest:.3g} to {normal:.3g}) were stored "
                        "as 0, which no rounding gives")
    else:
        if stores.misrounded:
            problems.append(misrounded_clause(stores, case.rounding))
        if case.rounding == "stochastic" and is_biased(stores):
            if stores.rms is not None and stores.rms > 1.0:
                # No rounding of the exact value errs by a whole ulp: the step stored another value (a wrong parameter,
                # a missing term), which a bias of the rounding cannot explain (and the misrounded clause names).
                if not stores.misrounded:
                    problems.append(f"stores off by more than a rounding: mean error {stores.mean:+.3g} ulp, rms "
                                    f"{stores.rms:.3g} ulp per store (a rounding errs by less than 1): the step "
                                    "computes another value")
            else:
                problems.append(f"biased: mean rounding error {stores.mean:+.3g} ulp per store (z = {stores.z:.1f})")
        elif case.rounding == "stochastic" and leans_up_or_down(stores):
            toward = "+inf" if stores.mean_up > 0 else "-inf"
            problems.append(f"biased toward {toward}: mean rounding error {stores.mean_up:+.3g} ulp per store signed "
                            f"toward +inf (z = {stores.z_up:.1f}), whatever the value's sign (along the values "
                            f"{stores.mean:+.3g}: it cancels over mixed signs)")
    beyond = [(e / l if l > 0 else math.inf, s, e, l) for s, e, l in zip(steps, errors, limits) if not e <= l]
    if beyond:
        _, step, error, limit = max(beyond)
        problems.append(f"state drift {error:.2e} > limit {limit:.2e} at step {step}")
    if clause := bias_clause("output", run.output_bias, run.baseline_output_bias):
        problems.append(clause)
    out_error = _rms([c.out_rel for c in run.checkpoints])
    out_baseline = _rms([c.out_rel for c in run.baseline])
    if not within_tolerance(out_error, out_baseline, **rule):
        limit = tolerance_limit(out_baseline, **rule)
        problems.append(f"output error {out_error:.2e} > limit {limit:.2e} (rms over checkpoints)")
    # The output against the exact step from the kernel's own previous state: its arithmetic alone (a gate, a skip
    # term or C·h taken at a lower precision, C·h of the rounded state), which the drift before the step hides in
    # the output error above; the baseline's is its output's rounding into the output dtype.
    step_error = _rms([c.step_out_rel for c in run.checkpoints])
    step_baseline = _rms([c.step_out_rel for c in run.baseline])
    if not within_tolerance(step_error, step_baseline, **rule):
        limit = tolerance_limit(step_baseline, **rule)
        problems.append(f"output error {step_error:.2e} > limit {limit:.2e} against the exact output of the step "
                        "from its own state (rms over checkpoints): the output's own arithmetic, not the drift")
    if problems:
        return DriftVerdict(Status.FAIL, "; ".join(problems), **figures)
    return DriftVerdict(Status.PASS, "", **figures)
