"""The ranks of a `torchrun` launch: which slice of the sweep this process runs, and how rank 0 gets
the other ranks' results.

torchrun sets WORLD_SIZE, RANK and LOCAL_RANK; with WORLD_SIZE > 1 each rank runs the slice of the
sweep that `--shard RANK+1/WORLD_SIZE` names (core.shard's rule), on GPU LOCAL_RANK. The results
travel through torch.distributed's key-value store, the one the launch's rendezvous provides
(MASTER_ADDR, MASTER_PORT), rather than through a collective: rank 0 waits for each rank's key
against one deadline, so a rank that crashed or hangs costs its own cases, which come back as
`error`, and never the results of the ranks that did report (a failed gather would lose them all).
Rank 0 polls the store rather than blocking in it, so that Ctrl-C and SIGTERM reach it.
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta

from ssmcheck.core.execution import Interrupted
from ssmcheck.core.shard import Shard

# Seconds rank 0 waits, once its own slice is done, for the others' results; long enough for the
# slowest case of a preset on a CPU (the ranks' slices cost about the same). SSMCHECK_GATHER_TIMEOUT
# overrides it.
GATHER_TIMEOUT = 1800.0
# Seconds between rank 0's looks at the store while it waits.
POLL_INTERVAL = 0.2
_KEY = "ssmcheck/results/{rank}"


@dataclass(frozen=True)
class Ranks:
    rank: int
    world_size: int
    local_rank: int

    @property
    def leads(self) -> bool:
        """Rank 0 gathers, renders and writes the report; the others only run their slices."""
        return self.rank == 0

    @property
    def shard(self) -> Shard:
        return Shard(self.rank + 1, self.world_size)


def from_environment(environ: Mapping[str, str] = os.environ) -> Ranks | None:
    """This process's rank when launched by torchrun (or any launcher that sets its variables) with more
    than one process; None otherwise."""
    world_size = int(environ.get("WORLD_SIZE", "1") or 1)
    if world_size <= 1:
        return None
    return Ranks(int(environ["RANK"]), world_size, int(environ.get("LOCAL_RANK", environ["RANK"])))


def local_processes(environ: Mapping[str, str] = os.environ) -> int:
    """How many ranks a launcher started on this machine (torchrun's LOCAL_WORLD_SIZE; 1 without one): they share
    its cores."""
    return max(1, int(environ.get("LOCAL_WORLD_SIZE", "1") or 1))


def rank_cores(cores: int, environ: Mapping[str, str] = os.environ) -> int:
    """This rank's share of the machine's `cores` (all of them without a launcher; `local_processes`)."""
    return max(1, cores // local_processes(environ))


def gather_timeout(environ: Mapping[str, str] = os.environ) -> float:
    return float(environ.get("SSMCHECK_GATHER_TIMEOUT", GATHER_TIMEOUT))


def use_local_gpu(ranks: Ranks) -> None:
    """Make GPU LOCAL_RANK this process's current device (where a run on `cuda` allocates and launches),
    before anything else touches CUDA."""
    import torch  # noqa: PLC0415

    if torch.cuda.is_available():
        torch.cuda.set_device(ranks.local_rank % torch.cuda.device_count())


def connect(timeout: float):
    """The launch's key-value store (every rank must connect within `timeout` seconds)."""
    import torch.distributed as dist  # noqa: PLC0415

    store, _, _ = next(dist.rendezvous("env://", timeout=timedelta(seconds=timeout)))
    return store


def send(store, ranks: Ranks, results: list, interrupted: str | None) -> None:
    """A rank's results (and what interrupted it, if anything) for rank 0."""
    store.set(_KEY.format(rank=ranks.rank), pickle.dumps((results, interrupted)))


def gather(store, ranks: Ranks, cases: list, failed: Callable[[object, str], object], timeout: float) -> Iterator:
    """Rank 0: yield the other ranks' results, waiting at most `timeout` seconds for all. `cases` is the
    whole sweep; each case of a rank that has not reported by then comes back as `failed(case, message)`.
    Raises core.execution's Interrupted after them when a rank that reported had been interrupted."""
    deadline = time.monotonic() + timeout
    pending = list(range(1, ranks.world_size))
    interrupted = None
    while pending and time.monotonic() < deadline:
        for rank in [r for r in pending if store.check([_KEY.format(rank=r)])]:
            results, stopped = pickle.loads(store.get(_KEY.format(rank=rank)))
            pending.remove(rank)
            interrupted = interrupted or stopped
            yield from results
        if pending:
            time.sleep(POLL_INTERVAL)
    for rank in pending:
        message = f"lost: rank {rank} did not report its results within {timeout:g} s"
        yield from (failed(case, message) for case in Shard(rank + 1, ranks.world_size).take(cases))
    if interrupted:
        raise Interrupted(interrupted)
