"""Measurements of a kernel's output against a reference, computed on the output's device.

Everything is vectorised in float64 and read back in one transfer per figure:
- norm-wise relative error ||out - ref|| / ||ref|| and max abs error, with the
  location of the worst element taken from the same pass;
- the first non-finite element (where the reference is finite) in token order,
  with how far it spread;
- the relative error of y per chunk (by each sequence's own chunking) and a growth figure;
- the same per (chunk, head), for the report's error maps.
"""

from __future__ import annotations

import math

import torch

from ssmcheck.core.tensors import bits, same_bits
from ssmcheck.scan.inputs import TokenMap
from ssmcheck.scan.results import ErrorStats, NonfiniteToken, RepeatSpread, WorstGroup


def error_stats(out: torch.Tensor, ref: torch.Tensor) -> ErrorStats:
    diff = (out.double() - ref.double()).flatten()
    abs_diff = diff.abs()
    # NaN compares as the largest, so a NaN element is reported as the worst one.
    max_abs, where = torch.where(abs_diff.isnan(), math.inf, abs_diff).max(0)
    num, den = torch.linalg.vector_norm(diff), torch.linalg.vector_norm(ref.double())
    num, den, max_abs, where = torch.stack([num, den, abs_diff[where], where.double()]).tolist()
    if den > 0:
        rel = num / den
    else:
        rel = 0.0 if num == 0 else math.inf
    return ErrorStats(rel=rel, max_abs=max_abs, worst=_unravel(int(where), out.shape))


def _unravel(flat: int, shape) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


