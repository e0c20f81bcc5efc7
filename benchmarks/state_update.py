"""Time one decode step of the built-in state update and of the peers at Mamba2-2.7B widths on a GPU, and record it.

80 heads x 64 channels, dstate 128, one group, dt_softplus, dt_bias and D
(tied per head, as Mamba2 passes them), z optional, bf16 activations; batch
1, 64 and 256; the state in fp32, fp16 and bf16, to nearest and (fp16/bf16,
ours only: vLLM's is cvt.rs, sm_100 and up; mamba_ssm has none) stochastically. Every kernel
runs in this process on the same inputs (benchmarks/peers.py: vLLM and
mamba_ssm where they can be imported), and the table gives ratios of ours to
theirs. Two times per kernel:
- graph: the median of triton.testing.do_bench_cudagraph (a CUDA graph of many
  steps, as a decode loop captured in a graph runs them: device time only);
  the steps rotate over enough state buffers (4x L2) that no step finds its
  state cached;
- loop: a plain Python loop of eager steps, synchronised at its end, per step:
  what a decode loop without graphs pays, the host's launch time included
  (at batch 1 it is the host's).
Before timing, each kernel's step is checked against the float64 reference
(outputs poisoned), and after it every buffer must still be finite: a wrong
result prints WRONG instead of a time. Not a test: run it by hand on the GPU
machine from the checkout, e.g.

    PYTHONPATH=.:.peers/v033:.peers/mamba python benchmarks/state_update.py --z

It prints a table (ms, ours' GB/s against the measured copy bandwidth, the
bytes floor, software SR's cost over round to nearest, ours / each peer) and
appends it, with date, device, versions, commit and this command, to
benchmarks/RESULTS.md (or --results PATH). --sweep also times other launch
configurations of ours.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

from peers import state_updates
from record import append_section, commit, markdown_table

from ssmcheck.core import runtime
from ssmcheck.core.formats import DTYPES

SHAPE = dict(nheads=80, headdim=64, dstate=128, ngroups=1)
OURS = "ssmcheck"
LOOP_STEPS = 2000  # eager steps per loop timing
MODES = (("fp32", "nearest"), ("fp16", "nearest"), ("fp16", "stochastic"), ("bf16", "nearest"),
         ("bf16", "stochastic"))
# (block_p, num_warps)
SWEEP = [(4, 1), (8, 1), (16, 1), (32, 1), (8, 2), (16, 2), (32, 2)]


def inputs(batch: int, state_dtype, with_z: bool, seed: int = 0) -> dict:
    import torch  # noqa: PLC0415

    g = torch.Generator(device="cuda").manual_seed(seed)
    h, p, n, ng = SHAPE["nheads"], SHAPE["headdim"], SHAPE["dstate"], SHAPE["ngroups"]

    def randn(*shape):
        return torch.randn(*shape, generator=g, device="cuda")

    # Negate before expanding: `-t.expand(...)` would materialise A, and the kernel would take
    # its untied path (an A load and an exp per state element), which Mamba2 never runs.
    a_head = -torch.exp(torch.rand(h, generator=g, device="cuda") * 2.77)
    args = dict(
        x=randn(batch, h, p).bfloat16(),
        dt=randn(batch, h).bfloat16()[..., None].expand(batch, h, p),
        A=a_head[:, None, None].expand(h, p, n),
        B=randn(batch, ng, n).bfloat16(),
        C=randn(batch, ng, n).bfloat16(),
        D=randn(h)[:, None].expand(h, p),
        z=randn(batch, h, p).bfloat16() if with_z else None,
        dt_bias=(randn(h) - 4.0)[:, None].expand(h, p),
        dt_softplus=True,
    )
    tied = (args["A"].stride()[1:], args["dt"].stride(2), args["D"].stride(1), args["dt_bias"].stride(1))
    assert tied == ((0, 0), 0, 0, 0), f"A, dt, D, dt_bias must be stride-0 views over the head, got strides {tied}"
    return args, randn(batch, h, p, n).to(state_dtype)


def step_bytes(batch: int, state_size: int, with_z: bool) -> int:
    """The fewest bytes one step moves: the state read and written, each other input read once, out written."""
    h, p, n, ng = SHAPE["nheads"], SHAPE["headdim"], SHAPE["dstate"], SHAPE["ngroups"]
    state = 2 * batch * h * p * n * state_size
    activations = batch * h * p * 2 * (2 + with_z) + batch * h * 2 + 2 * batch * ng * n * 2  # x, out, z; dt; B, C
    return state + activations + 3 * h * 4  # A, D, dt_bias


def check_step(args: dict, state, step) -> None:
    """`step(state) -> out` once against the float64 reference, out poisoned first: a fast wrong kernel is not
    timed. Raises AssertionError."""
    import torch  # noqa: PLC0415

    from ssmcheck.ops.state_update import naive  # noqa: PLC0415

    fp64 = {k: v.double() if torch.is_tensor(v) else v for k, v in args.items()}
    ref_state, ref_out = naive.state_update_step(state.double(), **fp64)
    got = state.clone()
    out = step(got)
    for name, value, ref, tol in (("state", got, ref_state, 2 * 2.0 ** -8), ("out", out, ref_out, 2 * 2.0 ** -7)):
        err = ((value.double() - ref).norm() / ref.norm()).item()
        # fp16/bf16 storage of the state and bf16 output: a few units of their rounding, relative to the norm.
        assert err < tol, f"{name}: relative error {err:.3e} against float64 exceeds {tol:.1e}"


def time_step(step, args: dict, state, rep: int = 100, loop: bool = True,
              graph: bool = True) -> tuple[float | None, float | None]:
    """(graph ms or None without `graph`, loop ms or None without `loop`) of `step(state) -> out`, checked first
    against float64 (`check_step`); the steps rotate over copies of `state` (which is left as it is), enough
    (4x L2) that no step finds its state cached, all finite at the end. Raises AssertionError."""
    import torch  # noqa: PLC0415
    import triton  # noqa: PLC0415

    check_step(args, state, step)
    nbytes = step_bytes(state.shape[0], state.element_size(), args.get("z") is not None)
    l2 = torch.cuda.get_device_properties(state.device).L2_cache_size
    # Copies only: `state` stays as given, so that every build timed on it starts from the same state (stepped
    # itself, a decaying column reached the next build as zeros).
    buffers = [state.clone() for _ in range(min(64, math.ceil(4 * l2 / nbytes)))]
    turn, outs = [0], []

    def rotating():
        turn[0] += 1
        outs[:] = [step(buffers[turn[0] % len(buffers)])]

    # do_bench_cudagraph runs on a new stream that does not wait for this one: without the
    # sync its first steps can read buffers whose clones are still being written.
    torch.cuda.synchronize()
    graph_ms = triton.testing.do_bench_cudagraph(rotating, rep=rep, return_mode="median") if graph else None
    loop_ms = None
    if loop:
        for _ in range(50):
            rotating()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(LOOP_STEPS):
            rotating()
        torch.cuda.synchronize()
        loop_ms = (time.perf_counter() - start) * 1e3 / LOOP_STEPS
    bad = [i for i, b in enumerate(buffers) if not torch.isfinite(b).all()]
    if bad or not torch.isfinite(outs[0]).all():
        first = buffers[bad[0]] if bad else outs[0]
        where = (~torch.isfinite(first)).nonzero()[:4].tolist()
        raise AssertionError(f"non-finite after {turn[0]} timed steps: state buffers {bad[:8]} of {len(buffers)}, "
                             f"out finite: {bool(torch.isfinite(outs[0]).all())}, first at {where}")
    return graph_ms, loop_ms


def in_turn(steps: dict, rounds: int, timing) -> dict[str, list[float]]:
    """{name: its `rounds` timings}: every step timed once a round, in turn (`timing(step) -> ms`), so that a
    machine's drift between rounds reaches every step alike."""
    ms = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            ms[name].append(timing(step))
    return ms


