"""The GPU memory a scan case needs, estimated from its shape (issue #13), and the check that refuses,
before anything runs, a sweep whose largest case cannot fit in the device's free memory.

Two phases of a case hold memory at once:
- the kernel's calls: its inputs in the kernel's dtype, the copies core.guard keeps of them to check
  that the call leaves them unchanged, its outputs (y of each --repeat run, y of the call without D and
  z, the states) and its intermediates, estimated as the built-in kernel's (ops/chunk_scan/chunk.py:
  fp32 dt and fp64 cumulative log-decays per token and head, fp32 chunk states and the passed states
  per chunk, fp32 C·Bᵀ per chunk; another kernel's may differ);
- the comparison: the inputs and the outputs, and one segment (scan.segments) of the float64
  reference, the baselines and the measurements;
- with --invariance, the serving checks (scan.invariance): the inputs and the outputs, and whole, not
  by segment, the float64 reference's y and C·h (with the copy that stacks them) and the baseline's split
  runs in fp32; their kernel calls on parts of the batch need no more than the whole batch's.
Every regime is counted with z (the largest inputs), `conv-output` and `conv-output-varlen` with x, B and C twice (CONV_COPY_REGIMES); the
estimate is the largest phase.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ssmcheck.core.formats import DTYPES
from ssmcheck.scan.segments import SEGMENT_ELEMENTS, segment_tokens

# Bytes a segment costs per element of y: the float64 reference (x, y, C·h, the gate) and the baselines'
# fp32 copies (four of them under stochastic rounding), plus the measurements' float64 temporaries.
SEGMENT_BYTES_PER_ELEMENT = 128
# Bytes the invariance checks hold per element of y: the whole float64 reference's y and C·h, and the
# stack that makes each (3 x 8), and the baseline's two split parts, y and C·h in fp32 (4 x 4).
INVARIANCE_BYTES_PER_ELEMENT = 40
# The SSD form's per-block temporaries (naive._BLOCK_ELEMENTS float64 elements, a few of them at once).
BLOCK_BYTES = 2**30
GIB = 2**30
# Regimes that hold x, B and C twice: the causal conv's output the kernel reads, and the in_proj buffer's columns
# before the conv (scan.regimes.conv_output).
CONV_COPY_REGIMES = ("conv-output", "conv-output-varlen")


@dataclass(frozen=True)
class Estimate:
    case_id: str
    calls: int  # bytes during the kernel's calls: inputs, their copies, outputs, intermediates
    comparison: int  # bytes during the comparison: inputs, outputs, one segment
    segment: int  # bytes of one segment of the references and measurements
    invariance: int = 0  # bytes during the --invariance checks (0 without)

    @property
    def total(self) -> int:
        return max(self.calls, self.comparison, self.invariance)

    def line(self, free: int | None) -> str:
        """The header's line."""
        where = "not checked on the CPU" if free is None else f"{_size(free)} free on the GPU"
        checks = f", invariance checks {_size(self.invariance)}" if self.invariance else ""
        return (f"memory: about {_size(self.total)} at the peak of the largest case, {self.case_id} "
                f"(kernel calls {_size(self.calls)}, comparison {_size(self.comparison)} with reference segments "
                f"of {_size(self.segment)}{checks}); {where}")


def _size(nbytes: int) -> str:
    return f"{nbytes / GIB:.1f} GiB" if nbytes >= GIB else f"{nbytes / 2**20:.1f} MiB"


def estimate(case, repeat: int = 1, invariance: bool = False) -> Estimate:
    """The estimate of one ScanCase, with `invariance` its --invariance checks too (the module docstring says
    what it counts)."""
    size = DTYPES[case.dtype].itemsize
    state = DTYPES[case.state_dtype].itemsize
    ntok = case.batch * case.seqlen
    heads, headdim, dstate, groups, chunk = case.nheads, case.headdim, case.dstate, case.ngroups, case.chunk_size
    y = ntok * heads * headdim * size
    states = case.batch * heads * headdim * dstate
    inputs = 2 * y + 2 * ntok * groups * dstate * size + ntok * heads * size + states * 4
    held = inputs  # the inputs' buffers, which the kernel's arguments view (core.guard copies those views)
    if case.regime in CONV_COPY_REGIMES:
        held += y + 2 * ntok * groups * dstate * size
    nchunks = math.ceil(case.seqlen / chunk) * case.batch + case.batch  # varlen: a chunk more per sequence
    intermediates = (nchunks * heads * chunk * (4 + 8) + nchunks * heads * headdim * dstate * (4 + state)
                     + nchunks * groups * chunk * chunk * 4)
    outputs = (repeat + 1) * y + states * state
    elements = min(ntok, segment_tokens(heads, headdim)) * heads * headdim
    segment = elements * SEGMENT_BYTES_PER_ELEMENT + (BLOCK_BYTES if ntok * heads * headdim > SEGMENT_ELEMENTS else 0)
    checks = held + outputs + ntok * heads * headdim * INVARIANCE_BYTES_PER_ELEMENT if invariance else 0
    return Estimate(case.id, held + inputs + outputs + intermediates, held + outputs + segment, segment, checks)


def largest(cases: list, repeat: int = 1, invariance: bool = False) -> Estimate | None:
    """The estimate of the case that needs the most (cases that are skipped need none), or None."""
    runnable = [estimate(case, repeat, invariance) for case in cases if case.skip_reason is None]
    return max(runnable, key=lambda e: e.total, default=None)


def free_bytes(device: str) -> int | None:
    """The device's free memory in bytes (torch.cuda.mem_get_info), or None on the CPU."""
    return torch.cuda.mem_get_info()[0] if device == "cuda" else None


def refusal(need: Estimate | None, free: int | None) -> str | None:
    """Why the sweep cannot run here (one line), or None."""
    if need is None or free is None or need.total <= free:
        return None
    return (f"case {need.case_id} needs about {_size(need.total)} of GPU memory, more than the "
            f"{_size(free)} free (run fewer tokens, a smaller batch or fewer heads)")
