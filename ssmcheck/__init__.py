"""ssmcheck: numerical-stability diagnostics for Mamba2 SSM kernels.

Importing the package does not import triton: `ssmcheck.core.runtime.configure`
must decide between compiled kernels and Triton's interpreter first.
"""

__version__ = "0.1.0"
