"""`ssmcheck compare OLD.json NEW.json`: the regression gate between two runs of the same command."""

from __future__ import annotations

from pathlib import Path

import typer

from ssmcheck.cli import common as cli_common
from ssmcheck.cli.common import usage_error
from ssmcheck.core import compare as comparison
from ssmcheck.core.sweep import SweepError, parse_number

COMPARE_HELP = "\n\n".join([
    "Compare two JSON reports of the same command (scan or drift), case by case (matched by id): yesterday's "
    "run against today's. Reports new failures (a case that passed, or is new, and now fails, is non-finite or "
    "errors), fixed cases, and cases whose error ratio grew more than --max-growth times.",
    "Exit codes: 0 no regression; 1 a new failure, a ratio growth, or a NEW report that was interrupted "
    "(its missing cases were never judged); 2 usage error (a file that cannot be read or is no ssmcheck report).",
])


def compare(
    old: Path = typer.Argument(..., metavar="OLD.json", help="The reference run's JSON report."),
    new: Path = typer.Argument(..., metavar="NEW.json", help="The run to judge."),
    max_growth: float = typer.Option(1.5, "--max-growth", metavar="X", help="Largest accepted growth of a passing case's error ratio (default 1.5)."),
) -> None:
    try:
        growth = parse_number("--max-growth", max_growth)
    except SweepError as exc:
        usage_error(str(exc))
    if growth < 1:
        usage_error(f"--max-growth: invalid value {max_growth!r} (expected a number >= 1)")
    reports = [cli_common.read_json(label, path) for label, path in (("OLD", old), ("NEW", new))]
    try:
        result = comparison.compare_reports(*reports, max_growth=growth)
    except ValueError as exc:
        usage_error(str(exc))
    for line in comparison.text_lines(result):
        typer.echo(line)
    code = result.exit_code
    if reports[1].get("interrupted"):
        typer.echo(f"the new report was interrupted ({reports[1].get('interrupted_by')}): its missing cases were never judged")
        code = 1
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("compare", cls=cli_common.OneLineUsageErrors, help=COMPARE_HELP)(compare)
