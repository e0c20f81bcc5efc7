"""`ssmcheck report REPORT.json --html OUT.html`: a JSON report as one self-contained HTML page."""

from __future__ import annotations

from pathlib import Path

import typer

from ssmcheck import html as html_report
from ssmcheck.cli import common as cli_common
from ssmcheck.cli.common import usage_error
from ssmcheck.cli.session import check_writable
from ssmcheck.html.data import mapped_cases

REPORT_HELP = "\n\n".join([
    "Render a JSON report of scan or drift (--json) as one self-contained HTML file: the summary, the sortable "
    "case table, an error map (token x head) of each failing or non-finite scan case with its first non-finite "
    "element marked, per-chunk drift curves, and for drift, error against step with the rounding modes side by "
    "side. Images are inlined: the file needs no server and no network, so it works as a CI artifact.",
    # "\\[" keeps Rich from reading "[plot]" as markup
    'Needs matplotlib, an optional extra: pip install "ssmcheck\\[plot]".',
    "Exit codes: 0 written; 2 usage error (a report that cannot be read or is no ssmcheck report, an output path "
    "that cannot be written, matplotlib missing).",
])


def report(
    source: Path = typer.Argument(..., metavar="REPORT.json", help="A JSON report written by scan or drift --json."),
    html: Path = typer.Option(..., "--html", metavar="FILE", help="Write the HTML page here."),
) -> None:
    try:
        html_report.require_matplotlib()
    except html_report.PlotUnavailable as exc:
        usage_error(str(exc))
    data = cli_common.read_json("REPORT", source)
    try:
        html_report.check_report(data)
    except html_report.NotAReport as exc:
        usage_error(f"{str(source)!r}: {exc}")
    check_writable("--html", html)
    try:
        html_report.write_html(data, html)
    except KeyError as exc:  # a report edited by hand, or cut short
        usage_error(f"{str(source)!r}: not a complete ssmcheck {data['command']} report (no key {exc})")
    except OSError as exc:
        usage_error(f"--html: cannot write {str(html)!r}: {exc.strerror or exc}")
    maps = len(mapped_cases(data))
    typer.echo(f"wrote {html} ({len(data['cases'])} cases" + (f", {maps} error map{'s' * (maps != 1)})" if maps else ")"))


def register(app: typer.Typer) -> None:
    app.command("report", cls=cli_common.OneLineUsageErrors, help=REPORT_HELP)(report)
