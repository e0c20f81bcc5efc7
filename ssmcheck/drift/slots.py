"""The padded-slot check of a drift case: one decode step as a serving engine runs it under CUDA graphs.

An engine keeps its cached states in a pool larger than the batch, passes each row's slot in
`state_batch_indices`, and pads a decode batch to a captured size with rows whose slot is the pad slot
id (PAD_SLOT_ID -1; vLLM points them at its null block, slot 0). For a kernel that takes slot
indices (drift.adapter's pad_slot_id), one step runs on such a batch: the case's rows plus PAD_ROWS pad
rows in random places, a pool of SPARE_SLOTS more slots than rows (and the pad slot where it is one),
the regime's own states and inputs. It runs in two layouts of the pool (LAYOUTS), a call each:

- inner: the spares at the pool's two ends, the live rows on a random permutation of the rest. A pad
  row's index clamped into range or wrapped around (-1) writes a spare, where the write shows whatever
  the order of the stores (on a live row's slot it races that row's own store);
- ends: live rows on the pool's first and last slots (the pad slot aside), the spares inside, and no pad rows: a
  full batch, as a CUDA graph's that is. A bounds or pad test off by one (`slot > 0`, `slot < pool - 1`) leaves a
  live row there behind, and so does a path of its own for a batch without pad rows (no pad test needed) that
  stores row b at slot b, its index in the batch. Its slot indices are int64 (the others' int32, as engines pass
  them): a kernel that reads them as int32 whatever their dtype sends row 1 to slot 0 (the high word of row 0's
  index). A kernel that refuses int64 (raises) runs the layout on int32, and the layout records the refusal;
- null_slot, for a kernel told its pad slot id (a keyword) whose default is not 0: the inner layout with pad
  rows given slot id 0, vLLM's null block, in the pool. A kernel that finds pad rows by a negative index, not
  by the id it was told, writes slot 0.

Three verdicts, each the inner layout's unless another layout's fails (the first, in that order; its message
says which):

- live: each live row's slot holds the float64 step of its own state and inputs, and its out the
  step's output, within the tolerance rule (the baseline: the float64 step stored in the state dtype
  in the case's rounding mode; its output is the float64 one), judged slot by slot. Where the kernel
  takes `out`, the out judged is the one it was given, as an engine reads it (engines ignore the return
  value): a live row left NaN-filled there was not written, which fails;
- untouched: every other slot (the spares, the pad slot) and a guard slot on each side of the pool
  (where an index of -1 or one past the end writes) keeps its bits, and so does a guard row on each side
  of out where the kernel takes one (a store past the batch's last row, unmasked, lands there). The pool
  is paged as vLLM's cache is (core.pool.PagedPool): each slot's state is followed by more of its page, which
  must keep its bits too (a kernel that takes the slot stride for the state's size writes there);
- pad_out: the pad rows' out, NaN-filled (a NaN with its own payload) before the call where the kernel
  takes `out`: wholly written with finite values (zeros, as mamba_ssm and the built-in kernel write,
  or other values, as vLLM's step from a zero state gives) or wholly left (reported as not written,
  which passes); partly written or non-finite fails. A kernel that allocates out itself gets it NaN-filled
  (core.poison) but without the payload: its non-finite pad outputs are reported as undetermined.

How they combine with the case (`combine`): as scan's invariance checks, the case's status is the most
severe of its own and the checks', and its message adds one clause per check that did not pass.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from ssmcheck.core import sweep
from ssmcheck.core.capture import Transcript
from ssmcheck.core.pool import PagedPool, end_slots, inner_slots, nan_filled, paged_pool, poisoned
from ssmcheck.core.status import Status
from ssmcheck.core.tensors import bits
from ssmcheck.core.tolerance import Tolerance, tolerance_limit, tolerance_rule, within_tolerance
from ssmcheck.drift.adapter import DriftAdapter, KernelRaised, refused
from ssmcheck.drift.follow import output_rounded
from ssmcheck.drift.regimes import make_problem
from ssmcheck.drift.results import DriftVerdict, SlotCheck
from ssmcheck.drift.spec import DriftCase
from ssmcheck.ops.rounding.naive import round_to
from ssmcheck.ops.state_update.naive import state_update_step

LIVE, UNTOUCHED, PAD_OUT = "live", "untouched", "pad_out"
TITLES = {LIVE: "slots", UNTOUCHED: "slots untouched", PAD_OUT: "pad rows' out"}
PAD_ROWS = 2  # pad rows added to the case's batch
SPARE_SLOTS = 2  # pool slots beyond the rows, which no row names
INNER, ENDS, NULL_SLOT = "inner", "ends", "null_slot"  # the pool's layouts (the module docstring)
LAYOUTS = (INNER, ENDS, NULL_SLOT)
FAR = "far"  # drift.far_slots' rows, judged by live_verdict
_PLACED = {INNER: "", ENDS: " (a full batch, no pad rows, live rows on the pool's first and last slots, {indices} "
                           "slot indices)",
           NULL_SLOT: " (pad rows given slot id 0, a null block)", FAR: " (rows on slots past 2**32 elements)"}
# The order of severity, as the exit code ranks them (core.status).
_SEVERITY = (Status.NONFINITE, Status.ERROR, Status.FAIL, Status.PASS)


def run_check(case: DriftCase, kernel: DriftAdapter, tolerance: Tolerance, device: str,
              transcript: Transcript) -> tuple[list[SlotCheck], dict]:
    """The three verdicts of `case` for `kernel` (which takes slot indices), and the layouts they ran (the inner
    one's pool, slots and pad rows, each other's under its name)."""
    # A kernel told its pad slot id (a keyword) is also told vLLM's, 0: one that finds pad rows by another test
    # (a negative index) takes them for live rows there.
    placements = [p for p in LAYOUTS if p != NULL_SLOT or (kernel.takes_pad_slot_id and kernel.pad_slot_id != 0)]
    layouts = {p: _layout(case, 0 if p == NULL_SLOT else kernel.pad_slot_id, p) for p in placements}
    verdicts = [_run_layout(case, kernel, tolerance, device, transcript, layouts[p]) for p in placements]
    # Each check: the first layout's verdict that did not pass, in LAYOUTS' order (the inner one's if all did).
    checks = [next((c for c in by_layout if c.status is not Status.PASS), by_layout[0]) for by_layout in zip(*verdicts)]
    return checks, {**layouts[INNER], **{p: layouts[p] for p in placements if p != INNER}}


def _run_layout(case: DriftCase, kernel: DriftAdapter, tolerance: Tolerance, device: str, transcript: Transcript,
                layout: dict) -> list[SlotCheck]:
    """The three verdicts of one call on `layout`'s pool."""
    problem = make_problem(case.regime, replace(case.shape(), batch=layout["pool"]), case.dtype, 1,
                           layout["seed"], device)
    step = next(problem.steps())
    rows = len(layout["slots"])
    arguments = {"z": None, **dict(step.map(lambda _, t: _own_storage(t[:rows])).given()), **problem.parameters(),
                 "dt_softplus": problem.dt_softplus}
    # The pool between two guard slots (a write at slot -1 or one past the end lands in one of them), each slot a
    # page longer than its state (core.pool.PagedPool).
    paged = paged_pool(torch.cat([problem.initial_state[:1], problem.initial_state, problem.initial_state[-1:]]),
                       layout["seed"])
    pool = paged.pool
    # out between two guard rows, all NaN with a payload of ours: a write past either end of out lands in one.
    out_buffer = nan_filled((rows + 2, *arguments["x"].shape[1:]), arguments["x"])
    sent = out_buffer[1:-1]
    seed = sweep.case_seed(layout["seed"], {"step": 1})
    placed = _placed(layout)
    indices = torch.tensor(layout["slots"], dtype=getattr(torch, layout["slot_indices"]), device=device)
    try:
        returned = kernel.update_slots(pool, indices, arguments, sent, case.rounding, seed, "slot check" + placed,
                                       transcript, pad_slot_id=layout["pad_slot_id"])
    except KernelRaised as exc:
        if layout["slot_indices"] == "int32" or not refused(exc):
            return [SlotCheck(name, Status.ERROR, f"{TITLES[name]}{placed}: {exc}")
                    for name in (LIVE, UNTOUCHED, PAD_OUT)]
        # A kernel may take int32 slot indices alone, as engines pass them: one that refuses int64 runs the layout on
        # int32, noted in it. The pool and out are written again from the start: the refusing call may have begun.
        layout["slot_indices"], layout["refused"] = "int32", str(exc)
        return _run_layout(case, kernel, tolerance, device, transcript, layout)
    # An engine reads the out it passed, whatever the call returns; only that NaN-filled out shows what the
    # kernel left: one it allocated itself holds whatever it held.
    out = sent if kernel.takes_out else returned
    own = kernel.takes_out and returned.data_ptr() != sent.data_ptr()
    # The float64 step reads D and dt_bias whole: zeros where the kernel was passed None (regimes.ABSENT).
    reference = {**arguments, "D": problem.D, "dt_bias": problem.dt_bias}
    live = [s for r, s in enumerate(layout["slots"]) if r not in layout["pad_rows"]]
    return [live_verdict(layout, paged.states_before[1:-1][live], pool, out, reference, case, tolerance,
                         kernel.takes_out, own),
            _untouched(layout, paged, out_buffer if kernel.takes_out else None),
            _pad_out(layout, out, kernel.takes_out)]


