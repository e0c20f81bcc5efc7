"""Time builds of the state update's kernel module against each other in one process, on the same inputs.

For an A/B of a kernel change on a GPU: copy ssmcheck/ops/state_update/fused_recurrent.py to a few files,
edit each, and pass their paths; the first is also the one whose data figure is printed. At batch 256 of
benchmarks/state_update.py's inputs (Mamba2-2.7B widths, tied A/dt/D), for fp16 and bf16 states: how many
row groups (2 channels x 128, the 8-channel programs' groups) hold a nonzero new state below 2**-17 after 50
SR steps (fp16's 16 bits cannot round those exactly), then the median of triton.testing.do_bench_cudagraph
of one software-SR step per build, at 10 and 7 Philox rounds, and round to nearest for the first build. Run
from the checkout, e.g.

    PYTHONPATH=. python benchmarks/state_update_variants.py a.py b.py

It prints; copy what it prints into benchmarks/RESULTS.md with the device, date, commit and the edits.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).parent))
from state_update import inputs  # noqa: E402

from ssmcheck.ops.state_update.naive import state_update_step  # noqa: E402


def load(path: str):
    spec = importlib.util.spec_from_file_location("variant_" + Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    builds = {Path(p).stem: load(p) for p in sys.argv[1:]}
    first = next(iter(builds.values()))
    for state_dtype in (torch.float16, torch.bfloat16):
        args, state0 = inputs(256, state_dtype, False)
        state = state0.clone()
        for step in range(50):
            first.selective_state_update(state, **args, rounding="stochastic", seed=step)
        fp64 = {k: v.double() if torch.is_tensor(v) else v for k, v in args.items()}
        new, _ = state_update_step(state.double(), **fp64)
        magnitude = new.abs().view(256, 80, 32, 2 * 128)
        small = ((magnitude > 0) & (magnitude < 2.0**-17)).any(-1).float().mean().item()
        print(f"{state_dtype}: row groups holding 0 < |x| < 2**-17 after 50 steps: {small:.4%}", flush=True)
        for rounds in (10, 7):
            times = []
            for name, module in builds.items():
                states = [state0.clone() for _ in range(8)]
                calls = [0]

                def sr_step(module=module, states=states, calls=calls):
                    calls[0] += 1
                    module.selective_state_update(states[calls[0] % 8], **args, rounding="stochastic", seed=calls[0],
                                                  philox_rounds=rounds)

                sr_step()
                torch.cuda.synchronize()
                times.append(f"{name} {triton.testing.do_bench_cudagraph(sr_step, rep=200):.4f}")
            nearest = state0.clone()
            ms = triton.testing.do_bench_cudagraph(lambda: first.selective_state_update(nearest, **args), rep=200)
            print(state_dtype, "rounds", rounds, " | ".join(times), f"| nearest {ms:.4f}", flush=True)


if __name__ == "__main__":
    main()
