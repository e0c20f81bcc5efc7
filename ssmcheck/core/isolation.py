"""Running cases in a worker process, so that a case that crashes, exits or hangs costs only itself.

A worker, started with the `spawn` context (a forked CUDA context is unusable), runs cases one
after another: a process per case would import torch and triton per case, seconds each. With
`--workers` several run at once, each taking the next case when it is free (core.workers gives each
its GPU). The runner (scan.run.ScanRunner, drift.run.DriftRunner) is a picklable value that the
worker turns back into the kernel's adapter.

The protocol, over one duplex pipe, every message a plain pickle (never torch's shared-memory
reductions: a result must outlive the worker that made it):

    parent -> worker   a case; None to stop
    worker -> parent   ("ready", compiled) once configured (a compiling helper: once it has compiled its slice
                       of the sweep ahead, compiled then its Launches.record, or None; a worker: None),
                       or ("failed", why) if it cannot start;
                       per case: ("ticks", n) while it runs (batched), then ("result", result)
                       or ("failed", why) when running the case itself raised

A worker that dies makes its case `runner.failed(case, "crashed: signal 11 (SIGSEGV)")` or
`"exited with code N without a result"`; a case past the timeout is `"timed out after T s"`,
its worker killed. Either way the next case gets a new worker.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import signal
import sys
import time
import types
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext, suppress
from multiprocessing.connection import Connection, wait

from ssmcheck.core import prestart, runtime
from ssmcheck.core.execution import STOPPING_SIGNALS, ignore_stopping_signals
from ssmcheck.core.guard import describe
from ssmcheck.core.precompile import record_of
from ssmcheck.core.spawning import cpu_threads, main_script_hidden, stopping_signals_blocked
from ssmcheck.core.workers import cpu_threads_each

# Seconds a worker may take to import torch and triton and configure the device.
STARTUP_TIMEOUT = 600.0
# Progress ticks are sent at most this often (seconds): a decode step can take microseconds.
TICK_INTERVAL = 0.1
# Seconds to wait for a worker to end after asking (stop) or killing it.
END_WAIT = 5.0


class _WorkerLost(Exception):
    """The worker ended, or never started, before the case's result came back; the message says how."""


def run_isolated(runner, cases: list, timeout: float | None, advance: Callable[[], None],
                 devices: Sequence[str | None] = (None,)) -> Iterator:
    """Yield `runner(case, advance)` for each case, each run in a worker process: one worker per entry
    of `devices` (the CUDA_VISIBLE_DEVICES it is started with; None leaves the environment alone), each
    taking the next case when it is free. With one worker the results come in the cases' order; with
    more, in the order they finish.

    A case whose worker crashes, exits or runs past `timeout` seconds (None: no limit) yields
    `runner.failed(case, message, seconds)`, and a new worker takes the cases after it.
    `advance()` is called in this process for each of the workers' calls to their own advance.
    Closing the generator (or an exception while it waits, e.g. on Ctrl-C) kills the workers.
    """
    context = multiprocessing.get_context("spawn")
    count = min(len(devices), max(1, len(cases)))
    threads = _cpu_threads(runner, count)
    slots = [_Slot(context, runner, device, threads) for device in devices[:count]]
    waiting = deque(cases)
    try:
        while waiting or any(slot.busy for slot in slots):
            for slot in slots:
                if not slot.busy and waiting:
                    slot.take(waiting.popleft(), timeout)
            busy = [slot for slot in slots if slot.busy]
            deadlines = [slot.deadline for slot in busy if slot.deadline is not None]
            wait([handle for slot in busy for handle in slot.handles()],
                 None if not deadlines else max(0.0, min(deadlines) - time.monotonic()))
            for slot in busy:
                result = slot.collect(timeout, advance)
                if result is not _RUNNING:
                    yield result
        _stop_all([slot.worker for slot in slots if slot.worker is not None])
    finally:
        for slot in slots:
            slot.kill()


def interleaved(cases: list, group=None) -> list:
    """`cases` in the order for several workers: one case of each group in turn (`group`: case -> a hashable, the
    cases that launch mostly the same Triton variants; scan.run.ScanRunner.compile_group), each group's cases in
    the sweep's order; `cases` as they are without `group`.

    Workers each take the next case when free, so in the sweep's order they all start on one group's cases and
    meet each new variant together: on a fresh H200 the eight workers of `scan --preset thorough --workers 8` each
    waited 31-35 s, most of it in waits of 0.5-1.5 s that all eight made at once while one process compiled the
    variant (benchmarks/RESULTS.md, thirty-seventh session). Taking the groups in turn, neighbouring workers launch
    different variants and compile them side by side."""
    if group is None:
        return list(cases)
    groups = _grouped(cases, group)
    rounds = max(map(len, groups), default=0)
    return [cases[g[i]] for i in range(rounds) for g in groups if i < len(g)]


