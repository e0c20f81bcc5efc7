"""Compiling helpers started before the `ssmcheck` command imports torch.

A GPU sweep (scan, drift) compiles its Triton variants ahead in helper processes (core.isolation.CompilingHelpers).
A helper spends its first seconds importing torch and triton and starting CUDA, as the command does before it has
planned its sweep, so helpers spawned once the sweep is planned compile only after both: on a fresh H200 they were
spawned 4.7 s into `ssmcheck scan` and compiled from about 5 s later (benchmarks/RESULTS.md, thirty-second session);
the default drift took 111.1-115.4 s so and 78.3-88.9 s with its helpers started here (forty-first session).
Started here instead, first thing in the command (ssmcheck.console), they import beside it and then wait for their
work: CompilingHelpers takes them (`take`), and those it does not take end once the sweep has decided (`dismiss`),
or at exit.

Only where they will be wanted, guessed from the command line before anything is imported (`wanted`): the `scan`
and `drift` commands on a machine with an NVIDIA driver and the cores for a helper, and not --help, --device cpu,
--no-compile-ahead or Triton's interpreter. A wrong guess costs processes that are dismissed.

This module imports neither torch nor triton: its caller has not yet chosen between compiled kernels and
Triton's interpreter (core.runtime).
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.util  # its exit handler (which joins children) registered before this module's
import os
from collections.abc import Mapping, Sequence

from ssmcheck.core.ranks import rank_cores
from ssmcheck.core.spawning import main_script_hidden, stopping_signals_blocked, thread_environment
from ssmcheck.core.workers import cpu_cores, cpu_threads_each

# Cores a compiling helper gets (four threads: four processes of four threads compiled the default scan's variants
# fastest on the 16-core H200 machine; benchmarks/RESULTS.md, thirtieth session).
CORES_PER_COMPILER = 4
# Helper processes at most.
COMPILE_HELPERS = 3
# The commands whose sweeps compile ahead on a GPU.
SWEEPS = ("scan", "drift")
# Where the NVIDIA driver is loaded (Linux): the sign of a GPU before torch is imported to ask.
NVIDIA_DRIVER = "/proc/driver/nvidia/version"

# The helpers started and not yet taken: (device, process, this end of its pipe).
_WAITING: list[tuple[str, multiprocessing.Process, object]] = []


def wanted(args: Sequence[str], environ: Mapping[str, str], cores: int, driver: bool) -> int:
    """How many helpers to start for the command line `args` (without the program's name): as many as
    api.start_compiling_ahead would give a sweep run in this process, or 0 where it gives none."""
    if not _gpu_sweep(args, environ, driver) or "--no-compile-ahead" in args:
        return 0
    return helper_count(rank_cores(cores, environ), _running(args[1:]))


def cpu_threads(args: Sequence[str], environ: Mapping[str, str], cores: int, driver: bool) -> int | None:
    """torch's CPU threads for the command line `args` and every process it starts (workers.cpu_threads_each),
    where it is a sweep on the GPU and the user has not set OMP_NUM_THREADS; else None (torch's default)."""
    if "OMP_NUM_THREADS" in environ or not _gpu_sweep(args, environ, driver):
        return None
    return cpu_threads_each(_running(args[1:]), rank_cores(cores, environ))


def _gpu_sweep(args: Sequence[str], environ: Mapping[str, str], driver: bool) -> bool:
    """Whether the command line `args` runs a sweep that compiles ahead (SWEEPS) on the GPU (guessed: not asking
    for help)."""
    if not args or args[0] not in SWEEPS or not driver or environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return False
    options = list(args[1:])
    if any(a in ("-h", "--help", "--device=cpu") for a in options):
        return False
    return not any(a == "--device" and following == "cpu" for a, following in zip(options, options[1:]))


def helper_count(cores: int, running: int) -> int:
    """The compiling helpers for `cores` (this process's share of the machine) where `running` processes run the
    cases, a core each: CORES_PER_COMPILER of the cores left each, COMPILE_HELPERS at most; 0 where none are left."""
    return max(0, min(COMPILE_HELPERS, (cores - running) // CORES_PER_COMPILER))


def _running(options: Sequence[str]) -> int:
    """The processes that will run the cases: --workers N, else this one (and for --workers auto, one per GPU:
    its count is unknown before CUDA starts; one is the guess, and a helper too many is dismissed)."""
    values = [following for a, following in zip(options, options[1:]) if a == "--workers"]
    values += [a.split("=", 1)[1] for a in options if a.startswith("--workers=")]
    return int(values[-1]) if values and values[-1].isdigit() and int(values[-1]) > 0 else 1


def for_command(args: Sequence[str]) -> None:
    """Give the command and its processes their CPU threads (`cpu_threads`, as spawning.thread_environment's
    variables, but those the user set: before anything imports torch, which reads them then), and start the
    helpers `wanted` says the command line `args` will want, on the GPU."""
    cores, driver = cpu_cores(), os.path.exists(NVIDIA_DRIVER)
    threads = cpu_threads(args, os.environ, cores, driver)
    if threads is not None:
        for name, value in thread_environment(threads).items():
            os.environ.setdefault(name, value)
    count = wanted(args, os.environ, cores, driver)
    if count:
        start(count, "cuda")


def start(count: int, device: str) -> None:
    """Start `count` helpers that ready the runtime for `device` and wait for their work."""
    context = multiprocessing.get_context("spawn")
    if not _WAITING:
        # Exit handlers run last registered first: this one ends the waiting helpers before multiprocessing's
        # joins them, which would wait for ever (a command that ends before its sweep, say on a usage error).
        atexit.register(dismiss)
    for _ in range(count):
        parent_end, child_end = context.Pipe()
        # Not a daemon, as any worker (core.isolation._Worker says why).
        process = context.Process(target=_wait_for_work, args=(child_end, device), name="ssmcheck-helper")
        with stopping_signals_blocked(), main_script_hidden():
            process.start()
        child_end.close()
        _WAITING.append((device, process, parent_end))


def take(device: str) -> tuple[multiprocessing.Process, object] | None:
    """A helper started for `device` that is still alive, with this end of its pipe; None where none is."""
    while _WAITING:
        started_for, process, conn = _WAITING.pop(0)
        if started_for == device and process.is_alive():
            return process, conn
        _end(process, conn)
    return None


def waiting(device: str) -> int:
    """How many helpers started for `device` wait to be taken (alive or not)."""
    return sum(started_for == device for started_for, _, _ in _WAITING)


def dismiss() -> None:
    """End the helpers not taken: the sweep wanted fewer, or none."""
    while _WAITING:
        _, process, conn = _WAITING.pop()
        _end(process, conn)


def _end(process: multiprocessing.Process, conn) -> None:
    process.kill()  # it holds no work: nothing to finish
    process.join()
    conn.close()


def _wait_for_work(conn, device: str) -> None:
    """The helper: import what the work needs, beside the command's own imports, then serve it."""
    from ssmcheck.core import isolation  # noqa: PLC0415 (torch: here, in the helper, at once)

    isolation.serve_when_given(conn, device)
