"""core.compile_claims: one process (here also: one thread) compiles each Triton variant, the others wait for its
entry. The manager is driven as triton.compiler.compile drives it: get_group, then on a miss the compilation's
files (put) and put_group. On the CPU; the GPU test compiles a real kernel in two processes at once."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from ssmcheck.core import compile_claims
from ssmcheck.core.compile_claims import CLAIM_FILE, ClaimingCacheManager, install

CLAIMING_CACHE_MANAGER = f"{compile_claims.__name__}:ClaimingCacheManager"  # as TRITON_CACHE_MANAGER names it

KEY = "VARIANTKEY"
NAME = "_kernel.json"


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    return tmp_path


def compile_into(manager: ClaimingCacheManager, seconds: float = 0.0) -> dict:
    """What triton.compiler.compile writes for a variant, `seconds` after its miss."""
    time.sleep(seconds)
    group = {"_kernel.cubin": manager.put(b"\x7fELF cubin", "_kernel.cubin"), NAME: manager.put("{}", NAME, binary=False)}
    manager.put_group(NAME, group)
    return group


def timed_lookup(found: dict) -> None:
    """Look the variant up, as another process would: what it found, and how long it waited, into `found`."""
    began = time.monotonic()
    found["group"] = ClaimingCacheManager(KEY).get_group(NAME)
    found["waited"] = time.monotonic() - began
    found["ended"] = time.time()  # on the clock a claim records when it was made


def claim_path(cache_dir) -> str:
    return os.path.join(ClaimingCacheManager(KEY).cache_dir, CLAIM_FILE)


def test_the_first_to_miss_compiles_and_a_second_waits_for_its_entry(cache_dir):
    first = ClaimingCacheManager(KEY)
    assert first.get_group(NAME) is None  # a miss: this thread compiles
    assert os.path.exists(claim_path(cache_dir))
    found = {}
    waiter = threading.Thread(target=timed_lookup, args=(found,))
    waiter.start()
    written = compile_into(first, seconds=0.3)
    waiter.join(10)
    assert found["group"] == written
    assert found["waited"] >= 0.25
    assert not os.path.exists(claim_path(cache_dir))


@pytest.mark.parametrize("askers", [2, 5, 12])
def test_exactly_one_of_many_askers_compiles(askers):
    compiled, loaded = [], []

    def ask():
        manager = ClaimingCacheManager(KEY)
        group = manager.get_group(NAME)
        if group is None:
            compiled.append(compile_into(manager, seconds=0.1))
        else:
            loaded.append(group)

    threads = [threading.Thread(target=ask) for _ in range(askers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(compiled) == 1
    assert loaded == compiled * (askers - 1)


def test_a_claim_whose_compilation_raised_is_released_at_the_threads_next_lookup(cache_dir):
    manager = ClaimingCacheManager(KEY)
    assert manager.get_group(NAME) is None  # claimed; the compilation raises: no put_group
    assert os.path.exists(claim_path(cache_dir))
    ClaimingCacheManager("OTHERKEY").get_group(NAME)  # this thread's next variant
    assert not os.path.exists(claim_path(cache_dir))


def test_the_claim_of_a_process_that_ended_is_taken_over(cache_dir):
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with open(claim_path(cache_dir), "w") as f:
        f.write(f"{compile_claims.socket.gethostname()} {int(ended.stdout)} {time.time()}")
    began = time.monotonic()
    assert ClaimingCacheManager(KEY).get_group(NAME) is None  # claimed for this process at once
    assert time.monotonic() - began < 5
    with open(claim_path(cache_dir)) as f:
        assert f.read().split()[1] == str(os.getpid())


def test_another_hosts_claim_holds_until_it_is_old(cache_dir):
    with open(claim_path(cache_dir), "w") as f:
        f.write(f"elsewhere 1 {time.time() - compile_claims.CLAIM_SECONDS - 1}")
    assert ClaimingCacheManager(KEY).get_group(NAME) is None
    with open(claim_path(cache_dir)) as f:
        assert f.read().split()[1] == str(os.getpid())


def test_a_waiter_compiles_for_itself_once_a_live_holder_takes_too_long(cache_dir, monkeypatch):
    monkeypatch.setattr(compile_claims, "CLAIM_SECONDS", 0.3)
    holder = ClaimingCacheManager(KEY)
    found = {}

    def hold():
        assert holder.get_group(NAME) is None
        time.sleep(1.0)  # compiling, and alive, past CLAIM_SECONDS

    holding = threading.Thread(target=hold)
    holding.start()
    time.sleep(0.05)
    with open(claim_path(cache_dir)) as f:
        made = float(f.read().split()[2])
    waiting = threading.Thread(target=timed_lookup, args=(found,))
    waiting.start()
    waiting.join(10)
    holding.join(10)
    assert found["group"] is None
    # Taken over once the claim is CLAIM_SECONDS old, which is sooner than CLAIM_SECONDS after the waiter began (it
    # began 0.05 s after the claim, less the holder thread's start: the wait alone measured 0.249 s once), and long
    # before the holder would have finished.
    assert 0.3 <= found["ended"] - made < 0.9


def refuse_on_claims(monkeypatch, call: str) -> None:
    """Make os.<call> on a claim file raise PermissionError, as in a directory this process may not write."""
    real = getattr(os, call)

    def refused(path, *args, **kwargs):
        if os.path.basename(path) == CLAIM_FILE:
            raise PermissionError(13, "Permission denied", path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(compile_claims.os, call, refused)


def test_where_no_claim_can_be_made_the_variant_is_compiled_unclaimed(cache_dir, monkeypatch):
    refuse_on_claims(monkeypatch, "open")
    manager = ClaimingCacheManager(KEY)
    assert manager.get_group(NAME) is None
    assert compile_into(manager)[NAME].endswith(NAME)  # written, with no claim to release
    assert not os.path.exists(claim_path(cache_dir))


def test_a_stale_claim_that_cannot_be_removed_is_compiled_unclaimed(cache_dir, monkeypatch):
    with open(claim_path(cache_dir), "w") as f:
        f.write(f"elsewhere 1 {time.time() - compile_claims.CLAIM_SECONDS - 1}")
    refuse_on_claims(monkeypatch, "unlink")
    began = time.monotonic()
    assert ClaimingCacheManager(KEY).get_group(NAME) is None
    assert time.monotonic() - began < 1
    with open(claim_path(cache_dir)) as f:
        assert f.read().startswith("elsewhere")  # left as it was


def test_an_entry_already_written_is_loaded_without_a_claim(cache_dir):
    written = compile_into(ClaimingCacheManager(KEY))
    assert ClaimingCacheManager(KEY).get_group(NAME) == written
    assert not os.path.exists(claim_path(cache_dir))


def test_install_claims_this_processs_compilations_unless_the_user_named_a_manager(monkeypatch):
    import triton

    monkeypatch.delenv("TRITON_CACHE_MANAGER", raising=False)
    try:
        install()
        assert triton.knobs.cache.manager_class is ClaimingCacheManager  # what triton.runtime.cache resolves
        assert "TRITON_CACHE_MANAGER" not in os.environ  # not for processes a user's code starts
    finally:
        del triton.knobs.cache.manager_class
    monkeypatch.setenv("TRITON_CACHE_MANAGER", "triton.runtime.cache:FileCacheManager")
    try:
        install()
        assert triton.knobs.cache.manager_class is triton.runtime.cache.FileCacheManager  # the user's
    finally:
        del triton.knobs.cache.manager_class


def test_the_triton_cache_manager_variable_names_the_claiming_manager(monkeypatch):
    import triton

    monkeypatch.setenv("TRITON_CACHE_MANAGER", CLAIMING_CACHE_MANAGER)  # as the GPU test below starts processes
    assert triton.knobs.cache.manager_class is ClaimingCacheManager


_TWO_PROCESSES = """
import sys, time
import torch, triton, triton.language as tl
from triton import knobs

