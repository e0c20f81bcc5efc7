"""Running one scan case: inputs, kernel, float64 reference and same-precision baseline, measurements, verdict."""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import torch

from ssmcheck import measure
from ssmcheck.measure import ErrorStats, NonfiniteLocation
from ssmcheck.report import tolerance_rule
from ssmcheck.regimes import REGIMES, ScanInputs
from ssmcheck.scan_kernels import KernelUnderTest, call
from ssmcheck.scan_spec import DTYPES, ScanCase
from ssmcheck.verdict import Status, Tolerance, tolerance_limit, within_tolerance

# Beyond this many tokens per row the float64 reference uses the chunked form
# (tested against the sequential one to ~1e-12) instead of a Python loop over time.
SEQUENTIAL_REFERENCE_MAX_TOKENS = 8192
REFERENCE_CHUNK = 128


@dataclass(frozen=True)
class Comparison:
    """Errors of one implementation (kernel or baseline) against the reference."""

    y: ErrorStats
    states: ErrorStats


@dataclass
class CaseResult:
    case: ScanCase
    status: Status
    message: str = ""
    seconds: float = 0.0  # the whole case: inputs, kernel, reference, baseline, measurements
    kernel_seconds: float | None = None
    inputs_note: str = ""
    kernel: Comparison | None = None
    baseline: Comparison | None = None
    limits: tuple[float, float] | None = None  # the largest accepted (y, states) errors
    first_nonfinite: NonfiniteLocation | None = None  # in y, else in the final states
    first_nonfinite_state: NonfiniteLocation | None = None
    per_chunk: list[float] = field(default_factory=list)
    growth: float | None = None

    @property
    def ratio(self) -> float | None:
        """Kernel error over baseline error, for y."""
        return _ratio(self.kernel.y.rel, self.baseline.y.rel) if self.kernel and self.baseline else None

    @property
    def state_ratio(self) -> float | None:
        return _ratio(self.kernel.states.rel, self.baseline.states.rel) if self.kernel and self.baseline else None


def _ratio(error: float, baseline: float) -> float:
    if baseline > 0:
        return error / baseline
    return 0.0 if error == 0 else float("inf")


def reference(inputs: ScanInputs, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, states) of the sequential recurrence in float64 ("fp64") or float32 ("fp32")."""
    from ssmcheck.ops.chunk_scan import naive  # noqa: PLC0415

    args = (inputs.x, inputs.dt, inputs.A, inputs.B, inputs.C)
    if kind == "fp64" and inputs.x.shape[1] > SEQUENTIAL_REFERENCE_MAX_TOKENS:
        out = naive.scan_chunked(*args, REFERENCE_CHUNK, **inputs.kwargs())
    else:
        dtype = torch.float64 if kind == "fp64" else torch.float32
        out = naive.scan_recurrent(*args, **inputs.kwargs(), dtype=dtype)
    return out.y, (out.varlen_states if inputs.varlen else out.final_states)


def baseline(inputs: ScanInputs, case: ScanCase) -> tuple[torch.Tensor, torch.Tensor]:
    from ssmcheck.ops.chunk_scan import naive  # noqa: PLC0415

    out = naive.scan_baseline(
        inputs.x, inputs.dt, inputs.A, inputs.B, inputs.C, case.chunk_size, **inputs.kwargs(),
        state_dtype=DTYPES[case.state_dtype], rounding=case.rounding, seed=case.seed,
    )
    return out.y, (out.varlen_states if inputs.varlen else out.final_states)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_case(case: ScanCase, kernel: KernelUnderTest, tolerance: Tolerance, reference_kind: str,
             device: str) -> CaseResult:
    if case.skip_reason:
        return CaseResult(case, Status.SKIPPED, case.skip_reason)
    if not kernel.takes_state_options and (case.state_dtype, case.rounding) != ("fp32", "nearest"):
        return CaseResult(
            case, Status.SKIPPED,
            f"{kernel.name} takes no state_dtype/rounding/seed keywords, so it cannot store "
            f"{case.state_dtype} states with {case.rounding} rounding",
        )
    start = time.perf_counter()
    result = _run(case, kernel, tolerance, reference_kind, device)
    result.seconds = time.perf_counter() - start
    return result


def _run(case, kernel, tolerance, reference_kind, device) -> CaseResult:
    try:
        inputs = REGIMES[case.regime].generate(
            case.shape(), DTYPES[case.dtype], case.seed, state_dtype=DTYPES[case.state_dtype]
        ).to(device)
        ref = reference(inputs, reference_kind)
        base = baseline(inputs, case)
    except Exception as exc:  # noqa: BLE001 (a bug on our side is still one case's outcome)
        return CaseResult(case, Status.ERROR, f"setting up the case raised {_describe(exc)}")

    torch.manual_seed(case.seed)  # for kernels that draw random bits from torch's generator
    _sync(device)
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            # numpy's warnings from Triton's interpreter (e.g. exp overflow in masked lanes) say
            # nothing about the results, which are judged below.
            warnings.simplefilter("ignore", RuntimeWarning)
            out = call(kernel, inputs, case.chunk_size, DTYPES[case.state_dtype], case.rounding, case.seed)
            _sync(device)
    except Exception as exc:  # noqa: BLE001 (any failure of the kernel is this case's verdict)
        return CaseResult(case, Status.ERROR, _describe(exc), inputs_note=inputs.note)
    kernel_seconds = time.perf_counter() - start

    tokens = inputs.token_map()
    result = CaseResult(
        case, Status.PASS, kernel_seconds=kernel_seconds, inputs_note=inputs.note,
        kernel=Comparison(measure.error_stats(out[0], ref[0]), measure.error_stats(out[1], ref[1])),
        baseline=Comparison(measure.error_stats(base[0], ref[0]), measure.error_stats(base[1], ref[1])),
        first_nonfinite_state=measure.locate_nonfinite_states(out[1], ref[1], inputs),
        per_chunk=measure.per_chunk_error(out[0], ref[0], tokens, case.chunk_size),
    )
    result.first_nonfinite = (
        measure.locate_nonfinite_y(out[0], ref[0], tokens, case.chunk_size, inputs) or result.first_nonfinite_state
    )
    result.growth = measure.growth(result.per_chunk)
    result.status, result.message = _verdict(result, tolerance)
    return result


def _verdict(result: CaseResult, tolerance: Tolerance) -> tuple[Status, str]:
    where = result.first_nonfinite
    if where is not None:
        return Status.NONFINITE, _nonfinite_message(where)
    outputs = (("y", result.kernel.y.rel, result.baseline.y.rel),
               ("states", result.kernel.states.rel, result.baseline.states.rel))
    if tolerance.rtol is None:
        for name, _, base in outputs:
            if not base < float("inf"):
                return Status.ERROR, f"cannot judge: the same-precision baseline's {name} is non-finite"
    result.limits = tuple(
        tolerance_limit(base, tolerance.tol_factor, tolerance.floor, tolerance.rtol) for _, _, base in outputs
    )
    failed = [
        f"{name} error {err:.3g} > limit {limit:.3g}"
        for (name, err, base), limit in zip(outputs, result.limits)
        if not within_tolerance(err, base, tolerance.tol_factor, tolerance.floor, tolerance.rtol)
    ]
    if failed:
        return Status.FAIL, "; ".join(failed) + f" ({tolerance_rule(tolerance)})"
    return Status.PASS, ""


def _nonfinite_message(where: NonfiniteLocation) -> str:
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
