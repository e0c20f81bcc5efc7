"""`--jsonl FILE`: the report as JSON lines, written while the sweep runs.

A header line, one line per case the moment it finishes, and a summary line at
the end: each line flushed to the OS as it is written, so a sweep that is
killed outright (SIGKILL, a lost machine) still leaves every finished case
behind. Lines are objects with a "type" of "header", "case" or "summary"; a
file without its summary line is a sweep that never finished.
"""

from __future__ import annotations

import json
from pathlib import Path

from ssmcheck.core.report import json_safe


class JsonLines:
    def __init__(self, path: Path, header: dict):
        self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 (open for the whole sweep)
        self._write({"type": "header", **header})

    def case(self, case: dict) -> None:
        self._write({"type": "case", **case})

    def close(self, summary: dict) -> None:
        self._write({"type": "summary", **summary})
        self._file.close()

    def _write(self, record: dict) -> None:
        self._file.write(json.dumps(json_safe(record)) + "\n")
        self._file.flush()