def nonfinite_mask(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    return ~torch.isfinite(out) & torch.isfinite(ref)


def first_nonfinite_token(y: torch.Tensor, ref: torch.Tensor, tokens: TokenMap, chunk_size: int):
    """For y (batch, seqlen, nheads, headdim): None, or (row, token, head, channel, counts) of the first
    non-finite element in token order, where counts = (elements, tokens, chunks)."""
    bad = nonfinite_mask(y, ref)
    bad_token = bad.flatten(2).any(-1)  # (batch, seqlen)
    no = torch.iinfo(torch.int64).max
    first = torch.where(bad_token, tokens.order, no).flatten().argmin()
    chunk = tokens.position // chunk_size
    nchunks = int(chunk.max()) + 1
    chunk_keys = (tokens.sequence * nchunks + chunk)[bad_token]
    elements, ntokens, any_bad = torch.stack([bad.sum(), bad_token.sum(), bad_token.any().long()]).tolist()
    if not any_bad:
        return None
    row, token = divmod(int(first), y.shape[1])
    head, channel = divmod(int(bad[row, token].flatten().nonzero()[0]), y.shape[3])
    return row, token, head, channel, (elements, ntokens, int(chunk_keys.unique().numel()))


def locate_nonfinite_y(y, ref, tokens: TokenMap, chunk_size: int, inputs) -> NonfiniteToken | None:
    """`inputs` is the case's ScanInputs (for whether the inputs at that token were finite)."""
    found = first_nonfinite_token(y, ref, tokens, chunk_size)
    if found is None:
        return None
    row, token, head, channel, (elements, ntokens, nchunks) = found
    position = int(tokens.position[row, token])
    return NonfiniteToken(
        output="y", sequence=int(tokens.sequence[row, token]), token=position, chunk=position // chunk_size,
        head=head, channel=channel, state_index=None, count=elements, tokens=ntokens, chunks=nchunks,
        inputs_finite=inputs.finite_at(row, token, head),
    )


def locate_nonfinite_states(states, ref, inputs) -> NonfiniteToken | None:
    """For final states (nseq, nheads, headdim, dstate): the first non-finite one in index order."""
    bad = nonfinite_mask(states, ref).flatten()
    count = int(bad.sum())
    if not count:
        return None
    sequence, head, channel, state_index = _unravel(int(bad.nonzero()[0]), states.shape)
    return NonfiniteToken(
        output="final_states", sequence=sequence, token=None, chunk=None, head=head, channel=channel,
        state_index=state_index, count=count, tokens=None, chunks=None,
        inputs_finite=inputs.finite_for_sequence(sequence, head),
    )


def _sums_by_key(key: torch.Tensor, groups: int, *values: torch.Tensor) -> list[torch.Tensor]:
    """Each of `values` summed over its rows by `key` into `groups` rows, in one fixed order.

    On a GPU, index_add_ adds with atomics in an order that varies between runs, so these float64
    figures moved in the last bit between identical runs (a serial and a --workers run of the same
    sweep differed). The CPU's index_add_ adds in index order; the values are already reduced over
    the head dimension, so the copy is small beside the reference's work."""
    key = key.cpu()
    return [torch.zeros(groups, *v.shape[1:], dtype=v.dtype).index_add_(0, key, v.cpu()).to(v.device)
            for v in values]


def per_chunk_error(y: torch.Tensor, ref: torch.Tensor, tokens: TokenMap, chunk_size: int) -> list[float]:
    """Norm-wise relative error of y in each chunk index (each sequence chunked on its own)."""
    diff2 = (y.double() - ref.double()).square().flatten(2).sum(-1).flatten()
    ref2 = ref.double().square().flatten(2).sum(-1).flatten()
    chunk = (tokens.position // chunk_size).flatten()
    nchunks = int(chunk.max()) + 1
    num, den = _sums_by_key(chunk, nchunks, diff2, ref2)
    rel = torch.where(den > 0, num / den, torch.where(num == 0, 0.0, math.inf)).sqrt()
    return rel.tolist()


def per_chunk_head_error(y: torch.Tensor, ref: torch.Tensor, tokens: TokenMap, chunk_size: int) -> list[list[float]]:
    """Norm-wise relative error of y per (chunk index, head), as a nested list [chunk][head].

    Chunks as in `per_chunk_error`; a chunk-head with non-finite output is nan (or inf).
    """
    diff2 = (y.double() - ref.double()).square().sum(-1).flatten(0, 1)  # (rows * tokens, nheads)
    ref2 = ref.double().square().sum(-1).flatten(0, 1)
    chunk = (tokens.position // chunk_size).flatten()
    nchunks = int(chunk.max()) + 1
    num, den = _sums_by_key(chunk, nchunks, diff2, ref2)
    rel = torch.where(den > 0, num / den, torch.where(num == 0, 0.0, math.inf)).sqrt()
    return rel.tolist()


def group_errors(y: torch.Tensor, ref: torch.Tensor, tokens: TokenMap, chunk_size: int) -> torch.Tensor:
    """Norm-wise relative error of y in every (sequence, chunk, head) group, flattened in that order:
    where an error confined to one chunk of one head lives, instead of averaged over all of y.

    A group whose reference is zero has error 0 (exact) or inf; a non-finite output gives nan or inf.
    """
    diff2 = (y.double() - ref.double()).square().sum(-1).flatten(0, 1)  # (rows * tokens, nheads)
    ref2 = ref.double().square().sum(-1).flatten(0, 1)
    chunk = (tokens.position // chunk_size).flatten()
    nchunks = int(chunk.max()) + 1
    key = tokens.sequence.flatten() * nchunks + chunk
    ngroups = (int(tokens.sequence.max()) + 1) * nchunks
    num, den = _sums_by_key(key, ngroups, diff2, ref2)
    return torch.where(den > 0, num / den, torch.where(num == 0, 0.0, math.inf)).sqrt().flatten()


def worst_group(kernel: torch.Tensor, baseline: torch.Tensor, nchunks_heads: tuple[int, int]) -> WorstGroup:
    """The kernel's worst group (NaN counts as the worst) beside the baseline's worst group: the error
    a straightforward implementation makes where it is worst, which the tolerance rule scales."""
    nchunks, nheads = nchunks_heads
    where = torch.where(kernel.isnan(), math.inf, kernel).argmax()
    rel, base = torch.stack([kernel[where], torch.where(baseline.isnan(), math.inf, baseline).max()]).tolist()
    sequence, rest = divmod(int(where), nchunks * nheads)
    chunk, head = divmod(rest, nheads)
    return WorstGroup(rel=rel, baseline_rel=base, sequence=sequence, chunk=chunk, head=head)


def group_shape(tokens: TokenMap, chunk_size: int, nheads: int) -> tuple[int, int]:
    """(chunks per sequence, heads): how `group_errors` lays its groups out within a sequence."""
    return int((tokens.position // chunk_size).max()) + 1, nheads


def repeat_spread(first: tuple, repeats: list[tuple], tokens: TokenMap) -> RepeatSpread:
    """Compare the (y, states) of runs 2.. with run 1's, bit for bit (NaN equals the same NaN)."""
    max_abs = spread = 0.0
    where = {}
    for run, (y, states) in enumerate(repeats, start=2):
        for output, a, b in (("y", first[0], y), ("states", first[1], states)):
            if same_bits(a, b):
                continue
            diff = (b.double() - a.double()).abs().nan_to_num(nan=math.inf)
            max_abs = max(max_abs, float(diff.max()))
            if output == "y":
                spread = max(spread, float(torch.linalg.vector_norm(b.double() - a.double())
                                           / torch.linalg.vector_norm(a.double()).clamp_min(1e-300)))
            if not where:
                where = {"run": run, "output": output, **_first_difference(output, a, b, tokens)}
    return RepeatSpread(len(repeats) + 1, not where, max_abs=max_abs, spread_rel=spread, **where)


def _first_difference(output: str, a: torch.Tensor, b: torch.Tensor, tokens: TokenMap) -> dict:
    """Where two runs' outputs first differ: in token order for y, index order for the states."""
    differs = bits(a) != bits(b)
    if output == "y":
        token_differs = differs.flatten(2).any(-1)  # (rows, tokens)
        first = torch.where(token_differs, tokens.order, torch.iinfo(torch.int64).max).flatten().argmin()
        row, token = divmod(int(first), a.shape[1])
        head = int(differs[row, token].any(-1).nonzero()[0])
        return {"sequence": int(tokens.sequence[row, token]), "token": int(tokens.position[row, token]), "head": head}
    sequence, head = (int(i) for i in differs.nonzero()[0][:2])
    return {"sequence": sequence, "head": head}


def growth(per_chunk: list[float]) -> float | None:
    """Fitted error ratio last chunk / first chunk: exp of a least-squares slope of log error over chunks.

    None with fewer than two chunks of finite, nonzero error.
    """
    points = [(k, math.log(e)) for k, e in enumerate(per_chunk) if math.isfinite(e) and e > 0]
    if len(points) < 2:
        return None
    n = len(points)
    mean_k = sum(k for k, _ in points) / n
    mean_e = sum(e for _, e in points) / n
    var = sum((k - mean_k) ** 2 for k, _ in points)
    slope = sum((k - mean_k) * (e - mean_e) for k, e in points) / var
    return math.exp(slope * (len(per_chunk) - 1))
