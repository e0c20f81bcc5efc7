"""ssmcheck as a library: plan a command's sweep, run it, read its Report. The CLI is a thin layer over this.

    import ssmcheck

    report = ssmcheck.scan(kernel="my_kernels:chunk_scan", preset="smoke", dtype=["bf16"])
    assert report.exit_code == 0, [c.message for c in report.cases if c.status != "pass"]

`kernel` is a callable, a `MODULE:FUNCTION` or `path/to/file.py:FUNCTION` string, or a named kernel
(`builtin`, `torch`, `mamba_ssm`, `vllm`). The other keywords are the CLI's options, named as in a preset (`chunk_size`,
`seqlen`, `tol_factor`, ...): a sweep axis takes a list or comma-separated text. Nothing is printed,
and the only global state set is what `core.runtime` must (the interpreter switch, before triton is
imported) plus torch's generator seeds, which every case sets for kernels that draw from it.
Bad options raise `UsageError`, one line naming the option.
"""

from __future__ import annotations

import json
import types
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ssmcheck.core import prestart
from ssmcheck.core import ranks as launch
from ssmcheck.core.execution import Interrupted, execute
from ssmcheck.core.precompile import combined
from ssmcheck.core.report import build_report, json_safe
from ssmcheck.core.status import exit_code, summarize
from ssmcheck.core.workers import cpu_cores, rank_gpu
from ssmcheck.plan import (  # noqa: F401 (the API's planning half: ssmcheck.api.plan_scan, ...)
    DEFAULT_CASE_TIMEOUT,
    Plan,
    UsageError,
    check_case_timeout,
    check_workers,
    plan_drift,
    plan_scan,
)


@dataclass(frozen=True)
class CaseReport:
    id: str
    status: str  # pass, fail, nonfinite, error, skipped
    message: str
    params: dict
    error: dict | None  # the figures judged (scan: the "error" dict; drift: ratio and drift); None when not run
    data: dict  # the whole case, as the JSON report holds it


class Report:
    """The outcome of a sweep: the JSON report's data, with attribute access to its cases."""

    def __init__(self, data: dict, results: list):
        self.data = data
        self.results = results  # the result objects, for renderers
        self.cases = [_case_report(data["command"], case) for case in data["cases"]]

    @property
    def command(self) -> str:
        return self.data["command"]

    @property
    def summary(self) -> dict[str, int]:
        return self.data["summary"]

    @property
    def exit_code(self) -> int:
        return self.data["exit_code"]

    @property
    def interrupted(self) -> str | None:
        return self.data["interrupted_by"]

    def to_json(self) -> dict:
        """The report as `--json` writes it (NaN and Inf as strings)."""
        return json.loads(json.dumps(json_safe(self.data)))


def _case_report(command: str, case: dict) -> CaseReport:
    if command == "scan":
        error = None if case["error"]["y_max_rel"] is None else {**case["error"], "first_nonfinite": case["first_nonfinite"]}
    else:
        last = case["checkpoints"][-1] if case["checkpoints"] else None
        error = None if last is None else {
            "state_rel": last["state_rel"], "out_rel": last["out_rel"], "ratio": case["ratio"],
            "bias_z": case["bias_z"], "first_nonfinite": case["first_nonfinite"],
        }
    return CaseReport(case["id"], case["status"], case["message"], case["params"], error, case)


# ---------------------------------------------------------------------------- running


def run(plan: Plan, *, isolate: bool = False, case_timeout: float | None = None, workers: str | int | None = None,
        on_result: Callable[[object], None] = lambda result: None, advance: Callable[[], None] = lambda: None,
        compile_ahead: bool = True) -> Report:
    """Run the plan's cases (in a worker process with `isolate`, or in `workers` of them at once, where a case
    running past `case_timeout` seconds, default DEFAULT_CASE_TIMEOUT, is an error), handing each result to
    `on_result` as it finishes; the Report holds them in the plan's order whatever order they finished in.
    An interruption (SIGINT, SIGTERM, a closed stdout) ends the run early: the Report
    then holds the cases that finished, `interrupted` names what stopped it, and its exit code is
    the interruption's. Under torchrun (core.ranks) each rank runs its slice, and rank 0's Report holds
    every rank's cases. On a GPU, with `compile_ahead`, helper processes compile the
    Triton variants of the later cases while the first cases run (`start_compiling_ahead`, core.precompile). The
    report's `compiled_ahead` sums the records of the helpers that finished before the sweep did (a torchrun rank's
    own: rank 0 gathers no other rank's)."""
    devices = check_workers(workers, plan.env.device) or ([None] if isolate else None)
    timeout = check_case_timeout(devices is not None, case_timeout)
    ranks = launch.from_environment()
    ahead = _Ahead(compile_ahead)
    if ranks is None:
        outcome = execute(_results(plan, devices, timeout, advance, ahead), on_result)
    else:
        outcome = _run_ranked(plan, ranks, devices, timeout, advance, on_result, ahead)
    outcome.results = _in_sweep_order(outcome.results, plan.cases)
    statuses = [r.status for r in outcome.results]
    interrupted: Interrupted | None = outcome.interrupted
    code = interrupted.exit_code if interrupted else int(exit_code(statuses, plan.settings.fail_on))
    data = build_report(plan.command, plan.env, [plan.case_json(r) for r in outcome.results], summarize(statuses),
                        code, interrupted.reason if interrupted else None)
    data["settings"] = plan.report_settings
    data["seconds"] = outcome.seconds
    data["compiled_ahead"] = combined(ahead.records)
    if plan.shard is not None:
        data["shard"] = plan.shard
    if ranks is not None:
        data["ranks"] = ranks.world_size
    return Report(data, outcome.results)


