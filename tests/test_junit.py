"""JUnit XML from the JSON report: one testsuite, one testcase per case, outcomes as CI viewers read them."""

import json
import xml.etree.ElementTree as ET

import pytest
from test_tables import drift_results, scan_results

from ssmcheck.core import runtime
from ssmcheck.core.junit import junit_xml
from ssmcheck.core.report import build_report, json_safe
from ssmcheck.core.status import summarize
from ssmcheck.drift.json import case_json as drift_case_json
from ssmcheck.scan.json import case_json as scan_case_json

ENVIRONMENT = {"device": "cuda", "interpreter": False, "torch": "2.5.1", "triton": "3.1.0",
               "gpu": "NVIDIA H200 (sm_90)", "python": "3.11.7"}


def report_of(command: str, results: list, case_json, interrupted: str | None = None) -> dict:
    """The report as --json writes it and a reader loads it back (NaN as "nan")."""
    statuses = [r.status for r in results]
    report = build_report(command, runtime.environment(), [case_json(r) for r in results], summarize(statuses), 3,
                          interrupted)
    return json.loads(json.dumps(json_safe(report)))


def case(id: str, status: str, message: str = "", seconds: float = 0.5, **more) -> dict:
    return {"id": id, "status": status, "message": message, "seconds": seconds, "params": {}, **more}


def report(cases: list[dict], **more) -> dict:
    return {"tool": "ssmcheck", "version": "0.1.0", "command": "scan", "environment": ENVIRONMENT, "cases": cases,
            "summary": {}, "exit_code": 1, **more}


def parse(text: str) -> ET.Element:
    assert text.startswith('<?xml version="1.0" encoding="UTF-8"?>\n')
    return ET.fromstring(text.encode("utf-8"))


def suite_of(text: str) -> ET.Element:
    root = parse(text)
    assert root.tag == "testsuites"
    [suite] = root.findall("testsuite")
    return suite


def test_a_scan_report_becomes_one_suite_with_a_testcase_per_case():
    results = scan_results()
    suite = suite_of(junit_xml(report_of("scan", results, scan_case_json)))
    assert suite.get("name") == "ssmcheck.scan"
    assert {k: suite.get(k) for k in ("tests", "failures", "errors", "skipped")} == {
        "tests": "5", "failures": "2", "errors": "1", "skipped": "1"}  # fail and nonfinite are failures
    assert float(suite.get("time")) == pytest.approx(sum(r.seconds for r in results), abs=1e-3)
    testcases = suite.findall("testcase")
    assert [t.get("name") for t in testcases] == [r.case.id for r in results]
    assert {t.get("classname") for t in testcases} == {"ssmcheck.scan"}
    passed, failed, nonfinite, errored, skipped = testcases
    assert list(passed) == [] and passed.get("time") == "0.410"
    assert failed.find("failure").attrib == {"type": "fail", "message": results[1].message}
    assert failed.find("failure").text == results[1].message
    assert nonfinite.find("failure").get("type") == "nonfinite"
    assert errored.find("error").get("message") == "RuntimeError: out of resource: shared memory"
    assert skipped.find("skipped").get("message") == "chunk size 8 is below the kernel's 16"


def test_a_drift_report_is_the_drift_suite():
    suite = suite_of(junit_xml(report_of("drift", drift_results(), drift_case_json)))
    assert suite.get("name") == "ssmcheck.drift"
    assert {t.get("classname") for t in suite.findall("testcase")} == {"ssmcheck.drift"}
    assert [(t.get("name"), [c.tag for c in t]) for t in suite.findall("testcase")] == [
        ("stagnation-fp16-nearest-b1-h8x64n128g1", ["failure"]), ("stagnation-fp16-stochastic-b1-h8x64n128g1", []),
        ("decay-bf16-nearest-b1-h8x64n128g1", ["error"]), ("stagnation-fp32-stochastic-b1-h8x64n128g1", ["skipped"])]


def test_the_suite_carries_the_environment_as_properties():
    suite = suite_of(junit_xml(report([case("c0", "pass")])))
    properties = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert properties == {"version": "0.1.0", "device": "cuda", "interpreter": "false", "gpu": "NVIDIA H200 (sm_90)",
                          "torch": "2.5.1", "triton": "3.1.0", "python": "3.11.7", "exit_code": "1",
                          "interrupted": "false"}
    assert suite.find("system-err") is None


def test_a_missing_gpu_is_left_out_rather_than_written_none():
    suite = suite_of(junit_xml(report([case("c0", "pass")], environment={**ENVIRONMENT, "gpu": None})))
    assert "gpu" not in {p.get("name") for p in suite.find("properties")}


def test_an_interrupted_run_says_so_on_the_suite():
    suite = suite_of(junit_xml(report([case("c0", "pass")], interrupted=True, interrupted_by="SIGTERM")))
    properties = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert properties["interrupted"] == "true" and properties["interrupted_by"] == "SIGTERM"
    assert "interrupted (SIGTERM)" in suite.find("system-err").text
    assert "1 cases that finished" in suite.find("system-err").text


def test_captured_kernel_stdout_goes_to_the_testcases_system_out():
    suite = suite_of(junit_xml(report([case("c0", "pass", stdout="tile 3: 0.5\n"), case("c1", "pass", stdout="")])))
    printed, silent = suite.findall("testcase")
    assert printed.find("system-out").text == "tile 3: 0.5\n"
    assert silent.find("system-out") is None


def test_markup_non_ascii_and_control_characters_still_give_well_formed_xml():
    message = "y error <inf> & \"worse\" × 2\nsecond line\x00"
    text = junit_xml(report([case("a<b>&c", "nonfinite", message, stdout="\x1b[31mred\x1b[0m\n")]))
    [testcase] = suite_of(text).findall("testcase")
    assert testcase.get("name") == "a<b>&c"
    failure = testcase.find("failure")
    assert failure.get("message") == "y error <inf> & \"worse\" × 2"  # the first line; the text has them all
    assert failure.text == "y error <inf> & \"worse\" × 2\nsecond line#x00"
    assert testcase.find("system-out").text == "#x1B[31mred#x1B[0m\n"


def test_an_empty_report_is_an_empty_suite():
    suite = suite_of(junit_xml(report([])))
    assert suite.get("tests") == "0" and suite.get("time") == "0.000" and suite.findall("testcase") == []
