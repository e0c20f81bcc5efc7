"""The serving-shaped checks of a scan case (--invariance), each a verdict of its own:

- batch: each sequence run alone gives the same y and final state as when packed with the case's other
  sequences: bitwise, or (declared with --batch-invariance tolerance) within the tolerance rule, the
  difference measured against the reference's norm and limited by the baseline's error;
- split: each sequence cut in two at a random token (mid-chunk where it can be), the second part started
  from the state the first part returned, as a chunked prefill runs it; the split run's y and final
  states are judged against the float64 reference by the tolerance rule, with the baseline split alike;
- prefill_decode: each sequence longer than DECODE_STEPS tokens is prefilled with the chunk scan up to its
  last DECODE_STEPS tokens, which the state-update kernel then decodes from the returned states; the
  decoded y (the hand-off step's on its own) and the final states are judged against the float64
  recurrence over all the tokens, with the baseline (its own prefill, then plain-PyTorch steps) alike;
- cache_write: for a kernel that writes its final states straight into a state cache
  (scan.adapter.CACHE_WRITE_KEYWORDS, vLLM 0.33's fused write, as its model code calls it): the case run
  again into a cache of CACHE_SPARES more slots than sequences, NaN-filled (core.pool) between two guard
  slots and paged as vLLM's is (core.pool.PagedPool: the rest of each page must keep its bits), each sequence's
  slot drawn at random but never the first or the last (where a slot index clamped or wrapped around lands).
  Each sequence's slot must hold the states the kernel returns without the cache, and y must be the same,
  bitwise (or, with --batch-invariance tolerance, within the tolerance rule); no other slot, guard or spare,
  may change; a slot left (partly) NaN-filled was not written.

How they combine with the case (`combine`): the case's status is the most severe of its own and its
checks' (nonfinite, then error, then fail), and its message names each check that did not pass, the most
severe first (so the message opens with what the status says). A check
that cannot run for the case or the kernel is skipped with the reason and changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ssmcheck.core import sweep
from ssmcheck.core.guard import describe
from ssmcheck.core.pool import inner_slots, nan_filled, paged_pool, poisoned
from ssmcheck.core.status import Status
from ssmcheck.core.tensors import bits, nonfinite_mask
from ssmcheck.core.tolerance import Tolerance, tolerance_limit, tolerance_rule, within_tolerance
from ssmcheck.ops.naive import NO_DT_LIMIT, process_dt
from ssmcheck.scan import measure
from ssmcheck.scan.inputs import ScanInputs
from ssmcheck.scan.results import Comparison, InvarianceCheck, ScanResult
from ssmcheck.scan.sequences import Piece, initial_state_of, packed, scattered, split_points, unpacked, whole_sequences

BATCH, SPLIT, PREFILL_DECODE, CACHE_WRITE = "batch", "split", "prefill_decode", "cache_write"
TITLES = {BATCH: "batch invariance", SPLIT: "split invariance", PREFILL_DECODE: "prefill→decode",
          CACHE_WRITE: "cache write"}
# Tokens each sequence decodes after its prefill.
DECODE_STEPS = 4
# Cache slots beyond the sequences' in the cache_write check: the first, the last and one among the others.
CACHE_SPARES = 3
# The order of severity, as the exit code ranks them (core.status).
_SEVERITY = (Status.NONFINITE, Status.ERROR, Status.FAIL, Status.PASS)

Outputs = tuple[torch.Tensor, torch.Tensor]  # (y, states: one per sequence)


@dataclass(frozen=True)
class Options:
    """The settings of the checks, as the runner holds them."""

    batch_exact: bool  # batch invariance bit for bit (else within the tolerance rule)
    decode: object | None  # the state-update kernel's drift.adapter.DriftAdapter (None: none to decode with)
    decode_skip: str = ""  # why there is none


@dataclass(frozen=True)
class Serving:
    """What the checks call: the kernel under test, the same-precision baseline and the decode step."""

    scan: Callable[[ScanInputs], Outputs]  # the chunk-scan kernel under test
    baseline: Callable[[ScanInputs], Outputs]  # the baseline, its states stored as the kernel's are judged
    # (state, selective_state_update arguments, seed) -> out, updating state in place; None: no state update
    decode: Callable[[torch.Tensor, dict, int], torch.Tensor] | None
    baseline_decode: Callable[[torch.Tensor, dict, int], torch.Tensor]
    tolerance: Tolerance
    batch_exact: bool  # batch invariance bit for bit (else within the tolerance rule)
    decode_skip: str = ""  # why there is no state update to decode with
    # (inputs, cache, slots) -> y, the kernel writing sequence i's final state into cache[slots[i]]; None: it
    # writes no cache (CACHE_WRITE_KEYWORDS)
    write_cache: Callable[[ScanInputs, torch.Tensor, torch.Tensor], torch.Tensor] | None = None


def run_checks(serving: Serving, inputs: ScanInputs, chunk_size: int, seed: int, out: Outputs, ref,
               base: Comparison) -> list[InvarianceCheck]:
    """The four checks of a case whose kernel run gave `out`, against the reference `ref` (y, states)."""
    checks = []
    for name, check in ((BATCH, _batch), (SPLIT, _split), (PREFILL_DECODE, _prefill_decode),
                        (CACHE_WRITE, _cache_write)):
        try:
            checks.append(check(serving, inputs, chunk_size, seed, out, ref, base))
        except Raised as exc:
            checks.append(InvarianceCheck(name, Status.ERROR, f"{TITLES[name]}: {exc}"))
    return checks


class Raised(Exception):
    """A kernel (or the baseline) raised during a check: the check's error, with what raised it."""


