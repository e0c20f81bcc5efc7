"""Kernels that misbehave as a process, not numerically: they exit, interrupt, print, crash or hang.

Each wraps a correct kernel (the torch baseline), so whatever it does not break passes. For
`--kernel tests/misbehaving_kernels.py:NAME`:

- scan_* have the mamba_chunk_scan_combined signature, drift_* the selective_state_update one;
- the guard kernels (sys_exit_0, sys_exit_3, keyboard_interrupt) misbehave only when the batch
  is 1, so a sweep over --batch 1,2 shows the case after them still running;
- the *_printing kernels print on every call, from Python and at the file-descriptor level;
- the *_by_batch kernels pick a way to die from the batch size (BY_BATCH): one sweep over
  several batch sizes runs a crash, an exit and a hang between correct cases;
- the *_cuda_only kernels enter `torch.cuda.device` at batch 1, as GPU-only kernels do.

`ScriptedRunner` misbehaves one level up, as the runner core.isolation's worker calls.
"""

import ctypes
import os
import signal
import sys
import time
from dataclasses import dataclass

import torch

from ssmcheck.drift.adapter import torch_state_update
from ssmcheck.scan.adapter import torch_kernel

BY_BATCH = {2: "segfault", 4: "exit", 6: "hang"}
HANG_SECONDS = 60


def _misbehave(how: str | None) -> None:
    if how == "sys_exit_0":
        sys.exit(0)
    elif how == "sys_exit_3":
        sys.exit(3)
    elif how == "keyboard_interrupt":
        raise KeyboardInterrupt
    elif how == "print":
        print("noise")
        os.write(1, b"c-level noise\n")
    elif how == "segfault":
        ctypes.string_at(0)
    elif how == "exit":
        os._exit(0)
    elif how == "hang":
        time.sleep(HANG_SECONDS)
    elif how == "cuda":
        # As mamba_ssm's kernels do, with a CPU tensor's device index (None): on a machine without CUDA
        # torch.cuda raises a TypeError that does not say why.
        with torch.cuda.device(torch.device("cpu").index):
            pass


def _scan_kernel(pick):
    """A mamba_chunk_scan_combined that first does what `pick(batch)` names (None: nothing)."""

    def kernel(x, dt, A, B, C, chunk_size, *, state_dtype=torch.float32, rounding="nearest", seed=0, **kwargs):
        _misbehave(pick(x.shape[0]))
        return torch_kernel(x, dt, A, B, C, chunk_size, state_dtype=state_dtype, rounding=rounding, seed=seed,
                            **kwargs)

    return kernel


def _drift_kernel(pick):
    """A selective_state_update that first does what `pick(batch)` names (None: nothing)."""

    def kernel(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *, rounding="nearest",
               seed=0):
        _misbehave(pick(state.shape[0]))
        return torch_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, rounding=rounding, seed=seed)

    return kernel


def _at_batch_1(how: str):
    return lambda batch: how if batch == 1 else None


def _always(how: str):
    return lambda batch: how


scan_sys_exit_0 = _scan_kernel(_at_batch_1("sys_exit_0"))
scan_sys_exit_3 = _scan_kernel(_at_batch_1("sys_exit_3"))
scan_keyboard_interrupt = _scan_kernel(_at_batch_1("keyboard_interrupt"))
scan_printing = _scan_kernel(_always("print"))
scan_by_batch = _scan_kernel(BY_BATCH.get)
scan_cuda_only = _scan_kernel(_at_batch_1("cuda"))

drift_sys_exit_0 = _drift_kernel(_at_batch_1("sys_exit_0"))
drift_sys_exit_3 = _drift_kernel(_at_batch_1("sys_exit_3"))
drift_keyboard_interrupt = _drift_kernel(_at_batch_1("keyboard_interrupt"))
drift_printing = _drift_kernel(_always("print"))
drift_by_batch = _drift_kernel(BY_BATCH.get)
drift_cuda_only = _drift_kernel(_at_batch_1("cuda"))


@dataclass(frozen=True)
class ScriptedRunner:
    """A runner for core.isolation whose cases are strings naming what to do; "ok" returns ("done", case)."""

    device: str = "cpu"

    def __call__(self, case: str, advance):
        if case == "raise":
            raise ValueError("a bug\nover two lines")
        if case == "unpicklable":
            return lambda: None
        if case == "sigint":
            os.kill(os.getpid(), signal.SIGINT)  # ignored: Ctrl-C is the parent's to handle
        advance()
        return "done", case

    def failed(self, case: str, message: str, seconds: float):
        return "failed", case, message
