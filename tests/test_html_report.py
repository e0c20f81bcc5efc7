"""`ssmcheck report REPORT.json --html OUT.html`: the page's structure, parsed with the standard library.

Real reports come from the CLI in-process (the built-in kernel, the torch baseline and the broken
kernels of tests/broken_scan_kernels.py); tests/test_html_browser.py opens the same pages in Chromium.
"""

import base64
import json
import math
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from broken_scan_kernels import NAN_HEAD, NAN_OFFSET
from cli_invoke import assert_usage_error, invoke
from whole_tensors import group_sums

from ssmcheck.html import build_html
from ssmcheck.scan.inputs import TokenMap

pytest.importorskip("matplotlib")

BROKEN = str(Path(__file__).with_name("broken_scan_kernels.py"))
TINY = ["--nheads", "2", "--headdim", "16", "--dstate", "8", "--ngroups", "1"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class Page(HTMLParser):
    """Every element as a dict of its attributes plus "tag" and "text" (all the text inside it), in document order."""

    VOID = ("img", "meta", "br")  # elements that never close

    def __init__(self, text: str):
        super().__init__()
        self.elements: list[dict] = []
        self._open: list[dict] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        element = {**dict(attrs), "tag": tag, "text": ""}
        self.elements.append(element)
        if tag not in self.VOID:
            self._open.append(element)

    def handle_endtag(self, tag):
        if tag not in self.VOID:
            self._open.pop()

    def handle_data(self, data):
        for element in self._open:
            element["text"] += data

    def find(self, tag: str | None = None, cls: str | None = None, **attributes) -> list[dict]:
        return [e for e in self.elements
                if (tag is None or e["tag"] == tag) and (cls is None or cls in e.get("class", "").split())
                and all(e.get(k.replace("_", "-")) == v for k, v in attributes.items())]

    def text(self, element_id: str) -> str:
        (element,) = self.find(id=element_id)
        return element["text"]

    def children(self, parent_id: str, tag: str) -> list[dict]:
        """The `tag` elements inside the element with `parent_id` (figures hold no nested ids)."""
        inside, found = False, []
        for e in self.elements:
            if e.get("id") is not None:
                inside = e["id"] == parent_id
            elif inside and e["tag"] == tag:
                found.append(e)
        return found


def render(tmp_path: Path, report_path: Path) -> Page:
    out = tmp_path / "report.html"
    result, _ = invoke("report", report_path, "--html", out)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"wrote {out}")
    return Page(out.read_text())


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory):
    """The smoke preset on a kernel that puts NaN into the partial last chunk of one head: (report path, report)."""
    path = tmp_path_factory.mktemp("nan") / "r.json"
    result, report = invoke("scan", "--preset", "smoke", "--kernel", f"{BROKEN}:nan_in_partial_last_chunk", json_path=path)
    assert result.exit_code == 3, result.output
    return path, report


def test_the_page_has_the_summary_and_one_table_row_per_case(tmp_path, nan_run):
    path, report = nan_run
    page = render(tmp_path, path)
    assert page.find("title")[0]["text"] == "ssmcheck scan report"
    assert "ssmcheck scan report" in page.text("summary")
    assert {e["data-status"]: int(e["data-count"]) for e in page.find("li")} == report["summary"]
    assert page.find(id="exit-code")[0]["data-exit-code"] == "3"
    assert not page.find(id="interrupted")
    assert report["environment"]["torch"] in page.text("environment")
    assert "smoke" in page.text("settings")
    rows = page.find("tr", cls="case")
    assert [(r["data-case-id"], r["data-status"]) for r in rows] == [(c["id"], c["status"]) for c in report["cases"]]
    headers = page.find("th")
    assert {"status", "case", "ratio", "first non-finite", "message"} <= {h["text"] for h in headers}
    assert all(h["data-type"] in ("number", "text") for h in headers)
    assert len(page.find("td")) == len(rows) * len(headers)


