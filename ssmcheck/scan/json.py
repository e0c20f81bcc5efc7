"""One scan case as the plain dict of the JSON report (issue #3's stable keys, plus a few more).

Keys are always present; figures a case did not produce (skipped, error) are null.
`y_max_rel` and `state_max_rel` are the norm-wise relative errors ||out - ref|| / ||ref||.
`stdout` is what the kernel printed ("" when nothing).
`error`'s `y_bias` and `baseline_y_bias` (null for fp32 y, and where a case measured none) are {"dtype", "count",
"mean_ulp", "z", "beyond", "mean_up_ulp", "z_up"}: the mean signed error of y (the kernel's, the baseline's) in ulps
of its dtype, negative toward zero, its z statistic, how many elements erred by more than an ulp, and the mean and z
with each error signed toward +inf instead (core.output_bias); `state_bias` and
`baseline_state_bias` the same of the final states (null where they are stored in fp32).
`stages` (with --stages, and for failing cases where the kernel offers its stages; else null) is {"first_wrong":
null | {"stage", "label", "status", "sequence", "chunk", "head"}, "note", "figures": {stage: StageFigure's fields}}
(scan.stages); `repro` the folder of the case's reproducer (--repro), else null.
`error_map` (fail and nonfinite cases only, else null) is {"chunk_size", "tokens", "per_chunk_head"}: the
relative error of y per [chunk][head], each sequence chunked on its own, to 3 significant digits (a colour
map's worth), and the longest sequence's length.
`reads_outside` (nonfinite cases whose call came back non-finite, else null) lists the inputs, by the
storage they share (e.g. [["x"]], [["x", "B", "C", "dt"]] for one fused buffer), whose NaN fences the
non-finite values came from (core.outside); [] when zero fences made the outputs finite but no single
input's NaN fences made them non-finite again; null also when the values are the kernel's own.
`invariance` (with --invariance, else null) is {"batch", "split", "prefill_decode", "cache_write"}: each check's own
status, message and figures (scan.invariance; README, "Serving-shaped checks").
"""

from __future__ import annotations

from dataclasses import asdict

from ssmcheck.core import outside
from ssmcheck.scan.results import Comparison, ScanResult


def case_json(result: ScanResult) -> dict:
    kernel, base = result.kernel, result.baseline
    limits = result.limits or (None, None)
    return {
        "id": result.case.id,
        "status": result.status.value,
        "message": result.message,
        "seconds": round(result.seconds, 4),
        "kernel_seconds": None if result.kernel_seconds is None else round(result.kernel_seconds, 4),
        "warmup_seconds": None if result.warmup_seconds is None else round(result.warmup_seconds, 4),
        "autotune_picks": result.autotune_picks,
        "params": result.case.params(),
        "inputs": result.inputs_note,
        "state_storage": result.state_storage,
        "error": {
            "y_max_rel": kernel.y.rel if kernel else None,
            "y_max_abs": kernel.y.max_abs if kernel else None,
            "y_worst": list(kernel.y.worst) if kernel else None,  # (row, token, head, channel)
            "state_max_rel": kernel.states.rel if kernel else None,
            "state_max_abs": kernel.states.max_abs if kernel else None,
            "state_worst": list(kernel.states.worst) if kernel else None,  # (sequence, head, channel, state index)
            "baseline_y_max_rel": base.y.rel if base else None,
            "baseline_state_max_rel": base.states.rel if base else None,
            "ratio": result.ratio,
            "state_ratio": result.state_ratio,
            "y_limit": limits[0],
            "state_limit": limits[1],
            "y_worst_group": asdict(result.worst_group) if result.worst_group else None,
            "group_ratio": result.group_ratio,
            "ssm_rel": kernel.ssm.rel if kernel and kernel.ssm else None,
            "baseline_ssm_rel": base.ssm.rel if base and base.ssm else None,
            "ssm_ratio": result.ssm_ratio,
            "y_bias": _bias(kernel, "y_bias"),
            "baseline_y_bias": _bias(base, "y_bias"),
            "state_bias": _bias(kernel, "states_bias"),
            "baseline_state_bias": _bias(base, "states_bias"),
            "worst_ratio": result.worst_ratio,
            "precision": result.precision,
        },
        "first_nonfinite": result.first_nonfinite.as_dict() if result.first_nonfinite else None,
        "first_nonfinite_state": result.first_nonfinite_state.as_dict() if result.first_nonfinite_state else None,
        "reads_outside": outside.as_json(result.reads_outside),
        "drift": {"per_chunk": result.per_chunk, "growth": result.growth},
        "repeat": asdict(result.repeat) if result.repeat else None,
        "error_map": _error_map(result),
        "stages": _stages(result),
        "repro": result.repro,
        "stdout": result.stdout,
        "invariance": {c.name: {"status": c.status.value, "message": c.message, **c.figures}
                       for c in result.invariance} or None,
    }


def _bias(comparison: Comparison | None, field: str) -> dict | None:
    bias = getattr(comparison, field) if comparison else None
    return bias.as_dict() if bias else None


def _stages(result: ScanResult) -> dict | None:
    report = result.stages
    if report is None:
        return None
    first = report.first_wrong
    return {"first_wrong": None if first is None else {k: getattr(first, k) for k in ("stage", "label", "status", "sequence", "chunk", "head")},
            "note": report.note, "figures": {f.stage: {k: v for k, v in asdict(f).items() if k != "stage"} for f in report.figures}}


def _error_map(result: ScanResult) -> dict | None:
    error_map = result.error_map
    if error_map is None:
        return None
    rows = [[float(f"{e:.3g}") for e in row] for row in error_map.per_chunk_head]
    return {"chunk_size": error_map.chunk_size, "tokens": error_map.tokens, "per_chunk_head": rows}
