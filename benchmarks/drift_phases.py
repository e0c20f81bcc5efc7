"""Where a drift sweep's own process spends each case: seconds per phase, case by case.

Runs `ssmcheck drift` (the command line after `--`) in this process, as the console entry does (its compiling
helpers started first, core.prestart), with a timer around each phase of a case: drawing the problem, the step
window's loads, the trial's set-up, the first step's check of the compiled float64 step, the CUDA graph's capture,
the checkpoints' measurements, a localisation, the slot and independence checks. On a GPU each timed call is
bracketed by device synchronisations, so a phase's seconds hold its device work too (and the steps between them
are timed as "other"). Phases nest (a graph's capture runs a step): each phase's figure is inclusive, and "other"
is the case less its outermost phases. The helpers are not timed. E.g., on the GPU machine:

    PYTHONPATH=. python benchmarks/drift_phases.py -- drift --preset default -q

Prints one JSON line per case (`case`, `seconds`, and per phase its seconds and calls), then each phase's total
over the sweep; appends the totals to benchmarks/RESULTS.md (or --results PATH) with --record.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import sys
import time
from types import SimpleNamespace

from record import append_section, commit, markdown_table

# (module, attribute path, phase): where each phase is looked up when called. Module-level functions are patched
# in the module that calls them.
PHASES = [
    ("ssmcheck.drift.run", "make_problem", "draw the problem"),
    ("ssmcheck.drift.lockstep", "StepWindow.__init__", "step window"),
    ("ssmcheck.drift.lockstep", "StepWindow.load", "step window"),
    ("ssmcheck.drift.lockstep", "Lockstep.__init__", "trial set-up"),
    ("ssmcheck.drift.follow", "Follower._choose", "float64 step chosen and checked"),
    ("ssmcheck.drift.lockstep", "Lockstep.try_graph", "graph capture"),
    ("ssmcheck.drift.run", "_measure", "checkpoint measurements"),
    ("ssmcheck.drift.run", "_localise", "localisation"),
    ("ssmcheck.drift.slots", "run_check", "slot check"),
    ("ssmcheck.drift.independence", "run_check", "independence check"),
]


class Phases:
    """Seconds and calls per phase of the case being run."""

    def __init__(self, synchronise):
        self.synchronise = synchronise
        self.seconds: collections.Counter = collections.Counter()
        self.calls: collections.Counter = collections.Counter()
        self.outermost = 0.0  # seconds in phases called inside no other
        self.depth = 0

    def timed(self, phase: str, fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            self.synchronise()
            start = time.perf_counter()
            self.depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth -= 1
                self.synchronise()
                seconds = time.perf_counter() - start
                self.seconds[phase] += seconds
                self.calls[phase] += 1
                if self.depth == 0:
                    self.outermost += seconds

        return run


def patch(phases: Phases) -> None:
    import importlib  # noqa: PLC0415

    for module_name, path, phase in PHASES:
        owner = importlib.import_module(module_name)
        *outer, name = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        raw = owner.__dict__[name]
        if isinstance(raw, staticmethod):
            setattr(owner, name, staticmethod(phases.timed(phase, raw.__func__)))
        else:
            setattr(owner, name, phases.timed(phase, raw))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", action="store_true", help="append the totals to --results")
    parser.add_argument("--results", default="benchmarks/RESULTS.md")
    parser.add_argument("--commit", help="the commit measured (where the machine has no .git)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the ssmcheck drift command line")
    opts = parser.parse_args()
    argv = opts.command[1:] if opts.command[:1] == ["--"] else opts.command
    if argv[:1] != ["drift"]:
        raise SystemExit("give the drift command after --, e.g. -- drift --preset default -q")

    from ssmcheck.core import prestart  # noqa: PLC0415 (before torch: the helpers import beside this process)

    prestart.for_command(argv)
    import torch  # noqa: PLC0415

    from ssmcheck.drift import run as drift_run  # noqa: PLC0415

    gpu = torch.cuda.is_available() and "cpu" not in argv
    phases = Phases(torch.cuda.synchronize if gpu else lambda: None)
    patch(phases)
    totals: collections.Counter = collections.Counter()
    case_call = drift_run.DriftRunner.__call__
    sweep_start = time.perf_counter()

    def timed_case(self, case, advance):
        phases.seconds.clear()
        phases.calls.clear()
        phases.outermost = 0.0
        start = time.perf_counter()
        result = case_call(self, case, advance)
        seconds = time.perf_counter() - start
        inside = phases.outermost
        line = {"case": case.id, "seconds": round(seconds, 3), "status": result.status.value,
                **{p: [round(s, 3), phases.calls[p]] for p, s in phases.seconds.items()},
                "other": round(seconds - inside, 3)}
        print(json.dumps(line), file=sys.stderr, flush=True)
        totals.update(phases.seconds)
        totals["other"] += seconds - inside
        totals["cases"] += seconds
        return result

    drift_run.DriftRunner.__call__ = timed_case
    from ssmcheck.cli import app  # noqa: PLC0415

    try:
        app(argv, standalone_mode=False)
    except SystemExit:
        pass
    wall = time.perf_counter() - sweep_start
    body = [[phase, f"{seconds:.2f} s"] for phase, seconds in totals.most_common()]
    body.append(["sweep (this process, from the CLI's start)", f"{wall:.2f} s"])
    text = markdown_table(["phase (inclusive)", "seconds"], body)
    print(text)
    if opts.record:
        env = SimpleNamespace(gpu=torch.cuda.get_device_name() if gpu else None, device="cuda" if gpu else "cpu",
                              torch=torch.__version__, triton=__import__("triton").__version__)
        append_section(opts.results, "a drift sweep's phases, in its own process", env, commit(opts.commit),
                       [f"ssmcheck command: `{' '.join(argv)}`"], text)


if __name__ == "__main__":
    main()
