"""A drift case's first window of step inputs, drawn on a background thread while the case before it decodes.

A window's inputs are drawn on the host (drift.regimes: a case is the same on every device), 0.05-0.2 s a case at
the default GPU widths and ~2 s for its 256-row case: 8-10 s of the default GPU drift's 41-50 s warm on an H100,
the device idle meanwhile (sixty-sixth session). The case before leaves the host's other cores idle as it decodes,
so a sweep that runs its cases in one process (api) asks `start` for the next case before it runs each; the case's
window (drift.lockstep.StepWindow) then takes the blocks drawn (`taken`) and draws only those missing. The blocks
are the stream's own (each block from its own generator, DecodeProblem.host_blocks): the same values either way.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from ssmcheck.drift.lockstep import first_window_steps
from ssmcheck.drift.regimes import STEP_BLOCK, StepInputs, make_problem
from ssmcheck.drift.spec import DriftCase

# Cases drawn ahead and not yet taken, at most: the next case's, and the one before it (a case that ended before its
# decode, or raised, never takes its own).
PENDING = 2

_pool = ThreadPoolExecutor(1, thread_name_prefix="ssmcheck-prefetch")
_pending: dict[tuple, Future] = {}


def _key(case: DriftCase) -> tuple:
    """What the case's stream of steps is drawn from (make_problem's arguments but the device)."""
    return case.regime, case.shape(), case.dtype, case.steps, case.seed


def start(case: DriftCase) -> None:
    """Draw the blocks of `case`'s first window (drift.lockstep.StepWindow) on the background thread (nothing for
    a case that is skipped or starts from a prefill, or one already drawing)."""
    if case.skip_reason is not None or case.from_prefill or _key(case) in _pending:
        return
    while len(_pending) >= PENDING:
        _pending.pop(next(iter(_pending))).cancel()
    _pending[_key(case)] = _pool.submit(_draw, _key(case))


def _draw(key: tuple) -> dict[int, StepInputs]:
    problem = make_problem(*key, "cpu")
    blocks = {0: problem.block(0)}
    steps = first_window_steps(problem, blocks[0])
    blocks.update((k, problem.block(k)) for k in range(1, -(-steps // STEP_BLOCK)))
    return blocks


def taken(case: DriftCase) -> dict[int, StepInputs]:
    """The blocks drawn ahead for `case`, by index (waiting for them where they are still being drawn); none where
    nothing was started for it."""
    future = _pending.pop(_key(case), None)
    return {} if future is None or future.cancelled() else future.result()
