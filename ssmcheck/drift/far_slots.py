"""The far-slot check of a drift case: rows whose slots lie past 2**32 elements into the state pool.

An engine keeps a layer's cached states in one pool, (slots, nheads, headdim, dstate), and a row's state lies
slot x slot-stride elements in. A kernel that forms that offset in 32-bit integers (the slot loaded from int32
`state_batch_indices`, as vLLM passes them, times a stride Triton passes as a 32-bit argument) wraps once the pool
passes 2**31 elements: at Mamba2-2.7B widths (655,360 elements a slot) from slot 3,277, a pool of 4 GiB of fp16
states. Between 2**31 and 2**32 elements the wrapped offset is negative, an illegal address that ends the process's
CUDA context; past 2**32 it lands back inside the pool, on another sequence's slot: a silent write. So the rows
here lie past 2**32 only.

For a kernel that takes slot indices, on a CUDA GPU: one step of ROWS rows on slots f + LEAD, f + LEAD + 1, ..., f
the first slot at or past 2**32 elements, in a pool of f + LEAD + ROWS slots (8 GiB of fp16 or bf16 states, 16 GiB
of fp32), every other slot FILL (finite: a step from a NaN could keep the NaN's bits, and hide the write). One
verdict, `far_slot`: every other slot keeps FILL's bits (the first written is named, and where a row's offset wrapped
to it, that row; where it is a row's index in the batch, that), and each
row's slot holds the float64 step of its state within the tolerance rule, as drift.slots judges a live row. Skipped,
with the reason, where the GPU's free memory cannot hold the pool. Not run on the CPU, whose host memory a pool of
8-16 GiB would exceed on a CI machine (tests lower FAR_ELEMENTS to run it there).

For a kernel that also takes draft tokens, its twin `far_drafts`: drift.speculative's verifying call of ROWS rows
whose source and destination slots all lie past 2**32 elements (the pad id stays where it is), judged the same way:
every slot before them keeps FILL's bits (the first written named, with the token or source whose offset wraps to
it), and each kept token's state and out as the drafts verdict judges them. A draft path may form its destination
offsets apart from the plain step's.
"""

from __future__ import annotations

import fcntl
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch

from ssmcheck.core import sweep
from ssmcheck.core.capture import Transcript
from ssmcheck.core.pool import nan_filled
from ssmcheck.core.status import Status
from ssmcheck.core.tensors import bits
from ssmcheck.core.tolerance import Tolerance
from ssmcheck.drift import speculative
from ssmcheck.drift.adapter import DriftAdapter, KernelRaised
from ssmcheck.drift.regimes import make_problem
from ssmcheck.drift.results import SlotCheck
from ssmcheck.drift.slots import FAR, live_verdict
from ssmcheck.drift.spec import DriftCase

FAR_SLOT = "far_slot"
TITLE = "slots past 2**32 elements"
FAR_DRAFTS = "far_drafts"
DRAFTS_TITLE = "draft tokens' slots past 2**32 elements"
# Where an offset formed in 32 bits wraps back into the pool: the first row's slot is the first at or past it.
FAR_ELEMENTS = 2**32
ROWS = 2
# The rows' slots start this many past the first slot at or past FAR_ELEMENTS: where a slot's size divides 2**32 an
# offset that wraps lands on slots LEAD.., apart from slots 0..ROWS-1, where a row stored at its batch index lands.
LEAD = 2
# On the CPU the check runs only on a pool this small (tests that lower FAR_ELEMENTS).
CPU_POOL_BYTES = 64 * 2**20
# The GPU's free memory must exceed the pool's size by this factor (the step's other tensors, the checks' blocks).
HEADROOM = 1.25
# What every slot but the rows' holds: exact in fp32, fp16 and bf16, and finite (a wrapped row's step from it writes
# other bits, where a step from a NaN may keep the NaN's).
FILL = -0.8125
# Elements of the pool compared with FILL at once (a bool per element while a block is compared).
BLOCK_ELEMENTS = 2**26


def run_check(case: DriftCase, kernel: DriftAdapter, tolerance: Tolerance, device: str,
              transcript: Transcript) -> SlotCheck | None:
    """The far-slot verdict of `case` for `kernel` (which takes slot indices); None on the CPU at FAR_ELEMENTS."""
    return _in_a_far_pool(case, device, FAR_SLOT, TITLE, LEAD + ROWS,
                          lambda pool, far: _step(case, kernel, tolerance, transcript, pool, far + LEAD))


