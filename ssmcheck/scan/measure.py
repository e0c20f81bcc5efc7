"""Measurements of a kernel's output against a reference, computed on the output's device.

Everything is vectorised in float64 and read back in one transfer per figure:
- norm-wise relative error ||out - ref|| / ||ref|| and max abs error, with the
  location of the worst element taken from the same pass;
- the first non-finite element (where the reference is finite) in token order,
  with how far it spread;
- the relative error of y per chunk (by each sequence's own chunking) and a growth figure;
- the same per (chunk, head), for the report's error maps;
- the rounding bias of y stored in fp16/bf16: its mean signed error in ulps (core.output_bias).

Each figure of y also accumulates over segments of flattened tokens (batch*seqlen, in row order) fed
in order (`ErrorSum`, `GroupSums`, `FirstNonfinite`, `BiasSum`): a long case is compared a segment at a time
(scan.streamed), with the figures of the whole-tensor functions here, which are one segment.
Segments must not cut a chunk of any sequence (scan.segments), so each (sequence, chunk) group
lies in one segment.
"""

from __future__ import annotations

import math

import torch

from ssmcheck.core.output_bias import NARROW_OUTPUTS, OutputBias, moment_sums, output_bias, signed_ulp_errors
from ssmcheck.core.tensors import bits, nonfinite_mask, same_bits
from ssmcheck.scan.inputs import TokenMap
from ssmcheck.scan.results import ErrorStats, NonfiniteToken, RepeatSpread, WorstGroup


def error_stats(out: torch.Tensor, ref: torch.Tensor) -> ErrorStats:
    return ErrorSum(out.shape).add(out, ref).stats()


