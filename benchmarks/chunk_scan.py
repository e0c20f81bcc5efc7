"""Time the built-in chunk scan and the peers' at Mamba2-2.7B widths on a GPU, and record the result.

80 heads x 64, dstate 128, one group, chunk 256, bf16, dt_softplus, dt_bias and D,
batch 1 (DESIGN §7); medians of triton.testing.do_bench on fresh random inputs, every
kernel in this process on the same inputs (benchmarks/peers.py: vLLM and mamba_ssm where
they can be imported, their metadata made outside the timed call), each checked finite.
Every kernel runs once at a length (compiling, autotuning) before any is timed, and then
they are timed in turn for --rounds rounds, the median of the rounds kept: a short prefill's
time is its host's, and a single timing of it, first in its process, moved by up to 2x
between runs on the H200 (benchmarks/RESULTS.md, 2026-12-03).
Not a test: run it by hand on the GPU machine from the checkout, e.g.

    PYTHONPATH=.:.peers/v033:.peers/mamba python benchmarks/chunk_scan.py --stages

It prints a table and appends it, with date, device, versions, commit and this
command, to benchmarks/RESULTS.md (or --results PATH).
"""

from __future__ import annotations

import argparse
import statistics

from peers import chunk_scans
from record import append_section, commit, markdown_table

from ssmcheck.core import runtime
from ssmcheck.core.formats import DTYPES

PEERS = ("vLLM", "mamba_ssm")
SHAPE = dict(nheads=80, headdim=64, dstate=128, ngroups=1, chunk_size=256)


def inputs(seqlen: int, seed: int = 0) -> dict:
    import torch  # noqa: PLC0415

    g = torch.Generator(device="cuda").manual_seed(seed)
    h, p, n, ng = SHAPE["nheads"], SHAPE["headdim"], SHAPE["dstate"], SHAPE["ngroups"]

    def randn(*shape):
        return torch.randn(*shape, generator=g, device="cuda")

    return dict(
        x=randn(1, seqlen, h, p).bfloat16(),
        dt=randn(1, seqlen, h).bfloat16(),
        A=-torch.exp(torch.rand(h, generator=g, device="cuda") * 2.77),
        B=randn(1, seqlen, ng, n).bfloat16(),
        C=randn(1, seqlen, ng, n).bfloat16(),
        D=randn(h),
        dt_bias=randn(h) - 4.0,
    )


def length_label(seqlen: int) -> str:
    return f"{seqlen // 1024}k" if seqlen % 1024 == 0 else str(seqlen)


def stage_inputs(args: dict, state_dtype) -> dict:
    """What each pipeline stage reads, made by the stages before it as chunk_scan_combined makes it (batch 1):
    x, B, C, D, the chunk table, the matmul dtype, dt_proc, dA_cs, log2_pairs, the chunks' own states, the
    passed states, C·Bᵀ."""
    import torch  # noqa: PLC0415

    from ssmcheck.ops.chunk_scan.chunk_cb import chunk_cb  # noqa: PLC0415
    from ssmcheck.ops.chunk_scan.chunk_state import chunk_state  # noqa: PLC0415
    from ssmcheck.ops.chunk_scan.dt_cumsum import dt_cumsum  # noqa: PLC0415
    from ssmcheck.ops.chunk_scan.layout import batch_table  # noqa: PLC0415
    from ssmcheck.ops.chunk_scan.state_passing import state_passing  # noqa: PLC0415
    from ssmcheck.ops.rounding.stochastic import triton_dtype  # noqa: PLC0415

    x, B, C = args["x"][0], args["B"][0], args["C"][0]
    table = batch_table(1, x.shape[0], SHAPE["chunk_size"], x.device)
    mm = triton_dtype(x.dtype)
    dt_proc, dA_cs, log2_pairs = dt_cumsum(args["dt"][0], args["A"], args["dt_bias"], True, (0.0, float("inf")),
                                           table)
    local = chunk_state(x, B, dt_proc, dA_cs, mm, table, False)
    passed = x.dtype if state_dtype == torch.float32 else state_dtype  # as chunk_scan_combined passes them
    states, _ = state_passing(local, dA_cs, None, state_dtype, False, 0, table, passed_dtype=passed)
    return dict(x=x, B=B, C=C, D=args["D"], table=table, mm=mm, dt_proc=dt_proc, dA_cs=dA_cs,
                log2_pairs=log2_pairs, local=local, passed=passed,
                states=states, cb=chunk_cb(C, B, mm, table, False))


