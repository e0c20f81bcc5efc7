"""How many worker processes `--workers` runs, and the GPU each one gets.

On the CPU every worker shares the machine's cores. On a GPU host each worker sees one GPU as its
only device (CUDA_VISIBLE_DEVICES, set in the worker before CUDA starts): a kernel that names
`cuda` or `cuda:0` then runs on its worker's GPU without being told. More workers than GPUs share
them round-robin.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ssmcheck.core.ranks import from_environment, rank_cores

AUTO = "auto"


def worker_devices(option: str, text: str | int, device: str,
                   gpu_count: Callable[[], int] | None = None) -> list[str | None]:
    """One entry per worker: the CUDA_VISIBLE_DEVICES value it gets, None on the CPU. `text` is a count
    >= 1 or `auto` (a worker per CPU core, or per GPU); a ValueError naming `option` otherwise."""
    if from_environment() is not None:  # each torchrun rank already has its GPU and its slice
        raise ValueError(f"{option}: not under torchrun (WORLD_SIZE > 1), where each rank runs its own slice")
    gpus = _visible_gpus(gpu_count) if device == "cuda" else []
    if str(text).strip() == AUTO:
        count = len(gpus) if gpus else cpu_cores()
    else:
        try:
            count = int(str(text).strip())
        except ValueError:
            count = 0
        if count < 1:
            raise ValueError(f"{option}: invalid value {str(text)!r} (expected a number of workers >= 1, or {AUTO})")
    if not gpus:
        return [None] * count
    return [gpus[i % len(gpus)] for i in range(count)]


def rank_gpu(local_rank: int) -> str:
    """The CUDA_VISIBLE_DEVICES entry of torchrun's rank LOCAL_RANK, for the worker an `--isolate` rank starts
    (a spawned process does not inherit the rank's current device)."""
    gpus = _visible_gpus(None)
    return gpus[local_rank % len(gpus)]


# The processes a GPU sweep keeps busy at once where it runs its cases alone: itself and up to 3 compiling helpers
# (core.prestart.COMPILE_HELPERS).
LONE_SWEEP_PROCESSES = 4


def cpu_threads_each(running: int, cores: int | None = None) -> int:
    """torch's CPU threads (OMP_NUM_THREADS) for each process of a GPU sweep whose cases `running` processes run:
    an equal share of `cores` (None: this process's, or its torchrun rank's) among the processes busy at once,
    the runners or, where one runs alone, it and its compiling helpers. Left at torch's default, every core
    each, the eight workers of `scan --preset thorough --workers 8` and their helpers on the H200's 16 cores took
    262.7 s on a fresh cache, where with 2 threads each they took 46-48 s (benchmarks/RESULTS.md, thirty-sixth
    session)."""
    if cores is None:
        cores = rank_cores(cpu_cores())
    return max(1, cores // max(running, LONE_SWEEP_PROCESSES))


def cpu_cores() -> int:
    """The cores this process may run on (a container's or taskset's share, not the whole machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _visible_gpus(gpu_count: Callable[[], int] | None) -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries: its own list when set (a job
    scheduler's share), else every GPU torch sees."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None and listed.strip():
        return [entry.strip() for entry in listed.split(",") if entry.strip()]
    if gpu_count is None:
        import torch  # noqa: PLC0415 (only on a GPU host)

        gpu_count = torch.cuda.device_count
    return [str(i) for i in range(gpu_count())]
