"""One run of a command, from its cases to its exit code, losing nothing on the way.

- Every report path is checked before the first case runs.
- Cases run through the Python API (api.run): in this process or, with --isolate, in a worker.
- Each finished case goes at once to --jsonl and, when stdout is a log rather than a
  terminal, to one printed line.
- SIGINT, SIGTERM and a closed stdout stop the sweep (core.execution); the cases that
  finished are still rendered and written, marked as interrupted, and the exit code is the
  interruption's (130, 143, 141).
- The reports are written before the summary line is printed, so the line never promises
  an exit code the run did not end with.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ssmcheck import api
from ssmcheck.cli.common import follower_rank, usage_error
from ssmcheck.core.execution import stdout_closed, stopped_sweeps_ignore_signals
from ssmcheck.core.jsonl import JsonLines
from ssmcheck.core.report import summary_line, write_json
from ssmcheck.core.status import LISTED, ExitCode


@dataclass(frozen=True)
class Outputs:
    json: Path | None = None
    jsonl: Path | None = None
    junit: Path | None = None
    summary: Path | None = None  # --summary, else $GITHUB_STEP_SUMMARY (appended to, as GitHub expects)
    summary_appends: bool = False


def outputs(json: Path | None, jsonl: Path | None, junit: Path | None, summary: Path | None) -> Outputs:
    """The report files of this run, each checked writable now (a usage error names the bad one)."""
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    chosen = Outputs(json, jsonl, junit, summary or (Path(step_summary) if step_summary else None),
                     summary_appends=summary is None and bool(step_summary))
    for option, path in (("--json", json), ("--jsonl", jsonl), ("--junit", junit), ("--summary", summary)):
        check_writable(option, path)
    return chosen


def check_writable(option: str, path: Path | None) -> None:
    """Usage error unless `path` can be written (the file is created and removed again if it was new)."""
    if path is None:
        return
    if path.is_dir():
        usage_error(f"{option}: {str(path)!r} is a directory")
    if not path.parent.is_dir():
        usage_error(f"{option}: no such directory {str(path.parent)!r}")
    existed = path.exists()
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        usage_error(f"{option}: cannot write {str(path)!r}: {exc.strerror or exc}")
    if not existed:
        path.unlink(missing_ok=True)


class _Batched:
    """A progress unit a call (a decode step of drift), passed on to the bar at most every INTERVAL seconds: rich's
    advance took 3.2 s of the default GPU drift's 712k decode steps under cProfile (fiftieth session), where the
    steps' CUDA graph replays take 10-20 us each. A case's end sets the bar's count itself, dropping what is
    pending."""

    INTERVAL = 0.1  # rich redraws ten times a second

    def __init__(self, advance: Callable[[int], None], clock: Callable[[], float] = time.monotonic):
        self.advance, self.clock = advance, clock
        self.pending = 0
        self.told = clock()

    def __call__(self) -> None:
        self.pending += 1
        now = self.clock()
        if now - self.told >= self.INTERVAL:
            self.advance(self.pending)
            self.pending, self.told = 0, now


def run_sweep(plan, out: Console, files: Outputs, *, render: Callable, case_line: Callable, quiet: bool,
              isolate: bool, case_timeout: float | None, workers: str | None = None, unit: str | None = None,
              prefix: str = "", compile_ahead: bool = True) -> tuple:
    """Run the plan (api.run), streaming each result to --jsonl and the log; then render the table, write
    the report files and print the summary line. Returns (the Report, the exit code). A signal that stops the
    sweep leaves further ones ignored until the reports are written (core.execution)."""
    with stopped_sweeps_ignore_signals():
        if follower_rank():  # rank 0 reports; a nonzero exit here would have torchrun stop the other ranks
            return api.run(plan, isolate=isolate, case_timeout=case_timeout, workers=workers,
                           compile_ahead=compile_ahead), 0
        cases, size = plan.cases, plan.progress_units
        jsonl = None
        if files.jsonl is not None:
            jsonl = JsonLines(files.jsonl, {"tool": "ssmcheck", "command": plan.command,
                                            "environment": plan.env.as_dict(), "settings": plan.report_settings,
                                            "cases": len(cases)})
        log_lines = not quiet and not out.is_terminal
        with Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), *([TextColumn(unit)] if unit else []),
            TimeElapsedColumn(), console=Console(stderr=True), disable=quiet, transient=True,
        ) as progress:
            task = progress.add_task(cases[0].id if cases else plan.command, total=sum(map(size, cases)))
            finished = [0, 0]  # cases, progress units
            advance = _Batched(lambda units: progress.advance(task, units))

            def on_result(result) -> None:
                advance.pending = 0  # (counted in the update below)
                finished[0] += 1
                finished[1] += size(result.case)
                progress.update(task, completed=finished[1])  # a case stopped early (non-finite, error) skips ahead
                if finished[0] < len(cases):
                    progress.update(task, description=cases[finished[0]].id)
                if jsonl is not None:
                    jsonl.case(plan.case_json(result))
                if log_lines:
                    out.print(case_line(result), markup=False, highlight=False, soft_wrap=True)

            report = api.run(plan, isolate=isolate, case_timeout=case_timeout, workers=workers, on_result=on_result,
                             advance=advance, compile_ahead=compile_ahead)

        if not quiet:
            _to_stdout(lambda: render(out, report.results))
        else:  # as pytest's -q: what failed still shows, a line each
            def listed() -> None:
                for result in report.results:
                    if result.status in LISTED:
                        out.print(case_line(result), markup=False, highlight=False, soft_wrap=True)

            _to_stdout(listed)
        code = _write_reports(report.data, files, jsonl)
        line = summary_line(report.summary, report.data["seconds"], code, prefix)
        if report.interrupted:
            line += f" (interrupted by {report.interrupted} after {len(report.cases)} of {len(cases)} cases)"
        _to_stdout(lambda: out.print(line, markup=False, highlight=False, soft_wrap=True))
        return report, code


def _to_stdout(write: Callable[[], None]) -> None:
    """Print, unless the reader of stdout has gone: then print nothing more (the reports still get written)."""
    try:
        write()
    except BrokenPipeError:
        stdout_closed()


def _write_reports(report: dict, files: Outputs, jsonl: JsonLines | None) -> int:
    """Write every report file; a file that cannot be written after all is one line on stderr and exit 2."""
    from ssmcheck.core.junit import junit_xml  # noqa: PLC0415
    from ssmcheck.core.markdown import markdown_summary  # noqa: PLC0415

    code = report["exit_code"]
    writers = [
        ("--json", files.json, lambda p: write_json(p, report)),
        ("--junit", files.junit, lambda p: p.write_text(junit_xml(report), encoding="utf-8")),
        ("--summary", files.summary, lambda p: _write_summary(p, markdown_summary(report), files.summary_appends)),
    ]
    if jsonl is not None:
        jsonl.close({"summary": report["summary"], "exit_code": code, "interrupted": report["interrupted"],
                     "interrupted_by": report["interrupted_by"]})
    for option, path, write in writers:
        if path is None:
            continue
        try:
            write(path)
        except OSError as exc:
            typer.echo(f"Error: {option}: could not write {str(path)!r}: {exc.strerror or exc}", err=True)
            code = int(ExitCode.USAGE)
    return code


def _write_summary(path: Path, text: str, append: bool) -> None:
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        f.write(text)
