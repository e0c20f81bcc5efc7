"""`--shard K/N` and `ssmcheck merge`: the slices of a sweep, run as a CI matrix runs them, make the
unsharded run's report again: the same cases in the same order, summary and exit code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_invoke import assert_usage_error, invoke

from ssmcheck.core.shard import Shard, parse_shard

TIMINGS = {"seconds", "kernel_seconds", "warmup_seconds", "compiled_ahead"}
NAN_KERNEL = f"{Path(__file__).with_name('broken_scan_kernels.py')}:nan_in_partial_last_chunk"
# Four cases, one of them non-finite (seqlen 40 is no multiple of the chunk): exit code 3 unsharded.
MIXED = ("--kernel", NAN_KERNEL, "--regime", "normal,ragged", "--dtype", "fp16", "--seqlen", "40,64",
         "--chunk-size", "32", "--batch", "2", "--nheads", "2", "--headdim", "8", "--dstate", "8", "--ngroups", "1")


def without_timings(value):
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k not in TIMINGS}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def run_shards(tmp_path: Path, command: str, options: tuple, count: int) -> list[Path]:
    paths = []
    for index in range(1, count + 1):
        path = tmp_path / f"{command}-{index}.json"
        result, report = invoke(command, *options, "--shard", f"{index}/{count}", "--quiet", json_path=path)
        assert report is not None, result.output
        assert result.exit_code == report["exit_code"]
        paths.append(path)
    return paths


def merge(*paths, output: Path):
    result, merged = invoke("merge", *paths, "-o", output)
    return result, (json.loads(output.read_text()) if output.exists() else merged)


@pytest.mark.parametrize(("command", "options", "count"), [
    ("scan", ("--preset", "smoke"), 3),
    ("scan", MIXED, 3),
    ("drift", ("--preset", "smoke", "--kernel", "torch"), 2),
])
def test_shards_merge_into_the_unsharded_report(tmp_path, command, options, count):
    result, whole = invoke(command, *options, "--quiet", json_path=tmp_path / "whole.json")
    shards = run_shards(tmp_path, command, options, count)
    shard_reports = [json.loads(p.read_text()) for p in shards]
    assert sum(len(r["cases"]) for r in shard_reports) == len(whole["cases"])
    assert all(len(r["cases"]) < len(whole["cases"]) for r in shard_reports)

    merged_result, merged = merge(*reversed(shards), output=tmp_path / "all.json")  # any order
    assert merged_result.exit_code == result.exit_code == whole["exit_code"], merged_result.output
    assert "shard" not in merged
    assert without_timings(merged) == without_timings(whole)
    assert merged["seconds"] == pytest.approx(sum(r["seconds"] for r in shard_reports))


def test_the_shards_compilations_ahead_are_summed(tmp_path):
    shards = run_shards(tmp_path, "scan", ("--preset", "smoke"), 2)
    records = [{"seconds": 4.0, "launches": 10, "compilations": 5, "compiled": 5, "processes": 1, "cache_warm": False},
               {"seconds": 1.0, "launches": 8, "compilations": 4, "compiled": 0, "processes": 2, "cache_warm": True}]
    for path, record in zip(shards, records):  # as a GPU's shards record them (the CPU compiles nothing ahead)
        path.write_text(json.dumps({**json.loads(path.read_text()), "compiled_ahead": record}))
    _, merged = merge(*shards, output=tmp_path / "all.json")
    assert merged["compiled_ahead"] == {"seconds": 5.0, "launches": 18, "compilations": 9, "compiled": 5,
                                        "processes": 3, "cache_warm": False}


def test_a_failing_shard_decides_the_merged_exit_code(tmp_path):
    shards = run_shards(tmp_path, "scan", MIXED, 3)
    codes = [json.loads(p.read_text())["exit_code"] for p in shards]
    assert codes == [3, 0, 0]  # round-robin: the non-finite first case is shard 1's
    result, merged = merge(*shards, output=tmp_path / "all.json")
    assert result.exit_code == 3 and merged["summary"]["nonfinite"] == 1
    assert "exit code 3" in result.stdout


def test_each_shard_records_its_slice_of_which_sweep(tmp_path):
    first, second = run_shards(tmp_path, "scan", MIXED, 2)
    records = [json.loads(p.read_text())["shard"] for p in (first, second)]
    assert [(r["index"], r["count"], r["sweep_cases"]) for r in records] == [(1, 2, 4), (2, 2, 4)]
    assert records[0]["sweep_digest"] == records[1]["sweep_digest"]
    ids = [[c["id"] for c in json.loads(p.read_text())["cases"]] for p in (first, second)]
    assert ids == [["normal-fp16-c32-L40-b2-h2x8n8g1", "ragged-fp16-c32-L40-b2-h2x8n8g1"],
                   ["normal-fp16-c32-L64-b2-h2x8n8g1", "ragged-fp16-c32-L64-b2-h2x8n8g1"]]


def test_the_rule_is_round_robin_by_position():
    assert Shard(2, 3).take(list("abcdefgh")) == ["b", "e", "h"]
    assert [len(Shard(k, 3).take(range(8))) for k in (1, 2, 3)] == [3, 3, 2]
    assert Shard(5, 5).take(range(3)) == []  # more shards than cases: an empty slice (exit code 5)
    assert parse_shard("--shard", " 2 / 7 ") == Shard(2, 7)


@pytest.mark.parametrize("command", ["scan", "drift"])
@pytest.mark.parametrize("value", ["0/3", "4/3", "3", "1/0", "a/b", "-1/2", "1/2/3", ""])
def test_a_malformed_shard_is_a_usage_error(command, value):
    result, _ = invoke(command, "--preset", "smoke", "--shard", value)
    assert_usage_error(result, "--shard")
    assert repr(value) in result.stderr


def test_overlapping_missing_and_foreign_shards_are_refused(tmp_path):
    one, two, three = run_shards(tmp_path, "scan", MIXED, 3)
    out = tmp_path / "all.json"
    cases = [
        ((one, two), "missing shard 3/3"),
        ((one, two, three, two), "overlapping shards"),
        ((one,), "missing shards 2/3, 3/3"),
    ]
    for paths, named in cases:
        result, _ = invoke("merge", *paths, "-o", out)
        assert_usage_error(result, named)
        assert not out.exists()

    _, whole = invoke("scan", *MIXED, "-q", json_path=tmp_path / "whole.json")
    result, _ = invoke("merge", one, two, tmp_path / "whole.json", "-o", out)
    assert_usage_error(result, "not a shard's report")

    # The same slice of another sweep: other settings, another command, other cases.
    (tmp_path / "tol").mkdir()
    other_tol = run_shards(tmp_path / "tol", "scan", (*MIXED, "--tol-factor", "3"), 3)[2]
    result, _ = invoke("merge", one, two, other_tol, "-o", out)
    assert_usage_error(result, "settings.tol_factor (3.0 vs 2.0)")
    (tmp_path / "seqlen").mkdir()
    other_cases = run_shards(tmp_path / "seqlen", "scan", (*MIXED[:7], "40,72", *MIXED[8:]), 3)[2]
    result, _ = invoke("merge", one, two, other_cases, "-o", out)
    assert_usage_error(result, "shard.sweep_digest")
    drift = json.loads(three.read_text()) | {"command": "drift"}
    (tmp_path / "drift.json").write_text(json.dumps(drift))
    result, _ = invoke("merge", one, two, tmp_path / "drift.json", "-o", out)
    assert_usage_error(result, "command ('drift' vs 'scan')")
    newer = json.loads(three.read_text()) | {"version": "99.0"}
    (tmp_path / "newer.json").write_text(json.dumps(newer))
    result, _ = invoke("merge", one, two, tmp_path / "newer.json", "-o", out)
    assert_usage_error(result, "version")


def test_merge_usage_errors_name_the_file_or_option(tmp_path):
    result, _ = invoke("merge", tmp_path / "absent.json", "-o", tmp_path / "all.json")
    assert_usage_error(result, "absent.json")
    (tmp_path / "x.json").write_text("[1]")
    result, _ = invoke("merge", tmp_path / "x.json", "-o", tmp_path / "all.json")
    assert_usage_error(result, "not an ssmcheck report")
    result, _ = invoke("merge", tmp_path / "x.json", "-o", tmp_path / "no" / "all.json")
    assert_usage_error(result, "--output")
    result, _ = invoke("merge", tmp_path / "x.json")
    assert_usage_error(result, "--output")


def test_an_interrupted_shard_merges_into_an_interrupted_report(tmp_path):
    one, two = run_shards(tmp_path, "scan", MIXED, 2)
    cut = json.loads(two.read_text())
    kept = cut["cases"][:1]  # as a run stopped by SIGTERM after its first case writes it
    cut |= {"cases": kept, "interrupted": True, "interrupted_by": "SIGTERM", "exit_code": 143}
    two.write_text(json.dumps(cut))
    result, merged = merge(one, two, output=tmp_path / "all.json")
    assert result.exit_code == 143
    assert merged["interrupted"] is True and merged["interrupted_by"] == "SIGTERM"
    first = json.loads(one.read_text())["cases"]
    assert [c["id"] for c in merged["cases"]] == [first[0]["id"], kept[0]["id"], first[1]["id"]]
    cut["cases"] = cut["cases"] * 3  # more cases than the slice has: not this sweep's shard
    two.write_text(json.dumps(cut))
    result, _ = invoke("merge", one, two, "-o", tmp_path / "all2.json")
    assert_usage_error(result, "holds 3 cases where shard 2/2 of a sweep of 4 has 2")
