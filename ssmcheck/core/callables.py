"""Resolving a `--kernel` value to a callable.

`builtin` and `torch` are named by each command; anything else is
`MODULE:FUNCTION` or `path/to/file.py:FUNCTION`.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path


class KernelSpecError(ValueError):
    """The --kernel value names nothing callable."""


def _describe(exc: BaseException) -> str:
    """core.guard.describe, imported only when an import failed (it needs torch)."""
    from ssmcheck.core.guard import describe  # noqa: PLC0415

    return describe(exc)


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
            raise KernelSpecError(f"--kernel {spec!r}: importing {target} raised {_describe(exc)}") from exc
    else:
        try:
            with _cwd_on_path():
                module = importlib.import_module(target)
        except Exception as exc:
            raise KernelSpecError(f"--kernel {spec!r}: cannot import {target}: {_describe(exc)}") from exc
    fn = getattr(module, name, None)
    if fn is None or not callable(fn):
        raise KernelSpecError(f"--kernel {spec!r}: {target} has no callable {name!r}")
    return fn


@contextlib.contextmanager
def _cwd_on_path():
    """The current directory first on sys.path while a MODULE spec is imported, as `python -m ssmcheck` has it.

    The installed `ssmcheck` script has its own folder there instead, so `--kernel mykernels:fn`
    would not find ./mykernels.py. The entry is removed afterwards so that nothing imported
    later (the drift plot's matplotlib, say) is shadowed by a file of the user's directory;
    the user's module has imported its own siblings by then.
    """
    entry = os.getcwd()
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        sys.path.remove(entry)


def keywords(fn: Callable) -> frozenset[str]:
    """The keywords `fn` names in its signature. A `**kwargs` catch-all names none: a wrapper
    that forwards its keywords to a kernel with the plain mamba signature would pass ours on
    to a call that rejects them."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins and some C extensions have no signature
        return frozenset()
    return frozenset(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def takes_any_keyword(fn: Callable) -> bool:
    """Whether `fn` may take keywords its signature does not name: a `**kwargs` catch-all, or no signature to read
    (builtins, some C extensions)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind == p.VAR_KEYWORD for p in parameters)


def unset(value) -> bool:
    """Whether an optional argument of a kernel's call carries nothing (None, or a flag off): one the kernel's
    signature does not name is then left out of the call."""
    return value is None or value is False


def keywords_not_taken(kernel: str, missing: list[str], regime: str) -> str:
    """The skip reason of a case whose regime passes keywords (`missing`) the kernel's signature does not name."""
    listed = missing[0] if len(missing) == 1 else f"{', '.join(missing[:-1])} or {missing[-1]}"
    return f"{kernel} takes no {listed} keyword, which {regime} cases pass (its signature names no such parameter)"


def keyword_default(fn: Callable, name: str):
    """The default value of `fn`'s keyword `name` (inspect.Parameter.empty: it has none, or no such keyword)."""
    try:
        parameter = inspect.signature(fn).parameters.get(name)
    except (TypeError, ValueError):
        return inspect.Parameter.empty
    return inspect.Parameter.empty if parameter is None else parameter.default


def kernel_name(fn: Callable) -> str:
    """How a kernel passed as a callable is named in reports: MODULE:QUALNAME."""
    return f"{getattr(fn, '__module__', None) or '?'}:{getattr(fn, '__qualname__', None) or type(fn).__name__}"
