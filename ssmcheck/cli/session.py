"""One run of a command, from its cases to its exit code, losing nothing on the way.

- Every report path is checked before the first case runs.
- Cases run in this process or, with --isolate, in a worker process (core.isolation).
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ssmcheck.cli.common import usage_error
from ssmcheck.core import runtime
from ssmcheck.core.execution import Interrupted, execute, stdout_closed
from ssmcheck.core.jsonl import JsonLines
from ssmcheck.core.report import build_report, summary_line, write_json
from ssmcheck.core.status import ExitCode, exit_code, summarize

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


@dataclass(frozen=True)
class CommandView:
    """What the session needs of a command to stream, render and report its results."""

    name: str  # "scan" or "drift"
    env: runtime.Environment
    settings: dict  # recorded in the JSON report
    fail_on: tuple[str, ...]
    case_json: Callable  # result -> the case's JSON dict
    case_line: Callable  # result -> one line for a log
    render: Callable  # (console, results) -> None: the table and its notes
    prefix: str = ""  # of the summary line


def run_sweep(view: CommandView, cases: list, runner: Callable, out: Console, files: Outputs, *, quiet: bool,
              isolate: bool, case_timeout: float | None, unit: str | None = None,
              size: Callable = lambda case: 1) -> tuple[list, int, Interrupted | None]:
    """Run the cases, streaming each result; return (results, exit code, interruption or None).

    A case counts `size(case)` units of the progress bar (`unit` names them; default one a case).
    """
    jsonl = None
    if files.jsonl is not None:
        env = view.env.as_dict()
        jsonl = JsonLines(files.jsonl, {"tool": "ssmcheck", "command": view.name, "environment": env,
                                        "settings": view.settings, "cases": len(cases)})
    log_lines = not quiet and not out.is_terminal
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), *([TextColumn(unit)] if unit else []),
        TimeElapsedColumn(), console=Console(stderr=True), disable=quiet, transient=True,
    ) as progress:
        task = progress.add_task(cases[0].id if cases else view.name, total=sum(map(size, cases)))
        finished: list = []
        completed = [0]

        def advance() -> None:
            progress.advance(task)

        def on_result(result) -> None:
            finished.append(result)
            completed[0] += size(result.case)
            progress.update(task, completed=completed[0])  # a case stopped early (non-finite, error) skips ahead
            if len(finished) < len(cases):
                progress.update(task, description=cases[len(finished)].id)
            if jsonl is not None:
                jsonl.case(view.case_json(result))
            if log_lines:
                out.print(view.case_line(result), markup=False, highlight=False, soft_wrap=True)

        outcome = execute(_results(cases, runner, isolate, case_timeout, advance), on_result)

    statuses = [r.status for r in outcome.results]
    code = outcome.interrupted.exit_code if outcome.interrupted else int(exit_code(statuses, view.fail_on))
    counts = summarize(statuses)
    interrupted = outcome.interrupted.reason if outcome.interrupted else None
    if not quiet:
        _to_stdout(lambda: view.render(out, outcome.results))
    report = build_report(view.name, view.env, [view.case_json(r) for r in outcome.results], counts, code,
                          interrupted)
    report["settings"] = view.settings
    code = _write_reports(report, files, jsonl)
    line = summary_line(counts, outcome.seconds, code, view.prefix)
    if interrupted:
        line += f" (interrupted by {interrupted} after {len(outcome.results)} of {len(cases)} cases)"
    _to_stdout(lambda: out.print(line, markup=False, highlight=False, soft_wrap=True))
    return outcome.results, code, outcome.interrupted


def _results(cases: list, runner: Callable, isolate: bool, case_timeout: float | None,
             advance: Callable[[], None]) -> Iterator:
    if isolate:
        from ssmcheck.core.isolation import run_isolated  # noqa: PLC0415 (multiprocessing only when asked)

        yield from run_isolated(runner, cases, case_timeout, advance)
    else:
        for case in cases:
            yield runner(case, advance)


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
