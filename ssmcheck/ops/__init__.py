"""Triton kernels and their float64 references."""

import os

# The kernels' bf16 conversions and dots need core.runtime's mends of Triton's interpreter: in place before
# any kernel here runs interpreted, whoever set TRITON_INTERPRET (read as Triton reads it, ops.common).
if os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes", "y"):
    from ssmcheck.core import runtime

    runtime.mend_interpreter()
