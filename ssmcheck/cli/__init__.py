"""The `ssmcheck` command line: parses options, hands plain data to the runners, renders reports.

The CLI knows no numerics. Each command lives in its own module (`scan`, `drift`,
`regimes`, sharing `common`); this one assembles the app.
"""

from __future__ import annotations

import typer

from ssmcheck import __version__
from ssmcheck.cli import compare, drift, merge, regimes, report, scan
from ssmcheck.cli.common import EXIT_CODES

app = typer.Typer(
    name="ssmcheck",
    help=(
        "Diagnose the numerical stability of Mamba2 SSM kernels (chunk scan and state update) "
        "against a float64 ground truth.\n\n"
        "Exit codes: " + EXIT_CODES
    ),
    no_args_is_help=False,
    invoke_without_command=True,
    add_completion=False,
    # Help texts are plain: '[tool.ssmcheck.scan]' and '[z | x | B | C | dt]' are not Rich markup.
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ssmcheck {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", metavar="", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Diagnose the numerical stability of Mamba2 SSM kernels."""
    if ctx.invoked_subcommand is None:  # bare `ssmcheck`: say what it can do
        typer.echo(ctx.get_help())
        raise typer.Exit(0)


# Registered at import so that tests drive the very app users run. Neither module imports
# triton: the commands configure the device first, then import the kernels.
scan.register(app)
drift.register(app)
regimes.register(app)
compare.register(app)
report.register(app)
merge.register(app)


def main() -> None:
    app()