def combine(result: ScanResult) -> None:
    """Fold the invariance checks into the case's status and message (see the module docstring)."""
    parts = [(result.status, result.message)] + [(c.status, c.message) for c in result.invariance
                                                   if c.status not in (Status.PASS, Status.SKIPPED)]
    parts.sort(key=lambda part: _SEVERITY.index(part[0]))  # stable: the case's own first among equals
    result.status = parts[0][0]
    result.message = "; ".join(message for _, message in parts if message)


def _called(what: str, fn: Callable, *args):
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 (the check's error, as a kernel failure is the case's)
        raise Raised(f"the {what} raised {describe(exc)}") from exc


# ---------------------------------------------------------------------------- batch


def _batch(serving: Serving, inputs: ScanInputs, chunk_size, seed, out: Outputs, ref, base: Comparison):
    pieces = whole_sequences(inputs)
    if len(pieces) == 1:
        return InvarianceCheck(BATCH, Status.SKIPPED, "one sequence: nothing is packed with it")
    runs = []
    for piece in pieces:
        y, states = _called("kernel (a sequence alone)", serving.scan,
                            packed(inputs, [piece], initial_state_of(inputs, piece.sequence)))
        runs.append(((y[0], states[0]), (out[0][piece.row, piece.start:piece.stop], out[1][piece.sequence]),
                     (ref[0][piece.row, piece.start:piece.stop], ref[1][piece.sequence])))
    figures_of = torch.stack([_piece_figures(*run) for run in runs]).tolist()  # every piece's, read back at once
    worst = {"sequence": None, "y_rel": 0.0, "state_rel": 0.0, "max_abs": 0.0}
    differs = nonfinite = None
    for piece, (alone, together, _), values in zip(pieces, runs, figures_of):
        y_figures, state_figures = values[:5], values[5:]
        if nonfinite is None and (y_figures[0] or state_figures[0]):
            nonfinite = piece.sequence
        rels = [measure.ratio(*f[1:3]) for f in (y_figures, state_figures)]
        gap = max(y_figures[3], state_figures[3])
        if differs is None and (y_figures[4] or state_figures[4]):
            differs = (piece.sequence, _first_token(alone[0], together[0]))
        if max(rels) > max(worst["y_rel"], worst["state_rel"]) or worst["sequence"] is None:
            worst = {"sequence": piece.sequence, "y_rel": rels[0], "state_rel": rels[1], "max_abs": gap}
    figures = {"sequences": len(pieces), "identical": differs is None, "mode": "exact" if serving.batch_exact
               else "tolerance", "first_difference": None if differs is None else
               {"sequence": differs[0], "token": differs[1]}, "worst": worst}
    if nonfinite is not None:
        return InvarianceCheck(BATCH, Status.NONFINITE, f"batch invariance: sequence {nonfinite} run alone is "
                               "non-finite where the reference is finite", figures)
    if differs is None:
        return InvarianceCheck(BATCH, Status.PASS, "", figures)
    where = f"sequence {differs[0]} run alone differs from its packed run" + (
        f" in y from token {differs[1]}" if differs[1] is not None else " in its final state")
    sizes = (f"(worst: sequence {worst['sequence']}, y {worst['y_rel']:.3g}, state {worst['state_rel']:.3g} "
             f"of the reference's norm, max |Δ| {worst['max_abs']:.3g})")
    failed = _over(serving.tolerance, [("y", worst["y_rel"], base.y.rel),
                                       ("state", worst["state_rel"], base.states.rel)])
    if serving.batch_exact:
        # Bits that move with the packing within the rule: a kernel whose reductions follow the batch's layout
        # by design is declared so, and then judged on the rule.
        hint = "" if failed else ("; within the tolerance rule, which --batch-invariance tolerance judges by, for a "
                                  "kernel whose results depend on the packing by design")
        return InvarianceCheck(BATCH, Status.FAIL, f"batch invariance: {where} {sizes}{hint}", figures)
    if failed:
        return InvarianceCheck(BATCH, Status.FAIL, f"batch invariance: {where}: {failed}", figures)
    return InvarianceCheck(BATCH, Status.PASS, "", figures)