def test_every_nonfinite_case_has_its_map_marking_the_first_nan_where_ssmcheck_names_it(tmp_path, nan_run):
    path, report = nan_run
    page = render(tmp_path, path)
    failing = [c for c in report["cases"] if c["status"] in ("fail", "nonfinite")]
    batch_mode = [c for c in report["cases"]
                  if c["params"]["regime"] not in ("ragged", "aligned", "initial-state", "aligned-initial-state", "long")]
    assert failing == batch_mode  # seqlen 40 = 2.5 chunks of 16; long's last chunk holds only NAN_OFFSET tokens
    maps = page.find("figure", cls="error-map")
    assert [m["id"] for m in maps] == [f"map-{c['id']}" for c in failing]
    for case, figure in zip(failing, maps):
        first = case["first_nonfinite"]
        # the kernel's NaN starts NAN_OFFSET tokens into the partial last chunk (32..39), in head NAN_HEAD
        assert (first["token"], first["head"]) == (40 - 40 % 16 + NAN_OFFSET, NAN_HEAD)
        assert (figure["data-first-output"], int(figure["data-first-token"]), int(figure["data-first-head"]),
                int(figure["data-first-chunk"])) == ("y", first["token"], first["head"], first["chunk"])
        assert f"token {first['token']} (chunk {first['chunk']}), head {first['head']}" in page.text(figure["id"])
        (image,) = page.children(figure["id"], "img")
        prefix = "data:image/png;base64,"
        assert image["src"].startswith(prefix)
        assert base64.b64decode(image["src"][len(prefix):]).startswith(PNG_MAGIC)
    # each mapped case's id in the table links to its map
    links = {a["href"] for a in page.find("a")}
    assert links == {f"#map-{c['id']}" for c in failing}
    assert len(page.find("figure", cls="chunk-drift")) == 1


def test_the_json_keeps_the_error_per_chunk_and_head_only_for_failing_cases(nan_run):
    _, report = nan_run
    for case in report["cases"]:
        if case["status"] == "pass":
            assert case["error_map"] is None
            continue
        error_map = case["error_map"]
        assert (error_map["chunk_size"], error_map["tokens"]) == (16, 40)
        grid = [[float(e) for e in row] for row in error_map["per_chunk_head"]]
        assert len(grid) == 3 and all(len(row) == 2 for row in grid)  # [chunk][head]
        bad = {(k, h) for k, row in enumerate(grid) for h, e in enumerate(row) if not math.isfinite(e)}
        assert bad == {(case["first_nonfinite"]["chunk"], NAN_HEAD)}
        assert all(0 < e < 0.1 for row in grid for e in row if math.isfinite(e))


def test_per_chunk_head_error_chunks_each_sequence_on_its_own():
    # one packed row of two sequences (5 and 3 tokens), chunk size 2, 2 heads, 1 channel
    ref = torch.ones(1, 8, 2, 1, dtype=torch.float64)
    y = ref.clone()
    y[0, 1, 0] = 1.5  # sequence 0, token 1: chunk 0, head 0
    y[0, 6, 1] = 2.0  # sequence 1, token 1: chunk 0, head 1
    y[0, 4, 0] = math.inf  # sequence 0, token 4: chunk 2, head 0
    tokens = TokenMap(sequence=torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1]]),
                      position=torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2]]), order=torch.arange(8)[None])
    grid = group_sums(y, ref, tokens, 2).per_chunk_head()
    # chunk 0 holds tokens 0, 1 of both sequences: 4 tokens per head
    assert grid[0] == [pytest.approx(math.sqrt(0.25 / 4)), pytest.approx(math.sqrt(1 / 4))]
    assert grid[1] == [0.0, 0.0]  # tokens 2, 3 of sequence 0 and token 2 of sequence 1
    assert grid[2][0] == math.inf and grid[2][1] == 0.0


def test_a_nan_final_state_gets_a_map_without_a_marker(tmp_path):
    path = tmp_path / "r.json"
    result, report = invoke("scan", "--kernel", f"{BROKEN}:nan_final_state", "--regime", "ragged", "--dtype", "fp16",
                            "--seqlen", "30", "--chunk-size", "16", "--batch", "3", *TINY, json_path=path)
    assert result.exit_code == 3, result.output
    (case,) = report["cases"]
    # varlen: the token axis ends at the longest sequence, not at the packed row's length
    lengths = [int(n) for n in case["inputs"].split("of ")[1].split(" tokens")[0].split(", ")]
    assert case["error_map"]["tokens"] == max(lengths)
    page = render(tmp_path, path)
    (figure,) = page.find("figure", cls="error-map")
    assert figure["data-first-output"] == "final_states" and "data-first-token" not in figure
    assert "y stayed finite" in page.text(figure["id"])


