"""Stage localisation: which SSD stage of a kernel goes wrong first, and where (DESIGN §1, issue #11).

A chunk scan is five stages; each one's result is compared with the float64 reference's
(ops/chunk_scan/naive.py, the chunked form at the case's chunk size) and judged by the
tolerance rule against the same-precision baseline's result of the same stage:

  cumsum         cumulative log-decay dt·A within each chunk        (chunk, head)
  chunk_states   each chunk's own state, from a zero state          (chunk, head)
  passed_states  the state entering each chunk (state passing)      (chunk, head)
  cb             C·Bᵀ within each chunk, causal part                (chunk, group)
  output         y                                                   (chunk, head)

Stages are compared in the layout of the built-in kernel (a kernel's `stages` callable,
scan.adapter, returns them so): each sequence cut into its own chunks from its first token,
the sequences in order; entries past a chunk's end, and C·Bᵀ above the diagonal, are never
read by the output stage and are not compared. A stage is judged per (chunk, head) group, as
y is (scan.verdict): its worst group against the baseline's worst group, and the whole stage
against the baseline's whole stage. The first wrong stage in pipeline order is named with the
first group, in chunk order, that is non-finite or out of tolerance: later stages inherit the
error of earlier ones, and later chunks that of earlier chunks through the state passing.
"""

from __future__ import annotations

import math

import torch

from ssmcheck.core.tolerance import Tolerance, tolerance_limit, within_tolerance
from ssmcheck.scan.inputs import ScanInputs
from ssmcheck.scan.results import StageFigure, StageReport

STAGES = {
    "cumsum": "cumulative decay",
    "chunk_states": "chunk states",
    "passed_states": "state passing",
    "cb": "C·Bᵀ",
    "output": "output",
}


def chunks(inputs: ScanInputs, chunk_size: int) -> list[tuple[int, int, int, int]]:
    """(sequence, chunk within it, first flattened token, length) of every chunk, in the stages' order."""
    seqlen = inputs.x.shape[1]
    if inputs.varlen:
        bounds = [int(b) for b in inputs.cu_seqlens.tolist()]
    else:
        bounds = [row * seqlen for row in range(inputs.x.shape[0] + 1)]
    return [(s, k // chunk_size, start + k, min(chunk_size, end - start - k))
            for s, (start, end) in enumerate(zip(bounds[:-1], bounds[1:]))
            for k in range(0, end - start, chunk_size)]


def output_by_chunk(y: torch.Tensor, layout: list[tuple[int, int, int, int]], chunk_size: int) -> torch.Tensor:
    """y (batch, seqlen, nheads, headdim) -> (nchunks, nheads, chunk_size, headdim), zero past a chunk's end."""
    flat = y.reshape(-1, *y.shape[2:])
    starts = torch.tensor([c[2] for c in layout], device=y.device)
    index = (starts[:, None] + torch.arange(chunk_size, device=y.device)[None, :]).clamp(max=flat.shape[0] - 1)
    return flat[index].transpose(1, 2) * _valid_tokens(layout, chunk_size, y.device)[:, None, :, None]


def _valid_tokens(layout, chunk_size: int, device) -> torch.Tensor:
    lengths = torch.tensor([c[3] for c in layout], device=device)
    return torch.arange(chunk_size, device=device)[None, :] < lengths[:, None]  # (nchunks, chunk_size)


def _valid(stage: str, layout, chunk_size: int, device) -> torch.Tensor:
    """Which entries of a stage's (nchunks, heads or groups, ...) tensor the output stage reads."""
    tokens = _valid_tokens(layout, chunk_size, device)
    if stage == "cumsum":
        return tokens[:, None, :]
    if stage == "output":
        return tokens[:, None, :, None]
    if stage == "cb":
        causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=device).tril()
        return (tokens[:, :, None] & tokens[:, None, :] & causal)[:, None]
    return torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)


def _fit(t: torch.Tensor, stage: str, chunk_size: int) -> torch.Tensor:
    """A reference stage padded to chunk_size tokens (the reference's chunks are no longer than its longest one)."""
    pad = chunk_size - t.shape[-1]
    if stage not in ("cumsum", "cb") or pad <= 0:
        return t
    return torch.nn.functional.pad(t, (0, pad) if stage == "cumsum" else (0, pad, 0, pad))


