"""The Markdown summary of a report: heading, counts, failing cases and the worst ratios, safe in table cells."""

from test_junit import ENVIRONMENT, case, report, report_of
from test_tables import drift_results, scan_results

from ssmcheck.core.markdown import markdown_summary
from ssmcheck.drift.json import case_json as drift_case_json
from ssmcheck.scan.json import case_json as scan_case_json


def table_after(text: str, heading: str) -> list[list[str]]:
    """The cells of the table under `heading` (its header row first), split on unescaped pipes."""
    lines = text[text.index(heading):].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        cells = line.replace("\\|", "\0")[1:-1].split("|")
        rows.append([cell.strip().replace("\0", "\\|") for cell in cells])
    return [rows[0]] + rows[2:]  # without the alignment row


def scan_case(id: str, status: str, ratio, state_ratio, message: str = "") -> dict:
    return case(id, status, message, error={"ratio": ratio, "state_ratio": state_ratio})


def test_a_scan_summary_has_its_heading_counts_failures_and_ratios():
    text = markdown_summary(report_of("scan", scan_results(), scan_case_json))
    assert text.startswith("## ssmcheck scan: exit code 3\n\nssmcheck 0.1.0 · device ")
    counts = text[text.index("| pass"):].splitlines()
    assert counts[0].split() == ["|", "pass", "|", "fail", "|", "nonfinite", "|", "error", "|", "skipped", "|"]
    assert [c.strip() for c in counts[2].split("|")[1:-1]] == ["1", "1", "1", "1", "1"]
    assert table_after(text, "### Failing cases (3)") == [
        ["status", "case", "message"],
        ["fail", "`normal-bf16-c64-L300-b2-h4x32n16g1-state-fp16-stochastic`",
         "y error 2.07e-03 is 2.07 x baseline, above 2 x baseline + 1e-05"],
        ["nonfinite", "`ragged-fp16-c128-L300-b2-h4x32n16g1`",
         "y is non-finite at sequence 1 token 98 (chunk 1) head 2 channel 5"],
        ["error", "`normal-fp16-c256-L300-b2-h4x32n16g1`", "RuntimeError: out of resource: shared memory"],
    ]
    # Worst first, a NaN ratio (a non-finite kernel) above any number; the error and the skip have none.
    assert table_after(text, "### Highest ratios") == [
        ["case", "status", "ratio"],
        ["`ragged-fp16-c128-L300-b2-h4x32n16g1`", "nonfinite", "nan"],
        ["`normal-bf16-c64-L300-b2-h4x32n16g1-state-fp16-stochastic`", "fail", "2.07"],
        ["`normal-fp16-c64-L300-b2-h4x32n16g1`", "pass", "1.20"],
    ]
    assert "Interrupted" not in text


def test_a_scan_case_is_ranked_by_the_larger_of_its_y_and_state_ratios():
    text = markdown_summary(report([scan_case("a", "pass", 1.1, 1.9), scan_case("b", "pass", 1.5, 0.2),
                                    scan_case("c", "fail", "inf", 1.0), scan_case("d", "skipped", None, None),
                                    scan_case("e", "nonfinite", 1.0, float("nan"))]))  # a report not yet written
    assert [row[0] for row in table_after(text, "### Highest ratios")[1:]] == ["`e`", "`c`", "`a`", "`b`"]
    assert [row[2] for row in table_after(text, "### Highest ratios")[1:3]] == ["nan", "inf"]


def test_a_drift_summary_ranks_the_top_level_ratio():
    text = markdown_summary(report_of("drift", drift_results(), drift_case_json))
    assert text.startswith("## ssmcheck drift: exit code 3")
    assert table_after(text, "### Highest ratios")[1:] == [
        ["`stagnation-fp16-nearest-b1-h8x64n128g1`", "fail", "2.07"],
        ["`stagnation-fp16-stochastic-b1-h8x64n128g1`", "pass", "0.12"],
    ]


def test_worst_limits_the_ratio_table():
    cases = [scan_case(f"c{i}", "pass", i / 10, 0.0) for i in range(30)]
    assert len(table_after(markdown_summary(report(cases)), "### Highest ratios")) == 1 + 10
    assert len(table_after(markdown_summary(report(cases), worst=3), "### Highest ratios")) == 1 + 3
    assert "### Highest ratios" not in markdown_summary(report(cases), worst=0)


def test_pipes_newlines_and_tags_in_a_message_stay_inside_their_cell():
    message = "RuntimeError: a | b\nTraceback <module>\r\nlast"
    text = markdown_summary(report([case("c0", "error", message)]))
    [row] = [line for line in text.splitlines() if line.startswith("| error")]
    assert row.endswith("| RuntimeError: a \\| b<br>Traceback &lt;module><br>last |")
    assert table_after(text, "### Failing cases (1)")[1][2] == "RuntimeError: a \\| b<br>Traceback &lt;module><br>last"


def test_a_clean_run_says_no_failing_cases_and_an_interrupted_one_says_so():
    text = markdown_summary(report([case("c0", "pass")], environment={**ENVIRONMENT, "gpu": None}))
    assert "No failing cases." in text and "### Failing cases" not in text
    assert "device cuda (compiled) · torch 2.5.1" in text
    interrupted = markdown_summary(report([case("c0", "pass")], interrupted=True, interrupted_by="SIGINT"))
    assert "> **Interrupted** (SIGINT): only the 1 cases that finished are reported." in interrupted
    assert "device cuda (compiled), NVIDIA H200 (sm_90)" in interrupted


def test_the_raw_tables_line_up():
    text = markdown_summary(report([scan_case("short", "fail", 3.0, 1.0, "too big"),
                                    scan_case("a-much-longer-case-id", "pass", 1.0, 1.0)]))
    for heading in ("### Failing cases", "### Highest ratios"):
        table = text[text.index(heading):].split("\n\n")[1].splitlines()
        assert len(table) == 3 + (heading == "### Highest ratios") and len({len(line) for line in table}) == 1
