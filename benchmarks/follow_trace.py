"""What dynamo's trace of drift's float64 step costs a process, compile group by compile group.

A warm GPU drift loads every graph of the float64 step (drift.follow) from inductor's caches, but dynamo traces
`follow` again in each process for each of its compile groups first (0.3-0.7 s a group on an H200's host, 20.7 s of
the default drift's 58.6 s warm; benchmarks/RESULTS.md, forty-second session). This runs a drift plan's first
cases, cut to 3 steps and one trial, with the float64 step compiled through a dynamo backend that generates no code
(`graph`: the traced graph runs as it is; or any torch.compile backend named, e.g. `aot_eager`), so that the trace is
timed on any machine, a CPU's included. Prints, per case, the first call's seconds (a new group's trace) and the
traced graph's operations. E.g.:

    PYTHONPATH=. python benchmarks/follow_trace.py --preset default --cases 12
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="default")
    parser.add_argument("--cases", type=int, default=12, help="the plan's first N cases")
    parser.add_argument("--backend", default="graph", help="`graph` (no code generated) or a torch.compile backend")
    parser.add_argument("--device", default="cpu")
    opts = parser.parse_args()

    from ssmcheck import api  # noqa: PLC0415

    plan = api.plan_drift("builtin", opts.preset, device=opts.device)  # before dynamo imports triton
    from torch._dynamo.utils import counters  # noqa: PLC0415

    from ssmcheck.drift import follow, lockstep  # noqa: PLC0415
    graphs = []

    def graph_as_it_is(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    backend = graph_as_it_is if opts.backend == "graph" else opts.backend
    traced = follow.unlimited(torch.compile(follow.follow, fullgraph=True, dynamic=False, backend=backend))
    calls: list[float] = []

    def timed(**arguments):
        start = time.perf_counter()
        try:
            return traced(**arguments)
        finally:
            calls.append(time.perf_counter() - start)

    follow._fast_steps = lambda: [("torch.compile", lambda: timed)]
    lockstep.Follower = lambda device: follow.Follower("cuda")  # compiled on any device
    traces = []
    for case in plan.cases[: opts.cases]:
        calls.clear()
        before, graphs_before = counters["stats"]["unique_graphs"], len(graphs)
        plan.runner(replace(case, steps=3, trials=1), lambda: None)
        new = counters["stats"]["unique_graphs"] > before
        operations = sum(1 for g in graphs[graphs_before:] for n in g.graph.nodes
                         if n.op in ("call_function", "call_method"))
        print(f"{case.id:55s} first call {calls[0]:6.3f} s  later calls {sum(calls[1:]):6.3f} s"
              + ("  traced" if new else "") + (f": {operations} operations" if operations else ""))
        if new:
            traces.append(calls[0])
    if traces:
        print(f"{len(traces)} traces: {sum(traces):.2f} s, {min(traces):.3f}-{max(traces):.3f} s each "
              f"(the first {traces[0]:.3f} s)")


if __name__ == "__main__":
    main()