def _group_errors(out: torch.Tensor, ref: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per (chunk, head) group: (relative error, whether non-finite where the reference is finite), and the
    whole stage's (numerator, denominator) of the norm-wise relative error."""
    out, ref = out.double(), ref.double()
    diff = torch.where(valid, out - ref, 0.0)
    ref = torch.where(valid, ref, 0.0)
    num = diff.square().flatten(2).sum(-1)
    den = ref.square().flatten(2).sum(-1)
    rel = torch.where(den > 0, num / den, torch.where(num == 0, 0.0, math.inf)).sqrt()
    nonfinite = (valid & ~torch.isfinite(out) & torch.isfinite(ref)).flatten(2).any(-1)
    return rel, nonfinite, num.sum(), den.sum()


def _ratio(num: float, den: float) -> float:
    return math.sqrt(num / den) if den > 0 else (0.0 if num == 0 else math.inf)


def judge_stage(stage: str, kernel: torch.Tensor, reference: torch.Tensor, baseline: torch.Tensor, layout,
                chunk_size: int, tolerance: Tolerance) -> StageFigure:
    """One stage's figures and status: nonfinite, out of tolerance, or ok."""
    valid = _valid(stage, layout, chunk_size, kernel.device)
    rel, nonfinite, num, den = _group_errors(kernel, reference, valid)
    base_rel, _, base_num, base_den = _group_errors(baseline, reference, valid)
    rule = (tolerance.tol_factor, tolerance.floor, tolerance.rtol)
    base_worst = float(torch.where(base_rel.isnan(), math.inf, base_rel).max())
    whole, base_whole = _ratio(float(num), float(den)), _ratio(float(base_num), float(base_den))
    group_limit, limit = tolerance_limit(base_worst, *rule), tolerance_limit(base_whole, *rule)
    # NaN counts as out of tolerance (within_tolerance's rule), as it does for y.
    wrong = ~((rel <= group_limit) & ~rel.isnan()) | nonfinite
    if bool(nonfinite.any()):
        status, where = "nonfinite", nonfinite
    elif bool(wrong.any()) or not within_tolerance(whole, base_whole, *rule):
        status, where = "out of tolerance", wrong
    else:
        status, where = "ok", None
    if where is not None and bool(where.any()):
        flat = int(where.flatten().nonzero()[0])  # the first group in chunk order
    else:
        flat = int(torch.where(rel.isnan(), math.inf, rel).flatten().argmax())
    chunk, head = divmod(flat, rel.shape[1])
    sequence, index = layout[chunk][:2]
    worst = float(torch.where(rel.isnan(), math.inf, rel).max())
    return StageFigure(stage=stage, label=STAGES[stage], status=status, rel=whole, baseline_rel=base_whole,
                       limit=limit, group_rel=float(rel.flatten()[flat]), worst_group_rel=worst,
                       baseline_worst_group_rel=base_worst, group_limit=group_limit, sequence=sequence,
                       chunk=index, head=head)


def localise(kernel: dict, reference: dict, baseline: dict, inputs: ScanInputs, chunk_size: int,
             tolerance: Tolerance) -> StageReport:
    """Judge every stage. `kernel` holds the kernel's stages in the built-in layout with "y"; `reference`
    and `baseline` the SSD form's recorded stages (naive._ssd's names) with "y"."""
    layout = chunks(inputs, chunk_size)
    figures = []
    for stage in STAGES:
        if stage == "output":
            k, r, b = (output_by_chunk(s["y"], layout, chunk_size) for s in (kernel, reference, baseline))
        else:
            k, r, b = kernel[stage], _fit(reference[stage], stage, chunk_size), _fit(baseline[stage], stage, chunk_size)
        figures.append(judge_stage(stage, k, r, b, layout, chunk_size, tolerance))
    first = next((f for f in figures if f.status != "ok"), None)
    return StageReport(tuple(figures), first)


def describe(report: StageReport) -> str:
    """The message's words: `first wrong stage: state passing, sequence 0 chunk 7 head 3 (...)`."""
    if report.note:
        return f"stages not compared ({report.note})"
    first = report.first_wrong
    if first is None:
        return "every stage within tolerance"
    unit = "group" if first.stage == "cb" else "head"
    why = "non-finite" if first.status == "nonfinite" else f"error {first.group_rel:.3g} > limit {first.group_limit:.3g}"
    return f"first wrong stage: {first.label}, sequence {first.sequence} chunk {first.chunk} {unit} {first.head} ({why})"
