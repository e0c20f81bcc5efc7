"""The speculative-decoding check of a drift case: one state-update call verifying draft tokens, as vLLM runs it.

With speculative decoding (MTP, EAGLE) an engine proposes several tokens per sequence and verifies them in one
state-update call: x, dt, B and C hold every row's tokens packed (`cu_seqlens`), a row starts from the state in
the slot of its last accepted token (`state_batch_indices[b, num_accepted_tokens[b] - 1]`), and the state after
each of its tokens t goes to slot `dst_state_batch_indices[b, t]`, so that the next step can start from
whichever token the verifier accepts. For a kernel that takes these keywords (vLLM's), each case runs one such
call: its rows, of TOKENS - 1 and TOKENS tokens in turn (packed by cu_seqlens: a kernel that takes a row's tokens
at a fixed stride reads the next row's wrong), from a pool whose source slots hold the regime's states (the one at the
accepted index is the row's; the others are decoys, other states), each token's destination slot NaN-filled (a
NaN with ssmcheck's payload: unwritten shows), and a guard slot on each side of the pool. The last row's last
token is not to be kept: its destination is the pad id, as an engine marks a token whose state no later step
reads (vLLM's null block), and its state is stored nowhere. Two verdicts:

- drafts: the state after each token, in its destination slot, within the tolerance rule against the float64
  recurrence from the row's source state (the baseline: each token's float64 state stored in the state dtype in
  the case's rounding mode, the next token's step taken from it, as a decode of one token per call does;
  stochastically, the rms over BASELINE_DRAWS draws), and each token's out within what that stored state's
  rounding allows of C·h + D·x (`_out_beyond_storage`); stochastically also the first tokens' stores, exact steps
  from the sources rounded, against stochastic rounding's spread (stats.nearest_z: a draft path that rounds to
  nearest stays within the tolerance, its errors smaller, but takes the nearer neighbour every time);
- kept: every slot that is no token's destination (the sources, the decoys, a spare, the pad slot) and both
  guards keep their bits: a store without the pad test writes the pad slot, or the guard before the pool at -1;
  the pool is paged (core.pool.PagedPool), and the rest of every page keeps its bits too.

They fold into the case as the padded-slot checks do (drift.slots.combine).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import torch

from ssmcheck.core import sweep
from ssmcheck.core.capture import Transcript
from ssmcheck.core.formats import ulp
from ssmcheck.core.pool import PagedPool, nan_filled, paged_pool
from ssmcheck.core.status import Status
from ssmcheck.core.tolerance import Tolerance, tolerance_limit, tolerance_rule, within_tolerance
from ssmcheck.drift.adapter import DriftAdapter, KernelRaised
from ssmcheck.drift.regimes import make_problem
from ssmcheck.drift.results import SlotCheck
from ssmcheck.drift.slots import relative_error
from ssmcheck.drift.spec import DriftCase
from ssmcheck.drift.stats import NEAREST_Z_LIMIT, nearest_z
from ssmcheck.ops.naive import heads_of_groups, skip_and_gate
from ssmcheck.ops.rounding.naive import round_to
from ssmcheck.ops.state_update.naive import state_update_step

DRAFTS, KEPT = "drafts", "kept"
TITLES = {DRAFTS: "draft tokens", KEPT: "slots kept"}
TOKENS = 3  # draft tokens per row
BASELINE_DRAWS = 8  # stochastic baselines drawn


def run_check(case: DriftCase, kernel: DriftAdapter, tolerance: Tolerance, device: str,
              transcript: Transcript) -> tuple[list[SlotCheck], dict]:
    """The two verdicts of `case` for `kernel` (which takes draft tokens: DriftAdapter.takes_draft_tokens), and
    the layout they ran."""
    layout = draft_layout(case, kernel.pad_slot_id, "speculative")
    problem = draft_problem(case, layout, device)
    # The pool paged as the slot check's (core.pool.PagedPool), between two guard slots.
    contents = nan_filled((layout["pool"] + 2, *problem.initial_state.shape[1:]), problem.initial_state)
    sources = torch.tensor(layout["sources"], device=device).flatten()
    contents[1:-1][sources] = problem.initial_state  # source (b, t) holds state row b * TOKENS + t
    paged = paged_pool(contents, layout["seed"])
    try:
        out, reference = draft_call(case, kernel, layout, problem, paged.pool, "speculative check", transcript)
    except KernelRaised as exc:
        return [SlotCheck(name, Status.ERROR, f"{TITLES[name]}: {exc}") for name in (DRAFTS, KEPT)], layout
    return [drafts_verdict(layout, problem.initial_state, paged.pool, out, reference, case, tolerance),
            _kept(layout, paged)], layout


def draft_problem(case: DriftCase, layout: dict, device: str):
    """The decode problem of `layout`'s call: one row per (row, column) of its source table, whose initial state
    is a source or a decoy; the first of them, one per token, give the tokens' step-1 inputs."""
    return make_problem(case.regime, replace(case.shape(), batch=len(layout["lengths"]) * TOKENS), case.dtype, 1,
                        layout["seed"], device)