def relative_errors(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
    """`error_stats(out, ref).rel` of each (out, ref) pair, every norm read back in one transfer."""
    norms = torch.stack([norm for out, ref in pairs for norm in _norms(_difference(out, ref), ref)]).tolist()
    return [ratio(num, den) for num, den in zip(norms[::2], norms[1::2])]


def _difference(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    return (out.double() - ref.double()).flatten()


def _norms(diff: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.linalg.vector_norm(diff), torch.linalg.vector_norm(ref.double())


def ratio(num: float, den: float) -> float:
    """num / den, where a zero den makes 0 of a zero num and inf of any other."""
    if den > 0:
        return num / den
    return 0.0 if num == 0 else math.inf


class ErrorSum:
    """`error_stats` of a tensor of `shape` whose leading elements come segment by segment, in order."""

    def __init__(self, shape):
        self.shape = tuple(shape)
        self.norms, self.ref_norms = [], []
        self.worst = None  # (the key NaN counts as inf in, |difference|, flat index)

    def add(self, out: torch.Tensor, ref: torch.Tensor, offset: int = 0) -> ErrorSum:
        """Add the elements from flat index `offset` on (the next segment, any shape)."""
        diff = _difference(out, ref)
        abs_diff = diff.abs()
        # NaN compares as the largest, so a NaN element is reported as the worst one.
        _, where = torch.where(abs_diff.isnan(), math.inf, abs_diff).max(0)
        num, den, max_abs, where = torch.stack([*_norms(diff, ref), abs_diff[where], where.double()]).tolist()
        self.norms.append(num)
        self.ref_norms.append(den)
        key = math.inf if math.isnan(max_abs) else max_abs
        if self.worst is None or key > self.worst[0]:  # on a tie the first element stays the worst
            self.worst = (key, max_abs, offset + int(where))
        return self

    def norm(self) -> float:
        """The 2-norm of the difference over every element added."""
        return _combined(self.norms)

    def stats(self) -> ErrorStats:
        rel = ratio(*(_combined(norms) for norms in (self.norms, self.ref_norms)))
        return ErrorStats(rel=rel, max_abs=self.worst[1], worst=_unravel(self.worst[2], self.shape))


def _combined(norms: list[float]) -> float:
    """The 2-norm of the concatenation of vectors with these 2-norms (one: itself, bit for bit)."""
    return norms[0] if len(norms) == 1 else math.sqrt(math.fsum(n * n for n in norms))


def _unravel(flat: int, shape) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


class BiasSum:
    """The OutputBias of an output stored in `dtype` whose elements come segment by segment: the moment sums of
    its signed ulp errors stay on the output's device, one float64 tensor, read back once by `bias`."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self.sums = None

    def add(self, out: torch.Tensor, ref: torch.Tensor) -> BiasSum:
        if self.dtype in NARROW_OUTPUTS:  # an fp32 output has no figure: nothing to compute
            sums = moment_sums(signed_ulp_errors(out, ref, self.dtype), ref)
            self.sums = sums if self.sums is None else self.sums + sums
        return self

    def bias(self) -> OutputBias | None:
        """None for an output that is not narrow, or of fewer than two finite errors."""
        return None if self.sums is None else output_bias(self.sums.tolist(), self.dtype)


def stored_bias(stored: torch.Tensor, exact: torch.Tensor) -> OutputBias | None:
    """The OutputBias of a whole output (the final states) in the dtype it is stored in; None where that is fp32."""
    return BiasSum(stored.dtype).add(stored, exact).bias()


class FirstNonfinite:
    """The first non-finite element of y (where the reference is finite) in token order, and how far it
    spread, over segments of flattened tokens fed in order."""

    def __init__(self, seqlen: int, chunk_size: int):
        self.seqlen, self.chunk_size = seqlen, chunk_size
        self.first = None  # (order, row, token, head, channel)
        self.elements = self.tokens = self.chunks = 0

    def add(self, y: torch.Tensor, ref: torch.Tensor, tokens: TokenMap, f0: int = 0) -> FirstNonfinite:
        """y, ref (tokens, nheads, headdim) from flattened token `f0` on; `tokens` their (1, tokens) map."""
        bad = nonfinite_mask(y, ref)
        bad_token = bad.flatten(1).any(-1)  # (tokens,)
        no = torch.iinfo(torch.int64).max
        order = tokens.order.flatten()
        first = torch.where(bad_token, order, no).argmin()
        chunk_keys = (tokens.sequence.flatten() * (self.seqlen // self.chunk_size + 1)
                      + tokens.position.flatten() // self.chunk_size)[bad_token]
        elements, ntokens, first_order = torch.stack([bad.sum(), bad_token.sum(), order[first]]).tolist()
        if not ntokens:
            return self
        # A (sequence, chunk) lies within one segment: its chunks are counted once.
        self.elements, self.tokens = self.elements + elements, self.tokens + ntokens
        self.chunks += int(chunk_keys.unique().numel())
        if self.first is None or first_order < self.first[0]:
            row, token = divmod(f0 + int(first), self.seqlen)
            head, channel = divmod(int(bad[int(first)].flatten().nonzero()[0]), y.shape[2])
            self.first = (first_order, row, token, head, channel)
        return self

    def locate(self, tokens: TokenMap, inputs, output: str = "y") -> NonfiniteToken | None:
        """The first one as a NonfiniteToken of `output` (`tokens`: the whole case's map; `inputs`: its
        ScanInputs, for whether the inputs at that token were finite), or None."""
        if self.first is None:
            return None
        _, row, token, head, channel = self.first
        position = int(tokens.position[row, token])
        return NonfiniteToken(
            output=output, sequence=int(tokens.sequence[row, token]), token=position, chunk=position // self.chunk_size,
            head=head, channel=channel, state_index=None, count=self.elements, tokens=self.tokens,
            chunks=self.chunks, inputs_finite=inputs.finite_at(row, token, head),
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


class GroupSums:
    """Squared errors and squared reference norms of y per (sequence, chunk, head), each sequence chunked
    on its own, over segments of flattened tokens: the group errors, per-chunk errors and error maps.

    The sums live on the CPU: on a GPU, index_add_ adds with atomics in an order that varies between
    runs, and the figures moved in the last bit between identical runs (a serial and a --workers run
    of one sweep differed on the H200). The CPU adds in index order; what is copied is already
    reduced over headdim."""

    def __init__(self, tokens: TokenMap, chunk_size: int, nheads: int):
        """`tokens`: the whole case's map."""
        self.chunk_size = chunk_size
        self.nchunks = int((tokens.position // chunk_size).max()) + 1
        self.nseq = int(tokens.sequence.max()) + 1
        self.num = torch.zeros(self.nseq * self.nchunks, nheads, dtype=torch.float64)
        self.den = torch.zeros_like(self.num)

    def add(self, y: torch.Tensor, ref: torch.Tensor, tokens: TokenMap) -> GroupSums:
        """y, ref (tokens, nheads, headdim) of one segment; `tokens` their (1, tokens) map."""
        key = tokens.sequence.flatten() * self.nchunks + tokens.position.flatten() // self.chunk_size
        key = key.cpu()
        self.num.index_add_(0, key, (y.double() - ref.double()).square().sum(-1).cpu())
        self.den.index_add_(0, key, ref.double().square().sum(-1).cpu())
        return self

    def group_errors(self) -> torch.Tensor:
        """Norm-wise relative error of y in every (sequence, chunk, head) group, flattened in that order:
        where an error confined to one chunk of one head lives, instead of averaged over all of y.

        A group whose reference is zero has error 0 (exact) or inf; a non-finite output gives nan or inf.
        """
        return _relative(self.num, self.den).flatten()

    def per_chunk(self) -> list[float]:
        """Norm-wise relative error of y in each chunk index (each sequence chunked on its own)."""
        by_chunk = (t.view(self.nseq, self.nchunks, -1).sum((0, 2)) for t in (self.num, self.den))
        return _relative(*by_chunk).tolist()

    def per_chunk_head(self) -> list[list[float]]:
        """Norm-wise relative error of y per (chunk index, head), as a nested list [chunk][head]; a
        chunk-head with non-finite output is nan (or inf)."""
        by_chunk_head = (t.view(self.nseq, self.nchunks, -1).sum(0) for t in (self.num, self.den))
        return _relative(*by_chunk_head).tolist()

    def shape(self) -> tuple[int, int]:
        """(chunks per sequence, heads): how `group_errors` lays its groups out within a sequence."""
        return self.nchunks, self.num.shape[1]


MAX_SEQUENCES_MATCHED = 32


def states_of_other_sequences(states: torch.Tensor, ref: torch.Tensor) -> list[tuple[int, int]]:
    """(returned, sequence) pairs where the state returned for one sequence is another sequence's: within 1% of
    that sequence's reference state and ten times nearer to it than to its own (states returned in another
    order, or one sequence's written for another). Empty when every state is nearest its own, and past
    MAX_SEQUENCES_MATCHED sequences (the comparison grows with their square)."""
    if not 2 <= states.shape[0] <= MAX_SEQUENCES_MATCHED or states.shape != ref.shape:
        return []
    returned, truth = states.double().flatten(1), ref.to(states.device, torch.float64).flatten(1)
    scale = truth.norm(dim=1).clamp_min(torch.finfo(torch.float64).tiny)
    rel = torch.cdist(returned, truth) / scale[None, :]  # rel[i, j]: returned state i against sequence j's
    nearest = rel.nan_to_num(math.inf).argmin(1).tolist()
    return [(i, j) for i, j in enumerate(nearest) if j != i and rel[i, j] < 0.01 and rel[i, j] * 10 < rel[i, i]]


def _relative(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    return torch.where(den > 0, num / den, torch.where(num == 0, 0.0, math.inf)).sqrt()


def worst_group(kernel: torch.Tensor, baseline: torch.Tensor, nchunks_heads: tuple[int, int]) -> WorstGroup:
    """The kernel's worst group (NaN counts as the worst) beside the baseline's worst group: the error
    a straightforward implementation makes where it is worst, which the tolerance rule scales."""
    nchunks, nheads = nchunks_heads
    where = torch.where(kernel.isnan(), math.inf, kernel).argmax()
    rel, base = torch.stack([kernel[where], torch.where(baseline.isnan(), math.inf, baseline).max()]).tolist()
    sequence, rest = divmod(int(where), nchunks * nheads)
    chunk, head = divmod(rest, nheads)
    return WorstGroup(rel=rel, baseline_rel=base, sequence=sequence, chunk=chunk, head=head)


def first_group_over(kernel: torch.Tensor, limit: float, nchunks_heads: tuple[int, int]) -> tuple | None:
    """Of the groups whose error (group_errors' order; NaN counts as over) is above `limit`, the one in the
    earliest chunk (then sequence, then head): (sequence, chunk, head, its error); None where none is. Where an
    error carried from chunk to chunk starts, which the worst group, often chunks later, does not say."""
    nchunks, nheads = nchunks_heads
    errors = kernel.view(-1, nchunks, nheads)
    over = torch.where(errors.isnan(), math.inf, errors) > limit
    if not bool(over.any()):
        return None
    first = int(over.permute(1, 0, 2).flatten().nonzero()[0])  # chunk-major order
    chunk, rest = divmod(first, errors.shape[0] * nheads)
    sequence, head = divmod(rest, nheads)
    return sequence, chunk, head, float(errors[sequence, chunk, head])


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
