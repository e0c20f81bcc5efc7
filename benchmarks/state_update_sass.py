"""Registers and SASS instructions of the state update's kernel, compiled for a GPU target here, no GPU needed.

At the H200 benchmark's widths (batch 256, 80 heads x 64, dstate 128, one group, A/dt/D/dt_bias tied per
head, bf16 activations), for each state dtype and rounding, the kernel as `selective_state_update` launches
it (its launch rule, or --block-p): the registers and stack a thread holds, the static instruction count
(all paths: fp16 SR's rare redo included), the count of the common path (`common_path`: what a program whose
row groups all take the common case issues, which the SR step's time follows), and the most frequent
opcodes. A static count, not a time: the state update's software SR is issue- and occupancy-bound on the
H200 (benchmarks/RESULTS.md), and registers set how many one-warp programs an SM holds (65536 / 32 /
registers). Counts depend on the Triton version:
compare builds with the same one. With the GPU machine's Triton (3.6.0, pip-installed beside a CPU torch
in a virtual environment) they are the H200's: seven builds' registers matched the kernels' n_regs there
(benchmarks/RESULTS.md, 2026-12-01). Run from the checkout, e.g.

    PYTHONPATH=. python benchmarks/state_update_sass.py

It prints a table and appends it, with date, versions, commit and this command, to benchmarks/RESULTS.md
(or --results PATH). `--dump DIR` also writes each mode's SASS, addresses stripped, to DIR/<state>_<rounding>.sass:
a change that leaves every file byte-identical (`diff -r` of two builds' dumps) compiles to the same kernel,
so it needs no new timing on the device.
"""

from __future__ import annotations

import argparse
import collections
import functools
import re
from pathlib import Path

from builds import load_build
from record import append_section, commit, markdown_table
from sass_loop import BRANCH_TARGET, INSTRUCTION, Launch, compile_sass, offline_env, record_launches

MODES = (("fp32", "nearest"), ("fp16", "nearest"), ("fp16", "stochastic"), ("bf16", "nearest"),
         ("bf16", "stochastic"))


def launch(state_name: str, rounding: str, block_p: int | None, fused_recurrent) -> Launch:
    """The state update's kernel launch for this mode at the benchmark's widths, recorded on CPU tensors, of
    `fused_recurrent` (the module or a build of it)."""
    import torch  # noqa: PLC0415

    from ssmcheck.core.formats import DTYPES  # noqa: PLC0415

    batch, h, p, n = 256, 80, 64, 128
    args = dict(
        x=torch.empty(batch, h, p, dtype=torch.bfloat16),
        dt=torch.empty(batch, h, dtype=torch.bfloat16)[..., None].expand(batch, h, p),
        A=torch.empty(h)[:, None, None].expand(h, p, n),
        B=torch.empty(batch, 1, n, dtype=torch.bfloat16), C=torch.empty(batch, 1, n, dtype=torch.bfloat16),
        D=torch.empty(h)[:, None].expand(h, p), dt_bias=torch.empty(h)[:, None].expand(h, p), dt_softplus=True,
    )
    rule = fused_recurrent.launch_config
    if block_p is not None:
        fused_recurrent.launch_config = functools.cache(lambda *_: fused_recurrent.LaunchConfig(block_p, 1))
    try:
        return record_launches(fused_recurrent, lambda: fused_recurrent.selective_state_update(
            torch.empty(batch, h, p, n, dtype=DTYPES[state_name]), **args, rounding=rounding, seed=123456789,
            interpret=False))["_state_update_kernel"]
    finally:
        fused_recurrent.launch_config = rule


def common_path(found: list) -> int:
    """Instructions from the kernel's start to its first predicated EXIT, where every if-else block is passed
    by its predicated branch (`@P BRA X` over a body ending in an unconditional `BRA`: the count goes on at
    X). In this kernel that is the path of a program whose row groups all take the common case (fp16 SR's
    fixed field; no redo): the state update's SR time follows this count, not the total (RESULTS.md,
    2026-12-01). Since 85d7db4 a software-SR program at batch 256 takes its blocks of channels in a loop, whose
    redo is skipped by a branch to the loop's latch, not over an else: there the count runs through the redo
    too (fp16 SR 1841, of which the redo is some 750), and ncu's executed instructions are the measure
    (RESULTS.md, "the state update under ncu"). `found`: INSTRUCTION matches in address order."""
    index = {int(m.group(1), 16): i for i, m in enumerate(found)}
    count, i = 0, 0
    while i < len(found):
        predicated, opcode = found[i].group(2) is not None, found[i].group(3)
        if opcode == "EXIT" and predicated:
            break
        count += 1
        target = BRANCH_TARGET.search(found[i].group(0)) if opcode == "BRA" and predicated else None
        j = index.get(int(target.group(1), 16)) if target else None
        i = j if j and found[j - 1].group(3) == "BRA" and found[j - 1].group(2) is None else i + 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capability", type=int, default=90, help="compute capability to compile for (90: sm_90)")
    parser.add_argument("--block-p", type=int, default=None, help="channels per program (default: the launch rule)")
    parser.add_argument("--top", type=int, default=6, help="opcodes listed per mode")
    parser.add_argument("--build", help="a copy of ssmcheck/ops/state_update/fused_recurrent.py to compile instead "
                                        "(benchmarks/builds.py)")
    parser.add_argument("--results", default="benchmarks/RESULTS.md", help="markdown file to append to")
    parser.add_argument("--commit", help="commit being measured (where the checkout has no .git)")
    parser.add_argument("--dump", metavar="DIR", help="also write each mode's SASS (addresses stripped) to DIR")
    opts = parser.parse_args()
    if opts.build:
        module = load_build(opts.build)
    else:
        from ssmcheck.ops.state_update import fused_recurrent as module  # noqa: PLC0415
    rows = []
    for state_name, rounding in MODES:
        recorded = launch(state_name, rounding, opts.block_p, module)
        regs, stack, sass = compile_sass(recorded, opts.capability, f"state_update_{state_name}_{rounding}")
        found = [m for line in sass.splitlines() if (m := INSTRUCTION.search(line))]
        opcodes = [m.group(3) for m in found]
        if opts.dump:
            Path(opts.dump).mkdir(parents=True, exist_ok=True)
            text = "\n".join(re.sub(r"^/\*[0-9a-f]+\*/\s+", "", m.group(0)) for m in found)
            (Path(opts.dump) / f"{state_name}_{rounding}.sass").write_text(f"registers {regs} stack {stack}\n{text}\n")
        top = collections.Counter(opcodes).most_common(opts.top)
        rows.append([state_name, rounding, str(recorded.kwargs["BLOCK_P"]), regs, stack, str(len(opcodes)),
                     str(common_path(found)), ", ".join(f"{op} {c}" for op, c in top)])
        print(" | ".join(rows[-1]), flush=True)
    text = markdown_table(["state", "rounding", "block_p", "registers", "stack (bytes)", "instructions",
                           "common path", "most frequent"], rows)
    print(text)
    append_section(opts.results, "state update SASS (offline)", offline_env(opts.capability), commit(opts.commit),
                   ["compiled here (no GPU) at batch 256, 80 heads x 64, dstate 128, one group, tied A/dt/D, "
                    "one warp; static counts over all paths, not times",
                    *([f"build: {opts.build}"] if opts.build else [])], text)


if __name__ == "__main__":
    main()