def draft_call(case: DriftCase, kernel: DriftAdapter, layout: dict, problem, pool: torch.Tensor, where: str,
               transcript: Transcript) -> tuple[torch.Tensor, dict]:
    """The verifying call of `layout`'s rows on `pool` (its sources holding their states): (out, the arguments
    for the float64 steps). Raises KernelRaised."""
    starts = _starts(layout["lengths"])
    step = next(problem.steps()).map(lambda _, t: t[:starts[-1]])  # the tokens' inputs, packed row after row
    arguments = {"z": None, **dict(step.given()), **problem.parameters(), "dt_softplus": problem.dt_softplus}
    out = nan_filled(tuple(arguments["x"].shape), arguments["x"])
    device = pool.device
    extra = {"state_batch_indices": _int32(layout["sources"], device),
             "dst_state_batch_indices": _int32(layout["destinations"], device),
             "num_accepted_tokens": _int32(layout["accepted"], device),
             "cu_seqlens": _int32(starts, device)}
    if kernel.takes_pad_slot_id:
        extra["pad_slot_id"] = kernel.pad_slot_id
    if kernel.takes_out:
        extra["out"] = out
    seed = sweep.case_seed(layout["seed"], {"step": 1})
    out = kernel.fenced_update(pool, arguments, case.rounding, seed, where, transcript, extra)
    # The float64 steps read D and dt_bias whole: zeros where the kernel was passed None (regimes.ABSENT).
    return out, {**arguments, "D": problem.D, "dt_bias": problem.dt_bias}


def _int32(values, device: str) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


def draft_layout(case: DriftCase, pad: int, check: str) -> dict:
    """The pool: the pad slot where it is one (vLLM's null block, 0), each of `case.batch` rows' TOKENS source
    slots and TOKENS destination slots, all distinct and shuffled (drawn from the case's seed and `check`); each
    row's accepted count."""
    seed = sweep.case_seed(case.seed, {"check": check})
    generator = torch.Generator().manual_seed(seed)
    count = 2 * case.batch * TOKENS
    pool = count + (1 if 0 <= pad <= count else 0)
    usable = [s for s in range(pool) if s != pad]
    order = [usable[i] for i in torch.randperm(len(usable), generator=generator).tolist()]
    sources = [order[b * TOKENS:(b + 1) * TOKENS] for b in range(case.batch)]
    rest = order[case.batch * TOKENS:]
    destinations = [rest[b * TOKENS:(b + 1) * TOKENS] for b in range(case.batch)]
    # Row 0 accepted every draft token (its source the last, the farthest from a kernel that reads the first),
    # the next rows one fewer each, round again: every count where there are TOKENS rows or more.
    accepted = [TOKENS - b % TOKENS for b in range(case.batch)]
    # Rows of TOKENS - 1 and TOKENS tokens in turn, from row 0 (packed by cu_seqlens: a kernel that takes row b's
    # tokens at b * TOKENS reads row 1's in the wrong place); a column past a row's tokens is the pad id.
    lengths = [TOKENS - 1 if b % 2 == 0 else TOKENS for b in range(case.batch)]
    for b, length in enumerate(lengths):
        destinations[b][length:] = [pad] * (TOKENS - length)
    # The last row's last token is not kept (its destination the pad id, as an engine marks a token whose state
    # no later step reads): a store without the pad test lands in the pad slot, or before the pool at -1. Its
    # destination slot stays a spare, as do those of the columns past a row's tokens.
    not_kept = [case.batch - 1, lengths[-1] - 1]
    destinations[-1][lengths[-1] - 1] = pad
    return {"seed": seed, "pool": pool, "pad_slot_id": pad, "tokens": TOKENS, "lengths": lengths,
            "sources": sources, "destinations": destinations, "accepted": accepted, "not_kept": not_kept}


