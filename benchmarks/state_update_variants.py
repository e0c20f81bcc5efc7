"""Time builds of the state update's kernel module against each other in one process, on the same inputs.

For an A/B of a kernel change on a GPU: copy ssmcheck/ops/state_update/fused_recurrent.py to a few files,
edit each, and pass their paths; a copy may import its own copy of a rounding module from its directory
(which is put on sys.path), e.g. `from sr_b import (` for sr_b.py beside b.py. benchmarks/builds.py writes
such builds from git refs. At batch 256 (or each of `--batches`) of
benchmarks/state_update.py's inputs (Mamba2-2.7B widths, tied A/dt/D), for fp16 and bf16 states advanced
50 SR steps by the first build:
- how many row groups (2 channels x 128, the 8-channel blocks' groups) hold a nonzero value below 2**-14
  (fp16's subnormal range, or NaN) and below 2**-17 (where 16 random bits may not decide fp16's SR);
- whether each build's SR step, same seed, is bitwise the first build's (builds meant to draw alike must);
- the graph time (state_update.time_step: checked against float64 first, rotating state buffers) of one
  software-SR step per build, and round to nearest for the first build.
fp16 is also timed on three adversarial inputs: state column 0 at 2**-20 with B's column 0 zero (every row
group holds a subnormal below 2**-17: fp16's slow paths everywhere), the same at 2**-16 (every group takes the
subnormal branch, none can tie), and both zero (every group holds a zero). Run from
the checkout, e.g.

    PYTHONPATH=. python benchmarks/state_update_variants.py a.py b.py

It prints; copy what it prints into benchmarks/RESULTS.md with the device, date, commit and the edits.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from builds import load_build  # noqa: E402
from state_update import inputs, time_step  # noqa: E402

from ssmcheck.ops.rounding.stochastic import DEFAULT_PHILOX_ROUNDS  # noqa: E402


def share(state, below: float) -> float:
    """The share of row groups holding a nonzero |value| below `below`, or NaN."""
    value = state.float()
    odd = ((value.abs() < below) & (value != 0)) | value.isnan()
    return odd.reshape(*state.shape[:2], -1, 2 * state.shape[-1]).any(-1).float().mean().item()


def compare(builds: dict, args: dict, state, rounds: int, label: str) -> None:
    print(f"{label}: row groups with 0 < |x| < 2**-14 or NaN {share(state, 2.0**-14):.2%}, "
          f"below 2**-17 {share(state, 2.0**-17):.2%}", flush=True)
    results = {}
    for name, module in builds.items():
        results[name] = state.clone()
        module.selective_state_update(results[name], **args, rounding="stochastic", seed=77, philox_rounds=rounds)
    first = next(iter(results.values()))
    same = {name: torch.equal(got.view(torch.int16), first.view(torch.int16)) for name, got in results.items()}
    print(f"  bitwise the first build's SR step: {same}", flush=True)
    times = []
    # The first build is timed twice, the first time discarded: on the subnormal column the first timing of an
    # input ran 5-10% slower than the same kernel timed right after it (RESULTS.md, 2026-12-02; cause not found).
    for name, module in [next(iter(builds.items())), *builds.items()]:
        def step(s, module=module, calls=[0]):  # noqa: B006 (the call count, a new seed each step)
            calls[0] += 1
            return module.selective_state_update(s, **args, rounding="stochastic", seed=calls[0],
                                                 philox_rounds=rounds)
        times.append(f"{name} {time_step(step, args, state, rep=200, loop=False)[0]:.4f}")
    times = times[1:]
    module = next(iter(builds.values()))
    nearest = time_step(lambda s: module.selective_state_update(s, **args), args, state, rep=200, loop=False)[0]
    print(f"  {label} SR ms, {rounds} rounds: " + " | ".join(times) + f" | nearest {nearest:.4f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("builds", nargs="+", help="paths of fused_recurrent.py copies; the first is the reference")
    parser.add_argument("--philox-rounds", type=int, default=DEFAULT_PHILOX_ROUNDS)
    parser.add_argument("--batches", default="256",
                        help="comma-separated batch sizes (the launch of software SR depends on the batch)")
    opts = parser.parse_args()
    builds = {Path(p).stem: load_build(p) for p in opts.builds}
    first = next(iter(builds.values()))
    for batch in (int(b) for b in opts.batches.split(",")):
        for state_dtype in (torch.float16, torch.bfloat16):
            args, state = inputs(batch, state_dtype, False)
            for step in range(50):
                first.selective_state_update(state, **args, rounding="stochastic", seed=1000 + step)
            compare(builds, args, state, opts.philox_rounds, f"batch {batch} {state_dtype} benchmark inputs")
            if state_dtype == torch.float16:
                zero_b = {**args, "B": args["B"].clone()}
                zero_b["B"][..., 0] = 0
                for name, value in (("subnormal column", 2.0**-20), ("subnormal column above the ties", 2.0**-16),
                                    ("zero column", 0.0)):
                    adversarial = state.clone()
                    adversarial[..., 0] = value
                    compare(builds, zero_b, adversarial, opts.philox_rounds, f"batch {batch} {state_dtype} {name}")


if __name__ == "__main__":
    main()