def test_a_tolerance_failure_gets_a_map(tmp_path):
    path = tmp_path / "r.json"
    result, report = invoke("scan", "--kernel", f"{BROKEN}:leaky_varlen", "--regime", "ragged,normal", "--dtype",
                            "bf16", "--seqlen", "40", "--chunk-size", "16", "--batch", "1,4", *TINY, json_path=path)
    assert result.exit_code == 1, result.output
    page = render(tmp_path, path)
    (failed,) = [c for c in report["cases"] if c["status"] == "fail"]
    (figure,) = page.find("figure", cls="error-map")
    assert figure["id"] == f"map-{failed['id']}" and "data-first-output" not in figure
    assert len(page.children(figure["id"], "img")) == 1


def test_the_builtin_kernel_passing_the_smoke_preset_has_no_maps(tmp_path):
    path = tmp_path / "r.json"
    result, report = invoke("scan", "--preset", "smoke", json_path=path)
    assert result.exit_code == 0, result.output
    page = render(tmp_path, path)
    assert len(page.find("tr", cls="case")) == len(report["cases"]) == 13
    assert not page.find("figure", cls="error-map") and not page.find(id="error-maps")
    assert len(page.find("figure", cls="chunk-drift")) == 1


def test_a_drift_report_draws_each_configuration_with_its_rounding_modes_side_by_side(tmp_path):
    path = tmp_path / "r.json"
    result, report = invoke("drift", "--preset", "smoke", json_path=path)
    assert result.exit_code == 0, result.output
    page = render(tmp_path, path)
    assert "ssmcheck drift report" in page.text("summary")
    assert len(page.find("tr", cls="case")) == len(report["cases"]) == 4
    pairs = page.find("figure", cls="rounding-pair")
    assert [p["data-configuration"] for p in pairs] == ["normal-fp16-b1-h1x16n16g1", "stagnation-fp16-b1-h1x16n16g1"]
    assert all(p["data-roundings"] == "nearest,stochastic" for p in pairs)
    assert all(len(page.children(p["id"], "img")) == 1 for p in pairs)
    assert "drift with stochastic rounding" in page.text(pairs[0]["id"])
    assert not page.find("figure", cls="error-map")


def test_the_page_needs_no_network_and_escapes_the_report_text(nan_run):
    _, report = nan_run
    report = json.loads(json.dumps(report))
    report["cases"][0]["message"] = '<script>alert("x")</script>'
    report |= {"interrupted": True, "interrupted_by": "SIGTERM"}
    text = build_html(report)
    page = Page(text)
    (script,) = page.find("script")  # the one inline script
    assert "src" not in script
    assert not page.find("link")
    assert all(a["src"].startswith("data:") for a in page.find("img"))
    assert "http://" not in text and "https://" not in text
    assert '<script>alert("x")</script>' not in text and "&lt;script&gt;" in text
    assert "SIGTERM" in page.text("interrupted")


def test_a_report_from_before_error_maps_says_it_has_none(nan_run):
    _, report = nan_run
    report = json.loads(json.dumps(report))
    for case in report["cases"]:
        del case["error_map"]
    page = Page(build_html(report))
    maps = page.find("figure", cls="error-map")
    failing = [c for c in report["cases"] if c["status"] in ("fail", "nonfinite")]
    assert len(maps) == len(failing) > 0 and all("missing" in m["class"] for m in maps)
    assert "has no error map" in page.text(maps[0]["id"])


@pytest.mark.parametrize(("content", "named"), [
    (None, "cannot read"),
    ("{not json", "cannot read"),
    ('{"tool": "other"}', "not an ssmcheck report"),
    ('{"tool": "ssmcheck", "command": "bench"}', "scan or drift"),
])
def test_a_report_that_cannot_be_read_is_a_usage_error(tmp_path, content, named):
    source = tmp_path / "report.json"
    if content is not None:
        source.write_text(content)
    result, _ = invoke("report", source, "--html", tmp_path / "out.html")
    assert_usage_error(result, named)
    assert not (tmp_path / "out.html").exists()


@pytest.mark.parametrize(("out", "named"), [
    (lambda d: d / "no" / "out.html", "--html: no such directory"),
    (lambda d: d, "is a directory"),
    (lambda d: None, "Missing option '--html'"),
])
def test_an_html_path_that_cannot_be_written_is_a_usage_error(tmp_path, nan_run, out, named):
    target = out(tmp_path)
    result, _ = invoke("report", nan_run[0], *(["--html", target] if target else []))
    assert_usage_error(result, named)


def test_without_matplotlib_the_command_says_how_to_install_it(tmp_path, nan_run, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    result, _ = invoke("report", nan_run[0], "--html", tmp_path / "out.html")
    assert_usage_error(result, 'pip install "ssmcheck[plot]"')
