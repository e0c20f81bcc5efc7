"""A JSON report (a parsed dict) as one self-contained HTML page: summary, sortable case table, figures."""

from __future__ import annotations

from html import escape
from pathlib import Path

from ssmcheck.html import figures
from ssmcheck.html.columns import drift_columns, scan_columns
from ssmcheck.html.data import check_report, drift_configurations, mapped_cases, rounding_gain
from ssmcheck.html.page import counts, definitions, document, figure, table


def build_html(report: dict) -> str:
    """The page of a scan or drift report. Raises data.NotAReport, figures.PlotUnavailable."""
    check_report(report)
    figures.require_matplotlib()
    command = report["command"]
    sections = [_summary(report), _cases(report)]
    if command == "scan":
        sections += [_error_maps(report), _chunk_drift(report)]
    else:
        sections.append(_rounding_pairs(report))
    return document(f"ssmcheck {command} report", "\n".join(s for s in sections if s))


def write_html(report: dict, path: Path | str) -> None:
    Path(path).write_text(build_html(report), encoding="utf-8")


def _summary(report: dict) -> str:
    environment = report.get("environment") or {}
    exit_code = int(report.get("exit_code", -1))
    where = environment.get("device", "?") + (" (Triton interpreter)" if environment.get("interpreter") else "")
    parts = [
        f"<h1>ssmcheck {escape(report['command'])} report</h1>",
        f'<p class="muted">ssmcheck {escape(str(report.get("version", "?")))} on {escape(where)}, '
        f"{len(report['cases'])} cases</p>",
        counts(report["summary"]),
        f'<p id="exit-code" data-exit-code="{exit_code}">exit code {exit_code}</p>',
    ]
    if report.get("interrupted"):
        parts.append(f'<p id="interrupted">Interrupted by {escape(str(report.get("interrupted_by")))}: only the cases '
                     "that finished are reported; the others were never judged.</p>")
    parts += [
        '<div class="about"><details open><summary>Environment</summary>', definitions("environment", environment),
        "</details><details open><summary>Settings</summary>", definitions("settings", report.get("settings") or {}),
        "</details></div>",
    ]
    return '<header id="summary">' + "\n".join(parts) + "</header>"


def _cases(report: dict) -> str:
    if report["command"] == "scan":
        columns = scan_columns({c["id"] for c in mapped_cases(report)})
    else:
        columns = drift_columns()
    headers = [(c.header, "number" if c.numeric else "text") for c in columns]
    rows = [({"class": f"case status-{case['status']}", "data-case-id": case["id"], "data-status": case["status"]},
             [c.cell(case) for c in columns]) for case in report["cases"]]
    return ('<section id="cases"><h2>Cases</h2><p class="muted">Click a header to sort.</p>'
            + table(headers, rows) + "</section>")


def _error_maps(report: dict) -> str:
    cases = mapped_cases(report)
    if not cases:
        return ""
    maps = "\n".join(map(_error_map, cases))
    return ('<section id="error-maps"><h2>Error maps of the failing cases</h2>'
            '<p class="muted">Relative error of y per chunk and head, on the token axis (log colours); '
            "red cells are non-finite, the star is the first non-finite element, white lines are chunk "
            "boundaries. Above each map, the error per chunk over all heads.</p>"
            f'<div class="figures">{maps}</div></section>')


def _error_map(case: dict) -> str:
    attrs = {"class": "error-map", "id": f"map-{case['id']}", "data-case-id": case["id"], "data-status": case["status"]}
    first = case.get("first_nonfinite")
    marked = None
    if first:
        attrs["data-first-output"] = first["output"]
        if first["output"] == "y":
            marked = first["token"], first["head"]
            attrs |= {"data-first-sequence": first["sequence"], "data-first-token": first["token"],
                      "data-first-chunk": first["chunk"], "data-first-head": first["head"]}
    caption = f"<strong>{escape(case['id'])}</strong> ({escape(case['status'])}): {escape(case['message'])}"
    if marked is not None:
        caption += (f"<br>First non-finite element (★): sequence {first['sequence']}, token {first['token']} "
                    f"(chunk {first['chunk']}), head {first['head']}, channel {first['channel']}.")
    elif first:
        caption += (f"<br>y stayed finite; the first non-finite element is in the final states: sequence "
                    f"{first['sequence']}, head {first['head']}, channel {first['channel']}.")
    error_map = case.get("error_map")
    if error_map is None:  # a report written before error maps were measured
        attrs["class"] += " missing"
        return figure(None, "", caption + "<br>This report has no error map for the case.", attrs)
    png = figures.error_map(error_map["per_chunk_head"], error_map["chunk_size"], error_map["tokens"],
                            case["drift"]["per_chunk"], marked, case["id"])
    return figure(png, f"error map of {case['id']}", caption, attrs)


def _chunk_drift(report: dict) -> str:
    cases = [c for c in report["cases"] if c["drift"]["per_chunk"]]
    if not cases:
        return ""
    png = figures.chunk_drift(cases)
    caption = ("Relative error of y in each chunk, for every case that ran: passing cases in green, failing ones "
               "in their status colour; a red cross is a non-finite chunk. The table's growth column is the "
               "fitted ratio of the last chunk's error to the first's.")
    return ('<section id="chunk-drift"><h2>Per-chunk drift</h2>'
            + figure(png, "per-chunk drift of every case", caption, {"class": "chunk-drift"}) + "</section>")


def _rounding_pairs(report: dict) -> str:
    configurations = drift_configurations(report["cases"])
    if not configurations:
        return ""
    parts = []
    for config in configurations:
        caption = f"<strong>{escape(config.name)}</strong>: state (solid), its float64-rounded baseline (dashed), output (dotted)."
        gain = rounding_gain(config)
        if gain:
            step, rn, sr = gain
            verdict = f"{rn / sr:.3g}× less" if rn >= sr else f"{sr / rn:.3g}× more"
            caption += (f" At step {step}: round to nearest {rn:.2e}, stochastic rounding {sr:.2e} "
                        f"({verdict} drift with stochastic rounding).")
        attrs = {"class": "rounding-pair", "id": f"drift-{config.name}", "data-configuration": config.name,
                 "data-roundings": ",".join(c["params"]["rounding"] for c in config.cases)}
        parts.append(figure(figures.rounding_pair(config), f"error against step for {config.name}", caption, attrs))
    return ('<section id="rounding-pairs"><h2>Error against decode step</h2>'
            '<p class="muted">Each configuration\'s rounding modes side by side, on one scale.</p>'
            f'<div class="figures">{"".join(parts)}</div></section>')
