"""Load a copy of a kernel module (a build under test) from its path, for side-by-side benchmarks.

A copy may import its own copies of other modules from its directory, which is put on sys.path (e.g.
`from sr_b import (` for sr_b.py beside b.py).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def load_build(path: str):
    sys.path.insert(0, str(Path(path).resolve().parent))
    spec = importlib.util.spec_from_file_location("build_" + Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module
