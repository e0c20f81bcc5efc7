"""The pytest plugin, loaded as an installed plugin is: through its pytest11 entry point, by pytest in a
subprocess (pytester). Kernels: `torch` (passes everything) and tests/plugin_kernels.py's planted NaN,
which makes exactly the smoke preset's `ragged` case non-finite."""

import importlib.metadata
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ssmcheck import api

pytest_plugins = ["pytester"]

NAN_KERNEL = f"{Path(__file__).with_name('plugin_kernels.py')}:nan_in_varlen_partial_chunk"
# The smoke preset's cases, in sweep order.
# The smoke sweeps' case ids, as the API plans them (the plugin must collect exactly these).
SMOKE_IDS = [case.id for case in api.plan_scan("torch", "smoke").cases]
DRIFT_SMOKE_IDS = [case.id for case in api.plan_drift("torch", "smoke").cases]
RAGGED = "ragged-bf16-c16-L40-b2-h2x8n8g1"
LOCATION = "y non-finite from sequence 0 token 0 (chunk 0) head 1"
SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|XFAIL|ERROR) (\S+)")


@pytest.fixture
def pytester(pytester, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # short-summary lines carry the whole message
    return pytester


def outcomes_by_nodeid(result) -> dict[str, str]:
    """{nodeid: PASSED | FAILED | XFAIL | ERROR} from the `-rA` short test summary."""
    return {m[2]: m[1] for line in result.outlines if (m := SUMMARY_LINE.match(line))}


def scan_nodeids(ids, prefix="") -> set[str]:
    return {f"{prefix}ssmcheck-scan::{case_id}" for case_id in ids}


def test_registered_through_the_pytest11_entry_point():
    entry_points = importlib.metadata.entry_points(group="pytest11")
    assert "ssmcheck.pytest_plugin" in [e.value for e in entry_points if e.name == "ssmcheck"], \
        "reinstall the package (pip install -e .) to register the entry point"


def test_importing_the_plugin_leaves_triton_unimported():
    code = "import sys, ssmcheck.pytest_plugin; print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_stable_kernel_passes_one_item_per_case(pytester):
    result = pytester.runpytest_subprocess("--ssmcheck-scan", "torch", "-rA")
    result.assert_outcomes(passed=len(SMOKE_IDS))
    assert outcomes_by_nodeid(result) == dict.fromkeys(scan_nodeids(SMOKE_IDS), "PASSED")
    result.stdout.fnmatch_lines(["ssmcheck * scan | device * | kernel torch | preset smoke | 13 cases"])


def test_the_nan_kernel_fails_exactly_its_ragged_items(pytester):
    result = pytester.runpytest_subprocess("--ssmcheck-scan", NAN_KERNEL, "-rA")
    result.assert_outcomes(passed=len(SMOKE_IDS) - 1, failed=1)
    outcomes = outcomes_by_nodeid(result)
    assert {nodeid for nodeid, outcome in outcomes.items() if outcome == "FAILED"} == scan_nodeids([RAGGED])
    assert set(outcomes) == scan_nodeids(SMOKE_IDS)
    result.stdout.fnmatch_lines([f"FAILED ssmcheck-scan::{RAGGED} - Failed: nonfinite: {LOCATION}*"])


@pytest.mark.parametrize(("keyword", "outcomes"), [("ragged", {"failed": 1}), ("normal", {"passed": 1})])
def test_k_selects_by_case_id(pytester, keyword, outcomes):
    result = pytester.runpytest_subprocess("--ssmcheck-scan", NAN_KERNEL, "-k", keyword)
    result.assert_outcomes(**outcomes, deselected=len(SMOKE_IDS) - 1)


def test_x_stops_at_the_first_failing_case(pytester):
    # ragged is the second case: one pass, then the failure, then nothing
    result = pytester.runpytest_subprocess("--ssmcheck-scan", NAN_KERNEL, "-x")
    result.assert_outcomes(passed=1, failed=1)


def test_junitxml_has_one_testcase_per_case_with_its_json(pytester):
    pytester.runpytest_subprocess("--ssmcheck-scan", NAN_KERNEL, "--junitxml=report.xml")
    testcases = ET.parse(pytester.path / "report.xml").getroot().iter("testcase")
    by_name = {tc.get("name"): tc for tc in testcases}
    assert sorted(by_name) == sorted(SMOKE_IDS)
    assert {tc.get("classname") for tc in by_name.values()} == {"ssmcheck-scan"}
    failed = [name for name, tc in by_name.items() if tc.find("failure") is not None]
    assert failed == [RAGGED]
    assert LOCATION in by_name[RAGGED].find("failure").get("message")
    case = json.loads(by_name[RAGGED].find("properties/property[@name='ssmcheck']").get("value"))
    assert (case["id"], case["status"], case["first_nonfinite"]["sequence"]) == (RAGGED, "nonfinite", 0)


def test_xdist_workers_collect_the_same_items(pytester):
    pytest.importorskip("xdist")
    result = pytester.runpytest_subprocess("--ssmcheck-scan", NAN_KERNEL, "-n", "2", "-rA")
    result.assert_outcomes(passed=len(SMOKE_IDS) - 1, failed=1)
    assert outcomes_by_nodeid(result)[f"ssmcheck-scan::{RAGGED}"] == "FAILED"


def test_a_marked_module_adds_its_sweeps_after_its_own_tests(pytester):
    pytester.makepyfile(test_marked=f"""
        import pytest

        pytestmark = [
            pytest.mark.ssmcheck(kernel={NAN_KERNEL!r}, regime=["normal", "ragged"]),
            pytest.mark.ssmcheck(kernel="torch", command="drift", regime=["normal"], state_dtype=["fp32"],
                                 rounding=["nearest", "stochastic"]),
        ]

        def test_own():
            pass
    """)
    result = pytester.runpytest_subprocess("-rA", "--strict-markers")
    result.assert_outcomes(passed=3, failed=1, skipped=1)  # stochastic rounding into fp32: skipped
    assert outcomes_by_nodeid(result) == {
        "test_marked.py::test_own": "PASSED",
        "test_marked.py::ssmcheck-scan::normal-bf16-c16-L40-b2-h2x8n8g1": "PASSED",
        f"test_marked.py::ssmcheck-scan::{RAGGED}": "FAILED",
        "test_marked.py::ssmcheck-drift::normal-fp32-nearest-b1-h1x16n16g1": "PASSED",
    }
    result.stdout.fnmatch_lines(["SKIPPED * stochastic rounding needs an fp16 or bf16 state*"])


def test_a_case_that_fail_on_does_not_gate_is_xfailed(pytester):
    pytester.makepyfile(f"""
        import pytest

        pytestmark = pytest.mark.ssmcheck(kernel={NAN_KERNEL!r}, regime=["ragged"], fail_on=["tolerance"])
    """)
    result = pytester.runpytest_subprocess("-rA")
    result.assert_outcomes(xfailed=1)
    result.stdout.fnmatch_lines([f"XFAIL *::{RAGGED} - nonfinite (not gated by fail_on): {LOCATION}*"])


def test_a_bad_marker_is_a_one_line_collection_error(pytester):
    pytester.makepyfile("""
        import pytest

        pytestmark = pytest.mark.ssmcheck(kernel="torch", preset="nope")

        def test_own():
            pass
    """)
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["@pytest.mark.ssmcheck: --preset: unknown preset 'nope' (available: *)"])


