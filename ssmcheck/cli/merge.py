"""`ssmcheck merge A.json B.json ... -o ALL.json`: shard reports (`--shard K/N`) back into one sweep's report."""

from __future__ import annotations

from pathlib import Path

import typer

from ssmcheck.cli import common as cli_common
from ssmcheck.cli import session
from ssmcheck.cli.common import EXIT_CODES, usage_error
from ssmcheck.core import merge as merging
from ssmcheck.core.report import summary_line, write_json

MERGE_HELP = "\n\n".join([
    "Merge the JSON reports of the shards of one sweep (scan or drift run with --shard K/N, one report per "
    "K) into the report the unsharded run writes: its cases in the sweep's order, its summary and exit code; "
    "only the timings differ (seconds is the sum of the shards'). An interrupted shard's finished cases are "
    "merged, and the merged report is interrupted too.",
    "Refused (usage error): a report that is no shard's, two reports of one shard, a missing shard, or shards "
    "that differ in command, ssmcheck version, environment, settings or sweep.",
    "Exit codes: the unsharded run's: " + EXIT_CODES,
])


def merge(
    reports: list[Path] = typer.Argument(..., metavar="SHARD.json...", help="The shards' JSON reports, in any order."),
    output: Path = typer.Option(..., "--output", "-o", metavar="FILE", help="Write the merged JSON report here."),
) -> None:
    session.check_writable("--output", output)
    shards = [(str(path), cli_common.read_json(str(path), path)) for path in reports]
    try:
        merged = merging.merge_reports(shards)
    except merging.MergeError as exc:
        usage_error(str(exc))
    write_json(output, merged)
    typer.echo(summary_line(merged["summary"], merged.get("seconds", 0.0), merged["exit_code"],
                            f"{merged['command']} ({len(shards)} shards): "))
    raise typer.Exit(merged["exit_code"])


def register(app: typer.Typer) -> None:
    app.command("merge", cls=cli_common.OneLineUsageErrors, help=MERGE_HELP)(merge)
