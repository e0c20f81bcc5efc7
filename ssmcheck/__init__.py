"""ssmcheck: numerical-stability diagnostics for Mamba2 SSM kernels.

Importing the package does not import triton: `ssmcheck.core.runtime.configure`
must decide between compiled kernels and Triton's interpreter first (the API's
`scan` and `drift` configure it on their first call).
"""

__version__ = "0.1.0"

# The Python API: `ssmcheck.scan(...)` and `ssmcheck.drift(...)` run a sweep and return its Report.
from ssmcheck import drift, scan  # noqa: E402 (callable command packages: see ssmcheck.api)
from ssmcheck.api import Report, UsageError  # noqa: E402

__all__ = ["Report", "UsageError", "__version__", "drift", "scan"]