@pytest.mark.parametrize(("args", "message"), [
    (["--ssmcheck-scan", "torch", "--ssmcheck-preset", "nope"], "ERROR: --ssmcheck-preset: unknown preset 'nope' *"),
    (["--ssmcheck-scan", "nokernel"], "ERROR: --ssmcheck-scan 'nokernel': expected MODULE:FUNCTION *"),
    (["--ssmcheck-drift", "torch", "--ssmcheck-device", "gpu"], "ERROR: --ssmcheck-device: unknown device 'gpu'*"),
])
def test_a_bad_option_is_a_usage_error_naming_it(pytester, args, message):
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_the_builtin_kernels_pass_their_smoke_sweeps(pytester):
    result = pytester.runpytest_subprocess("--ssmcheck-scan", "builtin", "--ssmcheck-drift", "builtin",
                                           "--ssmcheck-preset", "smoke", "-rA")
    result.assert_outcomes(passed=len(SMOKE_IDS) + len(DRIFT_SMOKE_IDS))
    assert set(outcomes_by_nodeid(result)) == scan_nodeids(SMOKE_IDS) | {f"ssmcheck-drift::{i}" for i in DRIFT_SMOKE_IDS}


RECORD_AHEAD = """
import json
from pathlib import Path

import ssmcheck.api


def write(entry):
    with Path(__file__).with_name("ahead.jsonl").open("a") as f:
        f.write(json.dumps(entry) + "\\n")


class Helpers:
    def end(self):
        write("ended")


def record(plan, cases, running=1):  # in place of compiling ahead, which only a GPU does
    write([case.id for case in cases] + [running])
    return Helpers()


ssmcheck.api.start_compiling_ahead = record
"""


@pytest.mark.parametrize(("options", "compiled"), [
    # started once, before the first item, with the items that run, run by one process; ended after the last
    (("-k", "ragged"), [[i for i in SMOKE_IDS if "ragged" in i] + [1], "ended"]),
    (("-k", "ragged", "--ssmcheck-no-compile-ahead"), None),
])
def test_a_sweep_compiles_ahead_what_its_selected_items_launch(pytester, options, compiled):
    pytester.makeconftest(RECORD_AHEAD)
    result = pytester.runpytest_subprocess("--ssmcheck-scan", "torch", *options)
    result.assert_outcomes(passed=len([i for i in SMOKE_IDS if "ragged" in i]))
    ahead = pytester.path / "ahead.jsonl"
    assert ([json.loads(line) for line in ahead.read_text().splitlines()] if ahead.exists() else None) == compiled
