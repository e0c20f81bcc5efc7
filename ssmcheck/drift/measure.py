"""Measurements of one decode step against the float64 reference, computed on the state's device.

- per-step figures (state drift, output error, bias), summed over trials at the checkpoints, and the output's
  rounding errors against the exact output of the kernel's own previous state (core.output_bias), summed over
  the checkpoints and trials;
- the first non-finite element of the kernel's state or output where the reference is finite;
- with --repeat, where a repeated step first differs from the first run, bit for bit.
"""

from __future__ import annotations

import math

import torch

from ssmcheck.core.output_bias import (
    MOMENT_SUMS,
    NARROW_OUTPUTS,
    OutputBias,
    moment_sums,
    output_bias,
    signed_ulp_errors,
)
from ssmcheck.core.pool import POISON_BITS, poisoned
from ssmcheck.core.tensors import bits, nonfinite_mask
from ssmcheck.drift.results import Checkpoint, NonfiniteStep


class CheckpointSums:
    """Per-step sums of (state_rel, out_rel, bias, step_out_rel) over trials, and the output's rounding-error moments
    over every checkpoint and trial (`figures`' last four)."""

    def __init__(self):
        self.sums: dict[int, list[float]] = {}
        self.output_moments = [0.0] * len(MOMENT_SUMS)
        self.output_dtype: torch.dtype | None = None

    def add(self, step: int, figures: list[float], output_dtype: torch.dtype) -> None:
        entry = self.sums.setdefault(step, [0.0, 0.0, 0.0, 0.0, 0])
        for i, value in enumerate(figures[:4]):
            entry[i] += value
        entry[4] += 1
        self.output_moments = [a + b for a, b in zip(self.output_moments, figures[4:])]
        self.output_dtype = output_dtype

    def means(self) -> list[Checkpoint]:
        return [Checkpoint(step, s / n, o / n, b / n, e / n) for step, (s, o, b, e, n) in sorted(self.sums.items())]

    def output_bias(self) -> OutputBias | None:
        """The output's rounding bias over the checkpoints (None for an fp32 output, or before any)."""
        return None if self.output_dtype is None else output_bias(self.output_moments, self.output_dtype)


def _relative(diff: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    num, den = torch.linalg.vector_norm(diff), torch.linalg.vector_norm(ref)
    return torch.where(den > 0, num / den, torch.where(num == 0, 0.0, torch.inf).to(num))


def figures(state64, out, ref, ref_out, exact_out, out_dtype: torch.dtype) -> list[float]:
    """(state_rel, out_rel, bias) of a state and output against the reference, the output's relative error against
    `exact_out`, the exact output of the step from the same state (step_out_rel), then the moment sums
    (core.output_bias.MOMENT_SUMS: count, total, total of squares, count past an ulp, total up) of the output's
    signed rounding errors in ulps of `out_dtype` (the kernel's, where `out` may be a float64 copy of values in it)
    against `exact_out`; one transfer."""
    diff = state64 - ref
    bias = (torch.sign(ref) * diff).mean() / ref.square().mean().sqrt().clamp_min(torch.finfo(torch.float64).tiny)
    if out_dtype in NARROW_OUTPUTS:
        rounding = moment_sums(signed_ulp_errors(out, exact_out, out_dtype), exact_out)
    else:  # an fp32 output's error is its arithmetic's, not a store's
        rounding = torch.zeros(len(MOMENT_SUMS), dtype=torch.float64, device=ref.device)
    return torch.cat([torch.stack([_relative(diff, ref), _relative(out.double() - ref_out, ref_out), bias,
                                   _relative(out.double() - exact_out, exact_out)]), rounding]).tolist()


def first_nonfinite(state, out, ref, ref_out, step: int, trial: int) -> NonfiniteStep | None:
    """The first element, state before out, in index order, that the kernel made non-finite at `step`
    (drift.lockstep's flag is the device-side `any` of the same masks)."""
    for name, value, truth in (("state", state, ref), ("out", out, ref_out)):
        bad = nonfinite_mask(value, truth)
        flat = bad.flatten().nonzero()
        if flat.numel():
            coords = [int(i) for i in torch.unravel_index(flat[0, 0], bad.shape)]
            unwritten = name == "out" and value.dtype in POISON_BITS and bool(poisoned(value[tuple(coords)]))
            return NonfiniteStep(name, step, trial, *coords[:3], coords[3] if name == "state" else None,
                                 unwritten=unwritten)
    return None


def first_difference(first: tuple, again: tuple) -> tuple[str, list[int], float] | None:
    """Where a repeated step's (state, out) first differs bit for bit from the first run's: (output,
    its (batch, head, channel, ...) index, the largest |difference| over both), or None when identical."""
    found, max_abs = None, 0.0
    for name, a, b in (("state", first[0], again[0]), ("out", first[1], again[1])):
        differs = bits(a) != bits(b)
        if not bool(differs.any()):
            continue
        max_abs = max(max_abs, float((b.double() - a.double()).abs().nan_to_num(nan=math.inf).max()))
        if found is None:
            flat = differs.flatten().nonzero()[0, 0]
            found = (name, [int(i) for i in torch.unravel_index(flat, differs.shape)])
    return None if found is None else (*found, max_abs)