def _layout(case: DriftCase, pad: int, placement: str) -> dict:
    """The pool and the rows: `slots` per row (pad for a pad row), drawn from the case's seed. The ends layout
    has at least two live rows, one for each end."""
    # The inner layout's seed is the one it had before the ends layout came: its draws are unchanged.
    seed = sweep.case_seed(case.seed, {"check": "slots", **({} if placement == INNER else {"layout": placement})})
    generator = torch.Generator().manual_seed(seed)
    live_rows = max(case.batch, 2) if placement == ENDS else case.batch
    rows = live_rows + (0 if placement == ENDS else PAD_ROWS)
    pool = rows + SPARE_SLOTS
    if 0 <= pad <= pool:  # the pad id names a slot of the pool (vLLM's null block): never a live one
        pool += 1
    live = (end_slots if placement == ENDS else inner_slots)(live_rows, pool, generator, skip=pad)
    pad_rows = sorted(torch.randperm(rows, generator=generator)[:rows - live_rows].tolist())
    it = iter(live)
    slots = [pad if r in pad_rows else next(it) for r in range(rows)]
    # The ends layout passes int64 slot indices (as torch's integer tensors default to): a kernel that reads them as
    # int32 whatever their dtype sends row 1 to the high word of row 0's index, slot 0.
    return {"placement": placement, "seed": seed, "pool": pool, "pad_slot_id": pad, "slots": slots,
            "pad_rows": pad_rows, "slot_indices": "int64" if placement == ENDS else "int32"}


