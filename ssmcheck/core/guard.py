"""Calling a kernel under test so that it cannot end the run, fake its verdict or write into the report.

What it prints goes to a transcript (core.capture); what it allocates uninitialised is NaN-filled
(core.poison), so that an element it never writes shows. SystemExit and KeyboardInterrupt raised inside
the call become KernelExit, the case's own failure: exactly these two beyond Exception, not
BaseException, because a user's Ctrl-C arrives as core.execution.Interrupted and must end the
sweep, not this case; and SIGINT/SIGTERM are the sweep's again after the call, whatever native code the
kernel loaded (core.execution.reclaim_signals). In Triton's interpreter its programs cannot load or store
outside their launch's tensors (core.accesses): where one tried, the call is the case's error (KernelOutsideMemory)
instead of a corrupted or killed process. Both commands' adapters call their kernels through here.
"""

from __future__ import annotations

import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import triton

from ssmcheck.core.accesses import checked_accesses
from ssmcheck.core.capture import Transcript, captured_stdout
from ssmcheck.core.execution import reclaim_signals
from ssmcheck.core.poison import uninitialised_as_nan


class KernelExit(RuntimeError):
    """The kernel's call ended in a way this module describes itself (it raised SystemExit or KeyboardInterrupt, or
    accessed memory outside its tensors: KernelOutsideMemory); the message is the whole description."""


class KernelOutsideMemory(KernelExit):
    """A Triton program of the kernel, run by Triton's interpreter, loaded or stored outside every tensor of its
    launch (core.accesses): the case's error, found and kept from memory, where it could have corrupted the process
    or ended it."""


def describe(exc: BaseException) -> str:
    """'TypeName: message (raised at FILE:LINE)', the line being the innermost one outside torch and Triton
    (mamba_ssm 2.3.2's state update given no dt_bias: "AttributeError: 'NoneType' object has no attribute
    'stride' (raised at mamba_ssm/ops/triton/selective_state_update.py:199)", where the message alone does
    not say whose code failed); for an exception without a message (a bare `assert` in a peer's kernel), where
    it was raised instead: 'AssertionError at mamba_ssm/ops/triton/ssd_combined.py:418: assert
    initial_states.shape == ...'. Files are named from their import root. Either way followed by the reason
    when a kernel needed CUDA where there is none (`_without_cuda`)."""
    text = str(exc).strip()
    frames = traceback.extract_tb(exc.__traceback__)
    if text:
        said = f"{type(exc).__name__}: {text}"
        if frames:
            frame = _outside_libraries(frames)
            said += f" (raised at {_importable(frame.filename)}:{frame.lineno})"
    elif not frames:
        return type(exc).__name__
    else:
        frame = frames[-1]
        said = f"{type(exc).__name__} at {_importable(frame.filename)}:{frame.lineno}" + (
            f": {frame.line.strip()}" if frame.line else "")
    return said + _without_cuda(frames)


def _outside_libraries(frames: list[traceback.FrameSummary]) -> traceback.FrameSummary:
    """The innermost frame whose file lies outside torch's and Triton's packages (an error Triton raises while
    compiling is placed at the kernel's launch), or the innermost frame where every one lies inside them."""
    libraries = [Path(torch.__file__).resolve().parent, Path(triton.__file__).resolve().parent]
    for frame in reversed(frames):
        path = Path(frame.filename).resolve()
        if not any(library in path.parents for library in libraries):
            return frame
    return frames[-1]


def _without_cuda(frames: list[traceback.FrameSummary]) -> str:
    """' (the kernel called torch.cuda at FILE:LINE, and this machine has no CUDA GPU)' when the exception
    was raised inside torch.cuda on a machine without one: a GPU-only kernel (mamba_ssm's enters
    `torch.cuda.device`) run on the CPU, whose own message ('Torch not compiled with CUDA enabled', or a
    TypeError about a None device index) does not say so. '' otherwise."""
    if torch.cuda.is_available():
        return ""
    cuda = Path(torch.cuda.__file__).resolve().parent
    inside = [i for i, f in enumerate(frames) if cuda in Path(f.filename).resolve().parents]
    if not inside:
        return ""
    caller = frames[inside[0] - 1] if inside[0] > 0 else None
    where = f" at {_importable(caller.filename)}:{caller.lineno}" if caller is not None else ""
    return f" (the kernel called torch.cuda{where}, and this machine has no CUDA GPU)"


def _importable(filename: str) -> str:
    """`filename` relative to the longest sys.path entry holding it (the path its import uses)."""
    path = Path(filename).resolve()
    roots = [Path(p or ".").resolve() for p in sys.path]
    inside = [r for r in roots if r == path or r in path.parents]
    return str(path.relative_to(max(inside, key=lambda r: len(r.parts)))) if inside else filename


def guarded_call(fn: Callable, args: tuple, kwargs: dict, transcript: Transcript | None):
    """fn(*args, **kwargs), its printing kept in `transcript` (discarded without one), its uninitialised
    allocations NaN and its RuntimeWarnings dropped: numpy's, from Triton's interpreter evaluating masked
    lanes (an exp that overflows, a division by zero), say nothing about the results, which are judged
    afterwards. In Triton's interpreter its programs keep to their tensors' memory (core.accesses). Raises what the
    kernel raised, or KernelExit (KernelOutsideMemory where a program reached outside its tensors)."""
    try:
        with captured_stdout(transcript if transcript is not None else Transcript()), uninitialised_as_nan(), \
                checked_accesses() as accesses, warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            result = fn(*args, **kwargs)
        outside = accesses.outside()
        if outside is not None:
            raise KernelOutsideMemory(outside)
        return result
    except SystemExit as exc:
        raise KernelExit(f"SystemExit: {exc.code} (the kernel called sys.exit)") from exc
    except KeyboardInterrupt as exc:
        raise KernelExit("KeyboardInterrupt raised by the kernel") from exc
    finally:
        reclaim_signals()  # the kernel's native code may have taken SIGTERM over
