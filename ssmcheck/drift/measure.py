"""Measurements of one decode step against the float64 reference, computed on the state's device.

- per-step figures (state drift, output error, bias), summed over trials at the checkpoints;
- the first non-finite element of the kernel's state or output where the reference is finite.
"""

from __future__ import annotations

import torch

from ssmcheck.drift.results import Checkpoint, NonfiniteStep


class CheckpointSums:
    """Per-step sums of (state_rel, out_rel, bias) over trials."""

    def __init__(self):
        self.sums: dict[int, list[float]] = {}

    def add(self, step: int, figures: list[float]) -> None:
        entry = self.sums.setdefault(step, [0.0, 0.0, 0.0, 0])
        for i, value in enumerate(figures):
            entry[i] += value
        entry[3] += 1

    def means(self) -> list[Checkpoint]:
        return [Checkpoint(step, s / n, o / n, b / n) for step, (s, o, b, n) in sorted(self.sums.items())]


def _relative(diff: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    num, den = torch.linalg.vector_norm(diff), torch.linalg.vector_norm(ref)
    return torch.where(den > 0, num / den, torch.where(num == 0, 0.0, torch.inf).to(num))


def figures(state64, out, ref, ref_out) -> list[float]:
    """(state_rel, out_rel, bias) of a state and output against the reference, one transfer."""
    diff = state64 - ref
    bias = (torch.sign(ref) * diff).mean() / ref.square().mean().sqrt().clamp_min(torch.finfo(torch.float64).tiny)
    return torch.stack([_relative(diff, ref), _relative(out.double() - ref_out, ref_out), bias]).tolist()


def first_nonfinite(state, out, ref, ref_out, step: int, trial: int) -> NonfiniteStep | None:
    masks = [(name, ~torch.isfinite(value) & torch.isfinite(truth))
             for name, value, truth in (("state", state, ref), ("out", out, ref_out))]
    # Runs every decode step: one read-back decides; locating is only for the step that went bad.
    if not torch.stack([bad.any() for _, bad in masks]).any().item():
        return None
    for name, bad in masks:
        flat = bad.flatten().nonzero()
        if flat.numel():
            coords = [int(i) for i in torch.unravel_index(flat[0, 0], bad.shape)]
            return NonfiniteStep(name, step, trial, *coords[:3], coords[3] if name == "state" else None)
    return None