def _placed(layout: dict) -> str:
    """How the layout placed the rows, for messages."""
    return _PLACED[layout["placement"]].format(indices=layout.get("slot_indices", "int32"))


def _own_storage(rows: torch.Tensor) -> torch.Tensor:
    """The batch's rows copied into a storage of their own (a stride-0 last axis, dt's per head, kept): a slice
    of the pool-sized step would leave the rows past the batch right after it, where the kernel's fenced copy
    (drift.adapter.fenced_update) is to put NaN."""
    if rows.stride(-1) == 0:
        return rows[..., :1].clone().expand(rows.shape)
    return rows.clone()


def relative_error(a: torch.Tensor, ref: torch.Tensor) -> float:
    """||a - ref|| / ||ref|| (a non-finite element of a counts as infinite)."""
    num = torch.linalg.vector_norm((a.double() - ref).nan_to_num(math.inf)).item()
    den = torch.linalg.vector_norm(ref).item()
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def live_verdict(layout, before, pool, out, arguments, case: DriftCase, tolerance: Tolerance, took_out: bool,
                 returned_own: bool) -> SlotCheck:
    """The live rows' verdict on `layout` (its slots, pad rows, seed and placement): `before`, the live rows' states
    before the call, in row order; `took_out`: `out` is the NaN-filled one the kernel was given (a row left NaN
    there was not written); `returned_own`: the kernel returned another tensor."""
    rule = (tolerance.tol_factor, tolerance.floor, tolerance.rtol)
    rows = [r for r in range(len(layout["slots"])) if r not in layout["pad_rows"]]
    live = [layout["slots"][r] for r in rows]
    per_row = [arguments[k][rows].double() for k in ("x", "dt")]
    z = None if arguments["z"] is None else arguments["z"][rows].double()
    ref, ref_out = state_update_step(before.double(), *per_row, arguments["A"].double(),
                                     arguments["B"][rows].double(), arguments["C"][rows].double(),
                                     D=arguments["D"].double(), z=z, dt_bias=arguments["dt_bias"].double(),
                                     dt_softplus=arguments["dt_softplus"])
    generator = torch.Generator(device=pool.device).manual_seed(layout["seed"])
    stored = round_to(ref, case.dtype, case.rounding, generator).double()
    worst, failed, nonfinite, unwritten = None, None, None, None
    for i, (row, slot) in enumerate(zip(rows, live)):
        got_state, got_out = pool[slot], out[row]
        figures = {"row": row, "slot": slot, "state_rel": relative_error(got_state, ref[i]),
                   "out_rel": relative_error(got_out, ref_out[i]),
                   "baseline_state_rel": relative_error(stored[i], ref[i]),
                   "baseline_out_rel": relative_error(output_rounded(ref_out[i], out.dtype), ref_out[i])}
        figures["limit"] = tolerance_limit(figures["baseline_state_rel"], *rule)
        if unwritten is None and took_out and bool(poisoned(got_out).any()):
            unwritten = (figures, int(poisoned(got_out).sum()), got_out.numel())
        elif nonfinite is None and not (torch.isfinite(got_state).all() and torch.isfinite(got_out).all()):
            nonfinite = figures
        over = [f"{what} error {figures[f'{what}_rel']:.3g} > limit {limit:.3g}"
                for what, base, limit in (("state", figures["baseline_state_rel"], figures["limit"]),
                                          ("out", figures["baseline_out_rel"],
                                           tolerance_limit(figures["baseline_out_rel"], *rule)))
                if not within_tolerance(figures[f"{what}_rel"], base, *rule)]
        if failed is None and over:
            # A row the step skipped (a bounds or pad test that took it for a pad row) keeps its state's bits.
            kept = torch.equal(bits(got_state), bits(before[i]))
            skipped = "its state kept every bit (the row skipped, as a pad row is, or its store sent to another slot): "
            failed = (figures, (skipped if kept else "") + "; ".join(over))
        if worst is None or max(figures["state_rel"], figures["out_rel"]) > max(worst["state_rel"], worst["out_rel"]):
            worst = figures
    result = {"rows": len(rows), "worst": worst}
    title = TITLES[LIVE] + _placed(layout)
    if unwritten is not None:
        where, left, size = unwritten
        own = ": the kernel returned its output in a tensor of its own" if returned_own else ""
        return SlotCheck(LIVE, Status.FAIL, f"{title}: out row {where['row']} (slot {where['slot']}) left unwritten "
                         f"in {left} of {size} elements{own}", {**result, "out_unwritten_row": where["row"]})
    if nonfinite is not None:
        return SlotCheck(LIVE, Status.NONFINITE, f"{title}: slot {nonfinite['slot']} (row {nonfinite['row']}) is "
                         "non-finite after the step", result)
    if failed is not None:
        where, over = failed
        pads = f"; pad rows {layout['pad_rows']} carry slot id {layout['pad_slot_id']}" if layout["pad_rows"] else ""
        return SlotCheck(LIVE, Status.FAIL, f"{title}: slot {where['slot']} (row {where['row']}): {over} "
                         f"({tolerance_rule(tolerance)}{pads})", result)
    return SlotCheck(LIVE, Status.PASS, "", result)


