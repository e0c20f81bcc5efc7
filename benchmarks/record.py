"""Recording benchmark results: the commit, a markdown table, a dated section of RESULTS.md."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path


def commit(given: str | None = None) -> str:
    """The commit measured: `given` (the device machine has no .git), else git's HEAD."""
    if given:
        return given
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        # Untracked files (a copied checkout's ignored build folders) change nothing measured.
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git here; pass --commit)"
    return f"{head} + uncommitted changes" if dirty else head


def markdown_table(head: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])


def append_section(path: str | Path, title: str, env, commit_id: str, details: list[str], text: str) -> None:
    """Append `## title — date` with the device, versions, commit, command and `details` bullets."""
    bullets = [
        f"device: {env.gpu or env.device}; torch {env.torch}; triton {env.triton}",
        f"commit: {commit_id}",
        f"command: `PYTHONPATH={os.environ.get('PYTHONPATH', '')} python {' '.join(sys.argv)}`",
        *details,
    ]
    block = f"\n## {title} — {datetime.date.today().isoformat()}\n\n" + "".join(f"- {b}\n" for b in bullets) + f"\n{text}\n"
    path = Path(path)
    if not path.exists():
        path.write_text("# Benchmark results\n")
    with path.open("a") as f:
        f.write(block)
