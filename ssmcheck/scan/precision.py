"""What precision a failing kernel's error matches (DESIGN §3): TF32 matmuls, fp16/bf16 state
storage, fp16 accumulation, or none of them (a bug).

The kernel's norm-wise relative errors of y and of the states are compared with those of
same-precision baselines (ops/chunk_scan/baseline.py) run at each reduced precision on the
same inputs, and with the case's own baseline:

- "tf32 matmuls": matmul operands truncated to 10 fraction bits, as tensor cores read them (fp32 inputs only; for fp16/bf16
  inputs it is the baseline itself);
- "fp16 state storage", "bf16 state storage": states stored in that format (only a format with
  fewer fraction bits than the case's storage: a finer one cannot explain an error above the
  case's own baseline);
- "fp16 accumulation": fp16 matmul accumulators and fp16 elementwise work, cumulative
  log-decays included (fp32 and fp16 inputs);
- "the baseline's": the case's own baseline (x.dtype operands, fp32 accumulation, the case's
  storage); a failing kernel closest to it is only somewhat less accurate than a straightforward
  implementation in its dtype, not at a reduced precision.

Every candidate keeps the case's storage and rounding except the storage candidates. With
--allow-tf32 an fp32 case's own baseline is the TF32 one (`judged_baseline_options`): the
candidates keep TF32 operands and "tf32 matmuls" is no candidate.

Closeness rule (`closest`): errors below ERROR_FLOOR count as ERROR_FLOOR. A candidate explains
the kernel when the kernel's y error and its states error are each within a factor FACTOR (4)
of the candidate's, i.e. |ln(kernel / candidate)| <= ln 4 for both outputs; a precision
choice degrades both (TF32 and fp16 accumulation every matmul, storage every state), so an
error in one output that the other does not show is not that choice. Among the candidates
that explain it, the closest is the one with the smallest sum of the squared log ratios of
the two outputs, except that one in place (below) comes before any that is not; the ratio
reported is kernel / candidate for y. When the case's own baseline
is in the list, a candidate within DISTINCT (2x) of it in both outputs is dropped: it is no
precision one can tell apart (fp16 state storage for fp16 inputs, whose states error is only
about sqrt 2 times the baseline's, cannot explain a failure). A kernel error far above
every candidate (a 1% error in one chunk, a wrong decay) or non-finite matches none: it is
unexplained. Candidates with non-finite errors (an fp16 accumulator overflowing) explain
nothing. Precisions whose baselines make the same error cannot be told apart: on fp32 inputs
an fp16 matmul accumulator with fp32 decays errs like TF32 and is named TF32.

Size is not place (`in_place`): a bug can err by chance as much as a reduced precision does. A
kernel that rounds where a candidate rounds, on nearly the same values, lands near that
candidate's output: nearer it than the reference (`apart`, ||candidate - kernel|| / ||kernel -
reference||, below 1 in y and in the states). Errors of one size independent of each other lie
about sqrt 2 apart. So a match in size whose output is at least as far from the candidate's as
from the reference is reported as one of size only ("errs as much as ... but not where it rounds"):
a bug of that size, or that precision at other points (another chunking) or in another order
(accumulation order moves fp16 sums' roundings).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ssmcheck.core.formats import FORMATS
from ssmcheck.ops.chunk_scan.baseline import TF32_BITS, baseline_stream
from ssmcheck.ops.chunk_scan.naive import SSDStream
from ssmcheck.scan.inputs import ScanInputs
from ssmcheck.scan.spec import ScanCase

TF32 = "tf32 matmuls"
FP16_STORAGE = "fp16 state storage"
BF16_STORAGE = "bf16 state storage"
FP16_ACCUMULATION = "fp16 accumulation"
BASELINE = "the baseline's"

FACTOR = 4.0  # a candidate explains a kernel error within this factor of its own, in y and in the states
DISTINCT = 2.0  # a candidate within this factor of the case's own baseline in both outputs is not told apart
ERROR_FLOOR = 1e-12  # relative errors below this are this (an exact output has log error -inf)

# name -> (what the message calls it, what it calls the baseline the ratio is to)
_WORDS = {
    TF32: ("TF32 matmuls", "a TF32 baseline"),
    FP16_STORAGE: ("fp16 state storage", "a baseline storing fp16 states"),
    BF16_STORAGE: ("bf16 state storage", "a baseline storing bf16 states"),
    FP16_ACCUMULATION: ("fp16 accumulation", "a baseline accumulating in fp16"),
}


@dataclass(frozen=True)
class Precision:
    name: str  # TF32, FP16_STORAGE, BF16_STORAGE, FP16_ACCUMULATION or BASELINE
    y_rel: float  # that baseline's norm-wise relative y error against the float64 reference
    states_rel: float  # the same for its states
    # ||this baseline's output - the kernel's|| / ||the kernel's - the reference's||, y and states (None: not
    # measured, as for the case's own baseline, or the kernel's output exact)
    y_apart: float | None = None
    states_apart: float | None = None


def _options(inputs: ScanInputs, storage: torch.dtype, allow_tf32: bool) -> dict[str, dict]:
    """The scan_baseline keywords of each candidate that differs from the case's own baseline."""
    options = {}
    if inputs.x.dtype == torch.float32 and not allow_tf32:
        options[TF32] = dict(matmul_operand_bits=TF32_BITS)
    bits = FORMATS[storage].mantissa_bits if storage in FORMATS else 52
    for name, dtype in ((FP16_STORAGE, torch.float16), (BF16_STORAGE, torch.bfloat16)):
        if FORMATS[dtype].mantissa_bits < bits:
            options[name] = dict(state_dtype=dtype)
    if inputs.x.dtype in (torch.float32, torch.float16):
        options[FP16_ACCUMULATION] = dict(accumulate=torch.float16)
    return options


