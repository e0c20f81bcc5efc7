"""The peers as named kernels: `--kernel mamba_ssm` and `--kernel vllm`.

One small module per peer turns the installed package's Triton ops into callables with
ssmcheck's signatures (DESIGN §2): `chunk_scan()` for `scan`, `state_update()` for `drift`.

- `mamba_ssm` (state-spaces/mamba): its own `mamba_chunk_scan_combined` and
  `selective_state_update`, which have our signatures already.
- `vllm`: wrappers that call `mamba_chunk_scan_combined_varlen` as vLLM's model code does
  (one flat varlen token set, chunk metadata built from our layout, a preallocated `out`,
  states stored in C's dtype unless `state_dtype` says otherwise) and its
  `selective_state_update` (D and dt_bias positional, `out` preallocated).

The packages are imported when a function here is called, never at import time. A package
that cannot be imported raises core.callables.KernelSpecError with one line naming
`--kernel` and the import failure, which the API and CLI report as a usage error (exit 2).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ssmcheck.core.callables import KernelSpecError


def import_ops(kernel: str, what: str, module: str) -> ModuleType:
    """Import `module` for `--kernel kernel`; KernelSpecError, one line, when it cannot be imported."""
    try:
        return importlib.import_module(module)
    except Exception as exc:  # an import runs arbitrary code: any failure means the peer is unusable here
        text = str(exc).strip().splitlines()
        reason = text[0] if text else type(exc).__name__
        raise KernelSpecError(f"--kernel {kernel}: cannot import {what}: {reason}") from exc