def _untouched(layout, paged: PagedPool, out_buffer: torch.Tensor | None) -> SlotCheck:
    live = {s for r, s in enumerate(layout["slots"]) if r not in layout["pad_rows"]}
    changed = paged.changed_slots(live)
    rows = len(layout["slots"])
    # out_buffer index 0 and rows + 1 are its guards: out rows -1 and rows.
    past_out = [] if out_buffer is None else [
        i - 1 for i in (0, rows + 1) if not bool(poisoned(out_buffer[i]).all())]
    past_state = paged.past_states()
    figures = {"checked": paged.states.shape[0] - len(live), "changed": changed, "past_out": past_out,
               "past_state": past_state, "slot_stride": paged.pages.stride(0)}
    if not changed and not past_out and not past_state:
        return SlotCheck(UNTOUCHED, Status.PASS, "", figures)
    pool, pad = layout["pool"], layout["pad_slot_id"]

    def named(slot: int) -> str:
        what = "outside the pool" if slot < 0 or slot >= pool else ("the pad slot" if slot == pad else "no row's")
        return f"slot {slot} ({what})"

    wrote = [*map(named, changed), *(f"out row {row} (past out's {rows} rows)" for row in past_out),
             *([paged.past_states_text(past_state)] if past_state else [])]
    pads = f"; pad rows {layout['pad_rows']} carry slot id {pad}" if layout["pad_rows"] else ""
    return SlotCheck(UNTOUCHED, Status.FAIL, f"{TITLES[UNTOUCHED]}{_placed(layout)}: the step wrote "
                     f"{', '.join(wrote)}{pads}", figures)