def _piece_figures(alone, together, truth) -> torch.Tensor:
    """For y, then for the state: whether `alone` is non-finite where the truth is finite, the norms of
    alone - together (NaN as inf) and of the truth, the largest |alone - together| (NaN as inf), whether their
    bits differ; float64, on the device, so that the pieces' figures are read back in one transfer."""
    return torch.stack([figure for a, b, t in zip(alone, together, truth)
                        for figure in (nonfinite_mask(a, t).any().double(), *_norms(a - b, t),
                                       (a.double() - b.double()).abs().nan_to_num(math.inf).max(),
                                       (bits(a) != bits(b)).any().double())])


def _norms(diff: torch.Tensor, truth: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 2-norms of a difference (NaN counted as inf) and of its truth, in float64 on their device."""
    return torch.linalg.vector_norm(diff.double().nan_to_num(math.inf)), torch.linalg.vector_norm(truth.double())


def _rel(diff: torch.Tensor, truth: torch.Tensor) -> float:
    """‖diff‖ / ‖truth‖ (NaN in diff counted as inf), read back in one transfer."""
    return measure.ratio(*torch.stack(_norms(diff, truth)).tolist())


def _first_token(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """The first token (dim 0) where two y differ bit for bit (None: they are the same)."""
    rows = (bits(a) != bits(b)).flatten(1).any(1).nonzero()
    return int(rows[0]) if len(rows) else None


def _over(tolerance: Tolerance, figures: list[tuple[str, float, float]]) -> str:
    """The figures (name, error, baseline error) over the tolerance rule's limit, in words ("" if none)."""
    rule = (tolerance.tol_factor, tolerance.floor, tolerance.rtol)
    failed = [f"{name} error {err:.3g} > limit {tolerance_limit(b, *rule):.3g}"
              for name, err, b in figures if not within_tolerance(err, b, *rule)]
    return "; ".join(failed) + f" ({tolerance_rule(tolerance)})" if failed else ""


# ---------------------------------------------------------------------------- split


def _split(serving: Serving, inputs: ScanInputs, chunk_size, seed, out: Outputs, ref, base):
    generator = torch.Generator().manual_seed(sweep.case_seed(seed, {"check": SPLIT}))
    points = split_points(inputs, chunk_size, generator)
    if not any(points):
        return InvarianceCheck(SPLIT, Status.SKIPPED, "every sequence is one token long: nothing to split")
    wholes = whole_sequences(inputs)
    firsts = [Piece(p.sequence, p.row, p.start, p.start + c) if c else p for p, c in zip(wholes, points)]
    seconds = [Piece(p.sequence, p.row, p.start + c, p.stop) for p, c in zip(wholes, points) if c]
    runs = {}
    for who, fn in (("kernel", serving.scan), ("baseline", serving.baseline)):
        first_in = packed(inputs, firsts, inputs.initial_states)
        y1, states1 = _called(f"{who} (first part)", fn, first_in)
        continuing = [i for i, c in enumerate(points) if c]
        second_in = packed(inputs, seconds, states1[continuing])
        y2, states2 = _called(f"{who} (second part, from the first part's states)", fn, second_in)
        y = scattered(inputs, list(zip(firsts, unpacked(first_in, y1, firsts)))
                      + list(zip(seconds, unpacked(second_in, y2, seconds))))
        states = states1.clone()
        states[continuing] = states2.to(states.dtype)
        runs[who] = (y, states)
    y, states = runs["kernel"]
    rels = measure.relative_errors([(r[i], ref[i]) for r in runs.values() for i in (0, 1)])
    errors = dict(zip(runs, (rels[:2], rels[2:])))
    figures = {"points": points, "y_rel": errors["kernel"][0], "state_rel": errors["kernel"][1],
               "baseline_y_rel": errors["baseline"][0], "baseline_state_rel": errors["baseline"][1],
               "unsplit_y_rel": _rel(y - out[0], ref[0])}
    where = f"cut at {_points_text(points)}"
    if torch.stack([nonfinite_mask(y, ref[0]).any(), nonfinite_mask(states, ref[1]).any()]).any():
        return InvarianceCheck(SPLIT, Status.NONFINITE, f"split invariance: non-finite output ({where})", figures)
    kernel, baseline = errors["kernel"], errors["baseline"]
    failed = _over(serving.tolerance, [("y", kernel[0], baseline[0]), ("state", kernel[1], baseline[1])])
    if failed:
        return InvarianceCheck(SPLIT, Status.FAIL, f"split invariance ({where}): {failed}", figures)
    return InvarianceCheck(SPLIT, Status.PASS, "", figures)


def _points_text(points: list[int]) -> str:
    shown = ", ".join(map(str, points[:8])) + (", ..." if len(points) > 8 else "")
    return f"token {shown}" if len(points) == 1 else f"tokens {shown} (per sequence{'; 0: not cut' if 0 in points else ''})"


# ---------------------------------------------------------------------------- prefill -> decode


def _prefill_decode(serving: Serving, inputs: ScanInputs, chunk_size, seed, out, ref, base):
    if serving.decode is None:
        return InvarianceCheck(PREFILL_DECODE, Status.SKIPPED, serving.decode_skip)
    wholes = [p for p in whole_sequences(inputs) if p.length > DECODE_STEPS]
    if not wholes:
        return InvarianceCheck(PREFILL_DECODE, Status.SKIPPED, f"no sequence is longer than {DECODE_STEPS} tokens")
    prefills = [Piece(p.sequence, p.row, p.start, p.stop - DECODE_STEPS) for p in wholes]
    initial = None if inputs.initial_states is None else inputs.initial_states[[p.sequence for p in wholes]]
    prefill_in = packed(inputs, prefills, initial)
    sequences = [p.sequence for p in wholes]
    truth_y = torch.stack([ref[0][p.row, p.stop - DECODE_STEPS:p.stop] for p in wholes])
    runs = {}
    for who, scan, step in (("kernel", serving.scan, serving.decode), ("baseline", serving.baseline,
                                                                          serving.baseline_decode)):
        state = _called(f"{who} (the prefill)", scan, prefill_in)[1].clone()
        ys = []
        for n in range(DECODE_STEPS):
            arguments = _decode_arguments(inputs, wholes, n)
            step_seed = sweep.case_seed(seed, {"check": PREFILL_DECODE, "step": n})
            ys.append(_called(f"{who} state update (decode step {n + 1})", step, state, arguments, step_seed))
        runs[who] = (torch.stack(ys, 1), state)
    rels = measure.relative_errors([pair for y, state in runs.values()
                                    for pair in ((y[:, 0], truth_y[:, 0]), (y, truth_y), (state, ref[1][sequences]))])
    errors = dict(zip(runs, (rels[:3], rels[3:])))
    figures = {"sequences": len(wholes), "decode_steps": DECODE_STEPS, "handoff_y_rel": errors["kernel"][0],
               "y_rel": errors["kernel"][1], "state_rel": errors["kernel"][2],
               "baseline_handoff_y_rel": errors["baseline"][0], "baseline_y_rel": errors["baseline"][1],
               "baseline_state_rel": errors["baseline"][2]}
    y, state = runs["kernel"]
    bad_steps = nonfinite_mask(y, truth_y).flatten(2).any(-1).any(0).nonzero()
    if len(bad_steps) or nonfinite_mask(state, ref[1][sequences]).any():
        at = f"y from decode step {int(bad_steps[0]) + 1}" if len(bad_steps) else "the states after decoding"
        return InvarianceCheck(PREFILL_DECODE, Status.NONFINITE, f"prefill→decode: {at} non-finite", figures)
    names = ("hand-off step y", "decoded y", "state after decoding")
    failed = _over(serving.tolerance, [(name, errors["kernel"][i], errors["baseline"][i])
                                       for i, name in enumerate(names)])
    if failed:
        return InvarianceCheck(PREFILL_DECODE, Status.FAIL, f"prefill→decode: {failed}", figures)
    return InvarianceCheck(PREFILL_DECODE, Status.PASS, "", figures)


def _decode_arguments(inputs: ScanInputs, pieces: list[Piece], n: int) -> dict:
    """The selective_state_update arguments of decode step n (0-based) of each piece's last tokens:
    per-head parameters expanded as Mamba2 passes them (stride-0 views)."""
    nheads, headdim = inputs.x.shape[2:]
    dstate = inputs.B.shape[-1]

    def token(t: torch.Tensor) -> torch.Tensor:
        return torch.stack([t[p.row, p.stop - DECODE_STEPS + n] for p in pieces])

    def per_channel(t: torch.Tensor | None) -> torch.Tensor | None:
        return t if t is None or t.dim() == 2 else t[:, None].expand(nheads, headdim)

    dt, dt_bias, dt_softplus = token(inputs.dt), inputs.dt_bias, inputs.dt_softplus
    if tuple(inputs.dt_limit) != NO_DT_LIMIT:
        # The state update takes no dt_limit: it gets dt processed (bias, softplus and the clamp, rounded once to
        # fp32 from float64), as a caller that processes dt itself passes it.
        dt = process_dt(dt, dt_bias, dt_softplus, inputs.dt_limit, torch.float64).float()
        dt_bias, dt_softplus = None, False
    return {
        "x": token(inputs.x), "dt": dt[..., None].expand(len(pieces), nheads, headdim),
        "A": inputs.A[:, None, None].expand(nheads, headdim, dstate), "B": token(inputs.B), "C": token(inputs.C),
        "D": per_channel(inputs.D),
        "z": None if inputs.z is None else token(inputs.z), "dt_bias": per_channel(dt_bias),
        "dt_softplus": dt_softplus,
    }


# ---------------------------------------------------------------------------- cache write


def _cache_write(serving: Serving, inputs: ScanInputs, chunk_size, seed, out: Outputs, ref, base: Comparison):
    if serving.write_cache is None:
        return InvarianceCheck(CACHE_WRITE, Status.SKIPPED, "the kernel takes no final_states_out and "
                               "final_state_indices: it writes no state cache")
    returned = out[1]  # one state per sequence, stored as the kernel stores them
    count = returned.shape[0]
    generator = torch.Generator().manual_seed(sweep.case_seed(seed, {"check": CACHE_WRITE}))
    size = count + CACHE_SPARES
    slots = inner_slots(count, size, generator)
    # The cache between two guard slots, paged as vLLM's is (core.pool.PagedPool), every slot NaN-filled.
    paged = paged_pool(nan_filled((size + 2, *returned.shape[1:]), returned),
                       sweep.case_seed(seed, {"check": CACHE_WRITE, "pages": True}))
    cache = paged.pool
    y = _called("kernel (writing its final states into a cache)", serving.write_cache, inputs, cache,
                torch.tensor(slots, dtype=torch.int32, device=returned.device))
    stored = cache[slots]
    changed = paged.changed_slots(set(slots))
    past_state = paged.past_states()
    # Per sequence, read back at once: its slot still poisoned somewhere, its bits not the returned state's,
    # non-finite where the reference is finite.
    per_slot = torch.stack([poisoned(stored).flatten(1).any(1), (bits(stored) != bits(returned)).flatten(1).any(1),
                            nonfinite_mask(stored, ref[1][:count]).flatten(1).any(1)]).tolist()
    unwritten, differs = ([i for i in range(count) if flags[i]] for flags in per_slot[:2])
    y_first = _first_token(y.flatten(0, 1), out[0].flatten(0, 1))  # over the rows' tokens end to end
    figures = {"cache_slots": size, "slots": slots, "unwritten": unwritten, "changed": changed,
               "past_state": past_state, "slot_stride": paged.pages.stride(0),
               "differs": differs, "y_identical": y_first is None,
               "mode": "exact" if serving.batch_exact else "tolerance",
               "state_rel": _rel(stored.double() - returned.double(), ref[1]),
               "y_rel": _rel(y.double() - out[0].double(), ref[0])}
    bad = [i for i in range(count) if i not in unwritten and per_slot[2][i]]
    if bad:
        return InvarianceCheck(CACHE_WRITE, Status.NONFINITE, f"cache write: slot {slots[bad[0]]} (sequence {bad[0]}) "
                               "holds non-finite values where the reference is finite", figures)
    failed = []
    if unwritten:
        i = unwritten[0]
        left = int(poisoned(stored[i]).sum())
        failed.append(f"slot {slots[i]} (sequence {i}) left unwritten in {left} of {stored[i].numel()} elements")
    if changed or past_state:
        failed.append("wrote " + ", ".join([*(f"slot {s} ({_slot_owner(s, size)})" for s in changed),
                                             *([paged.past_states_text(past_state)] if past_state else [])]))
    if serving.batch_exact:
        wrong = [i for i in differs if i not in unwritten]
        if wrong:
            i = wrong[0]
            gap = _rel(stored[i].double() - returned[i].double(), ref[1][i])
            failed.append(f"slot {slots[i]} (sequence {i}) differs from the state the kernel returns without the "
                          f"cache ({gap:.3g} of the reference's norm)")
        if y_first is not None:
            row, token = divmod(y_first, y.shape[1])
            failed.append(f"y differs from the call without the cache from token {token}"
                          + (f" of row {row}" if y.shape[0] > 1 else ""))
    elif not unwritten:
        over = _over(serving.tolerance, [("state", measure.error_stats(stored, ref[1]).rel, base.states.rel),
                                         ("y", measure.error_stats(y, ref[0]).rel, base.y.rel)])
        if over:
            failed.append(over)
    if failed:
        return InvarianceCheck(CACHE_WRITE, Status.FAIL, f"cache write (slots {_slots_text(slots)}): "
                               + "; ".join(failed), figures)
    return InvarianceCheck(CACHE_WRITE, Status.PASS, "", figures)


def _slot_owner(slot: int, size: int) -> str:
    return "outside the cache" if slot < 0 or slot >= size else "no sequence's"


def _slots_text(slots: list[int]) -> str:
    return ", ".join(map(str, slots[:8])) + (", ..." if len(slots) > 8 else "")
