"""`torchrun --nproc-per-node N -m ssmcheck scan`: the ranks split the sweep by --shard's rule and rank 0
writes the single-process run's report (plus `ranks`); a rank that never reports costs only its cases.

On the CPU the ranks meet through torchrun's own store, as on GPUs; the `gpu` test adds a GPU per rank.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_invoke import assert_usage_error, invoke
from test_shards import without_timings

from ssmcheck.core.ranks import Ranks, from_environment

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).parent


def torchrun(nproc: int, *argv, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           str(nproc), "-m", "ssmcheck", *map(str, argv)], env=environ, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def without_ranks(report: dict) -> dict:
    return without_timings({k: v for k, v in report.items() if k != "ranks"})


@pytest.mark.parametrize(("command", "cases"), [("scan", 13), ("drift", 4)])
def test_two_ranks_write_the_single_process_report(tmp_path, command, cases):
    options = (command, "--preset", "smoke", "--kernel", "torch")
    _, single = invoke(*options, "--quiet", json_path=tmp_path / "one.json")
    run = torchrun(2, *options, "--json", tmp_path / "two.json")
    assert run.returncode == 0, run.stderr[-3000:]
    ranked = json.loads((tmp_path / "two.json").read_text())
    assert ranked["ranks"] == 2 and "ranks" not in single
    assert len(ranked["cases"]) == cases
    assert without_ranks(ranked) == without_timings(single)
    assert run.stdout.count("ssmcheck ") == 1  # one header, rank 0's
    assert f"{cases} cases: {cases} pass" in run.stdout


def test_a_rank_that_never_reports_costs_only_its_cases(tmp_path):
    run = torchrun(2, "scan", "--preset", "smoke", "--kernel", f"{TESTS / 'slow_kernels.py'}:hangs_on_rank_1",
                   "--json", tmp_path / "r.json", env={"SSMCHECK_GATHER_TIMEOUT": "5"})
    report = json.loads((tmp_path / "r.json").read_text())
    statuses = [c["status"] for c in report["cases"]]
    assert statuses[0::2] == ["pass"] * 7, run.stderr[-3000:]  # rank 0's slice of the 13
    assert statuses[1::2] == ["error"] * 6  # rank 1's, which hung
    assert {c["message"] for c in report["cases"][1::2]} == {"lost: rank 1 did not report its results within 5 s"}
    assert report["exit_code"] == 4 and report["ranks"] == 2
    assert run.returncode != 0  # torchrun passes on that a rank failed


def test_ranks_come_from_torchruns_environment():
    assert from_environment({}) is None
    assert from_environment({"WORLD_SIZE": "1", "RANK": "0"}) is None
    assert from_environment({"WORLD_SIZE": "4", "RANK": "5", "LOCAL_RANK": "1"}) == Ranks(5, 4, 1)
    assert Ranks(2, 3, 2).shard.take(list(range(8))) == [2, 5]


def test_workers_are_refused_under_torchrun():
    result, _ = invoke("scan", "--preset", "smoke", "--workers", "2", env={"WORLD_SIZE": "2", "RANK": "0"})
    assert_usage_error(result, "--workers")


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_ranks_on_two_gpus_write_the_single_gpu_report(tmp_path):
    options = ("scan", "--preset", "smoke")
    _, single = invoke(*options, "--quiet", json_path=tmp_path / "one.json")
    run = torchrun(2, *options, "--json", tmp_path / "two.json")
    assert run.returncode == 0, run.stderr[-3000:]
    assert without_ranks(json.loads((tmp_path / "two.json").read_text())) == without_timings(single)

    for isolated in ((), ("--isolate",)):  # a rank's isolated worker runs on the rank's GPU too
        run = torchrun(2, *options, *isolated, "--kernel", f"{TESTS / 'pool_helpers.py'}:scan_naming_its_gpu",
                       "--json", tmp_path / "named.json")
        assert run.returncode == 0, run.stderr[-3000:]
        cases = json.loads((tmp_path / "named.json").read_text())["cases"]
        gpus = [case["stdout"].split()[-1] for case in cases]
        assert len(set(gpus[0::2])) == len(set(gpus[1::2])) == 1  # each rank's slice on one GPU
        assert gpus[0] != gpus[1]  # the two ranks on two