def stage_times(args: dict, state_dtype, bench) -> dict[str, float]:
    """Median ms of each pipeline stage, run as chunk_scan_combined runs them."""
    from ssmcheck.ops.chunk_scan.chunk_cb import chunk_cb  # noqa: PLC0415
    from ssmcheck.ops.chunk_scan.chunk_output import chunk_output  # noqa: PLC0415
    from ssmcheck.ops.chunk_scan.chunk_state import chunk_state  # noqa: PLC0415
    from ssmcheck.ops.chunk_scan.dt_cumsum import dt_cumsum  # noqa: PLC0415
    from ssmcheck.ops.chunk_scan.state_passing import state_passing  # noqa: PLC0415
    from ssmcheck.ops.chunk_scan.states_passed import states_passed  # noqa: PLC0415

    s = stage_inputs(args, state_dtype)
    x, B, C, table, mm, dt_proc, dA_cs = s["x"], s["B"], s["C"], s["table"], s["mm"], s["dt_proc"], s["dA_cs"]
    y = x.new_empty(x.shape)
    return {
        "dt+cumsum": bench(lambda: dt_cumsum(args["dt"][0], args["A"], args["dt_bias"], True, (0.0, float("inf")),
                                             table)),
        "chunk states": bench(lambda: chunk_state(x, B, dt_proc, dA_cs, mm, table, False)),
        "passing": bench(lambda: state_passing(s["local"], dA_cs, None, state_dtype, False, 0, table,
                                               passed_dtype=s["passed"])),
        # The two in one kernel, as the interpreter runs them (compiled it was the slower: RESULTS, sixty-eighth session).
        "both in one": bench(lambda: states_passed(x, B, dt_proc, dA_cs, None, state_dtype, False, 0, table, mm, False,
                                                   passed_dtype=s["passed"])),
        "C·Bᵀ": bench(lambda: chunk_cb(C, B, mm, table, False)),
        "output": bench(lambda: chunk_output(x, None, C, s["D"], s["cb"], dt_proc, s["log2_pairs"], s["states"], y, mm,
                                             table, False)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="4096,16384,65536", help="comma-separated sequence lengths")
    parser.add_argument("--state-dtype", default="fp32", choices=list(DTYPES))
    parser.add_argument("--stages", action="store_true", help="also time each pipeline stage alone")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of timing every kernel in turn (median kept)")
    parser.add_argument("--results", default="benchmarks/RESULTS.md", help="markdown file to append to")
    parser.add_argument("--commit", help="commit being measured (where the checkout has no .git)")
    opts = parser.parse_args()

    env = runtime.configure("cuda")
    import torch  # noqa: PLC0415
    import triton  # noqa: PLC0415

    from ssmcheck.ops.chunk_scan.chunk import chunk_scan_combined  # noqa: PLC0415

    state_dtype = DTYPES[opts.state_dtype]

    def bench(fn) -> float:
        return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")

    lengths = [int(v) for v in opts.lengths.split(",")]
    header = ["L", "ours (ms)", *(f"{name} (ms)" for name in PEERS), *(f"ours / {name}" for name in PEERS)]
    rows, stage_rows, left_out, origins = [], [], {}, {}
    for seqlen in lengths:
        args = inputs(seqlen)
        out = torch.empty_like(args["x"])

        def run():
            return chunk_scan_combined(**args, chunk_size=SHAPE["chunk_size"], dt_softplus=True,
                                       state_dtype=state_dtype, out=out)

        peers, missing = chunk_scans(args, SHAPE["chunk_size"])
        left_out.update(missing)
        kernels = {"ours": run, **peers}
        times, cells, failed = {}, {}, set()
        for name, fn in kernels.items():
            origins[name] = getattr(fn, "origin", "ssmcheck.ops.chunk_scan")
            try:
                finite = bool(torch.isfinite(fn()).all())  # a non-finite y is not a time
            except Exception as exc:  # noqa: BLE001 (a peer that fails here is reported, not fatal)
                print(f"L={seqlen} {name}: raised {type(exc).__name__}: {exc}".splitlines()[0], flush=True)
                cells[name] = "raised"
                failed.add(name)
                continue
            if not finite:
                cells[name] = "non-finite"
                failed.add(name)
        rounds = {name: [] for name in kernels if name not in failed}
        for _ in range(opts.rounds):
            for name in rounds:
                rounds[name].append(bench(kernels[name]))
        for name, ms in rounds.items():
            times[name] = statistics.median(ms)
            cells[name] = f"{times[name]:.3f}"
            print(f"L={seqlen} {name}: rounds " + ", ".join(f"{t:.3f}" for t in ms), flush=True)
        ours = times.get("ours")
        rows.append([length_label(seqlen), *(cells.get(n, "-") for n in ("ours", *PEERS)),
                     *(f"{ours / times[n]:.2f}" if ours and times.get(n) else "-" for n in PEERS)])
        print(" | ".join(rows[-1]), flush=True)
        if opts.stages:
            stages = stage_times(args, state_dtype, bench)
            stage_rows.append([length_label(seqlen), *(f"{t:.3f}" for t in stages.values())])
            stage_header = ["L", *(f"{name} (ms)" for name in stages)]

    text = markdown_table(header, rows)
    if stage_rows:
        text += "\n\nStages alone:\n\n" + markdown_table(stage_header, stage_rows)
    print(text)
    shape = ", ".join(f"{k} {v}" for k, v in SHAPE.items())
    details = [f"shape: bf16, batch 1, {shape}, dt_softplus, dt_bias, D; state_dtype {opts.state_dtype} (ours; "
               "the peers store states in their own way); median of triton.testing.do_bench",
               *(f"{name}: {origin}" for name, origin in origins.items()),
               *(f"{name} left out: {why}" for name, why in left_out.items())]
    append_section(opts.results, "chunk scan", env, commit(opts.commit), details, text)


if __name__ == "__main__":
    main()
