"""The page itself: HTML skeleton, CSS, the table-sorting script, and the elements the builder fills.

Everything is inline (styles, script, images as data: URIs), so the file works offline, as a CI
artifact, from any folder. Text from the report is always escaped here.

Structure a test can rely on:
    header#summary       ul.counts > li[data-status][data-count]; p#exit-code[data-exit-code];
                         p#interrupted (only when interrupted); dl#environment; dl#settings
    table#case-table     thead th[data-type="number"|"text"] (click: sort, th[aria-sort]);
                         tbody tr.case[data-case-id][data-status] > td[data-value]
    figure.error-map     id="map-<case id>", data-case-id, data-first-output, data-first-token,
                         data-first-head (when y had the first non-finite element), img, figcaption
    figure.chunk-drift, figure.rounding-pair   img, figcaption
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from html import escape

from ssmcheck.html.data import STATUS_COLOURS

_STATUS_CSS = "\n".join(
    f".status-{name} {{ --status: {colour}; }}" for name, colour in STATUS_COLOURS.items()
)

CSS = """
:root { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; color: #1f2328; }
body { margin: 1.5rem; }
h1 { font-size: 1.4rem; margin-bottom: .3rem; } h2 { font-size: 1.15rem; margin-top: 2rem; }
.muted { color: #57606a; }
ul.counts { list-style: none; padding: 0; display: flex; gap: .5rem; flex-wrap: wrap; }
ul.counts li { border-left: 5px solid var(--status); background: #f6f8fa; padding: .25rem .7rem; }
#exit-code { font-weight: 600; }
#interrupted { background: #fff8c5; border: 1px solid #d4a72c; padding: .4rem .7rem; }
dl { display: grid; grid-template-columns: max-content auto; gap: .1rem 1rem; font-size: .9rem; }
dt { color: #57606a; } dd { margin: 0; font-family: ui-monospace, monospace; }
.about { display: flex; flex-wrap: wrap; gap: .5rem 4rem; align-items: flex-start; }
table { border-collapse: collapse; font-size: .85rem; width: 100%; }
th, td { border-bottom: 1px solid #d0d7de; padding: .25rem .45rem; text-align: left; vertical-align: top; }
th { background: #f6f8fa; cursor: pointer; user-select: none; white-space: nowrap; }
th[aria-sort="ascending"]::after { content: " \\25B2"; } th[aria-sort="descending"]::after { content: " \\25BC"; }
td.number { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; } td.text { white-space: nowrap; }
td.message { min-width: 16rem; } td.id { min-width: 12rem; }
.scroll { overflow-x: auto; }
td.status { font-weight: 600; color: var(--status); }
tr.case { border-left: 5px solid var(--status); }
tr.case:not(.status-pass):not(.status-skipped) { background: color-mix(in srgb, var(--status) 7%, white); }
.figures { display: flex; flex-wrap: wrap; gap: 0 2rem; align-items: flex-start; }
figure { margin: 1rem 0 2rem; } figure img { max-width: 100%; height: auto; border: 1px solid #d0d7de; }
figcaption { font-size: .9rem; margin-top: .3rem; max-width: 720px; }
""" + _STATUS_CSS

# Sorts the table by a clicked header: numbers by their data-value, text naturally; empty cells
# (a figure the case did not produce) stay last in either direction.
SCRIPT = """
function cellKey(cell) { return cell.dataset.value !== undefined ? cell.dataset.value : cell.textContent.trim(); }
function compareKeys(a, b, numeric) {
  return numeric ? Number(a) - Number(b) : a.localeCompare(b, undefined, {numeric: true});
}
function sortTable(table, header, column) {
  const descending = header.getAttribute("aria-sort") === "ascending";
  table.querySelectorAll("th").forEach(function (th) { th.removeAttribute("aria-sort"); });
  header.setAttribute("aria-sort", descending ? "descending" : "ascending");
  const numeric = header.dataset.type === "number";
  const body = table.tBodies[0];
  const rows = Array.from(body.rows);
  rows.sort(function (r, s) {
    const a = cellKey(r.cells[column]), b = cellKey(s.cells[column]);
    if (a === "" || b === "") { return (a === "") - (b === ""); }
    return descending ? compareKeys(b, a, numeric) : compareKeys(a, b, numeric);
  });
  rows.forEach(function (row) { body.appendChild(row); });
}
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (header, column) {
    header.addEventListener("click", function () { sortTable(table, header, column); });
  });
});
"""


@dataclass(frozen=True)
class Cell:
    text: str
    value: str | None = None  # the sort key (numbers as JavaScript reads them); None: the text
    href: str | None = None
    kind: str = "text"  # "number", "status", "id", "message" or "text": the cell's CSS class


def document(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n{body}\n"
        f"<script>{SCRIPT}</script>\n</body>\n</html>\n"
    )


def definitions(element_id: str, items: dict) -> str:
    rows = "".join(f"<dt>{escape(str(k))}</dt><dd>{escape(_plain(v))}</dd>" for k, v in items.items())
    return f'<dl id="{escape(element_id)}">{rows}</dl>'


def _plain(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "—"
    return str(value)


def counts(summary: dict[str, int]) -> str:
    items = "".join(
        f'<li class="status-{escape(status)}" data-status="{escape(status)}" data-count="{int(n)}">{int(n)} {escape(status)}</li>'
        for status, n in summary.items()
    )
    return f'<ul class="counts">{items}</ul>'


def table(headers: list[tuple[str, str]], rows: list[tuple[dict[str, str], list[Cell]]]) -> str:
    """`headers`: (title, "number" or "text"); `rows`: (the row's data attributes, its cells)."""
    head = "".join(f'<th scope="col" data-type="{kind}">{escape(title)}</th>' for title, kind in headers)
    body = "\n".join(f"<tr{_attributes(attrs)}>{''.join(map(_cell, cells))}</tr>" for attrs, cells in rows)
    return (f'<div class="scroll"><table id="case-table" class="sortable">\n<thead><tr>{head}</tr></thead>\n'
            f"<tbody>\n{body}\n</tbody>\n</table></div>")


def _cell(cell: Cell) -> str:
    text = escape(cell.text)
    if cell.href:
        text = f'<a href="{escape(cell.href)}">{text}</a>'
    value = "" if cell.value is None else f' data-value="{escape(cell.value)}"'
    return f'<td class="{cell.kind}"{value}>{text}</td>'


def _attributes(attrs: dict[str, str]) -> str:
    return "".join(f' {name}="{escape(str(value))}"' for name, value in attrs.items())


def figure(png: bytes | None, alt: str, caption: str, attrs: dict[str, str]) -> str:
    """An inline image (none: the caption alone); `caption` is HTML (the builder escapes what it puts in)."""
    image = ""
    if png is not None:
        image = f'<img src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}" alt="{escape(alt)}">'
    return f"<figure{_attributes(attrs)}>{image}<figcaption>{caption}</figcaption></figure>"
