"""Running a sweep's cases so that no finished case is ever lost.

Each result is handed to the sinks (a JSON-lines file, one line per case on a
log) the moment its case finishes. SIGINT and SIGTERM, as a user or a CI
runner's timeout sends them, and a closed stdout (`| head -1`) stop the sweep
with `Interrupted`: the cases that finished are kept, and the caller writes
their report marked as interrupted, with the exit code of the interruption.

The signal handlers raise `Interrupted`, a BaseException that is not
KeyboardInterrupt, so a kernel that raises KeyboardInterrupt itself is told
apart from a user's Ctrl-C: the former is that case's error, the latter ends
the sweep. A sweep stops once, however many signals come, and keeps its
handler installed against native code that takes the signals over
(`reclaim_signals`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field

# Exit codes of an interrupted sweep: 128 + the signal's number, as shells report them.
INTERRUPT_EXIT_CODES = {"SIGINT": 130, "SIGPIPE": 141, "SIGTERM": 143}


class Interrupted(BaseException):
    """The sweep was stopped from outside: `reason` is SIGINT, SIGTERM or SIGPIPE (stdout closed)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason

    @property
    def exit_code(self) -> int:
        return INTERRUPT_EXIT_CODES[self.reason]


# The signals that stop a sweep, and what they do while a sweep (its handler) or a worker (SIG_IGN) owns them:
# what reclaim_signals installs again. None: nobody here owns them.
STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_owner_action: Callable | int | None = None
# interrupts_held: how deep the blocks go, and the name of a stopping signal that arrived inside one.
_held = 0
_arrived: list[str] = []
# Inside stopped_sweeps_ignore_signals: the former actions of the signals an interrupted sweep left ignored.
_left_ignored: list[dict] | None = None


@contextmanager
def interruptible() -> Iterator[None]:
    """While inside, SIGINT and SIGTERM raise Interrupted in the main thread, once: a second signal while
    the sweep stops is ignored (`timeout` signals its command, then the command's whole process group, so
    the command gets two, microseconds apart). Called from another thread (a library user's), it changes
    nothing: only the main thread may set handlers, and only it receives the signals."""
    global _owner_action
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = []

    def handler(signum, _frame):
        if raised:
            return
        raised.append(signum)
        if _held:
            _arrived.append(signal.Signals(signum).name)
            return
        raise Interrupted(signal.Signals(signum).name)

    previous = {s: signal.signal(s, handler) for s in STOPPING_SIGNALS}
    _owner_action = handler
    try:
        yield
    finally:
        _owner_action = None
        _arrived.clear()
        if raised and _left_ignored is not None:
            for s in previous:
                signal.signal(s, signal.SIG_IGN)
            _left_ignored.append(previous)
        else:
            for s, old in previous.items():
                signal.signal(s, old)


@contextmanager
def stopped_sweeps_ignore_signals() -> Iterator[None]:
    """For a command that writes its reports after its sweep: once a signal has stopped the sweep, SIGINT and
    SIGTERM stay ignored until the block ends (the reports written), and only then get their former actions
    back. `timeout` sends its second SIGTERM microseconds after the first, and the default action would end
    the process before its report."""
    global _left_ignored
    _left_ignored = []
    try:
        yield
    finally:
        left, _left_ignored = _left_ignored, None
        for previous in reversed(left):
            for s, old in previous.items():
                signal.signal(s, old)


@contextmanager
def interrupts_held() -> Iterator[None]:
    """The sweep's Interrupted held back during the block and raised as it ends (in place of anything the
    block raised): for code that must not be cut halfway (core.capture putting fd 1 back). Blocking the
    signals in this thread is not enough: a signal sent to the process goes to any thread that does not
    block it (torch's pool threads), and Python then runs the handler in the main thread at its next
    instruction, inside the block."""
    global _held
    _held += 1
    try:
        yield
    finally:
        _held -= 1
        if not _held and _arrived:
            raise Interrupted(_arrived.pop())


def ignore_stopping_signals() -> None:
    """For a worker process: SIGINT and SIGTERM ignored for good (reclaim_signals keeps them so). The
    parent stops the sweep and then its workers; a Ctrl-C, or a `timeout` that signals the whole process
    group, must not end a worker first, which the parent would report as that case's failure."""
    global _owner_action
    _owner_action = signal.SIG_IGN
    for s in STOPPING_SIGNALS:
        signal.signal(s, signal.SIG_IGN)


def reclaim_signals() -> None:
    """Install again, at the level of the C library, what SIGINT and SIGTERM do here: the sweep's handler
    (interruptible) or, in a worker, nothing (ignore_stopping_signals).

    Native code that a kernel loads may take them over without Python knowing (signal.getsignal still
    names the old action). LLVM, inside Triton, installs one-shot handlers (SA_RESETHAND) for SIGTERM
    among others when it first compiles in a process: delivering the first SIGTERM resets the action to the
    default until LLVM's handler puts Python's back, and `timeout`'s second SIGTERM, microseconds later,
    killed the process before it could report (seen on the H200 with vLLM's kernels). Called after every
    kernel call and case; a no-op where nothing here owns the signals (a library user's handlers are theirs)
    and off the main thread."""
    if _owner_action is None or threading.current_thread() is not threading.main_thread():
        return
    for s in STOPPING_SIGNALS:
        signal.signal(s, _owner_action)


def stdout_closed() -> Interrupted:
    """Stdout's reader went away: point fd 1 at /dev/null (so the interpreter's own flush at exit
    cannot fail again) and stop the sweep as SIGPIPE would."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return Interrupted("SIGPIPE")


@dataclass
class Outcome:
    results: list = field(default_factory=list)  # every case that finished, in order
    seconds: float = 0.0
    interrupted: Interrupted | None = None


def execute(results: Iterable, on_result: Callable[[object], None]) -> Outcome:
    """Drain `results` (a generator yielding one result per finished case), handing each to
    `on_result` at once. Stops at Interrupted (a signal, or a BrokenPipeError from a sink
    writing to stdout) and returns what finished; the generator is closed either way, so an
    isolated worker is stopped with it."""
    outcome = Outcome()
    start = time.perf_counter()
    try:
        with interruptible(), closing(iter(results)) as stream:
            for result in stream:
                outcome.results.append(result)
                try:
                    on_result(result)
                except BrokenPipeError:
                    raise stdout_closed() from None
                reclaim_signals()  # a signal pending meanwhile is raised here, once the case is handed out
    except Interrupted as exc:
        outcome.interrupted = exc
    outcome.seconds = time.perf_counter() - start
    return outcome