def run_draft_check(case: DriftCase, kernel: DriftAdapter, tolerance: Tolerance, device: str,
                    transcript: Transcript) -> SlotCheck | None:
    """The far-drafts verdict of `case` for `kernel` (which takes draft tokens): drift.speculative's verifying call
    of ROWS rows whose source and destination slots lie past FAR_ELEMENTS; None on the CPU at FAR_ELEMENTS."""
    layout = speculative.draft_layout(replace(case, batch=ROWS), kernel.pad_slot_id, FAR_DRAFTS)
    return _in_a_far_pool(case, device, FAR_DRAFTS, DRAFTS_TITLE, layout["pool"],
                          lambda pool, far: _drafts(case, kernel, tolerance, transcript, layout, pool, far))


def _in_a_far_pool(case: DriftCase, device: str, name: str, title: str, slots: int,
                   check: Callable[[torch.Tensor, int], SlotCheck]) -> SlotCheck | None:
    """`check(pool, far)` in a pool of FILL whose `slots` last slots, from `far` on, lie past FAR_ELEMENTS; freed
    after. Skipped where the GPU's free memory cannot hold it; None on the CPU at FAR_ELEMENTS."""
    state_shape = (case.nheads, case.headdim, case.dstate)
    far = -(-FAR_ELEMENTS // math.prod(state_shape))
    shape = (far + slots, *state_shape)
    size = _pool_bytes(shape, case)
    if device == "cpu":
        return None if size > CPU_POOL_BYTES else _in_a_pool(shape, case, device, name, title, far, check)
    with _one_pool_at_a_time():
        free = torch.cuda.mem_get_info()[0]
        if free < HEADROOM * size:
            return SlotCheck(name, Status.SKIPPED, f"{title}: a pool of {_gib(size)} needs more GPU memory than "
                             f"is free ({_gib(free)})")
        return _in_a_pool(shape, case, device, name, title, far, check)


@contextmanager
def _one_pool_at_a_time() -> Iterator[None]:
    """Worker processes that share a GPU (--workers) make the check one at a time: each pool is 8-16 GiB. A lock
    file per user and GPU."""
    path = Path(tempfile.gettempdir()) / f"ssmcheck-far-slots-{os.getuid()}-gpu{torch.cuda.current_device()}.lock"
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _in_a_pool(shape: tuple[int, ...], case: DriftCase, device: str, name: str, title: str, far: int,
               check: Callable[[torch.Tensor, int], SlotCheck]) -> SlotCheck:
    """`check(pool, far)` in a pool of `shape` filled with FILL, freed after (skipped where it does not fit)."""
    try:
        pool = torch.full(shape, FILL, dtype=case.dtype, device=device)
    except torch.cuda.OutOfMemoryError:  # another process took the memory since it was asked
        return SlotCheck(name, Status.SKIPPED, f"{title}: a pool of {_gib(_pool_bytes(shape, case))} did not fit in "
                         "GPU memory")
    try:
        return check(pool, far)
    finally:
        del pool
        if device != "cpu":
            torch.cuda.empty_cache()  # 8-16 GiB the next case's tensors may need


def _step(case: DriftCase, kernel: DriftAdapter, tolerance: Tolerance, transcript: Transcript, pool: torch.Tensor,
          far: int) -> SlotCheck:
    """One step of ROWS rows on slots `far` on of `pool` (its last ROWS), judged; the slots before them keep FILL."""
    seed = sweep.case_seed(case.seed, {"check": FAR_SLOT})
    problem = make_problem(case.regime, replace(case.shape(), batch=ROWS), case.dtype, 1, seed, pool.device.type)
    pool[far:] = problem.initial_state
    step = next(problem.steps())
    arguments = {"z": None, **dict(step.given()), **problem.parameters(), "dt_softplus": problem.dt_softplus}
    slots = list(range(far, far + ROWS))
    sent = nan_filled(tuple(arguments["x"].shape), arguments["x"])
    try:
        returned = kernel.update_slots(pool, torch.tensor(slots, dtype=torch.int32, device=pool.device), arguments,
                                       sent, case.rounding, sweep.case_seed(seed, {"step": 1}), "far-slot check",
                                       transcript)
    except KernelRaised as exc:
        return SlotCheck(FAR_SLOT, Status.ERROR, f"{TITLE}: {exc}")
    written = _written_slots(pool, far)
    figures = {"slots": slots, "slot_elements": pool[0].numel(), "pool_slots": far + ROWS, "written": written[:8]}
    if written:
        rows = {slot: f"row {row}'s slot {slot}" for row, slot in enumerate(slots)}
        wrote = _wrote(written, rows, pool[0].numel(), None, batch_rows=ROWS)
        return SlotCheck(FAR_SLOT, Status.FAIL, f"{TITLE}: {wrote}", figures)
    reference = {**arguments, "D": problem.D, "dt_bias": problem.dt_bias}
    layout = {"slots": slots, "pad_rows": [], "seed": seed, "placement": FAR, "pad_slot_id": None}
    out = sent if kernel.takes_out else returned
    own = kernel.takes_out and returned.data_ptr() != sent.data_ptr()
    live = live_verdict(layout, problem.initial_state, pool, out, reference, case, tolerance, kernel.takes_out, own)
    return replace(live, name=FAR_SLOT, figures={**figures, **live.figures})


def _drafts(case: DriftCase, kernel: DriftAdapter, tolerance: Tolerance, transcript: Transcript, layout: dict,
            pool: torch.Tensor, far: int) -> SlotCheck:
    """The verifying call of `layout` with every slot but the pad id moved `far` slots on, judged."""
    pad = layout["pad_slot_id"]

    def moved(slots: list[list[int]]) -> list[list[int]]:
        return [[slot if slot == pad else slot + far for slot in row] for row in slots]

    layout = {**layout, "sources": moved(layout["sources"]), "destinations": moved(layout["destinations"])}
    problem = speculative.draft_problem(case, layout, pool.device.type)
    pool[torch.tensor(layout["sources"], device=pool.device).flatten()] = problem.initial_state
    try:
        out, reference = speculative.draft_call(case, kernel, layout, problem, pool, "far-drafts check", transcript)
    except KernelRaised as exc:
        return SlotCheck(FAR_DRAFTS, Status.ERROR, f"{DRAFTS_TITLE}: {exc}")
    written = _written_slots(pool, far)
    figures = {"sources": layout["sources"], "destinations": layout["destinations"], "slot_elements": pool[0].numel(),
               "pool_slots": pool.shape[0], "written": written[:8]}
    if written:
        named = {slot: f"row {b}'s source slot {slot}" for b, row in enumerate(layout["sources"]) for slot in row}
        named.update({slot: f"row {b} token {t}'s destination slot {slot}"
                      for b, row in enumerate(layout["destinations"]) for t, slot in enumerate(row) if slot != pad})
        return SlotCheck(FAR_DRAFTS, Status.FAIL,
                         f"{DRAFTS_TITLE}: {_wrote(written, named, pool[0].numel(), pad)}", figures)
    verdict = speculative.drafts_verdict(layout, problem.initial_state, pool, out, reference, case, tolerance,
                                         DRAFTS_TITLE)
    return replace(verdict, name=FAR_DRAFTS, figures={**figures, **verdict.figures})


def _wrote(written: list[int], far_slots: dict[int, str], per_slot: int, pad: int | None, batch_rows: int = 0) -> str:
    """'the step wrote slot S (...)', S the first of `written` (slots before the far ones): named where an offset of
    one of `far_slots` (slot: its description) wraps to it modulo FAR_ELEMENTS, where it is the pad id, or where it is
    the index of one of `batch_rows` rows in the batch."""
    wrapped = {slot * per_slot % FAR_ELEMENTS // per_slot: (slot, what) for slot, what in far_slots.items()}
    first = written[0]
    more = f" and {len(written) - 1} more" if len(written) > 1 else ""
    if first in wrapped:
        slot, what = wrapped[first]
        why = (f": {what} lies {slot * per_slot:,} elements in, {slot * per_slot % FAR_ELEMENTS:,} modulo "
               f"{FAR_ELEMENTS:,} (its offset formed in 32-bit integers)")
        return f"the step wrote slot {first} (no row's){more}{why}"
    if first == pad:
        return f"the step wrote slot {first} (the pad id: a token not kept){more}"
    if first < batch_rows:
        return (f"the step wrote slot {first} (no row's){more}: row {first}'s index in the batch (a row's state stored "
                "at its batch index, not at its slot)")
    return f"the step wrote slot {first} (no row's){more}"


def _written_slots(pool: torch.Tensor, far: int) -> list[int]:
    """The slots before `far` whose bits are no longer all FILL's, in order."""
    fill = bits(torch.tensor(FILL, dtype=pool.dtype)).item()
    per_block = max(1, BLOCK_ELEMENTS // pool[0].numel())
    flags = [(bits(pool[start:start + per_block]) != fill).flatten(1).any(1)
             for start in range(0, far, per_block)]
    return [int(i) for i in torch.cat(flags)[:far].nonzero().flatten().tolist()]


def _pool_bytes(shape: tuple[int, ...], case: DriftCase) -> int:
    return math.prod(shape) * case.dtype.itemsize


def _gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"
