"""The regression gate: two JSON reports of one command, compared case by case."""

import json
import math
import tempfile
from pathlib import Path

import pytest

from ssmcheck.core.compare import Growth, StatusChange, compare_reports, text_lines
from ssmcheck.core.report import write_json


def _scan_case(case_id, status="pass", ratio=1.0, state_ratio=0.5, message=""):
    return {"id": case_id, "status": status, "message": message, "params": {},
            "error": {"ratio": ratio, "state_ratio": state_ratio}}


def _drift_case(case_id, status="pass", ratio=1.0):
    return {"id": case_id, "status": status, "message": "", "ratio": ratio}


def _report(cases, command="scan"):
    """A report as `--json` writes it and the gate reads it back: NaN and Inf become the strings "nan", "inf"."""
    report = {"tool": "ssmcheck", "version": "0.1.0", "command": command, "environment": {},
              "cases": cases, "summary": {}, "exit_code": 0}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "report.json"
        write_json(path, report)
        return json.loads(path.read_text())


def test_identical_reports_have_no_findings():
    report = _report([_scan_case("a"), _scan_case("b", "fail")])
    c = compare_reports(report, report)
    assert not c.regression and c.exit_code == 0 and c.compared == 2
    assert (c.new_failures, c.fixed, c.growth, c.removed, c.added, c.still_failing) == ([], [], [], [], [], ["b"])
    assert text_lines(c)[-1].endswith("no regression, exit code 0")


def test_a_planted_regression_pass_to_fail_gates():
    old = _report([_scan_case("a"), _scan_case("b")])
    new = _report([_scan_case("a"), _scan_case("b", "nonfinite", message="NaN at token 3\nmore detail")])
    c = compare_reports(old, new)
    assert c.new_failures == [StatusChange("b", "pass", "nonfinite", "NaN at token 3 ... more detail")]
    assert c.regression and c.exit_code == 1
    lines = text_lines(c)
    assert lines[0] == "new failure: b: pass -> nonfinite (NaN at token 3 ... more detail)"
    assert lines[-1].startswith("compared 2 scan cases: new failures 1,") and lines[-1].endswith("exit code 1")


def test_a_new_case_that_fails_is_a_new_failure_and_a_skipped_one_that_fails_too():
    old = _report([_scan_case("a"), _scan_case("s", "skipped", None, None)])
    new = _report([_scan_case("a"), _scan_case("s", "error"), _scan_case("n", "fail"), _scan_case("ok")])
    c = compare_reports(old, new)
    assert [(x.id, x.old, x.new) for x in c.new_failures] == [("s", "skipped", "error"), ("n", None, "fail")]
    assert c.added == ["n", "ok"] and c.removed == []
    assert "new failure: n: new case -> fail" in text_lines(c)


def test_a_fixed_case_is_reported_and_does_not_gate():
    old = _report([_scan_case("a", "fail"), _scan_case("gone")])
    new = _report([_scan_case("a")])
    c = compare_reports(old, new)
    assert [(x.id, x.old, x.new) for x in c.fixed] == [("a", "fail", "pass")]
    assert c.removed == ["gone"] and not c.regression
    assert text_lines(c)[:2] == ["fixed: a: fail -> pass", "removed: gone"]


def test_a_case_no_longer_run_is_reported():
    c = compare_reports(_report([_scan_case("a")]), _report([_scan_case("a", "skipped", None, None, "no fp16")]))
    assert c.not_run == [StatusChange("a", "pass", "skipped", "no fp16")] and not c.regression


@pytest.mark.parametrize("new_ratio, grew", [(1.4, False), (1.5, False), (1.6, True)])
def test_ratio_growth_against_the_threshold(new_ratio, grew):
    old = _report([_scan_case("a", ratio=1.0, state_ratio=0.2)])
    new = _report([_scan_case("a", ratio=0.3, state_ratio=new_ratio)])  # the worst of the two ratios counts
    c = compare_reports(old, new, max_growth=1.5)
    assert c.regression is grew
    if grew:
        assert c.growth == [Growth("a", 1.0, new_ratio, new_ratio)]
        assert text_lines(c)[0] == f"ratio growth: a: 1 -> {new_ratio:.3g} ({new_ratio:.3g}x > 1.5x)"


def test_nonfinite_ratios_arrive_as_strings():
    case = _report([_drift_case("d", ratio=float("inf"))], "drift")["cases"][0]
    assert case["ratio"] == "inf"


def test_drift_growth_reads_the_top_level_ratio():
    old = _report([_drift_case("d", ratio=0.5)], "drift")
    new = _report([_drift_case("d", ratio=2.0)], "drift")
    assert [g.factor for g in compare_reports(old, new).growth] == [4.0]
    assert not compare_reports(old, new, max_growth=5).regression


@pytest.mark.parametrize("old_ratio, new_ratio, factor", [
    (float("nan"), 5.0, None), (1.0, float("nan"), None),  # NaN cannot be compared
    (None, 5.0, None), (1.0, None, None),  # nor can a missing ratio
    (0.0, 0.0, None), (0.0, 0.1, math.inf),  # exact before, inexact now: unbounded growth
    (float("inf"), float("inf"), None), (1.0, float("inf"), math.inf), (float("inf"), 3.0, None),
])
def test_nan_inf_zero_and_missing_ratios(old_ratio, new_ratio, factor):
    old = _report([_drift_case("d", ratio=old_ratio)], "drift")
    new = _report([_drift_case("d", ratio=new_ratio)], "drift")
    assert [g.factor for g in compare_reports(old, new).growth] == ([] if factor is None else [factor])


def test_a_nan_among_the_scan_ratios_is_not_compared():
    old = _report([_scan_case("a", ratio=1.0, state_ratio=1.0)])
    new = _report([_scan_case("a", ratio=9.0, state_ratio=float("nan"))])
    assert compare_reports(old, new).growth == []


def test_growth_is_only_judged_for_cases_passing_in_both():
    old = _report([_scan_case("a", "fail", ratio=1.0)])
    new = _report([_scan_case("a", "fail", ratio=100.0)])
    c = compare_reports(old, new)
    assert c.growth == [] and c.still_failing == ["a"] and not c.regression


def test_reports_of_different_commands_are_refused():
    with pytest.raises(ValueError, match="^cannot compare a scan report with a drift report$"):
        compare_reports(_report([]), _report([], "drift"))


@pytest.mark.parametrize("report, message", [
    ({"cases": []}, "not an ssmcheck report"),
    ([], "not an ssmcheck report"),
    ({"tool": "ssmcheck", "command": "bench", "cases": []}, "command is 'bench'"),
    ({"tool": "ssmcheck", "command": "scan", "cases": [{"status": "pass"}]}, "id and a status"),
    ({"tool": "ssmcheck", "command": "scan", "cases": [_scan_case("a"), _scan_case("a")]}, "case 'a' twice"),
])
def test_what_is_not_a_report_is_refused_in_one_line(report, message):
    with pytest.raises(ValueError, match=f"^the new report.*{message}") as caught:
        compare_reports(_report([]), report)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("max_growth", [0.5, float("nan"), -1])
def test_a_max_growth_below_one_is_refused(max_growth):
    with pytest.raises(ValueError, match="max growth"):
        compare_reports(_report([]), _report([]), max_growth)
