"""Time whole `ssmcheck` sweeps as a user runs them, on caches as a fresh machine has them.

Each run is a new process with its own empty `TRITON_CACHE_DIR` and `TORCHINDUCTOR_CACHE_DIR` (Triton's variants and
torch.compile's graphs: what a fresh machine compiles), of the command given after `--`, from a source tree (this
checkout, or another commit's `git archive`), through the `ssmcheck` console entry, which starts the compiling
helpers before it imports torch (core.prestart), or through the CLI alone (`cli`: the helpers start once the sweep
is planned). A run named `NAME+warm` runs again on NAME's caches. Runs go in the order given: time two trees in
both orders, since a machine's first run is slower. E.g., on the GPU machine:

    git archive 54a685b | (mkdir -p /tmp/old && tar -x -C /tmp/old)
    python benchmarks/fresh_sweep.py --run new=. --run old=/tmp/old --run new-cli=.:cli --run new-cli+warm \\
        -- drift --preset default -q

`--helpers HxK` sets core.prestart's COMPILE_HELPERS and CORES_PER_COMPILER (H helpers of K cores each) in
every run. Prints one line per run (summary line, wall, `compiled_ahead`, every case's seconds) and appends a table
to benchmarks/RESULTS.md (or --results PATH).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from record import append_section, commit, markdown_table

# The process a run starts: sys.argv is the command's; prestart's constants set first where asked.
ENTRY = """
import sys
from ssmcheck.core import prestart
if {helpers!r}:
    prestart.COMPILE_HELPERS, prestart.CORES_PER_COMPILER = {helpers!r}
sys.argv = ["ssmcheck", *{argv!r}]
from ssmcheck.{module} import main
main()
"""
# Cases whose seconds are summed apart: the sweep's front, which waits for the helpers on a fresh machine.
FRONT = 11


def parse_run(text: str) -> dict:
    """`NAME=TREE[:cli]`, or `NAME+warm` (again on NAME's caches, from the same tree and entry)."""
    if text.endswith("+warm") and "=" not in text:
        return {"name": text, "warm_of": text[: -len("+warm")]}
    name, _, where = text.partition("=")
    tree, _, entry = where.partition(":")
    if not name or not tree or entry not in ("", "cli"):
        raise SystemExit(f"--run: invalid value {text!r} (expected NAME=TREE[:cli] or NAME+warm)")
    return {"name": name, "tree": tree, "module": "cli" if entry else "console"}


def run_one(run: dict, argv: list[str], helpers: tuple | None, caches: Path, timeout: float) -> dict:
    """Run the command once; its figures (from its JSON report) with the wall clock."""
    cache = caches / (run.get("warm_of") or run["name"])
    if "warm_of" not in run:
        shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    report = caches / f"{run['name']}.json"
    report.unlink(missing_ok=True)
    tree = Path(run["tree"]).resolve()
    env = {**os.environ, "PYTHONPATH": str(tree), "TRITON_CACHE_DIR": str(cache / "triton"),
           "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor")}
    code = ENTRY.format(helpers=helpers, argv=[*argv, "--json", str(report)], module=run["module"])
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True,
                              timeout=timeout)
        last = (done.stdout.strip().splitlines() or [""])[-1]
        rc = done.returncode
    except subprocess.TimeoutExpired:
        last, rc = f"stopped after {timeout:.0f} s", None
    wall = time.perf_counter() - start
    figures = {"name": run["name"], "rc": rc, "last_line": last, "wall": round(wall, 1)}
    if report.exists():
        data = json.loads(report.read_text())
        seconds = [case["seconds"] for case in data["cases"]]
        figures.update(sweep=round(data["seconds"], 1), summary=data["summary"], env=data.get("environment"),
                       compiled_ahead=data.get("compiled_ahead"), front=round(sum(seconds[:FRONT]), 1),
                       rest=round(sum(seconds[FRONT:]), 1), cases=seconds)
    return figures


def row(f: dict) -> list[str]:
    ahead = f.get("compiled_ahead") or {}
    helpers = (f"{ahead['processes']} helpers, {ahead['seconds']:.1f} s, {ahead['compiled']} compiled" if ahead
               else "none")
    return [f["name"], f.get("last_line", ""), f"{f['wall']:.1f} s", helpers,
            f"{f['front']:.1f} s" if "front" in f else "", f"{f['rest']:.1f} s" if "rest" in f else ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", required=True, help="NAME=TREE[:cli] or NAME+warm; in order")
    parser.add_argument("--helpers", help="HxK: H compiling helpers of K cores each (core.prestart)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a run may take")
    parser.add_argument("--caches", help="where the runs' caches go (default: a new temporary folder)")
    parser.add_argument("--results", default=str(Path(__file__).with_name("RESULTS.md")))
    parser.add_argument("--commit", help="the commit measured (where the machine has no .git)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the ssmcheck command line")
    opts = parser.parse_args()
    argv = opts.command[1:] if opts.command[:1] == ["--"] else opts.command
    if not argv:
        raise SystemExit("give the ssmcheck command after --, e.g. -- drift --preset default -q")
    helpers = None
    if opts.helpers:
        count, _, cores = opts.helpers.partition("x")
        if not (count.isdigit() and cores.isdigit()):
            raise SystemExit(f"--helpers: invalid value {opts.helpers!r} (expected HxK, e.g. 3x4)")
        helpers = (int(count), int(cores))
    runs = [parse_run(text) for text in opts.run]
    named = {r["name"]: r for r in runs if "warm_of" not in r}
    for r in runs:
        if "warm_of" in r:
            if r["warm_of"] not in named:
                raise SystemExit(f"--run: {r['name']!r} follows no run named {r['warm_of']!r}")
            r.update(tree=named[r["warm_of"]]["tree"], module=named[r["warm_of"]]["module"])
    caches = Path(opts.caches or tempfile.mkdtemp(prefix="ssmcheck-fresh-"))
    results = []
    for r in runs:
        figures = run_one(r, argv, helpers, caches, opts.timeout)
        print(json.dumps({k: v for k, v in figures.items() if k != "env"}), flush=True)
        results.append(figures)
    env = next((f["env"] for f in results if f.get("env")), None) or {}
    text = markdown_table(["run", "summary line", "wall", "compiled_ahead", f"first {FRONT} cases", "the rest"],
                          [row(f) for f in results])
    details = [f"runs: {', '.join(opts.run)}", f"helpers: {opts.helpers or 'the defaults'}"]
    append_section(opts.results, f"`ssmcheck {' '.join(argv)}` on fresh caches", SimpleNamespace(
        gpu=env.get("gpu"), device=env.get("device"), torch=env.get("torch"), triton=env.get("triton")),
        commit(opts.commit), details, text)
    print(text)


if __name__ == "__main__":
    main()