@dataclass
class _Ahead:
    """Whether to compile ahead, and the helper processes' records (core.precompile's Launches.record)."""

    enabled: bool
    records: list = field(default_factory=list)


def _results(plan: Plan, devices: list | None, timeout: float | None, advance: Callable[[], None], ahead: _Ahead):
    running = 1 if devices is None else len(devices)  # the processes running the cases: this one, or its workers
    cases = plan.cases
    if running > 1:  # (the helpers compile ahead in the order the workers take the cases)
        from ssmcheck.core.isolation import interleaved  # noqa: PLC0415 (multiprocessing only when asked)

        cases = interleaved(cases, getattr(plan.runner, "compile_group", None))
    helpers = None
    if ahead.enabled:
        helpers = start_compiling_ahead(plan, cases, running)
    else:  # no helper will be given work: any the command started (core.prestart) end now, not at exit
        prestart.dismiss()
    try:
        if devices is not None:
            from ssmcheck.core.isolation import run_isolated  # noqa: PLC0415 (multiprocessing only when asked)

            yield from run_isolated(plan.runner, cases, timeout, advance, devices)
        else:
            # A runner that can begin the next case's host work while one runs (DriftRunner.prepare) is told it.
            prepare = getattr(plan.runner, "prepare", lambda case: None)
            for case, following in zip(cases, [*cases[1:], None]):
                if following is not None:
                    prepare(following)
                yield plan.runner(case, advance)
    finally:
        if helpers is not None:
            ahead.records += helpers.end()


def compile_ahead(plan: Plan, cases: list | None = None) -> dict | None:
    """Compile the Triton kernels that `cases` (default: all the plan's) will launch, in helper processes, and
    wait for them (the README's "Compiling ahead"; `run` does it by itself, alongside the cases): the JSON report's
    `compiled_ahead` record, None where nothing was compiled ahead (the CPU; a kernel that cannot be pickled)."""
    helpers = start_compiling_ahead(plan, plan.cases if cases is None else cases, running=0)
    return None if helpers is None else combined(helpers.wait())


# How many times faster a helper compiles than a process running the cases at their first launches, one variant
# after another (four threads: 3.2x for the default scan; benchmarks/RESULTS.md, thirtieth session): the share of
# the sweep such processes keep.
HELPER_PACE = 3


