"""Triton kernels and their float64 references."""

from ssmcheck.core.runtime import interpreting, mend_interpreter

__all__ = ["interpreting"]

# The kernels' bf16 conversions and dots need core.runtime's mends of Triton's interpreter: in place before
# any kernel here runs interpreted, whoever set TRITON_INTERPRET.
if interpreting():
    mend_interpreter()
