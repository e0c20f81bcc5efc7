"""Running cases in a worker process, so that a case that crashes, exits or hangs costs only itself.

One worker, started with the `spawn` context (a forked CUDA context is unusable), runs the
cases one after another: a process per case would import torch and triton per case, seconds
each. The runner (scan.run.ScanRunner, drift.run.DriftRunner) is a picklable value that the
worker turns back into the kernel's adapter.

The protocol, over one duplex pipe, every message a plain pickle (never torch's shared-memory
reductions: a result must outlive the worker that made it):

    parent -> worker   a case; None to stop
    worker -> parent   ("ready", None) once configured, or ("failed", why) if it cannot start;
                       per case: ("ticks", n) while it runs (batched), then ("result", result)
                       or ("failed", why) when running the case itself raised

A worker that dies makes its case `runner.failed(case, "crashed: signal 11 (SIGSEGV)")` or
`"exited with code N without a result"`; a case past the timeout is `"timed out after T s"`,
its worker killed. Either way the next case gets a new worker.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from multiprocessing.connection import Connection, wait

from ssmcheck.core import runtime
from ssmcheck.core.guard import describe

# Seconds a worker may take to import torch and triton and configure the device.
STARTUP_TIMEOUT = 600.0
# Progress ticks are sent at most this often (seconds): a decode step can take microseconds.
TICK_INTERVAL = 0.1
# Seconds to wait for a worker to end after asking (stop) or killing it.
END_WAIT = 5.0


class _WorkerLost(Exception):
    """The worker ended, or never started, before the case's result came back; the message says how."""


def run_isolated(runner, cases: list, timeout: float | None, advance: Callable[[], None]) -> Iterator:
    """Yield `runner(case, advance)` for each case, in order, each run in a worker process.

    A case whose worker crashes, exits or runs past `timeout` seconds (None: no limit) yields
    `runner.failed(case, message, seconds)`, and a new worker takes the cases after it.
    `advance()` is called in this process for each of the worker's calls to its own advance.
    Closing the generator (or an exception while it waits, e.g. on Ctrl-C) kills the worker.
    """
    context = multiprocessing.get_context("spawn")
    worker: _Worker | None = None
    try:
        for case in cases:
            if worker is None:
                worker = _Worker(context, runner)
                worker.start()
            result, healthy = _run_case(worker, runner, case, timeout, advance)
            if not healthy:
                worker.kill()
                worker = None
            yield result
        if worker is not None:
            worker.stop()
            worker = None
    finally:
        if worker is not None:
            worker.kill()


def _run_case(worker: _Worker, runner, case, timeout: float | None, advance: Callable[[], None]) -> tuple:
    """(the case's result, whether the worker can take another case)."""
    start = time.monotonic()
    try:
        worker.wait_ready()
        start = time.monotonic()  # the case's clock starts once a worker can run it
        deadline = None if timeout is None else start + timeout
        worker.send(case)
        while True:
            message = worker.receive(deadline)
            if message is None:
                return runner.failed(case, f"timed out after {timeout:g} s", time.monotonic() - start), False
            kind, value = message
            if kind == "ticks":
                for _ in range(value):
                    advance()
            elif kind == "result":
                return value, True
            else:
                return runner.failed(case, value, time.monotonic() - start), True
    except _WorkerLost as exc:
        return runner.failed(case, str(exc), time.monotonic() - start), False


