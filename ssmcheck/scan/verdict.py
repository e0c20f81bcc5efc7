"""The verdict on one scan case: a pure function of its measurements and the tolerance rule.

- nonfinite: the kernel's y or final states hold NaN/Inf where the reference is finite;
- error: the same-precision baseline itself is non-finite, so the rule cannot judge;
- fail: y or the states exceed tol_factor x the baseline's error + floor (or --rtol);
- pass otherwise.
"""

from __future__ import annotations

from ssmcheck.core.status import Status
from ssmcheck.core.tolerance import Tolerance, tolerance_limit, tolerance_rule, within_tolerance
from ssmcheck.scan.results import Comparison, NonfiniteToken, ScanVerdict


def judge(kernel: Comparison, baseline: Comparison, first_nonfinite: NonfiniteToken | None,
          tolerance: Tolerance) -> ScanVerdict:
    if first_nonfinite is not None:
        return ScanVerdict(Status.NONFINITE, nonfinite_message(first_nonfinite))
    outputs = (("y", kernel.y.rel, baseline.y.rel), ("states", kernel.states.rel, baseline.states.rel))
    if tolerance.rtol is None:
        for name, _, base in outputs:
            if not base < float("inf"):
                return ScanVerdict(Status.ERROR, f"cannot judge: the same-precision baseline's {name} is non-finite")
    rule = (tolerance.tol_factor, tolerance.floor, tolerance.rtol)
    limits = tuple(tolerance_limit(base, *rule) for _, _, base in outputs)
    failed = [
        f"{name} error {err:.3g} > limit {limit:.3g}"
        for (name, err, base), limit in zip(outputs, limits)
        if not within_tolerance(err, base, *rule)
    ]
    if failed:
        return ScanVerdict(Status.FAIL, "; ".join(failed) + f" ({tolerance_rule(tolerance)})", limits)
    return ScanVerdict(Status.PASS, "", limits)


def nonfinite_message(where: NonfiniteToken) -> str:
    inputs = "inputs finite" if where.inputs_finite else "inputs NOT finite"
    if where.output == "y":
        return (
            f"y non-finite from sequence {where.sequence} token {where.token} (chunk {where.chunk}) head "
            f"{where.head} channel {where.channel}, {inputs}; spread: {where.count} elements, "
            f"{where.tokens} tokens, {where.chunks} chunks"
        )
    return (
        f"final state non-finite at sequence {where.sequence} head {where.head} channel {where.channel} "
        f"state {where.state_index}, {inputs}; {where.count} elements"
    )
