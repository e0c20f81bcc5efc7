"""What the commands (`scan`, `drift`) share: common options, usage errors, the device, the run, the report.

Usage errors are one line on stderr and exit 2. Nothing here imports triton:
`configure_device` decides how it will be imported.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from typer.core import TyperCommand

from ssmcheck.core import runtime
from ssmcheck.core.report import build_report, summary_line, write_json
from ssmcheck.core.status import ExitCode, exit_code, summarize

EXIT_CODES = (
    "0 every case that ran passed; 1 a case failed tolerance; 2 usage error; 3 a case was non-finite; "
    "4 a case raised; 5 nothing ran. The most severe applicable code wins: 3, then 4, then 1."
)

# Options every command takes (the default stays in each command's signature).
FailOn = Annotated[str, typer.Option(
    "--fail-on", metavar="LIST",
    help="Which of nonfinite,tolerance,error may make the exit code nonzero (default: all).",
)]
JsonPath = Annotated[Path, typer.Option("--json", metavar="FILE", help="Write the JSON report here.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", metavar="", help="Print only the summary line.")]
Device = Annotated[str, typer.Option(
    metavar="cpu|cuda", help="cpu (Triton interpreter) or cuda (compiled). Default: cuda when available.",
)]


# The click that typer runs on: recent typer versions vendor their own copy.
_UsageError = inspect.getmodule(TyperCommand.__mro__[1]).UsageError


class OneLineUsageErrors(TyperCommand):
    """Report a bad option or value as one line on stderr, exit 2 (no usage block, no traceback)."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except _UsageError as exc:
            usage_error(exc.format_message())


def regime_lines(regimes: dict[str, str]) -> list[str]:
    """Regime names and explanations in two aligned columns, for help texts and `ssmcheck regimes`."""
    width = max(map(len, regimes))
    return [f"{name:<{width}}  {text}" for name, text in regimes.items()]


def usage_error(message: str) -> NoReturn:
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(int(ExitCode.USAGE))


def check_output_path(option: str, path: Path | None) -> None:
    if path is not None and not path.parent.is_dir():
        usage_error(f"{option}: no such directory {str(path.parent)!r}")


def configure_device(device: str | None) -> runtime.Environment:
    """runtime.configure (before anything imports triton), a bad --device being a usage error."""
    try:
        return runtime.configure(device)
    except runtime.DeviceError as exc:
        usage_error(f"--device: {exc}")


def open_report(width: int, header: str, quiet: bool) -> Console:
    """The console the report is printed on, with the header printed first (not with --quiet)."""
    out = Console(highlight=False)
    if not out.is_terminal:  # logs and pipes: wide enough for the table, never truncated
        out = Console(highlight=False, width=width)
    if not quiet:
        out.print(header, markup=False)
    return out


def run_cases(name: str, cases: list, run: Callable, quiet: bool, unit: str | None = None,
              size: Callable = lambda case: 1) -> tuple[list, float]:
    """`run(case, advance)` for every case under a progress bar: (the results, the seconds taken).

    A case counts `size(case)` units of the bar (`unit` names them; default one a case).
    `advance()` moves the bar one unit while the case runs; when it ends, the bar stands
    at the case's end, however far it advanced.
    """
    start = time.perf_counter()
    results = []
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), *([TextColumn(unit)] if unit else []),
        TimeElapsedColumn(), console=Console(stderr=True), disable=quiet, transient=True,
    ) as progress:
        task = progress.add_task(name, total=sum(map(size, cases)))
        done = 0
        for case in cases:
            progress.update(task, description=case.id)
            results.append(run(case, lambda: progress.advance(task)))
            done += size(case)
            progress.update(task, completed=done)  # a case stopped early (non-finite, error) skips ahead
    return results, time.perf_counter() - start


def finish(out: Console, command: str, env: runtime.Environment, results: list, case_json: Callable,
           fail_on: tuple[str, ...], seconds: float, json_path: Path | None, settings: dict,
           prefix: str = "") -> NoReturn:
    """Print the summary line, write the JSON report (with --json) and exit with the verdicts' code."""
    statuses = [r.status for r in results]
    counts = summarize(statuses)
    code = int(exit_code(statuses, fail_on))
    out.print(summary_line(counts, seconds, code, prefix), markup=False)
    if json_path is not None:
        report = build_report(command, env, [case_json(r) for r in results], counts, code)
        report["settings"] = settings
        write_json(json_path, report)
    raise typer.Exit(code)