class _Worker:
    """The parent's handle on one worker process."""

    def __init__(self, context, runner):
        self.conn, child_conn = context.Pipe()
        # The runner travels pickled, to be unpickled after the worker has configured the
        # runtime: unpickling imports the command's modules, and they may import triton.
        # Not a daemon: a daemonic process may not start processes of its own, and a kernel may
        # (compile workers). It is killed when done with, and dies with its parent (_serve).
        self.process = context.Process(
            target=_serve, args=(runner.device, pickle.dumps(runner), child_conn), name="ssmcheck-worker",
        )
        self._child_conn = child_conn
        self.ready = False

    def start(self) -> None:
        try:
            with _sigint_blocked():
                self.process.start()
        finally:
            self._child_conn.close()  # the worker's end: held here, it would hide the worker's exit

    def wait_ready(self) -> None:
        """Return once the worker is configured; raises _WorkerLost if it does not get there."""
        if self.ready:
            return
        try:
            message = self.receive(time.monotonic() + STARTUP_TIMEOUT)
        except _WorkerLost as exc:
            raise _WorkerLost(f"the worker could not start: {exc}") from None
        if message is None:
            raise _WorkerLost(f"the worker did not start within {STARTUP_TIMEOUT:g} s")
        kind, value = message
        if kind != "ready":
            raise _WorkerLost(f"the worker could not start: {value}")
        self.ready = True

    def send(self, obj) -> None:
        try:
            self.conn.send_bytes(pickle.dumps(obj))
        except OSError:  # the worker's end is closed: it has ended
            raise _WorkerLost(self._death()) from None

    def receive(self, deadline: float | None) -> tuple | None:
        """The worker's next message; None once `deadline` (time.monotonic) passes. Raises _WorkerLost."""
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = wait([self.conn, self.process.sentinel], remaining)
        if self.conn in ready:  # read first: a worker may have written its last message and ended
            try:
                data = self.conn.recv_bytes()
            except EOFError:
                raise _WorkerLost(self._death()) from None
            try:
                return pickle.loads(data)
            except Exception as exc:  # noqa: BLE001 (e.g. a result class this process cannot import)
                return "failed", f"the worker's message could not be read back: {_one_line(exc)}"
        if ready:  # only the sentinel: the worker ended with nothing left to read
            raise _WorkerLost(self._death())
        return None

    def _death(self) -> str:
        self.process.join(END_WAIT)
        code = self.process.exitcode
        if code is None:
            return "the worker closed its pipe"
        if code < 0:
            return f"crashed: signal {-code} ({_signal_name(-code)})"
        return f"exited with code {code} without a result"

    def stop(self) -> None:
        """Ask the worker to end, and kill it if it does not."""
        with suppress(OSError):
            self.conn.send_bytes(pickle.dumps(None))
        self.process.join(END_WAIT)
        self.kill()

    def kill(self) -> None:
        if self.process.pid is not None:
            self.process.kill()  # SIGKILL: a worker stuck in C code never sees anything gentler
            self.process.join(END_WAIT)
        self.conn.close()


@contextmanager
def _sigint_blocked() -> Iterator[None]:
    """Block SIGINT while a worker is started: the worker inherits the mask, so a Ctrl-C during
    its start-up waits until `_serve` has set SIGINT to be ignored (it is the parent's to handle)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"


def _one_line(exc: BaseException) -> str:
    return " ".join(describe(exc).split())


# ---------------------------------------------------------------------------- in the worker


def _serve(device: str, runner_bytes: bytes, conn: Connection) -> None:
    """The worker: configure the runtime, then run each case received until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    _die_with_parent()
    os.dup2(2, 1)  # what is printed outside a kernel's capture goes to stderr, never into the report
    try:
        runtime.configure(device)
        runner = pickle.loads(runner_bytes)
    except Exception as exc:  # noqa: BLE001 (reported to the parent as the case's error)
        _send(conn, ("failed", _one_line(exc)))
        return
    _send(conn, ("ready", None))
    ticks = _Ticks(conn)
    while True:
        try:
            case = pickle.loads(conn.recv_bytes())
        except EOFError:  # the parent has gone
            return
        if case is None:
            return
        try:
            message = ("result", runner(case, ticks.advance))
        except Exception as exc:  # noqa: BLE001 (a bug on our side is still one case's outcome)
            message = ("failed", f"running the case raised {_one_line(exc)}")
        ticks.flush()
        _send(conn, message)


def _send(conn: Connection, message: tuple) -> None:
    try:
        data = pickle.dumps(message)
    except Exception as exc:  # noqa: BLE001 (an unpicklable result is the case's error, not a hang)
        data = pickle.dumps(("failed", f"the result could not be sent back: {_one_line(exc)}"))
    conn.send_bytes(data)


def _die_with_parent() -> None:
    """On Linux, have the kernel SIGKILL this worker if the parent dies (say, SIGKILLed by CI)
    while a case hangs: nobody else would end it."""
    if sys.platform != "linux":
        return
    import ctypes  # noqa: PLC0415

    PR_SET_PDEATHSIG = 1
    with suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))


class _Ticks:
    """The worker's `advance`: counts calls and sends them to the parent at most every TICK_INTERVAL."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.count = 0
        self.sent = time.monotonic()

    def advance(self) -> None:
        self.count += 1
        if time.monotonic() - self.sent >= TICK_INTERVAL:
            self.flush()

    def flush(self) -> None:
        if self.count:
            self.conn.send_bytes(pickle.dumps(("ticks", self.count)))
            self.count = 0
        self.sent = time.monotonic()
