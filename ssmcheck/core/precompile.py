"""Compiling the Triton kernels a sweep will launch before its cases run, many at once, in helper processes.

On a fresh machine a Triton kernel compiles each of its variants (a dtype, a constexpr, a stride
divisible by 16 or not) at its first launch, one after another: 147 variants and 56 of the 74 s of
the default scan on a fresh H200 (benchmarks/RESULTS.md, "the default scan on a fresh H200").
Inside `compile_only`, every launch through `triton.jit`, ours or a peer's, is made a warm-up
instead (Triton compiles the variant and launches nothing), and Triton's AsyncCompileMode hands the
compilations to a pool of threads (Triton releases the GIL in its compiler passes, and ptxas runs as a
process of its own). A helper process calls the kernel once per shape so and throws the outputs away
(nothing was computed); Triton writes each variant to its disk cache, where the sweep's own process
finds it at the case's first launch (api, core.isolation.CompilingHelpers).

Only a process that runs no case may do this. A compile-only call leaves the kernel's host code in
whatever state a call that computed nothing leaves it: an autotuner with no choice (or, here, its first
config), a cache keyed by shape that holds what such a call "computed" (a serving engine keeps its
autotuned configs so, and may keep metadata). The helper processes end with it.

An autotuned kernel compiles each of its configs inside and benchmarks none: the choice, and with it
the benchmark, is the sweep's process's, at its first real call. A Triton without AsyncCompileMode
(older than mid-2025's) compiles nothing ahead: `compile_only` then says so and launches as usual.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

# A variant that Triton's disk cache holds loads in milliseconds; compiling one takes tenths of a second, or
# seconds with the GIL shared (benchmarks/RESULTS.md, thirtieth session).
CACHED_SECONDS = 0.1
# Threads compiling ahead at most: the default scan's 620 launches (141 variants) compiled in 63 s in one thread, 21 s
# in 4, 16 s in 8 and 20 s in 16 on the 16-core H200 machine (benchmarks/RESULTS.md, thirtieth session).
COMPILE_THREADS = 8
# Calls whose compilations all took under CACHED_SECONDS before a sweep takes the cache for warm and stops
# compiling ahead: the calls then only cost their inputs' generation.
WARM_CALLS = 4


# Whether this process is inside compile_only with Triton's launches made compile-only (compiling_ahead).
_compiling = False


def compiling_ahead() -> bool:
    """Whether Triton's launches in this process only compile (inside compile_only, where Triton can): a kernel
    launched now computes nothing, so nothing it returns can be checked."""
    return _compiling


@dataclass
class Launches:
    """What happened inside compile_only: whether Triton could compile ahead, the launches made compile-only, and
    the seconds each compilation took (None until it finishes), grouped by the calls that made them (`call_done`)."""

    supported: bool
    count: int = 0
    compilations: list = field(default_factory=list)
    calls: list = field(default_factory=list)  # each call's end in `compilations`

    def call_done(self) -> None:
        """Mark the end of one call of the kernel (its launches and their compilations)."""
        self.calls.append(len(self.compilations))

    def cache_warm(self) -> bool:
        """Whether the first WARM_CALLS calls' compilations have all finished, each in under CACHED_SECONDS: Triton's
        cache held them, and most likely the rest. Once a compilation took longer, never."""
        if len(self.calls) < WARM_CALLS:
            return False
        seconds = self.compilations[:self.calls[WARM_CALLS - 1]]
        return all(s is not None and s < CACHED_SECONDS for s in seconds)

    def record(self, seconds: float) -> dict:
        """Plain figures for a report, of a pass that took `seconds`: the launches, the compilations, how many
        took CACHED_SECONDS or longer, and whether the cache was found warm (and the pass stopped early)."""
        done = [s for s in self.compilations if s is not None]
        return {"seconds": seconds, "launches": self.count, "compilations": len(self.compilations),
                "compiled": sum(s >= CACHED_SECONDS for s in done), "cache_warm": self.cache_warm(), "processes": 1}


def record_of(launches: Launches | None, start: float) -> dict | None:
    """The record (Launches.record) of a pass begun at time.perf_counter() `start`; None where it compiled nothing
    ahead (no pass, or a Triton without AsyncCompileMode)."""
    if launches is None or not launches.supported:
        return None
    return launches.record(time.perf_counter() - start)


def combined(records: list, seconds: Callable = max) -> dict | None:
    """Several processes' records (Launches.record; None where one compiled nothing ahead) as one: their figures
    summed, `seconds` of their seconds (the longest, for processes that ran at once), the cache warm where it was
    for all; None where none compiled ahead."""
    records = [r for r in records if r is not None]
    if not records:
        return None
    return {"seconds": seconds(r["seconds"] for r in records),
            **{key: sum(r[key] for r in records) for key in ("launches", "compilations", "compiled", "processes")},
            "cache_warm": all(r["cache_warm"] for r in records)}


def _with_launcher(kernel):
    """`kernel` (a compiled variant) with its launcher made: Triton 3.6 builds one per signature at the variant's first
    launch, a C module compiled by the host's C compiler (about 0.5-0.9 s each) into its disk cache, where the sweep's
    process then finds it. On a fresh H100 the default GPU drift's first case of each new signature waited that long
    for its own (sixty-sixth session). A launcher that cannot be made is left to the sweep's launch, which meets the
    error in its case."""
    try:
        kernel._init_handles()
    except Exception:  # noqa: BLE001, S110 (as above)
        pass
    return kernel


class _TimedPool(ThreadPoolExecutor):
    """A thread pool that records each task's seconds in `launches.compilations`."""

    def __init__(self, threads: int, launches: Launches):
        super().__init__(threads, thread_name_prefix="ssmcheck-compile")
        self.launches = launches

    def submit(self, fn, /, *args, **kwargs):
        compilations = self.launches.compilations
        index = len(compilations)
        compilations.append(None)

        def timed():
            start = time.perf_counter()
            try:
                return _with_launcher(fn(*args, **kwargs))
            finally:
                compilations[index] = time.perf_counter() - start

        return super().submit(timed)


