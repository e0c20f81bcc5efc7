"""core.execution's signal rules, in this process: a sweep stops once, its Interrupted waits for the end of a
held block, and the CLI keeps later signals ignored until its reports are written. (test_ci_gate.py runs
the same rules through the CLI, with native code taking SIGTERM over.)"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from ssmcheck.core.execution import Interrupted, interruptible, interrupts_held, stopped_sweeps_ignore_signals

pytestmark = pytest.mark.skipif(not hasattr(signal, "pthread_kill") or threading.current_thread()
                                is not threading.main_thread(), reason="needs POSIX signals in the main thread")


def _signal_self(sig: signal.Signals) -> None:
    """Send `sig` to this process and give Python's handler its chance to run."""
    os.kill(os.getpid(), sig)
    for _ in range(100):
        time.sleep(0.001)


def test_a_signal_inside_a_held_block_is_raised_as_the_block_ends():
    ran_on = []
    with interruptible(), pytest.raises(Interrupted) as stopped:
        with interrupts_held():
            _signal_self(signal.SIGTERM)
            ran_on.append("after the signal")
    assert ran_on == ["after the signal"] and stopped.value.reason == "SIGTERM"


def test_a_held_signal_replaces_what_the_block_raised():
    with interruptible(), pytest.raises(Interrupted):
        with interrupts_held():
            _signal_self(signal.SIGINT)
            raise ValueError("the kernel's own error")


def test_a_sweep_stops_once_however_many_signals_come():
    with interruptible():
        with pytest.raises(Interrupted) as first:
            _signal_self(signal.SIGTERM)
        _signal_self(signal.SIGTERM)  # `timeout`'s second, to the process group: ignored
        _signal_self(signal.SIGINT)
    assert first.value.reason == "SIGTERM"


def test_a_stopped_sweep_leaves_the_signals_ignored_until_the_reports_are_written():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with stopped_sweeps_ignore_signals():
        with interruptible(), pytest.raises(Interrupted):
            _signal_self(signal.SIGTERM)
        assert {s: signal.getsignal(s) for s in before} == dict.fromkeys(before, signal.SIG_IGN)
        _signal_self(signal.SIGTERM)  # while the reports are written: ignored, the process lives
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_sweep_that_was_not_stopped_gives_the_signals_back_at_once():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with stopped_sweeps_ignore_signals():
        with interruptible():
            assert all(signal.getsignal(s) is not before[s] for s in before)
        assert {s: signal.getsignal(s) for s in before} == before