def _grouped(cases: list, group) -> list[list[int]]:
    """The indices of `cases` by `group(case)`, each group's in the sweep's order, the groups as they first appear."""
    groups: dict = {}
    for index, case in enumerate(cases):
        groups.setdefault(group(case), []).append(index)
    return list(groups.values())


def _shares(cases: list, parts: int, group=None) -> list[list]:
    """`cases` cut into at most `parts` slices of about equal length, none empty, each in the sweep's order.

    With `group` (case -> a hashable: cases that launch mostly the same Triton variants), a group stays in one
    slice where it fits in an equal share, so that one helper compiles its variants where several would each
    compile them (the default scan on a GPU: 88 compilations of its 81 variants, not the 132 of slices cut in the
    sweep's order; benchmarks/RESULTS.md, "fewer variants"); a larger group is cut into equal shares. Largest
    first, each piece goes to the slice with the fewest cases. Without `group`, contiguous slices in the sweep's
    order.
    """
    share = max(1, -(-len(cases) // parts))
    if group is None:
        return [cases[start:start + share] for start in range(0, len(cases), share)]
    pieces = [g[start:start + share] for g in _grouped(cases, group) for start in range(0, len(g), share)]
    slices: list[list[int]] = [[] for _ in range(parts)]
    for piece in sorted(pieces, key=len, reverse=True):
        min(slices, key=len).extend(piece)
    return [[cases[i] for i in sorted(part)] for part in slices if part]


class CompilingHelpers:
    """Processes that each compile a slice of a sweep ahead (runner.precompile) into Triton's disk cache, and end:
    the sweep's cases, run elsewhere meanwhile or after, then load each variant at their first launch. Each has a
    GIL of its own, where threads share one (Triton's code generation is Python: eight threads compile the default
    scan's variants about 4x faster than one, four processes of four threads about 5-6x; benchmarks/RESULTS.md,
    thirtieth session), and whatever a compile-only call leaves in the kernel's host code ends with it
    (core.precompile). A runner that cannot be pickled, or that holds what the main script defines (a library
    user's callable kernel: the helper would have to run the script again, spawning.main_script_hidden), gets no
    helpers."""

    def __init__(self, runner, cases: list, helpers: int, threads: int, running: int = 1):
        """Start up to `helpers` processes, each on a slice of `cases` in the sweep's order, with `threads` compiling
        threads, while `running` processes run the cases (their count sets torch's CPU threads in each). A runner
        with a `compile_group(case)` method has each group of cases that launch mostly the same variants compiled
        by one helper (`_shares`); otherwise the slices are contiguous, where cases alike mostly fall to one.
        Helpers the command started before it imported torch (core.prestart) are taken first; those not taken are
        ended."""
        context = multiprocessing.get_context("spawn")
        self.workers: list[_Worker] = []
        # A runner that cannot be pickled or that the main script defines, or no process to be had: those cases
        # compile when they run.
        try:
            with suppress(Exception):
                if _pickled(runner)[1]:
                    return
                cpu = _cpu_threads(runner, running)
                for part in _shares(cases, helpers, getattr(runner, "compile_group", None)):
                    self.workers.append(_helper(context, runner, (part, threads), cpu))
        finally:
            prestart.dismiss()

    def wait(self) -> list[dict]:
        """Wait for every helper's compilations and end it: their records (Launches.record), none for a helper
        that could not start, crashed or took past STARTUP_TIMEOUT (its cases compile when they run)."""
        return self._end(time.monotonic() + STARTUP_TIMEOUT)

    def end(self) -> list[dict]:
        """End every helper now: the records of those that have finished their slice; the others are killed (the
        sweep ended first: their cases compiled when they ran, or found the cache warm)."""
        return self._end(time.monotonic())

    def _end(self, deadline: float) -> list[dict]:
        records, finished = [], []
        for worker in self.workers:
            try:
                message = worker.receive(deadline)
            except _WorkerLost:
                message = None
            if message is not None and message[0] == "ready" and message[1] is not None:
                records.append(message[1])
                finished.append(worker)
            else:
                worker.kill()
        _stop_all(finished)
        self.workers = []
        return records


def _cpu_threads(runner, running: int) -> int | None:
    """torch's CPU threads for a process started for a GPU sweep with `running` processes running its cases
    (workers.cpu_threads_each); None on the CPU (torch's default, as in the sweep's own process)."""
    return cpu_threads_each(running) if getattr(runner, "device", None) == "cuda" else None


def _helper(context, runner, ahead: tuple[list, int], threads: int | None) -> _Worker:
    """A compiling helper given `ahead`: one the command started already where one is left (with the command's
    CPU threads), else a new one with `threads` (spawning.cpu_threads)."""
    started = prestart.take(runner.device)
    if started is not None:
        try:
            return _Worker(context, runner, None, ahead, started)
        except _WorkerLost:  # it ended while it waited (its runtime could not be configured)
            pass
    worker = _Worker(context, runner, None, ahead, threads=threads)
    worker.start()
    return worker


def _pickled(runner) -> tuple[bytes, bool]:
    """The runner pickled, and whether it holds a function or class of the `__main__` module (a library user's
    kernel defined in their script, which a process can unpickle only by running the script again)."""
    found = []

    class Finder(pickle.Pickler):
        def persistent_id(self, obj):  # called for every object pickled; None pickles it as usual
            if isinstance(obj, (types.FunctionType, type)) and obj.__module__ == "__main__":
                found.append(obj)
            return None

    data = io.BytesIO()
    Finder(data).dump(runner)
    return data.getvalue(), bool(found)


_RUNNING = object()  # _Slot.collect's answer while its case has not ended


class _Slot:
    """A place in the pool: the worker it runs cases in (started when a case comes, replaced when lost),
    the case it runs, and when that case's clock (or the worker's start-up) runs out."""

    def __init__(self, context, runner, device: str | None, threads: int | None = None):
        self.context, self.runner, self.device, self.threads = context, runner, device, threads
        self.worker: _Worker | None = None
        self.busy = False
        self.case = None
        self.start = 0.0
        self.deadline: float | None = None
        self.lost: str | None = None  # why the worker was found gone when the case was sent to it

    def take(self, case, timeout: float | None) -> None:
        self.case, self.busy, self.start = case, True, time.monotonic()
        if self.worker is None:
            self.worker = _Worker(self.context, self.runner, self.device, threads=self.threads)
            self.worker.start()
        if not self.worker.ready:
            self.deadline = self.start + STARTUP_TIMEOUT
            return
        try:
            self._send(timeout)
        except _WorkerLost as exc:  # it ended after its last case
            self.lost = str(exc)

    def _send(self, timeout: float | None) -> None:
        self.start = time.monotonic()  # the case's clock starts once a worker can run it
        self.deadline = None if timeout is None else self.start + timeout
        self.worker.send(self.case)

    def handles(self) -> list:
        return [self.worker.conn, self.worker.process.sentinel]

    def collect(self, timeout: float | None, advance: Callable[[], None]):
        """The case's result once it has ended (a result, the runner's failure, a lost worker, its
        deadline), else _RUNNING; reads whatever the worker has sent meanwhile."""
        if self.lost is not None:
            return self._end(self._failed(self.lost), healthy=False)
        ready = self.worker.ready
        try:
            while (message := self.worker.receive(time.monotonic())) is not None:
                kind, value = message
                if kind == "ready":
                    self.worker.ready = ready = True
                    self._send(timeout)
                elif kind == "ticks":
                    for _ in range(value):
                        advance()
                elif kind == "result":
                    return self._end(value, healthy=True)
                elif ready:
                    return self._end(self._failed(value), healthy=True)
                else:
                    return self._end(self._failed(f"the worker could not start: {value}"), healthy=False)
        except _WorkerLost as exc:
            return self._end(self._failed(str(exc) if ready else f"the worker could not start: {exc}"), healthy=False)
        if self.deadline is not None and time.monotonic() >= self.deadline:
            why = (f"timed out after {timeout:g} s" if ready
                   else f"the worker did not start within {STARTUP_TIMEOUT:g} s")
            return self._end(self._failed(why), healthy=False)
        return _RUNNING

    def _failed(self, message: str):
        return self.runner.failed(self.case, message, time.monotonic() - self.start)

    def _end(self, result, healthy: bool):
        if not healthy:
            self.kill()
        self.busy, self.case, self.deadline, self.lost = False, None, None, None
        return result

    def kill(self) -> None:
        if self.worker is not None:
            self.worker.kill()
            self.worker = None


class _Worker:
    """The parent's handle on one worker process."""

    def __init__(self, context, runner, device: str | None = None, ahead: tuple[list, int] | None = None,
                 started: tuple | None = None, threads: int | None = None):
        """`started`: a helper process already running for the runner's device, with this end of its pipe
        (core.prestart.take), to be given the work instead of a new process. `threads`: torch's CPU threads in
        a new one (spawning.cpu_threads; None: torch's default)."""
        self.threads = threads
        # The runner travels pickled, to be unpickled after the worker has configured the
        # runtime: unpickling imports the command's modules, and they may import triton.
        runner_bytes, self.needs_main_script = _pickled(runner)
        self.ready = False
        if started is not None:
            self.process, self.conn = started
            self._child_conn = None
            self.send((runner_bytes, pickle.dumps(ahead)))  # serve_when_given's work
            return
        self.conn, child_conn = context.Pipe()
        # Not a daemon: a daemonic process may not start processes of its own, and a kernel may
        # (compile workers). It is killed when done with, and dies with its parent (_serve).
        self.process = context.Process(
            target=_serve, args=(runner.device, runner_bytes, child_conn, device, pickle.dumps(ahead)),
            name="ssmcheck-worker",
        )
        self._child_conn = child_conn

    def start(self) -> None:
        if self._child_conn is None:  # started already
            return
        try:
            with (stopping_signals_blocked(), cpu_threads(self.threads),
                  nullcontext() if self.needs_main_script else main_script_hidden()):
                self.process.start()
        finally:
            self._child_conn.close()  # the worker's end: held here, it would hide the worker's exit

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

    def ask_to_stop(self) -> None:
        """Ask the worker to end after its current case (_stop_all waits for it)."""
        with suppress(OSError):
            self.conn.send_bytes(pickle.dumps(None))

    def kill(self) -> None:
        if self.process.pid is not None:
            self.process.kill()  # SIGKILL: a worker stuck in C code never sees anything gentler
            self.process.join(END_WAIT)
        self.conn.close()


def _stop_all(workers: list[_Worker]) -> None:
    """Ask every worker to end, wait up to END_WAIT for them all, and kill those still running: they end at once,
    not one after another (a worker's exit, its CUDA context torn down, takes a while)."""
    try:
        for worker in workers:
            worker.ask_to_stop()
        deadline = time.monotonic() + END_WAIT
        for worker in workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
    finally:  # interrupted (Ctrl-C) while waiting too: none is left running
        for worker in workers:
            worker.kill()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"


def _one_line(exc: BaseException) -> str:
    return " ".join(describe(exc).split())


# ---------------------------------------------------------------------------- in the worker


def _serve(device: str, runner_bytes: bytes, conn: Connection, visible_gpu: str | None, ahead_bytes: bytes) -> None:
    """The worker: configure the runtime (on GPU `visible_gpu` alone when given), compile its slice of the
    sweep ahead when given one, then run each case received until told to stop."""
    if visible_gpu is not None:  # before anything starts CUDA, which reads it once
        os.environ["CUDA_VISIBLE_DEVICES"] = visible_gpu
    _become_worker()
    try:
        runtime.configure(device)
    except Exception as exc:  # noqa: BLE001 (reported to the parent as the case's error)
        _send(conn, ("failed", _one_line(exc)))
        return
    _serve_configured(conn, runner_bytes, ahead_bytes)


def serve_when_given(conn: Connection, device: str) -> None:
    """A helper started before its work (core.prestart): configure the runtime for `device` at once, then wait
    for (runner_bytes, ahead_bytes), and serve them as _serve does; None, or the parent gone, ends it."""
    _become_worker()
    try:
        runtime.configure(device)
        work = pickle.loads(conn.recv_bytes())
    except Exception as exc:  # noqa: BLE001 (the parent, once it gives the work, reads why)
        with suppress(OSError):
            _send(conn, ("failed", _one_line(exc)))
        return
    if work is not None:
        _serve_configured(conn, *work)


def _become_worker() -> None:
    ignore_stopping_signals()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPPING_SIGNALS)
    _die_with_parent()
    os.dup2(2, 1)  # what is printed outside a kernel's capture goes to stderr, never into the report


def _serve_configured(conn: Connection, runner_bytes: bytes, ahead_bytes: bytes) -> None:
    try:
        runner = pickle.loads(runner_bytes)
    except Exception as exc:  # noqa: BLE001 (reported to the parent as the case's error)
        _send(conn, ("failed", _one_line(exc)))
        return
    _send(conn, ("ready", _compile_ahead(runner, ahead_bytes)))
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


def _compile_ahead(runner, ahead_bytes: bytes) -> dict | None:
    """Compile the worker's slice of the sweep ahead (runner.precompile): its record, or None where nothing was
    compiled ahead. A failure here is no case's: each case meets whatever it was again and reports it."""
    ahead = pickle.loads(ahead_bytes)
    if ahead is None:
        return None
    cases, threads = ahead
    start = time.perf_counter()
    try:
        launches = runner.precompile(cases, threads)
    except Exception:  # noqa: BLE001
        return None
    return record_of(launches, start)


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
