"""Running a sweep's cases so that no finished case is ever lost.

Each result is handed to the sinks (a JSON-lines file, one line per case on a
log) the moment its case finishes. SIGINT and SIGTERM, as a user or a CI
runner's timeout sends them, and a closed stdout (`| head -1`) stop the sweep
with `Interrupted`: the cases that finished are kept, and the caller writes
their report marked as interrupted, with the exit code of the interruption.

The signal handlers raise `Interrupted`, a BaseException that is not
KeyboardInterrupt, so a kernel that raises KeyboardInterrupt itself is told
apart from a user's Ctrl-C: the former is that case's error, the latter ends
the sweep.
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


@contextmanager
def interruptible() -> Iterator[None]:
    """While inside, SIGINT and SIGTERM raise Interrupted in the main thread. Called from another
    thread (a library user's), it changes nothing: only the main thread may set handlers, and only
    it receives the signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, _frame):
        raise Interrupted(signal.Signals(signum).name)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


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
    except Interrupted as exc:
        outcome.interrupted = exc
    outcome.seconds = time.perf_counter() - start
    return outcome
