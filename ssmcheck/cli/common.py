"""What the commands (`scan`, `drift`) share: common options, usage errors, the report's console.

Usage errors are one line on stderr and exit 2. Nothing here imports triton: the Python API's
plan configures the device first.
"""

from __future__ import annotations

import difflib
import inspect
import json
import os
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from typer.core import TyperCommand

from ssmcheck.core import ranks as launch
from ssmcheck.core.execution import INTERRUPT_EXIT_CODES, stdout_closed
from ssmcheck.core.status import ExitCode

EXIT_CODES = (
    "0 every case that ran passed; 1 a case failed tolerance; 2 usage error; 3 a case was non-finite; "
    "4 a case raised; 5 nothing ran. The most severe applicable code wins: 3, then 4, then 1. "
    f"Interrupted (the finished cases are still reported): {INTERRUPT_EXIT_CODES['SIGINT']} SIGINT, "
    f"{INTERRUPT_EXIT_CODES['SIGTERM']} SIGTERM, {INTERRUPT_EXIT_CODES['SIGPIPE']} stdout closed."
)

# Options every command takes (the default stays in each command's signature).
FailOn = Annotated[str, typer.Option(
    "--fail-on", metavar="LIST",
    help="Which of nonfinite,tolerance,error may make the exit code nonzero (default: all).",
)]
JsonPath = Annotated[Path, typer.Option("--json", metavar="FILE", help="Write the JSON report here.")]
JsonlPath = Annotated[Path, typer.Option(
    "--jsonl", metavar="FILE",
    help="Write the report as JSON lines while the sweep runs: a header, one line per finished case, a summary.",
)]
JunitPath = Annotated[Path, typer.Option("--junit", metavar="FILE", help="Write JUnit XML: one testcase per case.")]
SummaryPath = Annotated[Path, typer.Option(
    "--summary", metavar="FILE",
    help="Write a Markdown summary (counts, failing cases, worst ratios); default: append to $GITHUB_STEP_SUMMARY when set.",
)]
Isolate = Annotated[bool, typer.Option(
    "--isolate", metavar="",
    help="Run the cases in a worker process: a crash, exit or hang then costs only its case (status error).",
)]
CaseTimeout = Annotated[float, typer.Option(
    "--case-timeout", metavar="S", help="With --isolate: a case running past S seconds is an error (default 1800).",
)]
Shard = Annotated[str, typer.Option(
    "--shard", metavar="K/N",
    help="Run only the K-th of N slices of the sweep (case i, from 0 in the sweep's order, is in slice i mod N + 1), "
         "for a CI matrix; `ssmcheck merge` joins the slices' --json reports into the whole sweep's. Under torchrun "
         "each rank runs slice RANK+1/WORLD_SIZE by itself.",
)]
Workers = Annotated[str, typer.Option(
    "--workers", metavar="N|auto",
    help="Run the cases in N worker processes at once (implies --isolate; auto: one per CPU core on the CPU, one "
         "per GPU on a GPU host, each worker on its own GPU). Results and their order are a serial run's.",
)]
NoCompileAhead = Annotated[bool, typer.Option(
    "--no-compile-ahead", metavar="",
    help="On a GPU, start no helper processes compiling the kernel's Triton variants ahead while the first cases "
         "run (the default, where 4+ cores are left beside those running the cases: each helper calls the kernel "
         "once per shape of its share of the sweep with every Triton launch compile-only; for drift it rehearses "
         "each case for 2 steps, which also compiles the float64 step); each case then compiles at its first launch.",
)]
CaseId = Annotated[str, typer.Option("--case", metavar="ID", help="Run only the case with this id.")]
FromReport = Annotated[Path, typer.Option(
    "--from", metavar="REPORT.json", help="With --case: take the case and the settings from this JSON report.",
)]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", metavar="",
                                     help="Print only a line per failing, non-finite or erroring case, then the "
                                          "summary line.")]
Device = Annotated[str, typer.Option(
    metavar="cpu|cuda", help="cpu (Triton interpreter) or cuda (compiled). Default: cuda when available.",
)]


# The click that typer runs on: recent typer versions vendor their own copy.
_UsageError = inspect.getmodule(TyperCommand.__mro__[1]).UsageError
_NoSuchOption = sys.modules[_UsageError.__module__].NoSuchOption


class OneLineUsageErrors(TyperCommand):
    """Report a bad option or value as one line on stderr, exit 2 (no usage block, no traceback)."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except _NoSuchOption as exc:
            # Click suggests anything vaguely alike ("--bogus": "--ngroups"); suggest only near misses.
            names = [n for p in self.params for n in getattr(p, "opts", [])]
            close = difflib.get_close_matches(exc.option_name, names, n=1, cutoff=0.75)
            usage_error(f"No such option: {exc.option_name}" + (f" (did you mean {close[0]}?)" if close else ""))
        except _UsageError as exc:
            usage_error(exc.format_message())


def regime_lines(regimes: dict[str, str]) -> list[str]:
    """Regime names and explanations in two aligned columns, for help texts and `ssmcheck regimes`."""
    width = max(map(len, regimes))
    return [f"{name:<{width}}  {text}" for name, text in regimes.items()]


def usage_error(message: str) -> NoReturn:
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(int(ExitCode.USAGE))


class ReportConsole(Console):
    """Rich ends the process with exit code 1 when stdout's reader goes away; let the session decide."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError


def open_report(width: int, header: str, quiet: bool) -> Console:
    """The console the report is printed on, with the header printed first (not with --quiet).

    On a terminal, the terminal's width. In a log or a pipe, COLUMNS when it is set, else `width`:
    wide enough for the whole table, which then never wraps.
    """
    out = ReportConsole(highlight=False)
    if not out.is_terminal:
        columns = os.environ.get("COLUMNS", "")
        out = ReportConsole(highlight=False, width=int(columns) if columns.isdigit() and int(columns) > 0 else width)
    if not quiet and not follower_rank():
        try:
            out.print(header, markup=False, soft_wrap=True)
        except BrokenPipeError:  # nobody reads the report: run the sweep all the same, for the files
            stdout_closed()
    return out


def follower_rank() -> bool:
    """A torchrun rank other than 0 (core.ranks): it runs its slice and sends it to rank 0, which alone
    prints, writes the report files and sets the exit code."""
    ranks = launch.from_environment()
    return ranks is not None and not ranks.leads


def files_note(files: list[str]) -> str:
    """The header's line naming the configuration files read."""
    return f"\nconfiguration: {', '.join(files)}" if files else ""


def read_json(label: str, path: Path) -> dict:
    """A JSON report read from `path`; a usage error naming `label` when it cannot be read."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        usage_error(f"{label}: cannot read {str(path)!r}: {exc}")
