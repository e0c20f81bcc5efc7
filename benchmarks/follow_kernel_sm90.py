"""Compile drift.follow_kernel's variants for sm_90 without a GPU, and record each one's registers and stack.

Every variant a drift sweep can launch (state dtype, input dtype, rounding, gate, softplus), each launched by
`follow_triton` on CPU tensors laid out as drift.lockstep passes them at drift_step.py's widths (batch 2, 8 heads
x 64, dstate 128; A, D and dt_bias one value per head, expanded), recorded instead of run and specialised as Triton's
launcher would (sass_loop.record_launches, variants.specialisation: strides of 1 as constants, divisibility by 16),
then compiled by the installed Triton for an H200 and read back with the cuobjdump Triton ships. What a GPU run
would otherwise find first: a variant that does not compile with the device's Triton, or one that spills. Not a
test: run it by hand, in an environment holding the device's Triton (the H200's: 3.6), e.g.

    python -m venv --system-site-packages /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0
    PYTHONPATH=. /tmp/t36/bin/python benchmarks/follow_kernel_sm90.py

It prints a table and appends it, with date, versions, commit and this command, to benchmarks/RESULTS.md (or
--results PATH).
"""

from __future__ import annotations

import argparse
import itertools
import time

from record import append_section, commit, markdown_table
from sass_loop import compile_sass, offline_env, record_launches

CAPABILITY = 90
SHAPE = dict(batch=2, nheads=8, headdim=64, dstate=128)  # drift_step.py's


def arguments(state: str, inputs: str, rounding: str, gated: bool, softplus: bool) -> dict:
    """One step's arguments of follow_triton, drawn on the CPU (values do not matter: nothing runs)."""
    import torch  # noqa: PLC0415

    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
    b, h, p, n = SHAPE.values()
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(b, h, p, n, generator=g, dtype=torch.float64)
    x, dt, z = (torch.randn(b, h, p, generator=g).to(dtypes[inputs]) for _ in range(3))
    return dict(ref=ref, baseline=ref.clone(), before=ref.to(dtypes[state]), after=ref.to(dtypes[state]),
                out=x.clone(), x=x, dt=dt[..., :1].expand(b, h, p), z=z if gated else None,
                A=-torch.rand(h, 1, 1, generator=g, dtype=torch.float64).expand(h, p, n),
                B=torch.randn(b, 1, n, generator=g).to(dtypes[inputs]),
                C=torch.randn(b, 1, n, generator=g).to(dtypes[inputs]),
                D=torch.randn(h, 1, generator=g, dtype=torch.float64).expand(h, p),
                dt_bias=torch.randn(h, 1, generator=g, dtype=torch.float64).expand(h, p),
                sums=torch.zeros(5, b, h, p, dtype=torch.float64), tripped=torch.zeros(b, h, p, dtype=torch.bool),
                uniform=torch.rand(b, h, p, n, generator=g, dtype=torch.float64) if rounding == "stochastic" else None,
                dt_softplus=softplus, dtype=dtypes[state], rounding=rounding)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="benchmarks/RESULTS.md", help="markdown file to append to")
    parser.add_argument("--commit", help="commit being measured (where the checkout has no .git)")
    opts = parser.parse_args()

    from ssmcheck.drift import follow_kernel  # noqa: PLC0415

    rows = []
    for state, inputs, rounding, gated, softplus in itertools.product(("fp16", "bf16", "fp32"), ("fp32", "bf16"),
                                                                      ("nearest", "stochastic"), (False, True),
                                                                      (True, False)):
        if rounding == "stochastic" and state == "fp32":
            continue  # no stochastic rounding into fp32
        step = arguments(state, inputs, rounding, gated, softplus)
        launch = record_launches(follow_kernel, lambda: follow_kernel.follow_triton(**step))["_follow_kernel"]
        start = time.perf_counter()
        registers, stack, _ = compile_sass(launch, CAPABILITY, "follow")
        row = [state, inputs, rounding, "z" if gated else "-", "yes" if softplus else "no", registers, stack,
               f"{time.perf_counter() - start:.2f}"]
        rows.append(row)
        print(" | ".join(row), flush=True)

    text = markdown_table(["state", "inputs", "rounding", "gate", "softplus", "registers", "stack (bytes)",
                           "compile (s)"], rows)
    print(text)
    details = [f"drift.follow_kernel._follow_kernel at {SHAPE} (TILE {follow_kernel.TILE}), 4 warps; registers and "
               "stack per thread from cuobjdump -res-usage"]
    append_section(opts.results, f"drift's one-kernel float64 step compiled for sm_{CAPABILITY}",
                   offline_env(CAPABILITY), commit(opts.commit), details, text)


if __name__ == "__main__":
    main()
