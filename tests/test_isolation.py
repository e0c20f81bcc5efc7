"""Cases in a worker process: a crash, an exit or a hang costs exactly its own case.

Each sweep here runs correct cases around the bad ones (tests/misbehaving_kernels.py picks the
misbehaviour from the batch size), so a case after a dead worker is seen to run in a new one.
"""

from __future__ import annotations

import multiprocessing
import pickle
from pathlib import Path

import pytest

from ssmcheck.core.isolation import run_isolated
from ssmcheck.core.status import Status
from ssmcheck.drift.run import DriftRunner
from ssmcheck.drift.spec import build_cases as drift_cases
from ssmcheck.drift.spec import resolve as drift_settings
from ssmcheck.scan.run import ScanRunner
from ssmcheck.scan.spec import build_cases as scan_cases
from ssmcheck.scan.spec import resolve as scan_settings
from tests.misbehaving_kernels import BY_BATCH, ScriptedRunner

KERNELS = Path(__file__).parent / "misbehaving_kernels.py"
# ScriptedRunner's line that raises: a case's error names where it was raised (core.guard.describe).
RAISING_LINE = next(n for n, line in enumerate(KERNELS.read_text().splitlines(), 1) if 'raise ValueError("a bug' in line)
TINY_SCAN = {"regime": "normal", "dtype": "fp16", "chunk_size": "8", "seqlen": "12", "nheads": "2", "headdim": "4",
             "dstate": "4", "ngroups": "1"}
TINY_DRIFT = {"regime": "normal", "state_dtype": "fp16", "rounding": "nearest", "steps": 8, "nheads": "1",
              "headdim": "4", "dstate": "8"}


def _scan(batches: str):
    settings = scan_settings({**TINY_SCAN, "batch": batches}, {}, "test")
    runner = ScanRunner(f"{KERNELS}:scan_by_batch", settings.tolerance, "fp64", "cpu", interpreter=True)
    return runner, scan_cases(settings, runner.kernel)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_crash_an_exit_and_a_hang_each_cost_their_own_case(workers):
    assert BY_BATCH == {2: "segfault", 4: "exit", 6: "hang"}
    runner, cases = _scan("1,2,3,4,5,6,7")
    results = list(run_isolated(runner, cases, timeout=2, advance=lambda: None, devices=[None] * workers))
    if workers > 1:  # a pool yields results as they finish
        results.sort(key=lambda r: cases.index(r.case))
    assert [r.case for r in results] == cases
    assert [(r.status, r.message) for r in results] == [
        (Status.PASS, ""),
        (Status.ERROR, "crashed: signal 11 (SIGSEGV)"),
        (Status.PASS, ""),
        (Status.ERROR, "exited with code 0 without a result"),
        (Status.PASS, ""),
        (Status.ERROR, "timed out after 2 s"),
        (Status.PASS, ""),
    ]
    assert 2 <= results[5].seconds < 10
    assert multiprocessing.active_children() == []


def test_drift_cases_report_their_steps_and_come_back_as_plain_data():
    settings = drift_settings({**TINY_DRIFT, "batch": "1,2,3"}, {}, "test")
    runner = DriftRunner(f"{KERNELS}:drift_by_batch", settings.tolerance, "cpu", True, 10, "software")
    cases = drift_cases(settings, runner.kernel)
    ticks = []
    results = list(run_isolated(runner, cases, timeout=None, advance=lambda: ticks.append(1)))
    assert [(r.status, r.verdict.message) for r in results] == [
        (Status.PASS, ""), (Status.ERROR, "crashed: signal 11 (SIGSEGV)"), (Status.PASS, ""),
    ]
    assert len(ticks) == 2 * 8  # every step of the two cases that ran (the crash came before its first)
    for result in results:  # no tensor crossed the process boundary: nothing of torch is pickled
        assert b"torch" not in pickle.dumps(result)


