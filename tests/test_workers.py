"""`--workers N`: cases in a pool of isolated worker processes give the serial run's report (verdicts,
figures, the order of cases) and give each worker its own GPU; tests/test_isolation.py has a pool's crashes
and tests/test_ci_gate.py its interruptions."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest
import torch
from cli_invoke import assert_usage_error, invoke
from test_shards import without_timings

import ssmcheck
from ssmcheck.core.isolation import run_isolated
from ssmcheck.core.workers import worker_devices
from tests.pool_helpers import WhereRunner

HELPERS = Path(__file__).with_name("pool_helpers.py")


def table_without_times(stdout: str) -> list[str]:
    """The table's rows, each without its last cell (the case's time)."""
    return [line.rsplit("│", 2)[0] for line in stdout.splitlines() if line.startswith("│")]


def test_two_workers_give_the_serial_scan_report_and_table(tmp_path):
    serial, one = invoke("scan", "--preset", "smoke", json_path=tmp_path / "serial.json")
    pooled, two = invoke("scan", "--preset", "smoke", "--workers", "2", json_path=tmp_path / "pooled.json")
    assert pooled.exit_code == serial.exit_code == 0, pooled.output
    assert len(two["cases"]) == 13
    assert without_timings(two) == without_timings(one)
    assert table_without_times(pooled.stdout) == table_without_times(serial.stdout)
    assert len(table_without_times(serial.stdout)) == 13


def test_two_workers_give_the_serial_drift_report(tmp_path):
    options = ("drift", "--preset", "smoke", "--kernel", "torch", "--quiet")
    _, one = invoke(*options, json_path=tmp_path / "serial.json")
    result, two = invoke(*options, "--workers", "2", "--case-timeout", "600", json_path=tmp_path / "pooled.json")
    assert result.exit_code == 0, result.output
    assert without_timings(two) == without_timings(one)


def test_the_api_takes_workers_and_shards():
    serial = ssmcheck.scan(kernel="torch", preset="smoke").to_json()
    pooled = ssmcheck.scan(kernel="torch", preset="smoke", workers=2).to_json()
    assert without_timings(pooled) == without_timings(serial)
    second = ssmcheck.scan(kernel="torch", preset="smoke", shard="2/3").to_json()
    assert [c["id"] for c in second["cases"]] == [c["id"] for c in serial["cases"][1::3]]
    assert second["shard"]["index"] == 2 and second["shard"]["count"] == 3
    with pytest.raises(ssmcheck.UsageError, match="--workers"):
        ssmcheck.scan(kernel="torch", preset="smoke", workers="none")


@pytest.mark.parametrize("command", ["scan", "drift"])
@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5", ""])
def test_a_bad_worker_count_is_a_usage_error(command, value):
    result, _ = invoke(command, "--preset", "smoke", "--workers", value)
    assert_usage_error(result, "--workers")
    assert repr(value) in result.stderr


def test_each_worker_is_started_with_its_own_gpu():
    cases = [f"case {i}" for i in range(6)]
    results = list(run_isolated(WhereRunner(), cases, timeout=60, advance=lambda: None, devices=["3", "5"]))
    assert sorted(case for case, _, _ in results) == cases
    by_pid = {}
    for _, pid, visible in results:
        by_pid.setdefault(pid, set()).add(visible)
    assert len(by_pid) == 2  # two workers ran the cases
    assert sorted(visible for (visible,) in by_pid.values()) == ["3", "5"]  # each always on its own GPU
    assert multiprocessing.active_children() == []


def test_worker_counts_and_their_gpus(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert worker_devices("--workers", "auto", "cpu") == [None] * len(os.sched_getaffinity(0))
    assert worker_devices("--workers", "3", "cpu") == [None, None, None]
    assert worker_devices("--workers", "auto", "cuda", gpu_count=lambda: 2) == ["0", "1"]
    assert worker_devices("--workers", 3, "cuda", gpu_count=lambda: 2) == ["0", "1", "0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")  # a scheduler's share of the host's GPUs
    assert worker_devices("--workers", "auto", "cuda", gpu_count=lambda: 8) == ["4", "6"]
    with pytest.raises(ValueError, match="--workers: invalid value '0'"):
        worker_devices("--workers", "0", "cuda", gpu_count=lambda: 2)


@pytest.mark.gpu
def test_on_a_gpu_host_each_worker_runs_on_its_own_gpu(tmp_path):
    gpus = torch.cuda.device_count()
    options = ("scan", "--preset", "smoke", "--quiet")
    _, serial = invoke(*options, json_path=tmp_path / "serial.json")
    result, pooled = invoke(*options, "--workers", "auto", json_path=tmp_path / "pooled.json")
    assert result.exit_code == serial["exit_code"] == 0, result.output
    assert without_timings(pooled) == without_timings(serial)

    result, named = invoke(*options, "--kernel", f"{HELPERS}:scan_naming_its_gpu", "--workers", "auto",
                           json_path=tmp_path / "named.json")
    assert result.exit_code == 0, result.output
    seen = {case["stdout"].split()[-1] for case in named["cases"]}  # the GPUs' UUIDs
    visible = {case["stdout"].split()[0] for case in named["cases"]}
    assert len(seen) == len(visible) == min(gpus, len(named["cases"]))
