"""Whole-tensor figures for the tests: scan.measure's streamed figures (FirstNonfinite, GroupSums) fed one segment
that holds every token, as they are fed segment by segment in a sweep."""

from ssmcheck.scan import measure


def _whole(y, ref, tokens):
    """(y, ref) flattened over (batch, seqlen), and the map of that one segment."""
    return y.flatten(0, 1), ref.flatten(0, 1), tokens.segment(0, y.shape[0] * y.shape[1])


def group_sums(y, ref, tokens, chunk_size: int) -> measure.GroupSums:
    """measure.GroupSums of y, ref (batch, seqlen, nheads, headdim); `tokens` their TokenMap."""
    return measure.GroupSums(tokens, chunk_size, y.shape[2]).add(*_whole(y, ref, tokens))


def first_nonfinite_y(y, ref, tokens, chunk_size: int, inputs):
    """The first non-finite element of y (measure.FirstNonfinite.locate), or None."""
    return measure.FirstNonfinite(y.shape[1], chunk_size).add(*_whole(y, ref, tokens)).locate(tokens, inputs)
