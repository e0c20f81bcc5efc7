"""Sweep the block configurations of the chunk scan's two heaviest stages on a GPU, and record the result.

The chunk-state and chunk-output kernels of ssmcheck.ops.chunk_scan, each run alone over a grid of
block sizes, warps and pipeline stages at benchmarks/chunk_scan.py's shape (Mamba2-2.7B widths, bf16,
chunk 256); medians of triton.testing.do_bench. Every configuration's result is compared with the
default configuration's (a configuration that computes something else is reported, not timed).
Configurations run in worker processes, one after another: a miscompiled one whose illegal memory access
loses the CUDA context ends its worker, and the next worker goes on from the configuration after it.
Not a test: run it by hand on the GPU machine from the checkout, e.g.

    PYTHONPATH=. python benchmarks/stage_configs.py --lengths 16384,65536

It prints the fastest configurations per stage and length and appends them to benchmarks/RESULTS.md
(or --results PATH).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time

from chunk_scan import SHAPE, inputs, length_label, stage_inputs
from record import append_section, commit, markdown_table

from ssmcheck.core import runtime

STATE_GRID = dict(BLOCK_T=(32, 64, 128), BLOCK_P=(32, 64), BLOCK_N=(64, 128), num_warps=(4, 8), num_stages=(2, 3))
OUTPUT_GRID = dict(BLOCK_ROWS=(64, 128, 256), BLOCK_M=(64, 128), BLOCK_K=(32, 64), BLOCK_P=(32, 64),
                   num_warps=(4, 8), num_stages=(1, 2, 3))  # 1: no pipelined wgmma (vLLM drops the others on sm_90)
SHOWN = 6  # fastest configurations listed per stage and length


def grid(axes: dict) -> list[dict]:
    configs = [dict(zip(axes, values)) for values in itertools.product(*axes.values())]
    return [c for c in configs if c.get("BLOCK_M", 0) <= c.get("BLOCK_ROWS", 1 << 30)]


def worker(stage_name: str, seqlen: int, start: int, deadline: float) -> None:
    """Print a JSON line per configuration of `stage_name`'s grid from index `start` on: its time, or why it was
    rejected. Exits 3 after a CUDA error: the context is lost then, and the parent starts another worker."""
    runtime.configure("cuda")
    import torch  # noqa: PLC0415
    import triton  # noqa: PLC0415

    from ssmcheck.ops.chunk_scan.chunk_output import chunk_output  # noqa: PLC0415
    from ssmcheck.ops.chunk_scan.chunk_state import chunk_state  # noqa: PLC0415

    def bench(fn) -> float:
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")

    s = stage_inputs(inputs(seqlen), torch.float32)
    x, B, C, table, mm, dt_proc, dA_cs = s["x"], s["B"], s["C"], s["table"], s["mm"], s["dt_proc"], s["dA_cs"]
    y = torch.empty_like(x)

    def nan_filled(size, **options):  # an unwritten element shows
        return torch.full(size, float("nan"), **options)

    def state_stage(config, poisoned=False):
        return chunk_state(x, B, dt_proc, dA_cs, mm, table, False, config,
                           alloc=nan_filled if poisoned else torch.empty)

    def output_stage(config, poisoned=False):
        if poisoned:  # an unwritten element shows
            y.fill_(float("nan"))
        chunk_output(x, None, C, s["D"], s["cb"], dt_proc, s["log2_pairs"], s["states"], y, mm, table, False, config)
        return y

    stage, axes = {"chunk states": (state_stage, STATE_GRID), "output": (output_stage, OUTPUT_GRID)}[stage_name]
    expected = stage(None, poisoned=True).float()
    scale = expected.abs().max().item()
    if start == 0:
        print(json.dumps({"default": bench(lambda: stage(None))}), flush=True)
    for index, config in enumerate(grid(axes)[start:], start):
        if time.monotonic() > deadline:
            return
        try:
            got = stage(config, poisoned=True).float()
            error = (got - expected).abs().max().item() / scale
            if not error <= 1e-2:  # NaN: unwritten elements
                print(json.dumps({"index": index, "rejected": f"max error {error:.2e} of the largest value"}),
                      flush=True)
                continue
            print(json.dumps({"index": index, "ms": bench(lambda: stage(config))}), flush=True)
        except Exception as exc:  # noqa: BLE001 (out of shared memory, or registers, or a miscompile)
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
            print(json.dumps({"index": index, "rejected": reason}), flush=True)
            if isinstance(exc, torch.AcceleratorError) or "CUDA error" in reason:
                sys.exit(3)


def sweep(stage_name: str, seqlen: int, deadline: float) -> tuple[float, dict, dict]:
    """(default ms, {index: ms}, {index: rejection}) of a stage's grid, run by worker processes: one after
    another, each from the configuration after the last one reported (a miscompiled configuration's illegal
    memory access ends its worker, not the sweep)."""
    default, timed, rejected = float("nan"), {}, {}
    start, total = 0, len(grid(STATE_GRID if stage_name == "chunk states" else OUTPUT_GRID))
    while start < total and time.monotonic() < deadline:
        command = [sys.executable, __file__, "--worker", stage_name, str(seqlen), str(start),
                   str(deadline - time.monotonic())]
        run = subprocess.run(command, capture_output=True, text=True, env=os.environ)
        last = start - 1
        for line in run.stdout.splitlines():
            if not line.startswith("{"):
                continue
            got = json.loads(line)
            if "default" in got:
                default = got["default"]
                continue
            last = got["index"]
            if "ms" in got:
                timed[last] = got["ms"]
            else:
                rejected[last] = got["rejected"]
        if run.returncode not in (0, 3):
            raise SystemExit(f"stage_configs worker failed (exit {run.returncode}): {run.stderr.strip()[-2000:]}")
        if run.returncode == 0:
            break
        start = last + 1
    return default, timed, rejected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="16384,65536", help="comma-separated sequence lengths")
    parser.add_argument("--results", default="benchmarks/RESULTS.md", help="markdown file to append to")
    parser.add_argument("--commit", help="commit being measured (where the checkout has no .git)")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds of sweeping; the rest is not run")
    parser.add_argument("--stage", choices=["both", "chunk-states", "output"], default="both",
                        help="which stage's grid to sweep")
    parser.add_argument("--worker", nargs=4, metavar=("STAGE", "LENGTH", "START", "SECONDS"),
                        help=argparse.SUPPRESS)  # internal: one worker process of a sweep
    opts = parser.parse_args()
    if opts.worker:
        stage_name, seqlen, start, seconds = opts.worker
        worker(stage_name, int(seqlen), int(start), time.monotonic() + float(seconds))
        return
    deadline = time.monotonic() + opts.budget
    env = runtime.configure("cuda")

    sections = []
    for seqlen in (int(v) for v in opts.lengths.split(",")):
        for name, axes in (("chunk states", STATE_GRID), ("output", OUTPUT_GRID)):
            if opts.stage not in ("both", name.replace(" ", "-")):
                continue
            default, timed, rejected = sweep(name, seqlen, deadline)
            configs = grid(axes)
            labels = [" ".join(f"{k}={v}" for k, v in config.items()) for config in configs]
            best = sorted((ms, labels[i]) for i, ms in timed.items())
            not_run = len(configs) - len(timed) - len(rejected)
            print(f"L={seqlen} {name}: default {default:.3f} ms; best {best[:SHOWN]}; {len(rejected)} rejected, "
                  f"{not_run} not run (--budget spent)", flush=True)
            rows = [[f"{ms:.3f}", f"{ms / default:.2f}", label] for ms, label in best[:SHOWN]]
            sections.append(f"{name}, L = {length_label(seqlen)}: default configuration {default:.3f} ms; "
                            f"{len(timed)} timed, {len(rejected)} rejected, {not_run} not run\n\n"
                            + markdown_table(["ms", "/ default", "configuration"], rows))
            for i, reason in sorted(rejected.items())[:5]:
                print(f"  rejected: {labels[i]}: {reason}", flush=True)

    text = "\n\n".join(sections)
    print(text)
    shape = ", ".join(f"{k} {v}" for k, v in SHAPE.items())
    details = [f"shape: bf16, batch 1, {shape}, dt_softplus, dt_bias, D; states fp32; median of "
               "triton.testing.do_bench; each stage alone, its inputs made once by the stages before it; "
               "configurations run in worker processes (a CUDA error ends one, the next goes on)",
               f"grids: chunk states {STATE_GRID}; output {OUTPUT_GRID} (BLOCK_M <= BLOCK_ROWS)",
               f"stages swept: {opts.stage}"]
    append_section(opts.results, "chunk scan stage configurations", env, commit(opts.commit), details, text)


if __name__ == "__main__":
    main()
