"""The JSON report as a Markdown summary, for $GITHUB_STEP_SUMMARY or --summary FILE.

A heading with the command and exit code, the environment, the counts, the failing cases and
the highest kernel/baseline ratios; tables are padded so the raw text reads as well.
Read from the report dict alone, as built or as loaded back from --json (NaN a float or "nan").
"""

from __future__ import annotations

import math

from ssmcheck.core.report import worst_ratio

STATUSES = ("pass", "fail", "nonfinite", "error", "skipped")
FAILING = ("fail", "nonfinite", "error")
PAD_LIMIT = 60  # columns are padded to their widest cell up to this; longer cells (messages) stick out


def markdown_summary(report: dict, worst: int = 10) -> str:
    """The summary: counts, every failing case, and the `worst` highest ratios among the cases that ran."""
    cases = report["cases"]
    sections = [_heading(report)]
    if report.get("interrupted"):
        sections.append(f"> **Interrupted** ({report.get('interrupted_by') or 'stopped'}): "
                        f"only the {len(cases)} cases that finished are reported.")
    sections.append(_table(STATUSES, [[str(sum(c["status"] == s for c in cases)) for s in STATUSES]],
                           right=set(STATUSES)))
    failing = [c for c in cases if c["status"] in FAILING]
    if failing:
        sections.append(f"### Failing cases ({len(failing)})\n\n" + _table(
            ("status", "case", "message"), [[c["status"], f"`{c['id']}`", c.get("message") or ""] for c in failing]))
    else:
        sections.append("No failing cases.")
    ranked = sorted(((r, c) for c in cases if c["status"] != "skipped" and (r := worst_ratio(c)) is not None),
                    key=lambda pair: _severity(pair[0]), reverse=True)[:worst]
    if ranked:
        sections.append("### Highest ratios (kernel error / baseline error)\n\n" + _table(
            ("case", "status", "ratio"), [[f"`{c['id']}`", c["status"], _figure(r)] for r, c in ranked],
            right={"ratio"},
        ))
    return "\n\n".join(sections) + "\n"


def _heading(report: dict) -> str:
    env = report.get("environment", {})
    where = f"{env.get('device')} ({'Triton interpreter' if env.get('interpreter') else 'compiled'})"
    if env.get("gpu"):
        where += f", {env['gpu']}"
    return (
        f"## ssmcheck {report['command']}: exit code {report['exit_code']}\n\n"
        f"ssmcheck {report.get('version')} · device {where} · torch {env.get('torch')} · "
        f"triton {env.get('triton')} · python {env.get('python')}"
    )


def _severity(ratio: float) -> tuple[bool, float]:
    """Sorts a NaN ratio (a non-finite kernel output) above every number, infinity included."""
    return (True, 0.0) if math.isnan(ratio) else (False, ratio)


def _figure(value: float) -> str:
    return f"{value:.2f}" if math.isfinite(value) else str(value)


def _cell(text: str) -> str:
    """Table-safe: a `|` would end the cell, a newline the row, and `<...>` would vanish as HTML."""
    return text.strip().replace("|", "\\|").replace("<", "&lt;").replace("\r\n", "\n").replace("\n", "<br>")


def _table(headers, rows, right=frozenset()) -> str:
    """A Markdown table, its columns padded so the raw text lines up."""
    rows = [[_cell(cell) for cell in row] for row in rows]
    widths = [min(max(len(h), 3, *(len(row[i]) for row in rows)), PAD_LIMIT) for i, h in enumerate(headers)]

    def line(cells):
        return "| " + " | ".join(cell.rjust(w) if h in right else cell.ljust(w)
                                 for h, cell, w in zip(headers, cells, widths)) + " |"

    rule = ["-" * (w - 1) + ":" if h in right else "-" * w for h, w in zip(headers, widths)]
    return "\n".join([line(headers), line(rule)] + [line(row) for row in rows])