def start_compiling_ahead(plan: Plan, cases: list, running: int = 1):
    """Start processes that compile the cases' Triton variants ahead into Triton's disk cache
    (core.isolation.CompilingHelpers); None where none compile: not a GPU's plan (the CPU's interpreter compiles
    nothing), a runner without `precompile`, no cases, or a machine too small to spare prestart.CORES_PER_COMPILER cores.

    `running` processes run the cases meanwhile, in their order (this one, a harness running them one by one as
    the pytest plugin does, or workers), each with a core of its own. They keep the first cases, compiling them as
    they come while the helpers start up and, HELPER_PACE times faster each, compile the rest. But one process whose
    helpers the command started before it imported torch (core.prestart), ready as the sweep starts, keeps none:
    they race it through its first cases too, compiling a case's variants several at a time where it compiles them
    one after another at their first launches (on a fresh H200 the default scan's first case waited 3.2 s for its
    variants where it waited 4.3-5.9 s keeping 7 cases; benchmarks/RESULTS.md, "fewer variants"). Helpers started
    here come up seconds later, when it has compiled its first cases, and one whose first calls all find the cache
    warm stops (core.precompile). With none running, the caller waits for the helpers (`wait()`); else `end()`
    once the cases have run gives the records."""
    try:
        compiles = plan.env.device == "cuda" and not plan.env.interpreter and hasattr(plan.runner, "precompile")
        if not compiles or not cases:
            return None
        from ssmcheck.core.isolation import CompilingHelpers  # noqa: PLC0415 (multiprocessing only when it compiles)

        cores = _cores()
        helpers = prestart.helper_count(cores, running)
        if not running:  # (waited for: one helper at least, whatever the cores)
            helpers = max(1, helpers)
        if not helpers:
            return None
        if running == 1 and prestart.waiting(plan.env.device):
            kept = 0
        else:  # (fewer than all: the helpers' share is not 0)
            kept = len(cases) * running // (running + HELPER_PACE * helpers)
        threads = max(prestart.CORES_PER_COMPILER, (cores - running) // helpers)
        helping = CompilingHelpers(plan.runner, _left_to_helpers(plan.runner, cases, kept), helpers, threads, running)
        return helping if helping.workers else None
    finally:
        prestart.dismiss()  # the helpers the command started and this sweep did not take (core.prestart)


def _left_to_helpers(runner, cases: list, kept: int) -> list:
    """The cases the helpers compile ahead: those after the first `kept`, which the processes running the cases
    compile as they come. Where a runner's compile groups are exact (`groups_exact`: a case compiles nothing its
    group's first case did not, as drift's float64 step and state update), also without the cases of the kept
    cases' groups, which those processes compile then: a helper would compile them again, for nothing."""
    if not kept or not getattr(runner, "groups_exact", False):
        return cases[kept:]
    held = {runner.compile_group(case) for case in cases[:kept]}
    return [case for case in cases[kept:] if runner.compile_group(case) not in held]


def _cores() -> int:
    """The cores this process may use: its share where a launcher started several ranks here."""
    return launch.rank_cores(cpu_cores())


def _run_ranked(plan: Plan, ranks: launch.Ranks, devices, timeout, advance, on_result, ahead: _Ahead):
    """A torchrun rank's run (core.ranks): its slice of the sweep; rank 0 then gathers the other ranks'
    results, the others send theirs."""
    if devices is not None and plan.env.device == "cuda":  # --isolate: the worker runs on the rank's GPU
        devices = [rank_gpu(ranks.local_rank)]
    waited = launch.gather_timeout()
    store = launch.connect(waited)
    mine = replace(plan, cases=ranks.shard.take(plan.cases))
    if not ranks.leads:
        outcome = execute(_results(mine, devices, timeout, advance, ahead), on_result)
        launch.send(store, ranks, outcome.results, outcome.interrupted.reason if outcome.interrupted else None)
        return outcome

    def lost(case, why: str):
        return plan.runner.failed(case, why, 0.0)

    def everything():
        yield from _results(mine, devices, timeout, advance, ahead)
        yield from launch.gather(store, ranks, plan.cases, lost, waited)

    return execute(everything(), on_result)


def _in_sweep_order(results: list, cases: list) -> list:
    """The results in their cases' order in the sweep (workers finish them in any order)."""
    position: dict[str, int] = {}
    for i, case in enumerate(cases):
        position.setdefault(case.id, i)
    return sorted(results, key=lambda result: position[result.case.id])


def scan(kernel: str | Callable = "builtin", preset: str | None = None, *, device: str | None = None,
         case: str | None = None, isolate: bool = False, case_timeout: float | None = None,
         workers: str | int | None = None, compile_ahead: bool = True, **options) -> Report:
    """Run a chunk-scan sweep and return its Report (see the module docstring). Ctrl-C raises
    KeyboardInterrupt after the running case, as any library call would. `compile_ahead=False` is the CLI's
    --no-compile-ahead."""
    plan = plan_scan(kernel, preset, device=device, case=case, **options)
    return _interruptible(run(plan, isolate=isolate, case_timeout=case_timeout, workers=workers,
                              compile_ahead=compile_ahead))


def drift(kernel: str | Callable = "builtin", preset: str | None = None, *, device: str | None = None,
          case: str | None = None, isolate: bool = False, case_timeout: float | None = None,
          workers: str | int | None = None, compile_ahead: bool = True, **options) -> Report:
    """Run a decode-drift sweep and return its Report (see the module docstring). `compile_ahead=False` is the
    CLI's --no-compile-ahead."""
    plan = plan_drift(kernel, preset, device=device, case=case, **options)
    return _interruptible(run(plan, isolate=isolate, case_timeout=case_timeout, workers=workers,
                              compile_ahead=compile_ahead))


def _interruptible(report: Report) -> Report:
    if report.interrupted == "SIGINT":
        raise KeyboardInterrupt
    if report.interrupted == "SIGTERM":
        raise SystemExit(report.exit_code)
    return report


class CommandPackage(types.ModuleType):
    """The class of the command packages `ssmcheck.scan` and `ssmcheck.drift`: calling one runs its
    command, so `ssmcheck.scan(...)` is `ssmcheck.api.scan(...)` while `ssmcheck.scan.spec` and the
    other stage modules stay where they are."""

    def __call__(self, *args, **kwargs) -> Report:
        return _COMMANDS[self.__name__.rpartition(".")[2]](*args, **kwargs)


_COMMANDS = {"scan": scan, "drift": drift}