def candidate_baselines(inputs: ScanInputs, case: ScanCase, storage: torch.dtype, *, allow_tf32: bool = False
                        ) -> dict[str, SSDStream]:
    """name -> the stream (ops/chunk_scan/naive.py's SSDStream) of each reduced-precision baseline (see
    the module docstring for which).

    Each is the case's own baseline changed in one respect: scan_baseline on the case's inputs
    with the case's chunk size, rounding and seed and `storage` (the dtype the case's states are
    judged as stored in); with allow_tf32, fp32 cases are judged against TF32, so every candidate
    keeps TF32 operands and there is no TF32 candidate.
    """
    judged = judged_baseline_options(inputs, allow_tf32)
    results = {}
    for name, changed in _options(inputs, storage, allow_tf32).items():
        kw = dict(state_dtype=storage, rounding=case.rounding, seed=case.seed) | judged | changed
        results[name] = baseline_stream(inputs.x, inputs.dt, inputs.A, inputs.B, inputs.C, case.chunk_size,
                                        **inputs.kwargs(), **kw)
    return results


def candidate_precisions(inputs: ScanInputs, case: ScanCase, storage: torch.dtype,
                         measured: Callable[[dict[str, SSDStream]], dict[str, tuple[float, float]]],
                         baseline_y_rel: float, baseline_states_rel: float, *, allow_tf32: bool = False
                         ) -> list[Precision]:
    """The case's own baseline (its errors already measured) and every candidate, measured by `measured`:
    streams by name -> (relative error of y, of the states) against the float64 reference, and optionally
    (y apart, states apart) from the kernel's outputs (scan.streamed.relative_errors over the case's segments)."""
    own = Precision(BASELINE, baseline_y_rel, baseline_states_rel)
    errors = measured(candidate_baselines(inputs, case, storage, allow_tf32=allow_tf32))
    return [own, *(Precision(name, *figures) for name, figures in errors.items())]


def _log_ratio(kernel: float, candidate: float) -> float:
    return math.log(max(kernel, ERROR_FLOOR) / max(candidate, ERROR_FLOOR))


def _within(a: Precision, b: Precision, factor: float) -> bool:
    return max(abs(_log_ratio(a.y_rel, b.y_rel)), abs(_log_ratio(a.states_rel, b.states_rel))) <= math.log(factor)


