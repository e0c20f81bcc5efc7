"""Triton's disk cache, where one process compiles each variant and the others wait for it.

Triton compiles a variant missing from its cache in every process that launches it. On a fresh machine the
eight workers of `scan --preset thorough --workers 8` start on neighbouring cases, launch the same variants
at once and compiled each up to eight times over (the stochastic-rounding decode variant, 3 s, in nearly every
worker), while the compiling helpers (core.isolation.CompilingHelpers) waited for cores to compile the rest
(benchmarks/RESULTS.md, thirty-sixth session). Here the first process to miss a variant claims it with a file
beside the variant's entry, created exclusively; a process that finds the claim waits for the entry instead of
compiling it too, and loads it once it is written.

A claim is its holder's until the holder writes the entry, or until it asks for another variant from the same
thread (a compilation that raised writes nothing), or exits. One whose holder is gone (its process ended on
this host, or the claim is older than CLAIM_SECONDS) is taken over; a waiter that waits past CLAIM_SECONDS
compiles for itself. Nothing is ever wrong for a claim lost: at worst a variant is compiled twice, as before.

`install` makes it the manager of the process that calls it (core.runtime.configure, on a GPU: the command, and
each worker and helper it starts), unless the user named one in TRITON_CACHE_MANAGER. The entries are Triton's
own, in Triton's directory.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
import time

import triton
from triton.runtime.cache import FileCacheManager

# Longest a claim holds others off: past the slowest compilation seen under load (a dstate-256 fp32 output
# stage, 16.7 s with eight workers and four helpers compiling; benchmarks/RESULTS.md, thirty-sixth session).
CLAIM_SECONDS = 120.0
# How often a waiter looks for the entry.
POLL_SECONDS = 0.01
CLAIM_FILE = "claim"

_held = threading.local()  # the claim this thread holds, if any
_process_claims: set[str] = set()  # every claim this process holds, released at exit
_lock = threading.Lock()


def install() -> None:
    """Have this process's Triton compile through ClaimingCacheManager, unless the user named a manager of their
    own (TRITON_CACHE_MANAGER). This process only, through `triton.knobs`, not the environment: a process it starts
    that runs ssmcheck installs it again, and one a user's code starts, which may not import ssmcheck, keeps
    Triton's default. A Triton without `knobs` (before 3.4) keeps its default here too."""
    knobs = getattr(triton, "knobs", None)
    if knobs is None or os.environ.get("TRITON_CACHE_MANAGER") or knobs.cache.manager_class is not None:
        return
    knobs.cache.manager_class = ClaimingCacheManager


class ClaimingCacheManager(FileCacheManager):
    """FileCacheManager whose `get_group` claims a missing entry for this process to compile, or waits for the
    process that claimed it; `put_group` writes the entry and releases the claim."""

    def __init__(self, key, override=False, dump=False):
        super().__init__(key, override=override, dump=dump)
        self._claims = not (override or dump)  # only the cache proper: dumps and overrides are read as files

    def get_group(self, filename: str):
        _release_held()  # a compilation this thread claimed and never wrote (it raised): others may have it
        group = super().get_group(filename)
        if group is not None or not self._claims:
            return group
        claim = os.path.join(self.cache_dir, CLAIM_FILE)
        deadline = time.monotonic() + CLAIM_SECONDS
        while True:
            if _try_claim(claim):
                # Written while the claim was free: the holder finished between the looks.
                group = super().get_group(filename)
                if group is not None:
                    _release_held()  # (none where no claim could be made)
                return group
            group = super().get_group(filename)
            if group is not None:
                return group
            if _stale(claim):
                if not _remove(claim):
                    return None  # a stale claim this process may not remove: compile unclaimed
                continue
            if time.monotonic() > deadline:
                return None  # compile it here (the holder is alive but slow, or stuck)
            time.sleep(POLL_SECONDS)

    def put_group(self, filename: str, group):
        path = super().put_group(filename, group)
        if self._claims:
            claim = os.path.join(self.cache_dir, CLAIM_FILE)
            if getattr(_held, "claim", None) == claim:
                _release(claim)
        return path


def _try_claim(claim: str) -> bool:
    """Claim `claim` for this thread: False where another holds it. True also where no claim can be made (a
    directory this process may not write): then it compiles unclaimed, as without claims."""
    try:
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    except OSError:
        return True
    with os.fdopen(fd, "w") as f:
        f.write(f"{socket.gethostname()} {os.getpid()} {time.time()}")
    _held.claim = claim
    with _lock:
        if not _process_claims:
            atexit.register(_release_all)
        _process_claims.add(claim)
    return True


def _release(claim: str) -> None:
    if getattr(_held, "claim", None) == claim:
        _held.claim = None
    with _lock:
        _process_claims.discard(claim)
    _remove(claim)


def _release_held() -> None:
    claim = getattr(_held, "claim", None)
    if claim is not None:
        _release(claim)


def _release_all() -> None:
    with _lock:
        claims = list(_process_claims)
    for claim in claims:
        _release(claim)


def _remove(claim: str) -> bool:
    """Remove `claim`: whether it is gone (False: this process may not remove it)."""
    try:
        os.unlink(claim)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


def _stale(claim: str) -> bool:
    """Whether `claim`'s holder is gone: a process of this host that no longer runs, or a claim made more than
    CLAIM_SECONDS ago (another host's, or a pid reused). A claim that cannot be read (being written, or just
    released) is not stale."""
    try:
        with open(claim) as f:
            host, pid, made = f.read().split()
    except (OSError, ValueError):
        return False
    if time.time() - float(made) > CLAIM_SECONDS:
        return True
    if host != socket.gethostname():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process, alive
        return False
    return False
