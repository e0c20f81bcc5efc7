"""ssmcheck: numerical-stability diagnostics for Mamba2 SSM kernels.

The Python API: `ssmcheck.scan(...)` and `ssmcheck.drift(...)` run a sweep and return its Report
(see ssmcheck.api). They are loaded on first use, so that importing the package (as pytest does
for the plugin of every environment ssmcheck is installed in) costs nothing; nor does it import
triton: `ssmcheck.core.runtime.configure` must decide between compiled kernels and Triton's
interpreter first, and the API does so on its first call.
"""

import importlib

__version__ = "0.1.0"
__all__ = ["Report", "UsageError", "__version__", "drift", "scan"]


def __getattr__(name: str):
    if name in ("scan", "drift"):  # callable command packages: see ssmcheck.api.CommandPackage
        return importlib.import_module(f"ssmcheck.{name}")
    if name in ("Report", "UsageError"):
        return getattr(importlib.import_module("ssmcheck.api"), name)
    raise AttributeError(f"module 'ssmcheck' has no attribute {name!r}")
