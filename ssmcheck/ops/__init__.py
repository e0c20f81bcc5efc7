"""Triton kernels and their float64 references."""

import os


def interpreting() -> bool:
    """Whether Triton runs kernels through its interpreter: TRITON_INTERPRET read as Triton reads it
    (1, true, on, yes or y, in any case).

    What a kernel entry point's `interpret=None` stands for.
    """
    return os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes", "y")


# The kernels' bf16 conversions and dots need core.runtime's mends of Triton's interpreter: in place before
# any kernel here runs interpreted, whoever set TRITON_INTERPRET.
if interpreting():
    from ssmcheck.core import runtime

    runtime.mend_interpreter()
