"""`ssmcheck regimes`: what each input regime of `scan` and `drift` feeds the kernel."""

from __future__ import annotations

import typer

from ssmcheck.cli.common import regime_lines
from ssmcheck.drift.regimes import DRIFT_REGIMES  # torch only, no triton
from ssmcheck.scan.regimes import REGIMES


def regimes() -> None:
    """List the input regimes of `scan` and `drift`, with what each one feeds the kernel."""
    typer.echo("scan regimes (ssmcheck scan --regime):")
    for line in regime_lines({n: r.explanation for n, r in REGIMES.items()}):
        typer.echo("  " + line)
    typer.echo("\ndrift regimes (ssmcheck drift --regime):")
    for line in regime_lines(DRIFT_REGIMES):
        typer.echo("  " + line)


def register(app: typer.Typer) -> None:
    app.command("regimes")(regimes)
