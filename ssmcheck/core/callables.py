"""Resolving a `--kernel` value to a callable.

`builtin` and `torch` are named by each command; anything else is
`MODULE:FUNCTION` or `path/to/file.py:FUNCTION`.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path


class KernelSpecError(ValueError):
    """The --kernel value names nothing callable."""


def load_callable(spec: str) -> Callable:
    """Import `MODULE:FUNCTION` or `path/to/file.py:FUNCTION` and return the function."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise KernelSpecError(f"--kernel {spec!r}: expected MODULE:FUNCTION or path/to/file.py:FUNCTION")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise KernelSpecError(f"--kernel {spec!r}: no such file {target}")
        module_name = f"ssmcheck_user_{path.stem}_{abs(hash(path.resolve()))}"
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module
        try:
            loader_spec.loader.exec_module(module)
        except Exception as exc:
            raise KernelSpecError(f"--kernel {spec!r}: importing {target} raised {type(exc).__name__}: {exc}") from exc
    else:
        try:
            module = importlib.import_module(target)
        except Exception as exc:
            raise KernelSpecError(f"--kernel {spec!r}: cannot import {target}: {type(exc).__name__}: {exc}") from exc
    fn = getattr(module, name, None)
    if fn is None or not callable(fn):
        raise KernelSpecError(f"--kernel {spec!r}: {target} has no callable {name!r}")
    return fn


def keywords(fn: Callable) -> frozenset[str]:
    """The keywords `fn` names in its signature. A `**kwargs` catch-all names none: a wrapper
    that forwards its keywords to a kernel with the plain mamba signature would pass ours on
    to a call that rejects them."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins and some C extensions have no signature
        return frozenset()
    return frozenset(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