def test_closing_early_or_failing_while_waiting_leaves_no_worker():
    runner, cases = _scan("1,3,5")
    results = run_isolated(runner, cases, timeout=None, advance=lambda: None)
    assert next(results).status is Status.PASS
    results.close()
    assert multiprocessing.active_children() == []

    class Stop(BaseException):  # as the CLI's Ctrl-C handler raises while the parent waits
        pass

    def advance():
        raise Stop

    settings = drift_settings({**TINY_DRIFT, "batch": "1"}, {}, "test")
    drift = DriftRunner("torch", settings.tolerance, "cpu", True, 10, "software")
    with pytest.raises(Stop):
        list(run_isolated(drift, drift_cases(settings, "torch"), timeout=None, advance=advance))
    assert multiprocessing.active_children() == []


def test_a_failing_runner_is_one_line_and_the_worker_goes_on():
    cases = ["ok", "raise", "unpicklable", "sigint", "ok"]
    results = list(run_isolated(ScriptedRunner(), cases, timeout=30, advance=lambda: None))
    assert results == [
        ("done", "ok"),
        ("failed", "raise", "running the case raised ValueError: a bug over two lines (raised at "
                            f"misbehaving_kernels.py:{RAISING_LINE})"),
        ("failed", "unpicklable", results[2][2]),
        ("done", "sigint"),
        ("done", "ok"),
    ]
    assert results[2][2].startswith("the result could not be sent back: ")
    assert multiprocessing.active_children() == []


def test_workers_are_asked_to_end_all_at_once_before_any_is_waited_for(monkeypatch):
    """A worker's exit takes a while on a GPU (its CUDA context torn down): asked and waited for one after another,
    eight workers' exits added up at the end of every sweep."""
    from ssmcheck.core import isolation

    events = []

    class Process:
        def __init__(self, name):
            self.name = name

        def join(self, timeout):
            assert timeout > 0
            events.append(("join", self.name))

    class Worker:
        def __init__(self, name):
            self.process = Process(name)

        def ask_to_stop(self):
            events.append(("ask", self.process.name))

        def kill(self):
            events.append(("kill", self.process.name))

    isolation._stop_all([Worker("a"), Worker("b"), Worker("c")])
    assert events[:3] == [("ask", "a"), ("ask", "b"), ("ask", "c")]
    assert events[3:] == [("join", "a"), ("join", "b"), ("join", "c"), ("kill", "a"), ("kill", "b"), ("kill", "c")]


def test_workers_that_were_asked_to_end_have_ended_when_the_sweep_returns():
    runner, cases = _scan("1,3")
    children_before = set(multiprocessing.active_children())
    results = list(run_isolated(runner, cases, timeout=120, advance=lambda: None, devices=[None, None]))
    assert [r.status for r in results] == [Status.PASS, Status.PASS]
    assert set(multiprocessing.active_children()) == children_before


def test_workers_are_killed_when_the_wait_for_their_end_is_interrupted():
    from ssmcheck.core import isolation

    killed = []

    class Process:
        def join(self, timeout):
            raise KeyboardInterrupt

    class Worker:
        def __init__(self, name):
            self.name, self.process = name, Process()

        def ask_to_stop(self):
            pass

        def kill(self):
            killed.append(self.name)

    with pytest.raises(KeyboardInterrupt):
        isolation._stop_all([Worker("a"), Worker("b")])
    assert killed == ["a", "b"]


def test_workers_of_a_gpu_sweep_get_their_share_of_the_cpu_threads(monkeypatch):
    from ssmcheck.core import isolation, workers
    from tests.pool_helpers import ThreadsRunner

    gpu, cpu = ThreadsRunner(), ThreadsRunner()
    gpu.device = "cuda"
    assert isolation._cpu_threads(gpu, 8) == workers.cpu_threads_each(8)
    assert isolation._cpu_threads(cpu, 8) is None  # the CPU: torch's default
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    # One thread: torch takes no more than the cores, and the default is every core.
    monkeypatch.setattr(isolation, "_cpu_threads", lambda runner, running: 1)
    results = list(run_isolated(ThreadsRunner(), ["a", "b"], timeout=None, advance=lambda: None, devices=[None] * 2))
    assert sorted(results) == [("a", 1), ("b", 1)]