def closest(kernel_y_rel: float, kernel_states_rel: float, precisions: list[Precision],
            factor: float = FACTOR) -> tuple[Precision, float] | None:
    """(the candidate explaining the kernel's errors best, kernel y error / its y error), or None
    when none explains them (the rule is the module docstring's)."""
    if not (math.isfinite(kernel_y_rel) and math.isfinite(kernel_states_rel)):
        return None
    usable = [p for p in precisions if math.isfinite(p.y_rel) and math.isfinite(p.states_rel)]
    own = next((p for p in usable if p.name == BASELINE), None)
    if own is not None:  # a candidate erring like the case's own baseline is no distinct precision
        usable = [p for p in usable if p is own or not _within(p, own, DISTINCT)]
    kernel = Precision("kernel", kernel_y_rel, kernel_states_rel)
    best, best_key = None, (True, math.inf)
    for p in usable:
        if not _within(kernel, p, factor):
            continue
        dy, ds = _log_ratio(kernel_y_rel, p.y_rel), _log_ratio(kernel_states_rel, p.states_rel)
        key = (in_place(p) is not True, dy * dy + ds * ds)  # a candidate in place first, then the nearest in size
        if key < best_key:
            best, best_key = p, key
    if best is None:
        return None
    return best, max(kernel_y_rel, ERROR_FLOOR) / max(best.y_rel, ERROR_FLOOR)


def in_place(precision: Precision) -> bool | None:
    """Whether the kernel's outputs lie nearer this candidate's than the reference in both y and the
    states (the module docstring); None where that was not measured."""
    aparts = (precision.y_apart, precision.states_apart)
    if precision.name == BASELINE or None in aparts:
        return None
    return max(aparts) < 1


def describe(found: tuple[Precision, float] | None, factor: float = FACTOR) -> str:
    """'consistent with TF32 matmuls (ratio 1.1 to a TF32 baseline)', or what the baseline's or no
    match means; a match in size only says so ('errs as much as bf16 state storage ... but not where it
    rounds: ...')."""
    if found is None:
        return (f"unexplained by reduced precision: no TF32, fp16/bf16 state storage or fp16 accumulation "
                f"baseline comes within {factor:g}x of both errors")
    precision, ratio = found
    if precision.name == BASELINE:
        return f"closest to the same-precision baseline itself (ratio {ratio:.2g}), not to a reduced precision"
    what, baseline = _WORDS[precision.name]
    if in_place(precision) is not False:
        return f"consistent with {what} (ratio {ratio:.2g} to {baseline})"
    output, apart = max((("y lies", precision.y_apart), ("states lie", precision.states_apart)), key=lambda p: p[1])
    return (f"errs as much as {what} (ratio {ratio:.2g} to {baseline}) but not where it rounds: the kernel's "
            f"{output} {apart:.1f}x as far from that baseline's as from the reference (a bug that errs as much, or "
            f"that precision at other points or in another order)")


def as_json(found: tuple[Precision, float] | None, precisions: list[Precision]) -> dict:
    """The report's record: {"closest_precision": name or null, "ratio": kernel / its y error or null,
    "in_place": whether the kernel's outputs lie nearer the closest candidate's than the reference (null:
    no candidate, the baseline itself, or not measured), "description": describe's text,
    "candidates": {name: {"y_rel", "states_rel", "y_apart", "states_apart"}}}."""
    return {
        "closest_precision": found[0].name if found else None,
        "ratio": found[1] if found else None,
        "in_place": in_place(found[0]) if found else None,
        "description": describe(found),
        "candidates": {p.name: {"y_rel": p.y_rel, "states_rel": p.states_rel, "y_apart": p.y_apart,
                                "states_apart": p.states_apart} for p in precisions},
    }


def judged_baseline_options(inputs: ScanInputs, allow_tf32: bool) -> dict:
    """scan_baseline keywords of the baseline a case is judged against: with --allow-tf32, fp32
    inputs are judged against the TF32 baseline (operands truncated to 10 bits on every device)."""
    return dict(matmul_operand_bits=TF32_BITS) if allow_tf32 and inputs.x.dtype == torch.float32 else {}