@contextmanager
def compile_only(threads: int) -> Iterator[Launches]:
    """While inside, Triton launches compile their kernels in `threads` threads and run nothing (in a process that
    runs no case: the module's docstring says why). On leaving, every compilation is waited for; one that failed
    is left to the sweep's process, whose launch compiles again and raises its error in its case."""
    try:
        from triton.runtime import autotuner, jit  # noqa: PLC0415
        from triton.runtime._async_compile import AsyncCompileMode  # noqa: PLC0415
    except ImportError:
        yield Launches(supported=False)
        return
    launches = Launches(supported=True)
    run, tune = jit.JITFunction.run, autotuner.Autotuner.run

    def compile_run(self, *args, grid, warmup, **kwargs):
        launches.count += 1
        return run(self, *args, grid=grid, warmup=True, **kwargs)

    def compile_configs(self, *args, **kwargs):
        kwargs.pop("warmup", None)  # Autotuner.warmup passes its own on to the function it tunes
        compiled = self.warmup(*args, **kwargs)
        # Host code may read the choice after the launch (vLLM's launcher keeps it per key and launches the rest
        # of its call with it): a choice lets the call go on to its next kernels, so that they compile too.
        if getattr(self, "best_config", None) is None:
            self.best_config = self.configs[0]
        return compiled

    # ignore_errors (3.6 and 3.9 have it): a failed compilation is not raised on leaving.
    quiet = {"ignore_errors": True} if "ignore_errors" in inspect.signature(AsyncCompileMode).parameters else {}
    with _TimedPool(max(1, threads), launches) as pool:
        mode = AsyncCompileMode(pool, **quiet)
        global _compiling
        jit.JITFunction.run, autotuner.Autotuner.run = compile_run, compile_configs
        _compiling = True
        mode.__enter__()
        try:
            yield launches
        except BaseException:
            # Stopped (a signal): the compilations not yet started are dropped, not waited for.
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        finally:
            jit.JITFunction.run, autotuner.Autotuner.run = run, tune
            _compiling = False
            try:
                mode.__exit__(None, None, None)  # waits; raises a failed compilation's error without ignore_errors
            except Exception:  # noqa: BLE001, S110 (the sweep's process meets the error in its case)
                pass
