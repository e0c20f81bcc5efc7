"""Time one drift decode step on a GPU, its float64 side eager and compiled, and record the result.

One trial of the `normal` regime at the default GPU drift shape (batch 2, 8 heads x 64, dstate 128, one
group), the kernel under test `--kernel` (builtin by default): step 1 eager, step 2 captured in a CUDA
graph (drift.lockstep), then `--replays` replays timed with time.perf_counter around the Python loop,
host included; the float64 side of the step (drift.follow) run as plain PyTorch, compiled, or as
drift.follow_kernel's one Triton kernel (`--steps`). A `decode_loop` that names the float64 step eager says the
fast step did not pass its check against the eager one (drift.follow.Follower).
Not a test: run it by hand on the GPU machine from the checkout, e.g.

    PYTHONPATH=. python benchmarks/drift_step.py

It prints a table and appends it, with date, device, versions, commit and this command, to
benchmarks/RESULTS.md (or --results PATH).
"""

from __future__ import annotations

import argparse
import time

from record import append_section, commit, markdown_table

from ssmcheck.core import runtime

SHAPE = dict(batch=2, nheads=8, headdim=64, dstate=128, ngroups=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="builtin", help="the state-update kernel (drift's --kernel)")
    parser.add_argument("--replays", type=int, default=1000, help="graph replays timed per configuration")
    parser.add_argument("--results", default="benchmarks/RESULTS.md", help="markdown file to append to")
    parser.add_argument("--commit", help="commit being measured (where the checkout has no .git)")
    parser.add_argument("--steps", default="eager,compiled,triton",
                        help="how the float64 side runs, comma-separated: eager (plain PyTorch), compiled "
                             "(torch.compile), triton (drift.follow_kernel's one kernel)")
    opts = parser.parse_args()

    env = runtime.configure("cuda")
    import torch  # noqa: PLC0415

    from ssmcheck.core.capture import Transcript  # noqa: PLC0415
    from ssmcheck.drift import follow, lockstep  # noqa: PLC0415
    from ssmcheck.drift.adapter import resolve  # noqa: PLC0415
    from ssmcheck.drift.follow import Follower  # noqa: PLC0415
    from ssmcheck.drift.regimes import make_problem  # noqa: PLC0415
    from ssmcheck.drift.spec import DriftCase  # noqa: PLC0415
    from ssmcheck.drift.stats import SignedErrorMoments  # noqa: PLC0415

    # How each way runs the float64 side: Follower("cpu") runs plain PyTorch; on CUDA a Follower checks its one fast
    # step (torch.compile's, or the one Triton kernel) against the eager one at the first step.
    fast = dict(follow._fast_steps())
    ways = {"eager": (lambda device: Follower("cpu"), []),
            "compiled": (Follower, [("torch.compile", fast["torch.compile"])]),
            "triton": (Follower, [("Triton", fast["Triton"])])}
    ways = {name: ways[name] for name in opts.steps.split(",")}
    rows = []
    for state_dtype in ("fp16", "bf16"):
        for rounding in ("nearest", "stochastic"):
            row = [state_dtype, rounding]
            for name, (follower, steps) in ways.items():
                lockstep.Follower, follow._fast_steps = follower, lambda steps=steps: steps
                case = DriftCase(kernel=opts.kernel, state_dtype=state_dtype, rounding=rounding, regime="normal",
                                 steps=opts.replays + 2, model=None, seed=1, trials=1, **SHAPE)
                problem = make_problem(case.regime, case.shape(), case.dtype, case.steps, case.seed, "cuda")
                lock = lockstep.Lockstep(case, problem, lockstep.StepWindow(problem),
                                         resolve(opts.kernel, 10, "software", False), 0, 7, Transcript(),
                                         SignedErrorMoments())
                lock.advance(check_inputs=True)
                lock.try_graph()
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(opts.replays):
                    lock.advance()
                torch.cuda.synchronize()
                row.append(f"{(time.perf_counter() - start) / opts.replays * 1e3:.4f}")
                row.append(lock.decode_loop)
            rows.append(row)
            print(" | ".join(row), flush=True)

    header = ["state", "rounding"] + [part for name in ways for part in (f"{name} (ms/step)", "decode_loop")]
    text = markdown_table(header, rows)
    print(text)
    shape = ", ".join(f"{k} {v}" for k, v in SHAPE.items())
    details = [f"one trial of `normal`, {shape}, kernel {opts.kernel}; {opts.replays} CUDA graph replays after an "
               "eager step and the captured one, timed around the Python loop (host included)"]
    append_section(opts.results, "drift step", env, commit(opts.commit), details, text)


if __name__ == "__main__":
    main()
