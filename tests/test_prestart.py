"""Compiling helpers started before the command imports torch (core.prestart), and taken by the sweep's helpers."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

import pytest

from ssmcheck.core import isolation, prestart, workers
from ssmcheck.core.spawning import cpu_threads
from tests.pool_helpers import AheadRunner


@pytest.mark.parametrize(("args", "environ", "cores", "driver", "count"), [
    (["scan"], {}, 16, True, 3),
    (["scan", "--preset", "thorough", "--workers", "8"], {}, 16, True, 2),  # 8 cores run the cases: 8 left
    (["scan", "--workers=4"], {}, 16, True, 3),
    (["scan", "--workers", "14"], {}, 16, True, 0),
    (["scan", "--workers", "auto"], {}, 16, True, 3),  # one per GPU, guessed one
    (["scan", "--workers", "x"], {}, 16, True, 3),  # the CLI refuses it; the guess does not
    (["scan"], {}, 9, True, 2),
    (["scan"], {}, 5, True, 1),
    (["scan"], {}, 4, True, 0),  # no core to spare a helper
    (["scan"], {"LOCAL_WORLD_SIZE": "2"}, 16, True, 1),  # two torchrun ranks share the cores
    (["scan"], {}, 16, False, 0),  # no NVIDIA driver: the CPU's interpreter compiles nothing
    (["scan"], {"TRITON_INTERPRET": "1"}, 16, True, 0),
    (["scan"], {"TRITON_INTERPRET": "0"}, 16, True, 3),
    (["scan", "--device", "cpu"], {}, 16, True, 0),
    (["scan", "--device=cpu"], {}, 16, True, 0),
    (["scan", "--device", "cuda"], {}, 16, True, 3),
    (["scan", "--no-compile-ahead"], {}, 16, True, 0),
    (["scan", "--help"], {}, 16, True, 0),
    (["scan", "-h"], {}, 16, True, 0),
    (["drift"], {}, 16, True, 3),
    (["drift", "--device", "cpu"], {}, 16, True, 0),
    (["drift", "--no-compile-ahead"], {}, 16, True, 0),
    (["merge", "a.json", "b.json"], {}, 16, True, 0),
    ([], {}, 16, True, 0),
])
def test_helpers_are_started_only_for_a_scan_that_will_compile_ahead(args, environ, cores, driver, count):
    assert prestart.wanted(args, environ, cores, driver) == count


@pytest.mark.parametrize(("args", "environ", "cores", "driver", "threads"), [
    (["scan"], {}, 16, True, 4),  # this process and its 3 helpers
    (["scan", "--preset", "thorough", "--workers", "8"], {}, 16, True, 2),  # the 8 workers
    (["scan", "--workers", "2"], {}, 16, True, 4),  # 2 workers and their helpers
    (["scan", "--workers", "32"], {}, 16, True, 1),
    (["scan", "--no-compile-ahead"], {}, 16, True, 4),
    (["scan"], {}, 2, True, 1),
    (["scan"], {"LOCAL_WORLD_SIZE": "2"}, 16, True, 2),  # two torchrun ranks share the cores
    (["scan"], {"OMP_NUM_THREADS": "6"}, 16, True, None),  # the user's
    (["scan"], {}, 16, False, None),  # the CPU: torch's default, as measured there
    (["scan", "--device", "cpu"], {}, 16, True, None),
    (["scan"], {"TRITON_INTERPRET": "1"}, 16, True, None),
    (["scan", "--help"], {}, 16, True, None),
    (["drift"], {}, 16, True, 4),
    (["drift"], {}, 16, False, None),
])
def test_a_gpu_scan_shares_the_cores_among_its_processes_cpu_threads(args, environ, cores, driver, threads):
    assert prestart.cpu_threads(args, environ, cores, driver) == threads


def test_workers_started_by_the_library_share_a_torchrun_ranks_cores(monkeypatch):
    monkeypatch.setattr(workers, "cpu_cores", lambda: 16)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert workers.cpu_threads_each(8) == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two ranks on this machine: 8 cores each
    assert workers.cpu_threads_each(8) == 1
    assert workers.cpu_threads_each(1) == 2


def test_the_lone_sweep_counts_itself_and_its_most_helpers():
    assert workers.LONE_SWEEP_PROCESSES == 1 + prestart.COMPILE_HELPERS


THREAD_VARIABLES = ("OMP_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS", "TORCH_WARM_POOL")


def _childs_thread_variables() -> list[str]:
    code = f"import os; print(*(os.environ.get(name) for name in {THREAD_VARIABLES!r}))"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return child.stdout.split()


def test_children_get_the_threads_and_as_many_inductor_compilers_unless_the_user_set_them(monkeypatch):
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with cpu_threads(3):
        assert _childs_thread_variables() == ["3", "3", "0"]
    assert not set(THREAD_VARIABLES) & set(os.environ)  # this process's own are left as they were
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "5")
    with cpu_threads(3):
        assert _childs_thread_variables() == ["3", "5", "0"]
    assert os.environ["TORCHINDUCTOR_COMPILE_THREADS"] == "5" and "OMP_NUM_THREADS" not in os.environ
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    with cpu_threads(3):
        assert _childs_thread_variables() == ["7", "5", "None"]


@pytest.mark.parametrize(("args", "set_before", "expected"), [
    (["drift", "--no-compile-ahead"], {}, {"OMP_NUM_THREADS": "4", "TORCHINDUCTOR_COMPILE_THREADS": "4",
                                          "TORCH_WARM_POOL": "0"}),
    (["drift", "--no-compile-ahead"], {"TORCH_WARM_POOL": "1"}, {"OMP_NUM_THREADS": "4",
                                                                 "TORCHINDUCTOR_COMPILE_THREADS": "4",
                                                                 "TORCH_WARM_POOL": "1"}),
    (["drift", "--device", "cpu"], {}, {}),  # the CPU: torch's and inductor's defaults
])
def test_the_command_sets_its_own_threads_and_inductors_before_importing_torch(monkeypatch, args, set_before,
                                                                               expected):
    monkeypatch.setattr(os, "environ", dict(set_before))
    monkeypatch.setattr(prestart, "cpu_cores", lambda: 16)
    monkeypatch.setattr(prestart, "NVIDIA_DRIVER", __file__)  # a driver, as far as the guess goes
    prestart.for_command(args)
    assert os.environ == {**set_before, **expected}
    assert prestart._WAITING == []  # --no-compile-ahead, --device cpu: no helpers


def test_the_command_entry_starts_its_helpers_before_it_imports_torch_or_triton():
    code = "import sys, ssmcheck.console; print(sorted({'torch', 'triton'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_sweeps_helpers_are_those_started_and_the_rest_are_ended():
    prestart.start(2, "cpu")
    started = [process for _, process, _ in prestart._WAITING]
    helpers = isolation.CompilingHelpers(AheadRunner(), ["a", "b", "c"], helpers=1, threads=1)
    assert [worker.process for worker in helpers.workers] == started[:1]
    assert prestart._WAITING == [] and not started[1].is_alive()  # dismissed once the sweep took what it wanted
    assert [record["launches"] for record in helpers.wait()] == [30]
    assert multiprocessing.active_children() == []


def test_a_helper_started_for_another_device_is_ended_and_a_new_one_serves():
    prestart.start(1, "cuda")  # (on a CPU machine it fails to configure; either way the sweep's device is the CPU)
    ((_, other, _),) = prestart._WAITING
    helpers = isolation.CompilingHelpers(AheadRunner(), ["a", "b"], helpers=1, threads=1)
    assert helpers.workers[0].process is not other and not other.is_alive()
    assert [record["launches"] for record in helpers.wait()] == [20]
    assert multiprocessing.active_children() == []


def test_helpers_not_taken_are_ended_by_dismiss():
    prestart.start(2, "cpu")
    started = [process for _, process, _ in prestart._WAITING]
    assert (prestart.waiting("cpu"), prestart.waiting("cuda")) == (2, 0)
    prestart.dismiss()
    assert prestart.waiting("cpu") == 0
    assert prestart._WAITING == [] and not any(process.is_alive() for process in started)
    assert prestart.take("cpu") is None


def test_a_command_that_ends_before_its_sweep_ends_its_waiting_helpers():
    """A usage error, say: the helpers never get work, and the exit must not wait for them."""
    code = "from ssmcheck.core import prestart; prestart.start(2, 'cpu'); raise SystemExit(2)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