def _pad_out(layout, out: torch.Tensor, was_poisoned: bool) -> SlotCheck:
    rows = out[layout["pad_rows"]]
    left = poisoned(rows) if was_poisoned else torch.zeros_like(rows, dtype=torch.bool)
    finite = torch.isfinite(rows)
    if was_poisoned and left.all():
        return SlotCheck(PAD_OUT, Status.PASS, "", {"outputs": "not written"})
    if finite.all():
        return SlotCheck(PAD_OUT, Status.PASS, "", {"outputs": "zeros" if bool((rows == 0).all()) else "written"})
    if not was_poisoned:
        return SlotCheck(PAD_OUT, Status.PASS, "", {"outputs": "undetermined"})
    what = "partly written" if left.any() else "written non-finite"
    row = layout["pad_rows"][int((~finite).flatten(1).any(1).nonzero()[0])]
    return SlotCheck(PAD_OUT, Status.FAIL, f"{TITLES[PAD_OUT]}{_placed(layout)}: {what} (row {row}, "
                     f"slot id {layout['pad_slot_id']})", {"outputs": what})


def combine(verdict: DriftVerdict, checks: list[SlotCheck]) -> DriftVerdict:
    """The case's verdict with the slot checks folded in (see the module docstring)."""
    statuses = [verdict.status] + [c.status for c in checks if c.status is not Status.SKIPPED]
    words = [c.message for c in checks if c.status not in (Status.PASS, Status.SKIPPED)]
    return replace(verdict, status=next(s for s in _SEVERITY if s in statuses),
                   message="; ".join(([verdict.message] if verdict.message else []) + words))
