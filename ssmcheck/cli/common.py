"""What the commands (`scan`, `drift`) share: common options, usage errors, the device, the run, the report.

Usage errors are one line on stderr and exit 2. Nothing here imports triton:
`configure_device` decides how it will be imported.
"""

from __future__ import annotations

import difflib
import inspect
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from typer.core import TyperCommand

from ssmcheck.core import config, runtime
from ssmcheck.core.execution import INTERRUPT_EXIT_CODES, stdout_closed
from ssmcheck.core.status import ExitCode
from ssmcheck.core.sweep import SweepError, parse_number

# The default --case-timeout with --isolate: long enough for the slowest preset case on a CPU.
DEFAULT_CASE_TIMEOUT = 1800.0

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
CaseId = Annotated[str, typer.Option("--case", metavar="ID", help="Run only the case with this id.")]
FromReport = Annotated[Path, typer.Option(
    "--from", metavar="REPORT.json", help="With --case: take the case and the settings from this JSON report.",
)]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", metavar="", help="Print only the summary line.")]
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


def configure_device(device: str | None) -> runtime.Environment:
    """runtime.configure (before anything imports triton), a bad --device being a usage error."""
    try:
        return runtime.configure(device)
    except runtime.DeviceError as exc:
        usage_error(f"--device: {exc}")


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
    if not quiet:
        try:
            out.print(header, markup=False, soft_wrap=True)
        except BrokenPipeError:  # nobody reads the report: run the sweep all the same, for the files
            stdout_closed()
    return out


@dataclass
class Sweep:
    """What a command runs: its resolved settings and how to list its cases."""

    settings: object  # the command's Settings
    cases: Callable[[str], list]  # kernel name -> the cases to run
    preset: str  # the preset named (or "default"), or the report re-run with --from
    files: list[str]  # the configuration files read, in the order applied
    kernel: str | None = None  # the kernel of the report re-run with --from

    @property
    def header_note(self) -> str:
        return f"\nconfiguration: {', '.join(self.files)}" if self.files else ""


def resolve_sweep(command: str, spec, cli: dict, preset: str | None, device: str, case_id: str | None,
                  from_report: Path | None) -> Sweep:
    """Settings and cases from the command line over the preset (or over the report of --from)."""
    if from_report is not None and case_id is None:
        usage_error("--from: needs --case ID (the case to run again)")
    try:
        if from_report is not None:
            params, recorded = _load_case(from_report, command, case_id)
            table = {k: v for k, v in recorded.items() if k in spec.TABLE.settings and v is not None}
            settings = spec.resolve(cli, table, str(from_report))
            return Sweep(settings, lambda kernel: [spec.case_from_params(params, kernel)], str(from_report),
                         [str(from_report)], kernel=params.get("kernel"))
        conf = config.load_settings(preset, command, device)
        settings = spec.resolve(cli, conf.table, conf.label)
    except SweepError as exc:
        usage_error(str(exc))

    def cases(kernel: str) -> list:
        built = spec.build_cases(settings, kernel)
        return built if case_id is None else _pick_case(built, case_id)

    return Sweep(settings, cases, conf.preset, conf.files)


def case_timeout(isolate: bool, seconds: float | None) -> float | None:
    """--case-timeout: only with --isolate, where it defaults to DEFAULT_CASE_TIMEOUT."""
    if seconds is None:
        return DEFAULT_CASE_TIMEOUT if isolate else None
    if not isolate:
        usage_error("--case-timeout: needs --isolate (a case can only be stopped in a worker process)")
    try:
        return parse_number("--case-timeout", seconds)
    except SweepError as exc:
        usage_error(str(exc))


def _load_case(report_path: Path, command: str, case_id: str) -> tuple[dict, dict]:
    """(the case's params, the run's settings) of case `case_id` in an earlier JSON report (--from)."""
    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError) as exc:
        usage_error(f"--from: cannot read {str(report_path)!r}: {exc}")
    if not isinstance(report, dict) or report.get("tool") != "ssmcheck" or report.get("command") != command:
        usage_error(f"--from: {str(report_path)!r} is not an ssmcheck {command} report")
    for case in report.get("cases", []):
        if case.get("id") == case_id:
            return case["params"], report.get("settings", {})
    usage_error(f"--case: no case {case_id!r} in {str(report_path)!r}")


def _pick_case(cases: list, case_id: str) -> list:
    """The one case of the sweep with this id (--case without --from)."""
    chosen = [c for c in cases if c.id == case_id]
    if not chosen:
        close = difflib.get_close_matches(case_id, [c.id for c in cases], n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else f" ({len(cases)} cases in this sweep)"
        usage_error(f"--case: no case {case_id!r} in this sweep{hint}")
    return chosen