def ratio_spread(numerators: list[float], denominators: list[float]) -> tuple[float, float, float] | None:
    """(median, min, max) of the rounds' ratios; None without rounds."""
    ratios = [a / b for a, b in zip(numerators, denominators)]
    return (statistics.median(ratios), min(ratios), max(ratios)) if ratios else None


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read and written (the ceiling used here)."""
    import torch  # noqa: PLC0415
    import triton  # noqa: PLC0415

    src = torch.randn(2**29, device="cuda")  # 2 GiB
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    return 2 * src.numel() * 4 / ms / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,64,256", help="comma-separated batch sizes")
    parser.add_argument("--z", action="store_true", help="gate the output with z")
    parser.add_argument("--sweep", action="store_true",
                        help="also time other launch configurations at the largest batch")
    parser.add_argument("--results", default="benchmarks/RESULTS.md", help="markdown file to append to")
    parser.add_argument("--commit", default=None, help="commit to record (default: asks git)")
    parser.add_argument("--sr-rounds", type=int, default=0,
                        help="also time ours to nearest and with software SR in turn, this many rounds per 16-bit "
                             "state and batch, for SR's cost as the median of the rounds' ratios (0: not)")
    parser.add_argument("--loop-rounds", type=int, default=0,
                        help="also time the loops of ours and the peers (round to nearest) in turn, this many rounds "
                             "per state and batch, for ours / each peer as the median of the rounds' ratios (0: not)")
    parser.add_argument("--philox-rounds", type=int, default=None,
                        help="Philox rounds of the software stochastic rounding (default: the kernel's)")
    opts = parser.parse_args()

    env = runtime.configure("cuda")
    import torch  # noqa: PLC0415

    from ssmcheck.ops.state_update import fused_recurrent  # noqa: PLC0415

    rounds = fused_recurrent.DEFAULT_PHILOX_ROUNDS if opts.philox_rounds is None else opts.philox_rounds

    def kernels(args: dict, rounding: str) -> tuple[dict, dict]:
        """{name: step(state) -> out}: ours, and the peers for round to nearest; out NaN until written."""
        out = torch.full_like(args["x"], float("nan"))

        def ours(state):
            return fused_recurrent.selective_state_update(state, **args, rounding=rounding, seed=12345, out=out,
                                                          philox_rounds=rounds)

        peers, missing = state_updates(args) if rounding == "nearest" else ({}, {})
        return {OURS: ours, **peers}, missing

    def timed(name: str, step, args: dict, state, label: str, rep: int = 100) -> tuple[float, float] | None:
        """time_step, or None after printing why the kernel's result was wrong (or why it raised)."""
        try:
            return time_step(step, args, state, rep)
        except Exception as wrong:  # noqa: BLE001 (a peer that fails here is reported, not fatal)
            print(f"{label} {name}: WRONG: {type(wrong).__name__}: {wrong}".splitlines()[0], flush=True)
            return None

    def ms_text(value: float | None) -> str:
        return "wrong" if value is None else f"{value:.4f}"

    def ratio(ours: float | None, theirs: float | None) -> str:
        return f"{ours / theirs:.2f}" if ours and theirs else "-"

    peak = copy_bandwidth()
    batches = [int(v) for v in opts.batches.split(",")]
    rows, times, left_out, origins = [], {}, {}, {}
    peer_names = ("vLLM", "mamba_ssm")
    for batch in batches:
        for state_name, rounding in MODES:
            args, state = inputs(batch, DTYPES[state_name], opts.z)
            steps, missing = kernels(args, rounding)
            left_out.update(missing)
            label = f"batch {batch} {state_name} {rounding}"
            got = {}
            for name, step in steps.items():
                origins[name] = getattr(step, "origin", "ssmcheck.ops.state_update.fused_recurrent")
                got[name] = timed(name, step, args, state, label)
            times[batch, state_name, rounding] = got.get(OURS)
            ours = got.get(OURS)
            nbytes = step_bytes(batch, DTYPES[state_name].itemsize, opts.z)
            floor = nbytes / peak / 1e6
            nearest = times.get((batch, state_name, "nearest"))
            sr_cost = f"{ours[0] / nearest[0]:.2f}x" if rounding == "stochastic" and ours and nearest else "-"
            row = [str(batch), state_name, rounding, *(ms_text(ours[i]) if ours else "wrong" for i in (0, 1)),
                   f"{nbytes / ours[0] / 1e6:.0f}" if ours else "-", f"{floor:.4f}",
                   f"{floor / ours[0]:.0%}" if ours else "-", sr_cost]
            for peer in peer_names:
                theirs = got.get(peer)
                row += [ms_text(theirs[0]) if theirs else "-", ms_text(theirs[1]) if theirs else "-",
                        ratio(ours and ours[0], theirs and theirs[0]), ratio(ours and ours[1], theirs and theirs[1])]
            rows.append(row)
            print(" | ".join(row), flush=True)
    head = ["batch", "state", "rounding", "ours graph ms", "ours loop ms", "GB/s", "floor ms", "of floor",
            "SR / nearest"]
    for peer in peer_names:
        head += [f"{peer} graph ms", f"{peer} loop ms", f"ours / {peer} graph", f"ours / {peer} loop"]
    text = markdown_table(head, rows)

    if opts.sweep:
        batch = max(batches)
        sweep_rows = []
        default = fused_recurrent.launch_config
        for state_name, rounding in MODES:
            for config in SWEEP:
                if config[0] % fused_recurrent.ROW_GROUPS:
                    continue  # a program holds whole row groups
                fused_recurrent.launch_config = lambda *_, c=config: fused_recurrent.LaunchConfig(*c)
                args, state = inputs(batch, DTYPES[state_name], opts.z)
                ms = timed(OURS, kernels(args, rounding)[0][OURS], args, state, f"{config}", rep=30)
                sweep_rows.append([state_name, rounding, *map(str, config), "wrong" if ms is None else f"{ms[0]:.4f}"])
                print(" | ".join(sweep_rows[-1]), flush=True)
        fused_recurrent.launch_config = default
        text += f"\n\nLaunch configurations at batch {batch}:\n\n"
        text += markdown_table(["state", "rounding", "block_p", "num_warps", "ms"], sweep_rows)

    if opts.sr_rounds > 0:
        # One timing each, as in the table, is first in its process or follows another mode's: SR's cost moved
        # between 1.26x and 1.37x across runs. Nearest and SR in turn, each round's ratio kept.
        sr_rows = []
        for batch in batches:
            for state_name in ("fp16", "bf16"):
                args, state = inputs(batch, DTYPES[state_name], opts.z)
                steps = {rounding: kernels(args, rounding)[0][OURS] for rounding in ("nearest", "stochastic")}
                ms = in_turn(steps, opts.sr_rounds, lambda step: time_step(step, args, state, loop=False)[0])
                median, low, high = ratio_spread(ms["stochastic"], ms["nearest"])
                sr_rows.append([str(batch), state_name, *(", ".join(f"{t:.4f}" for t in ms[r]) for r in steps),
                                f"{median:.2f}x", f"{low:.2f}-{high:.2f}x"])
                print(" | ".join(sr_rows[-1]), flush=True)
        text += (f"\n\nSoftware SR's cost, ours to nearest and with SR timed in turn ({opts.sr_rounds} rounds, "
                 "graph ms):\n\n")
        text += markdown_table(["batch", "state", "nearest", "stochastic", "SR / nearest (median)", "range"], sr_rows)

    if opts.loop_rounds > 0:
        # At batch 1 the loop is the host's time, which moved by up to half between single runs of one kernel:
        # every kernel's loop in turn, each round's ratios kept.
        loop_rows = []
        for batch in batches:
            for state_name in ("fp32", "fp16", "bf16"):
                args, state = inputs(batch, DTYPES[state_name], opts.z)
                steps, _ = kernels(args, "nearest")
                ms = in_turn(steps, opts.loop_rounds, lambda step: time_step(step, args, state, graph=False)[1])
                spreads = [ratio_spread(ms[OURS], ms.get(peer, [])) for peer in peer_names]
                loop_rows.append([str(batch), state_name,
                                  *(", ".join(f"{t:.4f}" for t in ms[n]) if n in ms else "-"
                                    for n in (OURS, *peer_names)),
                                  *(f"{r[0]:.2f} ({r[1]:.2f}-{r[2]:.2f})" if r else "-" for r in spreads)])
                print(" | ".join(loop_rows[-1]), flush=True)
        text += (f"\n\nLoops (eager steps, host included), every kernel in turn ({opts.loop_rounds} rounds, ms a "
                 "step):\n\n")
        text += markdown_table(["batch", "state", f"{OURS} loop ms", *(f"{p} loop ms" for p in peer_names),
                                *(f"ours / {p} (median, range)" for p in peer_names)], loop_rows)

    print(text)
    shape = ", ".join(f"{k} {v}" for k, v in SHAPE.items())
    details = [
        f"one decode step: bf16 activations, {shape}, dt_softplus, dt_bias, D{', z' if opts.z else ''} "
        f"(A, dt, dt_bias, D tied per head); graph = median of triton.testing.do_bench_cudagraph, loop = "
        f"{LOOP_STEPS} eager steps / their wall time; floor = fewest bytes / measured copy bandwidth {peak:.0f} GB/s "
        f"(read + written); stochastic = software SR, Philox {rounds} rounds",
        *(f"{name}: {origin}" for name, origin in origins.items()),
        *(f"{name} left out: {why}" for name, why in left_out.items()),
    ]
    append_section(opts.results, "state update", env, commit(opts.commit), details, text)


if __name__ == "__main__":
    main()
