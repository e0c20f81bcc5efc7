"""The SASS of the chunk scan's two heaviest stages, compiled for a GPU target here, no GPU needed.

For the output stage (chunk_output) and the chunk-state stage (chunk_state) at the H200 benchmark's
widths (80 heads x 64, dstate 128, one group, chunk 256, bf16), each launched by its own launcher with
its GPU default configuration: the registers and stack a thread holds, and the instructions of the
innermost loop around the tensor-core MMAs (HGMMA), by opcode. A static count, not a time: it says
what one loop iteration issues (ncu on the H200 showed the output stage instruction-bound), and it
is the same on any machine with the same Triton. Run from the checkout, e.g.

    PYTHONPATH=. python benchmarks/sass_loop.py

It prints a table per stage and appends them, with date, versions, commit and this command, to
benchmarks/RESULTS.md (or --results PATH).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

from record import append_section, commit, markdown_table
from variants import compile_specialisation, specialisation

# Compiled mode on any machine: the kernels are compiled for the target, never run (before triton is imported).
os.environ.pop("TRITON_INTERPRET", None)

SHAPE = dict(ntok=512, nheads=80, headdim=64, dstate=128, ngroups=1, chunk_size=256)
INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_]*)[^;]*;")
# A branch's target, after the second predicate of `@!P4 BRA P3, 0x2c70` where there is one.
BRANCH_TARGET = re.compile(r"BRA\s+(?:!?U?P[0-9T],\s*)?(0x[0-9a-f]+)")


class Launch:
    """Stands in for a Triton kernel: `kernel[grid](*args, **kwargs)` records the call instead of running it."""

    def __init__(self, kernel):
        self.kernel, self.args, self.kwargs = kernel, None, None

    def __getitem__(self, grid):
        def record(*args, **kwargs):
            self.args, self.kwargs = args, kwargs
        return record


def compile_launch(launch: Launch, capability: int):
    """The recorded launch compiled for sm_`capability`, specialised as Triton's launcher would
    (variants.specialisation)."""
    kernel = launch.kernel
    unspecialised = {p.name for p in kernel.params if p.do_not_specialize}
    return compile_specialisation(kernel, specialisation(kernel.fn, unspecialised, launch.args, dict(launch.kwargs)),
                                  capability)


def _cuobjdump() -> str:
    import triton  # noqa: PLC0415

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")


def offline_env(capability: int) -> SimpleNamespace:
    """What record.append_section names as the device of an offline compilation."""
    import torch  # noqa: PLC0415
    import triton  # noqa: PLC0415

    return SimpleNamespace(gpu=None, device=f"none (compiled here for sm_{capability})", torch=torch.__version__,
                           triton=triton.__version__)


def record_launches(module, call) -> dict:
    """{name: Launch} of every `*_kernel` of `module` as `call()` launches them: recorded, never run (a
    launcher may launch helpers first)."""
    recorded = {k: Launch(v) for k, v in vars(module).items() if k.endswith("_kernel")}
    for k, launch in recorded.items():
        setattr(module, k, launch)
    try:
        call()
    finally:
        for k, launch in recorded.items():
            setattr(module, k, launch.kernel)
    return recorded


def compile_sass(launch: Launch, capability: int, name: str) -> tuple[str, str, str]:
    """(registers, stack bytes, SASS text) of a recorded launch compiled for sm_`capability` (the cubin kept
    as /tmp/ssmcheck_sass_`name`.cubin)."""
    tool = _cuobjdump()
    cubin = Path("/tmp") / f"ssmcheck_sass_{name}.cubin"
    cubin.write_bytes(compile_launch(launch, capability).asm["cubin"])
    usage = subprocess.run([tool, "-res-usage", str(cubin)], capture_output=True, text=True, check=True).stdout
    regs, stack = (re.search(rf"{k}:(\d+)", usage).group(1) for k in ("REG", "STACK"))
    return regs, stack, subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout


def mma_loop(sass: str) -> list[str]:
    """Opcodes of the smallest loop (a backward branch's range) that holds an HGMMA."""
    code = [(int(m.group(1), 16), m.group(3), line) for line in sass.splitlines()
            if (m := INSTRUCTION.search(line))]
    best = None
    for address, opcode, line in code:
        target = BRANCH_TARGET.search(line) if opcode == "BRA" else None
        if target is None or int(target.group(1), 16) >= address:
            continue
        body = [op for a, op, _ in code if int(target.group(1), 16) <= a <= address]
        if "HGMMA" in body and (best is None or len(body) < len(best)):
            best = body
    return best or []


def stage_launches():
    """{stage: Launch} of the built-in's launchers at SHAPE, on CPU tensors (never run)."""
    import torch  # noqa: PLC0415

    from ssmcheck.ops.chunk_scan import chunk_output, chunk_state  # noqa: PLC0415
    from ssmcheck.ops.chunk_scan.layout import batch_table  # noqa: PLC0415
    from ssmcheck.ops.rounding.stochastic import triton_dtype  # noqa: PLC0415

    L, h, p, n, g, cs = (SHAPE[k] for k in ("ntok", "nheads", "headdim", "dstate", "ngroups", "chunk_size"))
    table = batch_table(1, L, cs, "cpu")
    nc = table.nchunks
    x = torch.empty(L, h, p, dtype=torch.bfloat16)
    B = C = torch.empty(L, g, n, dtype=torch.bfloat16)
    dt, dA = torch.empty(nc, h, cs), torch.empty(nc, h, cs, dtype=torch.float64)
    mm = triton_dtype(x.dtype)
    launches = {}
    for stage, module, name, call in (
        ("output", chunk_output, "_chunk_output_kernel", lambda: chunk_output.chunk_output(
            x, None, C, torch.empty(h), torch.empty(nc, g, cs, cs), dt, torch.empty(nc, h, 2, cs),
            torch.empty(nc, h, p, n),
            torch.empty_like(x), mm, table, False)),
        ("chunk states", chunk_state, "_chunk_state_kernel",
         lambda: chunk_state.chunk_state(x, B, dt, dA, mm, table, False)),
    ):
        launches[stage] = record_launches(module, call)[name]
    return launches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capability", type=int, default=90, help="compute capability to compile for (90: sm_90)")
    parser.add_argument("--top", type=int, default=12, help="opcodes listed per stage")
    parser.add_argument("--results", default="benchmarks/RESULTS.md", help="markdown file to append to")
    parser.add_argument("--commit", help="commit being measured (where the checkout has no .git)")
    opts = parser.parse_args()

    text, summary = "", []
    for stage, launch in stage_launches().items():
        regs, stack, sass = compile_sass(launch, opts.capability, stage.replace(" ", "_"))
        loop = mma_loop(sass)
        config = {k: v for k, v in launch.kwargs.items() if k.startswith("BLOCK") or k.startswith("num_")}
        summary.append([stage, regs, stack, str(len(loop)), " ".join(f"{k}={v}" for k, v in config.items())])
        counts = collections.Counter(loop).most_common(opts.top)
        text += f"\n\n{stage}, the MMA loop by opcode:\n\n" + markdown_table(
            ["opcode", "per iteration"], [[op, str(c)] for op, c in counts])
    text = markdown_table(["stage", "registers", "stack (bytes)", "MMA loop instructions", "configuration"],
                          summary) + text
    print(text)
    append_section(opts.results, "chunk scan SASS (offline)", offline_env(opts.capability), commit(opts.commit),
                   [f"compiled here for sm_{opts.capability} (no GPU), shape {SHAPE}, bf16, each stage's GPU "
                    "default configuration; static instruction counts of one iteration, not times"], text)


if __name__ == "__main__":
    main()