def _starts(lengths: list[int]) -> list[int]:
    """cu_seqlens of rows of `lengths` tokens."""
    return list(itertools.accumulate(lengths, initial=0))


def drafts_verdict(layout, states, pool, out, arguments, case: DriftCase, tolerance: Tolerance,
                   title: str = TITLES[DRAFTS]) -> SlotCheck:
    """The drafts verdict: each kept token's state in its destination slot of `pool`, and its out, against the
    float64 recurrence from its row's source state (`states`: draft_problem's initial states); its message opens
    with `title`."""
    rule = (tolerance.tol_factor, tolerance.floor, tolerance.rtol)
    rows = len(layout["accepted"])
    # Row b starts from source (b, accepted - 1): state row b * TOKENS + accepted - 1. The baseline stores each
    # token's state in the state dtype and goes on from it, as a decode of one token per call does; rounded
    # stochastically, in BASELINE_DRAWS draws, whose rms error is its figure (one draw's is noise at small widths).
    exact = torch.stack([states[b * TOKENS + layout["accepted"][b] - 1] for b in range(rows)]).double()
    draws = BASELINE_DRAWS if case.rounding == "stochastic" else 1
    base = exact.expand(draws, *exact.shape).clone()
    generator = torch.Generator(device=pool.device).manual_seed(layout["seed"])
    fixed = {"A": arguments["A"].double(), "D": arguments["D"].double(), "dt_bias": arguments["dt_bias"].double(),
             "dt_softplus": arguments["dt_softplus"]}
    worst, failed, nonfinite, nearest = None, None, None, None
    lengths, starts = layout["lengths"], _starts(layout["lengths"])
    for t in range(TOKENS):
        # Row b's token t, where it has one (a row past its last token steps on its last one's inputs, unjudged).
        tokens = [starts[b] + min(t, lengths[b] - 1) for b in range(rows)]
        x, dt, B, C = (arguments[k][tokens].double() for k in ("x", "dt", "B", "C"))
        z = None if arguments["z"] is None else arguments["z"][tokens].double()
        new, _ = state_update_step(torch.cat([exact[None], base]), x, dt, fixed["A"], B, C, D=fixed["D"], z=z,
                                   dt_bias=fixed["dt_bias"], dt_softplus=fixed["dt_softplus"])
        exact, base = new[0], round_to(new[1:], case.dtype, case.rounding, generator).double()
        kept = [b for b in range(rows) if t < lengths[b] and layout["destinations"][b][t] != layout["pad_slot_id"]]
        stored = pool[[layout["destinations"][b][t] for b in kept]].double()
        if t == 0 and case.rounding == "stochastic":  # the first tokens' stores round exact steps from the sources
            nearest = nearest_z(exact[kept], stored, case.dtype)
        beyond = _out_beyond_storage(stored, out[[tokens[b] for b in kept]], C[kept], x[kept],
                                     None if z is None else z[kept], fixed["D"], case.dtype)
        for i, b in enumerate(kept):  # a token not kept has no state to judge, nor an out to judge by it
            slot = layout["destinations"][b][t]
            figures = {"row": b, "token": t, "slot": slot, "state_rel": relative_error(stored[i], exact[b]),
                       "baseline_state_rel": _rms([relative_error(d[b], exact[b]) for d in base]),
                       "out_beyond_state": beyond[i]}
            where = f"row {b} token {t} (slot {slot}, {layout['accepted'][b]} accepted)"
            if nonfinite is None and not (torch.isfinite(stored[i]).all() and torch.isfinite(out[tokens[b]]).all()):
                what = "its state" if not torch.isfinite(stored[i]).all() else "its out"
                nonfinite = f"{where}: {what} non-finite (NaN where it was not written)"
            over = []
            if not within_tolerance(figures["state_rel"], figures["baseline_state_rel"], *rule):
                limit = tolerance_limit(figures["baseline_state_rel"], *rule)
                over.append(f"state error {figures['state_rel']:.3g} > limit {limit:.3g} ({tolerance_rule(tolerance)})")
            if not beyond[i] <= 1.0:
                over.append(f"out {beyond[i]:.3g}x farther from C·(its stored state) than that state's rounding "
                            "allows")
            if failed is None and over:
                failed = f"{where}: {'; '.join(over)}"
            if worst is None or figures["state_rel"] > worst["state_rel"]:
                worst = figures
    result = {"tokens": starts[-1], "worst": worst, "nearest_z": nearest}
    if nonfinite is not None:
        return SlotCheck(DRAFTS, Status.NONFINITE, f"{title}: {nonfinite}", result)
    if failed is None and nearest is not None and nearest < -NEAREST_Z_LIMIT:
        failed = (f"the first tokens' stores rounded to nearest, not stochastically: their squared rounding errors "
                  f"lie {-nearest:.1f} standard deviations below what stochastic rounding gives (the nearer "
                  f"neighbour taken too often; limit {NEAREST_Z_LIMIT:g})")
    if failed is not None:
        return SlotCheck(DRAFTS, Status.FAIL, f"{title}: {failed}", result)
    return SlotCheck(DRAFTS, Status.PASS, "", result)


