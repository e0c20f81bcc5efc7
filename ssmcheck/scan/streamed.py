"""A case's outputs compared with its float64 reference and same-precision baselines a segment at a
time (scan.segments): the reference and the baselines are streams (ops/chunk_scan/naive.py's
RecurrentStream and SSDStream) computed one segment after the other, carrying their states, and
every figure accumulates (scan.measure), so only the kernel's own outputs are ever whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ssmcheck.core.formats import saturate
from ssmcheck.core.output_bias import OutputBias
from ssmcheck.scan import measure
from ssmcheck.scan.inputs import ScanInputs


def like_x(flat: torch.Tensor, inputs: ScanInputs) -> torch.Tensor:
    """Every flattened token's values (rows * seqlen, ...) shaped like x's tokens (rows, seqlen, ...)."""
    return flat.reshape(*inputs.x.shape[:2], *flat.shape[1:])


def states(stream, inputs: ScanInputs) -> torch.Tensor:
    """A finished stream's states as the kernel returns them: per sequence for varlen, else per row."""
    final_states, varlen_states = stream.states()
    return varlen_states if inputs.varlen else final_states


class Saturated:
    """A reference stream whose y and C·h come out saturated to `dtype`'s range, in their own dtype
    (core.formats.saturate): the float64 truth as an output stored in `dtype` can hold it."""

    def __init__(self, stream, dtype: torch.dtype):
        self.stream, self.dtype = stream, dtype

    def segment(self, f0: int, f1: int) -> tuple[torch.Tensor, torch.Tensor]:
        y, y_ssm = self.stream.segment(f0, f1)
        return saturate(y, self.dtype), saturate(y_ssm, self.dtype)

    def states(self):
        return self.stream.states()


