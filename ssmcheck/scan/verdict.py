"""The verdict on one scan case: a pure function of its measurements and the tolerance rule.

- nonfinite: the kernel's y or final states hold NaN/Inf where the reference is finite;
- error: the same-precision baseline itself is non-finite, so the rule cannot judge;
- fail: with --repeat, runs on identical inputs that differ bit for bit (unless the kernel is
  declared nondeterministic: its spread is then judged like an error); or one judged figure exceeds tol_factor x the baseline's same figure + floor (or --rtol):
  y over the whole output, the final states, y in its worst (sequence, chunk, head) group against
  the baseline's worst group, and the SSM part C·h alone (without D·x, before the z gate: a call without D, z
  and the return flags, so initial states used only when states are asked for fail there too). One
  global figure averages a local error away: a 2% error in a partial last chunk, or a 1% error in
  C·h under the larger D·x, passes bf16 cases that way;
- fail also (beside any of the above clauses) where y, stored in fp16 or bf16, is biased: its mean signed error
  (along the values, or toward +inf: a store rounding down whatever the sign cancels along values of both signs)
  more than a quarter ulp from the baseline's at |z| > 8 (core.output_bias). A store toward zero errs by at most
  one ulp per element, within 2 x the baseline's half ulp, and the norm-wise rule sees it only by chance; and
  where the final states, stored in fp16 or bf16 (--state-dtype), are biased by the same rule: the state a
  prefill leaves in the cache, from which every decode step goes on (a store toward zero there left the
  norm-wise error within 1.02x the baseline's, whose own arithmetic errs by more);
- pass otherwise.
"""

from __future__ import annotations

from ssmcheck.core.output_bias import bias_clause
from ssmcheck.core.status import Status
from ssmcheck.core.tolerance import Tolerance, tolerance_limit, tolerance_rule, within_tolerance
from ssmcheck.scan.results import SSM_PART_CALL, Comparison, NonfiniteToken, RepeatSpread, ScanVerdict, WorstGroup


def judge(kernel: Comparison, baseline: Comparison, first_nonfinite: NonfiniteToken | None,
          tolerance: Tolerance, worst_group: WorstGroup | None = None, repeat: RepeatSpread | None = None,
          allow_nondeterministic: bool = False, rounding: str = "nearest") -> ScanVerdict:
    """`rounding`: how the case declares its states stored ("nearest" or "stochastic"), as a biased store's clause
    names it."""
    if first_nonfinite is not None:
        return ScanVerdict(Status.NONFINITE, nonfinite_message(first_nonfinite))
    if repeat is not None and not repeat.identical and not allow_nondeterministic:
        return ScanVerdict(Status.FAIL, nondeterminism_message(repeat))
    outputs = [("y", kernel.y.rel, baseline.y.rel), ("states", kernel.states.rel, baseline.states.rel)]
    extra = []
    if worst_group is not None:
        where = f"y in sequence {worst_group.sequence} chunk {worst_group.chunk} head {worst_group.head}"
        extra.append((where, worst_group.rel, worst_group.baseline_rel))
    if kernel.ssm is not None and baseline.ssm is not None:
        extra.append(("SSM part C·h", kernel.ssm.rel, baseline.ssm.rel))
    if repeat is not None and not repeat.identical:  # declared nondeterministic: judged on its spread
        extra.append(("spread of y between runs", repeat.spread_rel, baseline.y.rel))
    if tolerance.rtol is None:
        for name, _, base in outputs + extra:
            if not base < float("inf"):
                return ScanVerdict(Status.ERROR, f"cannot judge: the same-precision baseline's {name} is non-finite")
    rule = (tolerance.tol_factor, tolerance.floor, tolerance.rtol)
    limits = tuple(tolerance_limit(base, *rule) for _, _, base in outputs)
    where = {"states": _states_where(kernel)}
    failed = [
        f"{name} error {err:.3g} > limit {tolerance_limit(base, *rule):.3g}{where.get(name, '')}"
        for name, err, base in outputs + extra
        if not within_tolerance(err, base, *rule)
    ]
    clauses = ["; ".join(failed) + f" ({tolerance_rule(tolerance)})"] if failed else []
    if bias := bias_clause("y", kernel.y_bias, baseline.y_bias):
        clauses.append(bias)
    if bias := bias_clause("final states", kernel.states_bias, baseline.states_bias, rounding):
        clauses.append(bias)
    if clauses:
        return ScanVerdict(Status.FAIL, "; ".join(clauses), limits, over_limit=bool(failed))
    return ScanVerdict(Status.PASS, "", limits)


def _states_where(kernel: Comparison) -> str:
    """Where the final states' largest error is, as y's worst group says where y's is."""
    if len(kernel.states.worst) != 4:  # (sequence, head, channel, state index)
        return ""
    sequence, head, channel, state_index = kernel.states.worst
    return (f" (largest |Δ| {kernel.states.max_abs:.3g} at sequence {sequence} head {head} channel {channel} state "
            f"{state_index})")


def nondeterminism_message(spread: RepeatSpread) -> str:
    at = f"sequence {spread.sequence}" + (f", token {spread.token}" if spread.token is not None else "")
    return (f"nondeterministic: runs 1 and {spread.run} differ in {spread.output} at {at}, head {spread.head} "
            f"(max |Δ| = {spread.max_abs:.3g} over {spread.runs} runs)")


def nonfinite_message(where: NonfiniteToken) -> str:
    inputs = "inputs finite" if where.inputs_finite else "inputs NOT finite"
    if where.output in ("y", "ssm_y"):
        what = "y" if where.output == "y" else f"the SSM part C·h ({SSM_PART_CALL})"
        return (
            f"{what} non-finite from sequence {where.sequence} token {where.token} (chunk {where.chunk}) head "
            f"{where.head} channel {where.channel}, {inputs}; spread: {where.count} elements, "
            f"{where.tokens} tokens, {where.chunks} chunks"
        )
    return (
        f"final state non-finite at sequence {where.sequence} head {where.head} channel {where.channel} "
        f"state {where.state_index}, {inputs}; {where.count} elements"
    )
