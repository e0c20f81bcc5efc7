"""ssmcheck as a CI gate that never loses a result: interruptions, streaming, report paths, re-runs.

The interruption tests run `python -m ssmcheck` in a subprocess, as a CI runner does, and send the
signal from the test once the --jsonl file shows that some cases finished.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_invoke import assert_usage_error, invoke

from ssmcheck.core import capture

ROOT = Path(__file__).resolve().parents[1]
SLOW = Path(__file__).with_name("slow_kernels.py")
SMOKE = ("--preset", "smoke", "--kernel", "torch")


def _ssmcheck(*argv, **popen) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "ssmcheck", *map(str, argv)], env=env, cwd=ROOT, **popen)


def _jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait_for_cases(path: Path, n: int, process: subprocess.Popen, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while sum(r["type"] == "case" for r in _jsonl(path)) < n:
        assert process.poll() is None, "the sweep ended before it could be interrupted"
        assert time.monotonic() < deadline, "no cases finished in time"
        time.sleep(0.1)


@pytest.mark.parametrize("pool", [(), ("--workers", "2")], ids=["serial", "workers"])
@pytest.mark.parametrize(("sig", "code", "name"), [(signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM")])
def test_an_interrupted_sweep_keeps_its_finished_cases(tmp_path, sig, code, name, pool):
    report, lines = tmp_path / "r.json", tmp_path / "r.jsonl"
    process = _ssmcheck("scan", "--preset", "smoke", "--kernel", f"{SLOW}:slow_scan", *pool, "--json", report,
                        "--jsonl", lines, "--junit", tmp_path / "r.xml", stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True)
    _wait_for_cases(lines, 2, process)
    process.send_signal(sig)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == code, stderr
    data = json.loads(report.read_text())
    assert data["interrupted"] is True and data["interrupted_by"] == name and data["exit_code"] == code
    assert 2 <= len(data["cases"]) < 12 and all(c["status"] == "pass" for c in data["cases"])
    records = _jsonl(lines)
    assert records[0]["type"] == "header" and records[-1]["type"] == "summary"
    assert records[-1]["interrupted_by"] == name
    assert f"interrupted by {name} after {len(data['cases'])} of 13 cases" in stdout
    assert "Traceback" not in stderr
    assert (tmp_path / "r.xml").read_text().count("<testcase") == len(data["cases"])


@pytest.mark.skipif(sys.platform != "linux", reason="sets a C library signal action through ctypes")
@pytest.mark.parametrize("pool", [(), ("--workers", "2")], ids=["serial", "workers"])
def test_timeouts_two_sigterms_keep_the_report_after_a_kernel_took_sigterm_over(tmp_path, pool):
    """`timeout` signals its command and then the command's process group: two SIGTERMs, microseconds apart,
    to the sweep and its workers alike. The kernel's first call takes SIGTERM over in the C library (as
    Triton's LLVM does on the GPU): the sweep must take it back, stop once, and report what finished."""
    report, lines = tmp_path / "r.json", tmp_path / "r.jsonl"
    process = _ssmcheck("scan", "--preset", "smoke", "--kernel", f"{SLOW}:takes_sigterm_over", *pool, "--json",
                        report, "--jsonl", lines, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                        start_new_session=True)
    _wait_for_cases(lines, 2, process)
    process.send_signal(signal.SIGTERM)
    os.killpg(process.pid, signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, (process.returncode, stderr)
    data = json.loads(report.read_text())
    assert data["interrupted_by"] == "SIGTERM" and 2 <= len(data["cases"]) < 12
    assert all(c["status"] == "pass" for c in data["cases"]), [c["message"] for c in data["cases"]]
    assert f"interrupted by SIGTERM after {len(data['cases'])} of 13 cases" in stdout
    assert "Traceback" not in stderr


# A sweep whose fifth captured kernel call gets SIGTERM while stdout is being put back after the call (as a
# CI runner's timeout may land): the summary must still reach the real stdout.
_SIGTERM_IN_THE_RESTORE = """
import os, runpy, signal, sys
from ssmcheck.core import capture
calls, flush = [0], capture._fflush
def flush_then_signal(stream):
    calls[0] += 1
    if calls[0] == 5:
        os.kill(os.getpid(), signal.SIGTERM)
    return flush(stream)
capture._fflush = flush_then_signal
sys.argv = ["ssmcheck", *sys.argv[1:]]
runpy.run_module("ssmcheck", run_name="__main__")
"""


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask") or capture._fflush is None, reason="needs POSIX signals")
def test_a_signal_while_stdout_is_put_back_after_a_kernel_call_keeps_the_summary_on_stdout(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", _SIGTERM_IN_THE_RESTORE, "scan", *SMOKE, "--quiet", "--json",
                           tmp_path / "r.json"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 143, done.stderr
    cases = len(json.loads((tmp_path / "r.json").read_text())["cases"])
    assert f"exit code 143 (interrupted by SIGTERM after {cases} of 13 cases)" in done.stdout, done.stdout


def test_a_closed_stdout_stops_the_sweep_and_keeps_the_report(tmp_path):
    report = tmp_path / "r.json"
    process = _ssmcheck("scan", *SMOKE, "--json", report, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = process.stdout.readline()  # `| head -1`: read the first line, then go away
    process.stdout.close()
    process.wait(timeout=120)
    stderr = process.stderr.read().decode()
    assert first.startswith(b"ssmcheck ")
    assert process.returncode == 141, stderr
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr
    data = json.loads(report.read_text())
    assert data["interrupted_by"] == "SIGPIPE" and data["exit_code"] == 141


def test_every_finished_case_streams_to_the_log_and_to_jsonl(tmp_path):
    result, report = invoke("scan", *SMOKE, "--jsonl", tmp_path / "r.jsonl", json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    ids = [c["id"] for c in report["cases"]]
    lines = result.stdout.splitlines()
    for case_id in ids:  # one line per case, before the table
        assert any(line.startswith("pass") and case_id in line for line in lines), case_id
    records = _jsonl(tmp_path / "r.jsonl")
    assert [r["type"] for r in records] == ["header"] + ["case"] * len(ids) + ["summary"]
    assert [r["id"] for r in records[1:-1]] == ids
    assert records[-1]["exit_code"] == 0 and records[-1]["interrupted"] is False


@pytest.mark.parametrize("option", ["--json", "--jsonl", "--junit", "--summary"])
def test_report_paths_are_checked_before_the_first_case(tmp_path, option):
    result, _ = invoke("scan", *SMOKE, option, tmp_path)  # a directory
    assert_usage_error(result, option)
    result, _ = invoke("scan", *SMOKE, option, "/proc/ssmcheck-report")
    assert_usage_error(result, option)
    assert not list(tmp_path.iterdir())


def test_usage_errors_of_the_gate_options(tmp_path):
    assert_usage_error(invoke("scan", *SMOKE, "--case-timeout", "5")[0], "--case-timeout")
    assert_usage_error(invoke("scan", *SMOKE, "--isolate", "--case-timeout", "0")[0], "--case-timeout")
    assert_usage_error(invoke("scan", *SMOKE, "--from", tmp_path / "none.json")[0], "--from")
    assert_usage_error(invoke("scan", *SMOKE, "--case", "normal-bf16-nope")[0], "--case")
    assert_usage_error(invoke("scan", "--preset", "smoke", "--chunk-size", "48")[0], "--chunk-size")
    result, _ = invoke("scan", "--bogus")
    assert_usage_error(result, "--bogus")
    assert "ngroups" not in result.stderr  # no far-fetched suggestion
    assert "did you mean --seqlen" in invoke("scan", "--seqln", "4")[0].stderr


def test_bare_ssmcheck_shows_help():
    result, _ = invoke()
    assert result.exit_code == 0
    assert "scan" in result.stdout and "drift" in result.stdout and "Exit codes" in result.stdout


def test_one_case_runs_again_by_id_and_from_a_report(tmp_path):
    _, report = invoke("scan", *SMOKE, json_path=tmp_path / "all.json")
    target = report["cases"][3]
    result, again = invoke("scan", *SMOKE, "--case", target["id"], json_path=tmp_path / "one.json")
    assert result.exit_code == 0 and [c["id"] for c in again["cases"]] == [target["id"]]
    assert again["cases"][0]["error"] == target["error"]
    result, replay = invoke("scan", "--case", target["id"], "--from", tmp_path / "all.json", json_path=tmp_path / "re.json")
    assert result.exit_code == 0, result.output
    (case,) = replay["cases"]
    assert case["params"] == target["params"] and case["error"] == target["error"]


def test_the_table_honours_columns_on_a_log(tmp_path):
    result, report = invoke("scan", *SMOKE, env={"COLUMNS": "80"}, json_path=tmp_path / "r.json")
    assert result.exit_code == 0
    table = [line for line in result.stdout.splitlines() if line[:1] in "┏┃┡│└"]
    assert table and max(map(len, table)) <= 80 and "…" not in result.stdout
    rows = [line for line in table if line.startswith("│")]
    for case in report["cases"]:  # status, id and the full ratio on every row
        ratio = f"{max(case['error']['ratio'], case['error']['state_ratio']):.2f}"
        assert any(case["id"] in row and "pass" in row and ratio in row for row in rows), case["id"]


def test_compare_flags_a_planted_regression(tmp_path):
    _, good = invoke("scan", *SMOKE, "--regime", "normal,ragged", json_path=tmp_path / "old.json")
    broken = Path(__file__).with_name("broken_scan_kernels.py")
    result, bad = invoke("scan", "--preset", "smoke", "--regime", "normal,ragged", "--kernel",
                         f"{broken}:nan_in_partial_last_chunk", json_path=tmp_path / "new.json")
    assert bad["summary"]["nonfinite"] >= 1, result.output
    result, _ = invoke("compare", tmp_path / "old.json", tmp_path / "new.json")
    assert result.exit_code == 1
    assert "new failure:" in result.stdout and "-> nonfinite" in result.stdout
    same, _ = invoke("compare", tmp_path / "old.json", tmp_path / "old.json")
    assert same.exit_code == 0 and "new failure:" not in same.stdout
    fixed, _ = invoke("compare", tmp_path / "new.json", tmp_path / "old.json")
    assert fixed.exit_code == 0 and "fixed:" in fixed.stdout
    assert_usage_error(invoke("compare", tmp_path / "old.json", tmp_path / "none.json")[0], "NEW")
    assert_usage_error(invoke("compare", tmp_path / "old.json", tmp_path / "old.json", "--max-growth", "0.5")[0],
                       "--max-growth")


def test_pyproject_tool_table_is_picked_up_and_named_in_the_header(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "mine"\n\n[tool.ssmcheck.scan]\npreset = "smoke"\nregime = ["normal"]\ndtype = ["fp16"]\n'
    )
    nested = tmp_path / "src" / "pkg"
    nested.mkdir(parents=True)
    monkeypatch.chdir(nested)
    result, report = invoke("scan", "--kernel", "torch", json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert {(c["params"]["regime"], c["params"]["dtype"]) for c in report["cases"]} == {("normal", "fp16")}
    assert result.stdout.splitlines()[2].endswith(f"configs/smoke.toml, {tmp_path / 'pyproject.toml'}")
    assert report["settings"]["preset"] == "smoke"
    # The command line wins over the pyproject.
    _, report = invoke("scan", "--kernel", "torch", "--dtype", "bf16", json_path=tmp_path / "r2.json")
    assert {c["params"]["dtype"] for c in report["cases"]} == {"bf16"}


def test_preset_takes_a_toml_file(tmp_path):
    (tmp_path / "mine.toml").write_text('[scan]\nregime = ["ragged"]\ndtype = ["fp32"]\nchunk_size = [16]\n'
                                        'seqlen = [40]\nbatch = [3]\nnheads = [2]\nheaddim = [8]\ndstate = [8]\n')
    result, report = invoke("scan", "--kernel", "torch", "--preset", tmp_path / "mine.toml", json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert [c["id"] for c in report["cases"]] == ["ragged-fp32-c16-L40-b3-h2x8n8g1"]
    assert_usage_error(invoke("scan", "--preset", tmp_path / "none.toml")[0], "--preset")


MISBEHAVING = Path(__file__).with_name("misbehaving_kernels.py")


def test_isolated_crashes_exits_and_timeouts_each_cost_one_case_through_the_cli(tmp_path):
    result, report = invoke("scan", "--kernel", f"{MISBEHAVING}:scan_by_batch", "--isolate", "--case-timeout", "3",
                            "--regime", "normal", "--dtype", "fp32", "--chunk-size", "16", "--seqlen", "24",
                            "--batch", "1,2,3,4,5,6,7", "--nheads", "2", "--headdim", "4", "--dstate", "4",
                            json_path=tmp_path / "r.json")
    assert result.exit_code == 4, result.output
    by_batch = {c["params"]["batch"]: c for c in report["cases"]}
    assert by_batch[2]["status"] == "error" and by_batch[2]["message"] == "crashed: signal 11 (SIGSEGV)"
    assert by_batch[4]["message"] == "exited with code 0 without a result"
    assert by_batch[6]["message"] == "timed out after 3 s"
    assert all(by_batch[b]["status"] == "pass" for b in (1, 3, 5, 7))


def test_what_a_kernel_prints_is_shown_under_its_case_not_in_the_table(tmp_path):
    result, report = invoke("scan", "--kernel", f"{MISBEHAVING}:scan_printing", "--preset", "smoke", "--regime",
                            "normal", json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    (case,) = report["cases"]
    lines = result.stdout.splitlines()
    title = lines.index(f"stdout of {case['id']}:")
    assert lines[title + 1:title + 3] == ["  noise", "  c-level noise"]
    assert not any(line.startswith(("noise", "c-level")) for line in lines)


def test_a_drift_case_from_a_report_rounds_as_the_report_did(tmp_path):
    options = ("drift", "--preset", "smoke", "--rounding", "stochastic", "--philox-rounds", "7")
    _, report = invoke(*options, json_path=tmp_path / "all.json")
    target = report["cases"][0]
    result, replay = invoke("drift", "--case", target["id"], "--from", tmp_path / "all.json",
                            json_path=tmp_path / "re.json")
    assert result.exit_code == 0, result.output
    assert replay["settings"]["philox_rounds"] == 7 and replay["settings"]["rounding_impl"] == "software"
    assert replay["cases"][0]["params"] == target["params"]
    assert replay["cases"][0]["checkpoints"] == target["checkpoints"]  # the same rounding bits: the same figures
    _, other = invoke("drift", "--case", target["id"], "--from", tmp_path / "all.json", "--philox-rounds", "10",
                      json_path=tmp_path / "ten.json")
    assert other["settings"]["philox_rounds"] == 10  # the command line still wins