hits = []
knobs.compilation.listener = lambda **kw: hits.append(kw["cache_hit"])

@triton.jit
def _claimed_add(x_ptr, n, K: tl.constexpr):
    i = tl.arange(0, 128)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) + K, mask=i < n)

x = torch.ones(100, device="cuda")
while time.time() < float(sys.argv[1]):
    time.sleep(0.001)
_claimed_add[(1,)](x, 100, K=int(sys.argv[2]))
assert x.eq(1 + int(sys.argv[2])).all()
print(hits)
"""


@pytest.mark.gpu
def test_gpu_two_processes_launching_a_fresh_variant_at_once_compile_it_once(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton"), "TRITON_CACHE_MANAGER": CLAIMING_CACHE_MANAGER}
    script = tmp_path / "launch.py"  # (triton.jit reads its function's source from a file)
    script.write_text(_TWO_PROCESSES)
    start = f"{time.time() + 8:.3f}"  # both launch at this instant, after their imports
    runs = [subprocess.Popen([sys.executable, str(script), start, "3"], env=env, stdout=subprocess.PIPE, text=True)
            for _ in range(2)]
    outputs = sorted(r.communicate(timeout=120)[0].strip() for r in runs)
    assert all(r.returncode == 0 for r in runs)
    assert outputs == ["[False]", "[True]"]  # one compiled, the other loaded what it wrote


@pytest.mark.gpu
def test_gpu_a_configured_process_compiles_through_claims(monkeypatch):
    import torch
    import triton

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from ssmcheck.core import runtime

    monkeypatch.delenv("TRITON_CACHE_MANAGER", raising=False)
    try:
        runtime.configure("cuda")  # as the command, each worker and each helper does
        assert triton.runtime.cache.get_cache_manager("0" * 64).__class__ is ClaimingCacheManager
    finally:
        del triton.knobs.cache.manager_class
