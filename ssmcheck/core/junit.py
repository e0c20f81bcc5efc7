"""The JSON report as JUnit XML, for CI test-report viewers: one testcase per case.

    <testsuites name="ssmcheck" tests failures errors skipped time>
      <testsuite name="ssmcheck.COMMAND" tests failures errors skipped time>
        <properties><property name="device" value="cuda"/>...</properties>
        <testcase classname="ssmcheck.COMMAND" name="CASE ID" time="S">
          <failure type="fail|nonfinite" message="FIRST LINE">MESSAGE</failure>  (or <error>, <skipped>)
          <system-out>WHAT THE KERNEL PRINTED</system-out>
        </testcase>
        <system-err>interrupted ...</system-err>  (an interrupted run only)
      </testsuite>
    </testsuites>

Read from the report dict alone, as built or as loaded back from --json.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import Counter

# The element a status becomes in its testcase; a pass has none.
OUTCOMES = {"fail": "failure", "nonfinite": "failure", "error": "error", "skipped": "skipped"}
ENVIRONMENT = ("device", "interpreter", "gpu", "torch", "triton", "python")
# XML 1.0 cannot hold most control characters even escaped (a kernel's ANSI colours, say): write them as #xNN.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def junit_xml(report: dict) -> str:
    """The report as a JUnit XML document (UTF-8, with its declaration)."""
    name = f"ssmcheck.{report['command']}"
    cases = report["cases"]
    counts = Counter(case["status"] for case in cases)
    totals = {
        "tests": str(len(cases)),
        "failures": str(counts["fail"] + counts["nonfinite"]),
        "errors": str(counts["error"]),
        "skipped": str(counts["skipped"]),
        "time": _seconds(sum(case.get("seconds") or 0 for case in cases)),
    }
    root = ET.Element("testsuites", name="ssmcheck", **totals)
    suite = ET.SubElement(root, "testsuite", name=name, **totals)
    properties = ET.SubElement(suite, "properties")
    for key, value in _properties(report):
        ET.SubElement(properties, "property", name=key, value=_xml(value))
    for case in cases:
        suite.append(_testcase(name, case))
    if report.get("interrupted"):
        ET.SubElement(suite, "system-err").text = (
            f"ssmcheck was interrupted ({report.get('interrupted_by') or 'stopped'}): "
            f"only the {len(cases)} cases that finished are reported"
        )
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _properties(report: dict) -> list[tuple[str, object]]:
    environment = report.get("environment", {})
    pairs = [("version", report.get("version"))] + [(key, environment.get(key)) for key in ENVIRONMENT]
    pairs += [("exit_code", report.get("exit_code")), ("interrupted", bool(report.get("interrupted")))]
    if report.get("interrupted"):
        pairs.append(("interrupted_by", report.get("interrupted_by")))
    return [(key, str(value).lower() if isinstance(value, bool) else value) for key, value in pairs
            if value is not None]


def _testcase(classname: str, case: dict) -> ET.Element:
    element = ET.Element("testcase", classname=classname, name=_xml(case["id"]),
                         time=_seconds(case.get("seconds") or 0))
    outcome = OUTCOMES.get(case["status"])
    if outcome is not None:
        message = _xml(case.get("message") or "")
        detail = ET.SubElement(element, outcome, message=message.split("\n", 1)[0])
        if outcome == "failure":
            detail.set("type", case["status"])
        if outcome != "skipped":
            detail.text = message
    if case.get("stdout"):
        ET.SubElement(element, "system-out").text = _xml(case["stdout"])
    return element


def _xml(value: object) -> str:
    return _NOT_XML.sub(lambda m: f"#x{ord(m.group()):02X}", str(value))


def _seconds(value: float) -> str:
    return f"{value:.3f}"