def _rms(values: list[float]) -> float:
    return math.sqrt(sum(v * v for v in values) / len(values))


# fp32's unit roundoff: the kernel's out is dstate fp32 products summed, D·x added and the gate applied, each
# rounding, so its arithmetic is off by at most (dstate + 4) u of the terms' magnitudes (recursive summation's bound).
FP32_UNIT_ROUNDOFF = 2.0**-24


def _out_beyond_storage(stored, out, C, x, z, D, dtype) -> list[float]:
    """Per row: the largest |out - y(stored)| over the bound the state's storage allows, where y(h) = C·h + D·x,
    gated. A kernel computes out from its state before storing it (vLLM goes on in fp32 across draft tokens), and
    the stored state is that within an ulp of `dtype` an element, so |out - y(stored)| <= sum_n |C_n| ulp(h_n)
    (times |silu(z)|), plus fp32's rounding of the sums (FP32_UNIT_ROUNDOFF) and out's own rounding into its
    dtype (x's: half an ulp of out there, a bf16 out's 2**-9 of itself). A deterministic bound: no draw of
    the kernel's rounding exceeds it by chance, as one would a comparison of later tokens' out with a baseline's
    (their outs follow the kernel's own random roundings of the tokens before)."""
    nheads = stored.shape[1]
    Ch = heads_of_groups(C, nheads)[:, :, None, :]  # (rows, nheads, 1, dstate)
    terms = stored * Ch
    y = skip_and_gate(terms.sum(-1), x, D, z, torch.float64)
    gate = 1.0 if z is None else torch.nn.functional.silu(z).abs()
    magnitude = (terms.abs().sum(-1) + (D * x).abs()) * gate
    arithmetic = (stored.shape[-1] + 4) * FP32_UNIT_ROUNDOFF * magnitude
    got = out.double()
    rounded = ulp(got, out.dtype) / 2
    bound = (ulp(stored, dtype) * Ch.abs()).sum(-1) * gate + arithmetic + rounded + torch.finfo(torch.float64).tiny
    ratio = ((got - y).abs() / bound).nan_to_num(math.inf)
    return ratio.flatten(1).amax(1).tolist()


def _kept(layout, paged: PagedPool) -> SlotCheck:
    pad = layout["pad_slot_id"]
    written = {slot for row in layout["destinations"] for slot in row if slot != pad}
    changed = paged.changed_slots(written)
    past_state = paged.past_states()
    figures = {"checked": paged.states.shape[0] - len(written), "changed": changed, "past_state": past_state}
    if not changed and not past_state:
        return SlotCheck(KEPT, Status.PASS, "", figures)
    sources = {slot: (b, t) for b, row in enumerate(layout["sources"]) for t, slot in enumerate(row)}

    def named(slot: int) -> str:
        if slot in sources:
            b, t = sources[slot]
            return f"slot {slot} (row {b}'s source {t})"
        if slot == pad:
            b, t = layout["not_kept"]
            return f"slot {slot} (the pad id: row {b} token {t}'s destination)"
        if slot < 0 or slot >= layout["pool"]:
            return f"slot {slot} (outside the pool)"
        return f"slot {slot} (a spare: no token's destination)"

    wrote = [*map(named, changed), *([paged.past_states_text(past_state)] if past_state else [])]
    return SlotCheck(KEPT, Status.FAIL, "slots kept: the call wrote " + ", ".join(wrote), figures)
