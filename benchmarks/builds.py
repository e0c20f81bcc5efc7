"""Builds of the state update's kernel module for side-by-side benchmarks: load one, or write them from git.

A build is a copy of ssmcheck/ops/state_update/fused_recurrent.py that may import its own copies of other
modules from its directory, which `load_build` puts on sys.path. From the checkout,

    python benchmarks/builds.py main my-branch --out .device/builds

writes .device/builds/fr_<ref>.py and sr_<ref>.py for each git ref (the state update and its rounding module
as committed there, the one importing the other) and prints the build paths, ready for
benchmarks/state_update_variants.py or benchmarks/state_update_sass.py --build on a machine without git.
The ref `WORKTREE` takes the files as they are in the working tree (an uncommitted variant).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

KERNEL = "ssmcheck/ops/state_update/fused_recurrent.py"
ROUNDING = "ssmcheck/ops/rounding/stochastic.py"
WORKTREE = "WORKTREE"


def load_build(path: str):
    sys.path.insert(0, str(Path(path).resolve().parent))
    spec = importlib.util.spec_from_file_location("build_" + Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def write_build(ref: str, out: Path) -> Path:
    """fr_<ref>.py and sr_<ref>.py in `out` from git ref `ref`: the path of the former."""
    name = re.sub(r"\W", "_", ref)

    def show(path: str) -> str:
        if ref == WORKTREE:
            return Path(path).read_text()
        return subprocess.run(["git", "show", f"{ref}:{path}"], capture_output=True, text=True, check=True).stdout

    kernel = show(KERNEL)
    rounding_import = "from ssmcheck.ops.rounding.stochastic import"
    if rounding_import not in kernel:
        raise SystemExit(f"{ref}:{KERNEL} does not import {ROUNDING} as expected")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"sr_{name}.py").write_text(show(ROUNDING))
    build = out / f"fr_{name}.py"
    build.write_text(kernel.replace(rounding_import, f"from sr_{name} import"))
    return build


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("refs", nargs="+", help=f"git refs (branches, commits) to write builds of; {WORKTREE}: the "
                                                "working tree")
    parser.add_argument("--out", default=".device/builds", help="folder to write them to")
    opts = parser.parse_args()
    for ref in opts.refs:
        print(write_build(ref, Path(opts.out)))


if __name__ == "__main__":
    main()
