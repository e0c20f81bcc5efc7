"""The HTML report in a real browser: Chromium driven by playwright, on pages of real runs.

Marked `browser`: skipped where playwright or a Chromium binary is missing (CI). To run them:
`apt-get install chromium && pip install playwright` (playwright's own browser download is not needed:
the tests launch the system's Chromium through `executable_path`).
"""

import shutil
from pathlib import Path

import pytest
from cli_invoke import invoke

pytestmark = pytest.mark.browser

pytest.importorskip("matplotlib")
sync_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("no Chromium browser installed", allow_module_level=True)

BROKEN = str(Path(__file__).with_name("broken_scan_kernels.py"))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    """A page that fails the test on any request other than the file itself and data: images."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    requests = []
    page.on("request", lambda request: requests.append(request.url))
    yield page
    assert all(url.startswith(("file://", "data:")) for url in requests), requests
    page.close()


def html_of(tmp_path: Path, *command) -> tuple[Path, dict]:
    """Run `ssmcheck COMMAND --json`, then `ssmcheck report --html`; return (the page's path, the report)."""
    json_path, html_path = tmp_path / "report.json", tmp_path / "report.html"
    _, report = invoke(*command, json_path=json_path)
    result, _ = invoke("report", json_path, "--html", html_path)
    assert result.exit_code == 0, result.output
    return html_path, report


def row_ids(page) -> list[str]:
    return page.locator("#case-table tbody tr").evaluate_all("rows => rows.map(r => r.dataset.caseId)")


def test_a_scan_page_renders_sorts_and_shows_every_failing_case_s_map(tmp_path, page):
    path, report = html_of(tmp_path, "scan", "--preset", "smoke", "--kernel", f"{BROKEN}:nan_in_partial_last_chunk")
    page.goto(path.as_uri())
    assert page.title() == "ssmcheck scan report"
    assert page.locator("#summary").is_visible()
    assert row_ids(page) == [c["id"] for c in report["cases"]]

    # status sorts by severity: the non-finite cases first, then back the other way
    status = page.locator("#case-table th", has_text="status")
    status.click()
    assert status.get_attribute("aria-sort") == "ascending"
    ids = row_ids(page)
    assert ids != [c["id"] for c in report["cases"]]
    statuses = {c["id"]: c["status"] for c in report["cases"]}
    n_bad = sum(s == "nonfinite" for s in statuses.values())
    n_good = len(statuses) - n_bad
    assert n_bad and n_good and set(statuses.values()) == {"nonfinite", "pass"}
    assert [statuses[i] for i in ids] == ["nonfinite"] * n_bad + ["pass"] * n_good
    status.click()
    assert status.get_attribute("aria-sort") == "descending"
    assert [statuses[i] for i in row_ids(page)] == ["pass"] * n_good + ["nonfinite"] * n_bad

    # numbers sort as numbers, NaN errors last when ascending
    seqlen = page.locator("#case-table th", has_text="seqlen")
    seqlen.click()
    lengths = {c["id"]: c["params"]["seqlen"] for c in report["cases"]}
    assert [lengths[i] for i in row_ids(page)] == sorted(lengths.values())
    page.locator("#case-table th", has_text="y err").click()
    assert [statuses[i] for i in row_ids(page)][-n_bad:] == ["nonfinite"] * n_bad

    failing = [c for c in report["cases"] if c["status"] in ("fail", "nonfinite")]
    assert page.locator("figure.error-map").count() == len(failing) == n_bad
    for case in failing:
        figure = page.locator(f'figure.error-map[data-case-id="{case["id"]}"]')
        image = figure.locator("img")
        image.scroll_into_view_if_needed()
        assert image.is_visible()
        assert image.evaluate("img => img.complete && img.naturalWidth > 300 && img.naturalHeight > 200")
        first = case["first_nonfinite"]
        assert figure.get_attribute("data-first-token") == str(first["token"])
        assert figure.get_attribute("data-first-head") == str(first["head"])
        assert f"token {first['token']} (chunk {first['chunk']}), head {first['head']}" in figure.inner_text()

    # the case id links to its map
    page.locator(f'#case-table a[href="#map-{failing[0]["id"]}"]').click()
    assert page.evaluate("location.hash") == f"#map-{failing[0]['id']}"

    page.goto(path.as_uri())
    shot = page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    assert shot.startswith(PNG_MAGIC) and len(shot) > 10_000


def test_a_drift_page_renders_its_rounding_pairs(tmp_path, page):
    path, report = html_of(tmp_path, "drift", "--preset", "smoke")
    page.goto(path.as_uri())
    assert page.title() == "ssmcheck drift report"
    assert row_ids(page) == [c["id"] for c in report["cases"]]
    pairs = page.locator("figure.rounding-pair img")
    assert pairs.count() == 2
    for i in range(2):
        pairs.nth(i).scroll_into_view_if_needed()
        assert pairs.nth(i).evaluate("img => img.complete && img.naturalWidth > 300")
    page.screenshot(path=str(tmp_path / "drift.png"), full_page=True)
