"""The `ssmcheck` command line: parses options, hands plain data to the runners, renders reports.

The CLI knows no numerics. Each command lives in its own module (`scan`, `drift`,
`regimes`, sharing `common`); this one assembles the app.
"""

from __future__ import annotations

import typer

from ssmcheck import __version__
from ssmcheck.cli import drift, regimes, scan

app = typer.Typer(
    name="ssmcheck",
    help=(
        "Diagnose the numerical stability of Mamba2 SSM kernels (chunk scan and state update) "
        "against a float64 ground truth.\n\n"
        "Exit codes: 0 every case that ran passed; 1 a case failed tolerance; 2 usage error; "
        "3 a case was non-finite; 4 a case raised; 5 nothing ran."
    ),
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ssmcheck {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", metavar="", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Diagnose the numerical stability of Mamba2 SSM kernels."""


# Registered at import so that tests drive the very app users run. Neither module imports
# triton: the commands configure the device first, then import the kernels.
scan.register(app)
drift.register(app)
regimes.register(app)


def main() -> None:
    app()