class Recorded:
    """A stream that keeps what its segments return, so that one pass both streams the comparison and
    leaves the whole output (for the --invariance checks, which compare whole outputs): the reference is
    computed once, not again whole. It holds the whole output, as computing it whole would."""

    def __init__(self, stream):
        self.stream, self.parts = stream, []

    def segment(self, f0: int, f1: int) -> tuple[torch.Tensor, torch.Tensor]:
        part = self.stream.segment(f0, f1)
        self.parts.append(part)
        return part

    def states(self):
        return self.stream.states()

    def whole(self, inputs: ScanInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(y, states, C·h) of the finished pass, y and C·h shaped like x (the segments covered every token)."""
        y, y_ssm = (like_x(torch.cat([part[k] for part in self.parts]), inputs) for k in (0, 1))
        return y, states(self, inputs), y_ssm


@dataclass
class Streamed:
    """What one pass over the segments measured: the kernel's y and SSM-part figures, the first
    baseline's, each baseline's group sums, the reference's states, the rounding bias of the kernel's y and the
    first baseline's (None for fp32 y)."""

    kernel_y: measure.ErrorStats
    kernel_ssm: measure.ErrorStats | None
    baseline_y: measure.ErrorStats
    baseline_ssm: measure.ErrorStats | None
    kernel_groups: measure.GroupSums
    baseline_groups: list[measure.GroupSums]  # one per baseline stream
    first_nonfinite: measure.FirstNonfinite
    first_nonfinite_ssm: measure.FirstNonfinite | None  # in the SSM part (the call without D, z and the return flags)
    reference_states: torch.Tensor
    baseline_states: torch.Tensor
    kernel_y_bias: OutputBias | None
    baseline_y_bias: OutputBias | None


def compare(inputs: ScanInputs, chunk_size: int, segments: list[tuple[int, int]], reference, kernel_y: torch.Tensor,
            kernel_ssm: torch.Tensor | None, baselines: list) -> Streamed:
    """The kernel's y (and its SSM part, from the call without D, z and the return flags) against the `reference`
    stream, beside the `baselines` streams (the case's own first; the others' group sums only), over `segments`."""
    tokens = inputs.token_map()
    shape, dtype = kernel_y.shape, inputs.x.dtype
    per_token = shape[2] * shape[3]
    flat_y = kernel_y.flatten(0, 1)  # a view for any contiguous output
    flat_ssm = None if kernel_ssm is None else kernel_ssm.flatten(0, 1)
    k_y, b_y, k_ssm, b_ssm = (measure.ErrorSum(shape) for _ in range(4))
    k_bias, b_bias = measure.BiasSum(dtype), measure.BiasSum(dtype)
    k_groups = measure.GroupSums(tokens, chunk_size, shape[2])
    b_groups = [measure.GroupSums(tokens, chunk_size, shape[2]) for _ in baselines]
    nonfinite = measure.FirstNonfinite(shape[1], chunk_size)
    nonfinite_ssm = None if flat_ssm is None else measure.FirstNonfinite(shape[1], chunk_size)
    for f0, f1 in segments:
        ref_y, ref_ssm = reference.segment(f0, f1)
        where, offset = tokens.segment(f0, f1), f0 * per_token
        y = flat_y[f0:f1]
        k_y.add(y, ref_y, offset)
        k_bias.add(y, ref_y)
        k_groups.add(y, ref_y, where)
        nonfinite.add(y, ref_y, where, f0)
        if flat_ssm is not None:
            k_ssm.add(flat_ssm[f0:f1], ref_ssm, offset)
            nonfinite_ssm.add(flat_ssm[f0:f1], ref_ssm, where, f0)
        for k, stream in enumerate(baselines):
            base_y, base_ssm = stream.segment(f0, f1)
            b_groups[k].add(base_y, ref_y, where)
            if k == 0:
                b_y.add(base_y, ref_y, offset)
                b_bias.add(base_y, ref_y)
                if flat_ssm is not None:  # C·h in x's dtype, as a kernel called without D and z returns it
                    b_ssm.add(saturate(base_ssm, dtype).to(dtype), ref_ssm, offset)
    has_ssm = flat_ssm is not None
    return Streamed(k_y.stats(), k_ssm.stats() if has_ssm else None, b_y.stats(), b_ssm.stats() if has_ssm else None,
                    k_groups, b_groups, nonfinite, nonfinite_ssm, states(reference, inputs),
                    states(baselines[0], inputs), k_bias.bias(), b_bias.bias())


def relative_errors(inputs: ScanInputs, segments: list[tuple[int, int]], reference, streams: dict,
                    kernel: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, tuple[float, ...]]:
    """name -> (norm-wise relative error of y, of the states) of each stream against the `reference` stream;
    given the `kernel`'s (y, states), also (y apart, states apart): how far each stream's output lies from the
    kernel's, over how far the kernel's lies from the reference (||stream - kernel|| / ||kernel - reference||,
    None where the kernel's is exact). Below 1 the stream errs where the kernel does; about sqrt 2 for errors
    of one size that are independent of each other."""
    errors = {name: measure.ErrorSum(inputs.x.shape) for name in streams}
    apart = {name: measure.ErrorSum(inputs.x.shape) for name in streams}
    kernel_error = measure.ErrorSum(inputs.x.shape)
    per_token = inputs.x.shape[2] * inputs.x.shape[3]
    flat_y = None if kernel is None else kernel[0].flatten(0, 1)
    for f0, f1 in segments:
        ref_y = reference.segment(f0, f1)[0]
        if flat_y is not None:
            kernel_error.add(flat_y[f0:f1], ref_y, f0 * per_token)
        for name, stream in streams.items():
            y = stream.segment(f0, f1)[0]
            errors[name].add(y, ref_y, f0 * per_token)
            if flat_y is not None:
                apart[name].add(y, flat_y[f0:f1], f0 * per_token)
    ref_states = states(reference, inputs)
    found = {}
    for name, stream in streams.items():
        stream_states = states(stream, inputs)
        found[name] = (errors[name].stats().rel, measure.error_stats(stream_states, ref_states).rel)
        if kernel is not None:
            found[name] += (_ratio(apart[name].norm(), kernel_error.norm()),
                            _ratio(measure.ErrorSum(ref_states.shape).add(stream_states, kernel[1]).norm(),
                                   measure.ErrorSum(ref_states.shape).add(kernel[1], ref_states).norm()))
    return found


def _ratio(num: float, den: float) -> float | None:
    ratio = num / den if den > 0 else math.nan
    return ratio if math.isfinite(ratio) else None
