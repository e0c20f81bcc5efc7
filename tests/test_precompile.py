"""Compiling a sweep's Triton kernels ahead (core.precompile, scan.run.compile_ahead, api.run).

On the CPU the launches are Triton's own entry points with their originals replaced by recorders (the
interpreter compiles nothing), and the helper processes run stand-in runners; the GPU tests compile real
kernels, plain and autotuned, and check that nothing ran inside, and that a sweep's cases run after its
helpers compile nothing more."""

from __future__ import annotations

import math
import multiprocessing
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from triton.runtime import autotuner, jit

from ssmcheck import api
from ssmcheck.core import isolation, precompile, prestart
from ssmcheck.core.precompile import Launches, compile_only, compiling_ahead
from ssmcheck.drift.adapter import DriftAdapter
from ssmcheck.scan import run as scan_run
from ssmcheck.scan.adapter import ScanAdapter
from ssmcheck.scan.spec import ScanCase
from tests.pool_helpers import AheadRunner, GroupedAheadRunner, SlowAheadRunner


class _Recorded:
    """Stands in for JITFunction.run / Autotuner.run: records each call's warmup flag and keywords."""

    def __init__(self):
        self.calls = []

    def __call__(self, fn_self, *args, **kwargs):
        self.calls.append((fn_self, args, kwargs))
        return "ran"


@pytest.fixture
def recorded(monkeypatch):
    run, tune = _Recorded(), _Recorded()
    monkeypatch.setattr(jit.JITFunction, "run", run)
    monkeypatch.setattr(autotuner.Autotuner, "run", tune)
    return run, tune


def test_launches_inside_are_warmups_and_the_originals_come_back(recorded):
    run, tune = recorded
    assert not compiling_ahead()
    with compile_only(2) as launches:
        assert launches.supported and compiling_ahead()
        jit.JITFunction.run("kernel", 1, 2, grid=(4,), warmup=False, BLOCK=16)
        jit.JITFunction.run("kernel", 3, grid=(4,), warmup=False)
    assert launches.count == 2
    assert [c[2]["warmup"] for c in run.calls] == [True, True]
    assert run.calls[0][1] == (1, 2) and run.calls[0][2]["BLOCK"] == 16 and run.calls[0][2]["grid"] == (4,)
    assert jit.JITFunction.run is run and autotuner.Autotuner.run is tune and not compiling_ahead()
    jit.JITFunction.run("kernel", grid=(1,), warmup=False)  # outside: launched as asked
    assert run.calls[-1][2]["warmup"] is False


def test_an_autotuned_launch_inside_warms_up_every_config_without_benchmarking(recorded):
    _, tune = recorded
    warmed = []

    class Tuner:
        configs = ["first"]

        def warmup(self, *args, **kwargs):
            warmed.append((args, kwargs))

    with compile_only(2):
        autotuner.Autotuner.run(Tuner(), "x", grid=(2,), warmup=False, N=8)
    assert warmed == [(("x",), {"grid": (2,), "N": 8})]  # Autotuner.warmup adds warmup=True itself
    assert tune.calls == []  # the autotuner's own run (which benchmarks) never ran


def test_an_autotuner_without_a_choice_gets_its_first_config_for_the_host_code_after_it(recorded):
    class Tuner:
        configs = ["first", "second"]

        def warmup(self, *args, **kwargs):
            return []

    fresh, chosen = Tuner(), Tuner()
    chosen.best_config = "second"  # chosen by an earlier real call
    with compile_only(2):
        for tuner in (fresh, chosen):
            autotuner.Autotuner.run(tuner, grid=(1,), warmup=False)
    assert fresh.best_config == "first" and chosen.best_config == "second"


def test_an_error_inside_restores_the_launches_and_propagates(recorded):
    run, tune = recorded
    with pytest.raises(KeyboardInterrupt), compile_only(2):
        raise KeyboardInterrupt
    assert jit.JITFunction.run is run and autotuner.Autotuner.run is tune and not compiling_ahead()


def test_without_async_compilation_nothing_is_patched(recorded, monkeypatch):
    import triton.runtime._async_compile as async_compile  # noqa: PLC0415

    monkeypatch.delattr(async_compile, "AsyncCompileMode")
    run, _ = recorded
    with compile_only(2) as launches:
        assert not launches.supported and jit.JITFunction.run is run and not compiling_ahead()


def test_the_pool_times_each_compilation():
    launches = Launches(supported=True)
    with precompile._TimedPool(2, launches) as pool:
        futures = [pool.submit(time.sleep, 0.0), pool.submit(time.sleep, 0.15)]
    assert [f.result() for f in futures] == [None, None]
    assert launches.compilations[0] < precompile.CACHED_SECONDS <= launches.compilations[1]


def test_the_pool_makes_each_compiled_variants_launcher_and_leaves_a_failure_to_the_sweep():
    class Compiled:  # stands in for Triton's CompiledKernel
        def __init__(self, fails):
            self.fails, self.made = fails, False

        def _init_handles(self):
            self.made = True
            if self.fails:
                raise RuntimeError("out of resources")

    launches = Launches(supported=True)
    with precompile._TimedPool(2, launches) as pool:
        futures = [pool.submit(Compiled, fails) for fails in (False, True)]
    kernels = [f.result() for f in futures]
    assert [k.made for k in kernels] == [True, True] and [k.fails for k in kernels] == [False, True]


@pytest.mark.parametrize(("compilations", "calls", "warm"), [
    ([0.01, 0.02, 0.01], [1, 1, 2, 3], True),  # a call that compiled nothing (its variants in memory) is warm too
    ([0.01, 0.02, 0.01, 0.5], [1, 1, 2, 3, 4], True),  # only the first WARM_CALLS calls are judged
    ([0.01, 0.5, 0.01], [1, 1, 2, 3], False),  # one compiled: the cache is not warm
    ([0.01, None, 0.01], [1, 1, 2, 3], False),  # one not finished yet: not known
    ([0.01, 0.01], [1, 2], False),  # too few calls
])
def test_the_cache_is_warm_when_the_first_calls_compiled_nothing(compilations, calls, warm):
    assert precompile.WARM_CALLS == 4
    launches = Launches(supported=True, count=5, compilations=compilations, calls=calls)
    assert launches.cache_warm() is warm
    record = launches.record(1.5)
    assert record["cache_warm"] is warm and record["launches"] == 5 and record["seconds"] == 1.5
    assert record["compiled"] == sum(s is not None and s >= precompile.CACHED_SECONDS for s in compilations)


def test_records_of_several_processes_combine():
    one = Launches(supported=True, count=3, compilations=[0.5, 0.01], calls=[1, 2, 2, 2]).record(2.0)
    two = Launches(supported=True, count=4, compilations=[0.01] * 4, calls=[1, 2, 3, 4]).record(1.0)
    assert precompile.combined([one, None, two]) == {
        "seconds": 2.0, "launches": 7, "compilations": 6, "compiled": 1, "processes": 2, "cache_warm": False}
    assert precompile.combined([two, two], sum)["seconds"] == 2.0 and precompile.combined([two])["cache_warm"]
    assert precompile.combined([None]) is None


# ---------------------------------------------------------------------------- compile_ahead: which calls


@dataclass
class _Inputs:
    x: torch.Tensor
    B: torch.Tensor
    D: torch.Tensor | None
    z: torch.Tensor | None
    varlen: bool = False
    initial_states: torch.Tensor | None = None
    pad_after: torch.Tensor | None = None

    @property
    def nsequences(self) -> int:
        return 2 if self.varlen else 1

    def to(self, device):
        return self


class _Kernel:
    """A kernel adapter whose calls are recorded; `launches` Triton launches a call (through core.precompile's
    counter), and `fails` the case ids whose call raises."""

    name = "fake"

    def __init__(self, launches: int = 1, fails=()):
        self.per_call, self.fails, self.calls = launches, set(fails), []
        self.compile_seconds = 0.5  # a cold cache's
        self.counter: Launches | None = None

    def skip_reason(self, case):
        return "skipped by the kernel" if case.seqlen == 13 else None

    def cached_inputs(self, inputs, case):
        return inputs

    def call(self, inputs, case, transcript):
        self.calls.append(("call", _name(case)))
        self.counter.count += self.per_call
        self.counter.compilations += [self.compile_seconds] * self.per_call
        if _name(case) in self.fails:
            raise RuntimeError("boom")

    def call_y(self, inputs, case, transcript):
        # without D and z: the SSM part's call; with them: the call for y alone (scan.run.judges_y_alone)
        self.calls.append(("call_y" if inputs.D is None and inputs.z is None else "y_alone", _name(case)))

    def call_both(self, inputs, case, transcript):  # the call with both return flags (scan.run.judges_both_flags)
        self.calls.append(("both", _name(case)))


@pytest.fixture
def ahead(monkeypatch):
    """compile_ahead over fake cases and inputs (each case's seqlen its x's length; D only where headdim is 4)."""

    kernel = _Kernel()

    @contextmanager
    def counting(threads):
        kernel.counter = Launches(supported=True)
        yield kernel.counter

    class Regime:
        def generate(self, shape, dtype, seed, state_dtype):
            x = torch.randn(shape.seqlen, shape.headdim, generator=torch.Generator().manual_seed(seed))
            # packed sequences where batch > 1
            return _Inputs(x, x[:, :1], torch.ones(1) if shape.headdim == 4 else None, None, varlen=shape.batch > 1)

    monkeypatch.setattr(scan_run, "compile_only", counting)
    monkeypatch.setattr(scan_run, "REGIMES", {"normal": Regime(), "dt-extreme": Regime()})
    monkeypatch.setattr(scan_run, "_shape_key", lambda k, inputs, case: (tuple(inputs.x.shape), inputs.D is None))
    return kernel


def _case(seqlen, headdim=8, seed=1, regime="normal", dtype="fp32", batch=1, chunk_size=16):
    return ScanCase(kernel="fake", regime=regime, dtype=dtype, chunk_size=chunk_size, seqlen=seqlen, batch=batch, nheads=1,
                    headdim=headdim, dstate=4, ngroups=1, state_dtype="fp32", rounding="nearest", model=None, seed=seed)


def _name(case):
    return f"c{case.seqlen}-{case.headdim}-{case.seed}"


def test_one_call_per_regime_and_shape_and_the_ssm_part_where_d_or_z(ahead):
    cases = [_case(40), _case(40, seed=2), _case(13), _case(24, headdim=4), _case(40, seed=3, regime="dt-extreme")]
    launches = scan_run.compile_ahead(ahead, cases, lambda case: {}, "cpu", 2)
    # (a regime sets the call's flags: another regime of the same shapes is another call)
    assert ahead.calls == [("call", "c40-8-1"), ("call", "c24-4-1"), ("call_y", "c24-4-1"), ("call", "c40-8-3")]
    assert launches.count == 3


def test_the_calls_for_y_alone_and_with_both_flags_are_compiled_where_their_cases_make_them(ahead):
    # bf16 with packed sequences and D: the cases call for y alone too, and with both return flags at chunk 64; fp32,
    # or one row, they do not
    cases = [_case(40, headdim=4, dtype="bf16", batch=2), _case(48, headdim=4, dtype="bf16", batch=2, chunk_size=64),
             _case(24, headdim=4, dtype="fp32", batch=2), _case(32, headdim=4, dtype="bf16")]
    scan_run.compile_ahead(ahead, cases, lambda case: {}, "cpu", 2)
    assert ahead.calls == [("call", "c40-4-1"), ("call_y", "c40-4-1"), ("y_alone", "c40-4-1"), ("call", "c48-4-1"),
                           ("call_y", "c48-4-1"), ("y_alone", "c48-4-1"), ("both", "c48-4-1"), ("call", "c24-4-1"),
                           ("call_y", "c24-4-1"), ("call", "c32-4-1"), ("call_y", "c32-4-1")]


def test_a_call_that_raises_is_left_to_its_case(ahead):
    ahead.fails = {"c40-8-1"}
    scan_run.compile_ahead(ahead, [_case(40), _case(24)], lambda case: {}, "cpu", 2)
    assert ahead.calls == [("call", "c40-8-1"), ("call", "c24-8-1")]


def test_a_kernel_that_launches_nothing_through_triton_is_called_once(ahead):
    ahead.per_call = 0
    launches = scan_run.compile_ahead(ahead, [_case(40), _case(24), _case(32)], lambda case: {}, "cpu", 2)
    assert ahead.calls == [("call", "c40-8-1")] and launches.count == 0


def test_the_pass_stops_once_the_first_calls_find_the_cache_warm(ahead):
    cases = [_case(16 * i + 1) for i in range(1, 9)]
    ahead.compile_seconds = 0.01
    launches = scan_run.compile_ahead(ahead, cases, lambda case: {}, "cpu", 2)
    assert len(ahead.calls) == precompile.WARM_CALLS and launches.cache_warm()


def test_a_cold_cache_is_compiled_ahead_to_the_end(ahead):
    cases = [_case(16 * i + 1) for i in range(1, 9)]
    launches = scan_run.compile_ahead(ahead, cases, lambda case: {}, "cpu", 2)
    assert len(ahead.calls) == 8 and not launches.cache_warm() and launches.record(0.0)["compiled"] == 8


def _record_calls(monkeypatch, computed: bool) -> set:
    """The signatures of the chunk-scan and state-update calls made from now on (shape, varlen, initial
    states, D, z; the state's shape and dtype). Not `computed`: each call's outputs come back NaN, as a
    compile-only call leaves the outputs it poisoned."""
    seen = set()
    call, update = ScanAdapter.call, DriftAdapter.update

    def scan_call(self, inputs, case, transcript, nan_fences=None):
        seen.add(("scan", tuple(inputs.x.shape), inputs.varlen, inputs.initial_states is None, inputs.D is None,
                  inputs.z is None))
        out = call(self, inputs, case, transcript, nan_fences)
        return out if computed else tuple(t.fill_(math.nan) for t in out)

    def decode(self, state, arguments, *rest):
        seen.add(("decode", tuple(state.shape), state.dtype))
        out = update(self, state, arguments, *rest)
        return out if computed else out.fill_(math.nan)

    monkeypatch.setattr(ScanAdapter, "call", scan_call)
    monkeypatch.setattr(DriftAdapter, "update", decode)
    return seen


def test_the_invariance_checks_calls_are_made_ahead_as_the_case_makes_them(monkeypatch):
    """With --invariance a case also calls the kernel on a sequence alone, on a split's second part from the
    first part's states, and the state update: each call of the case has its like among compile_ahead's,
    although those compute nothing."""
    plan = api.plan_scan("builtin", "smoke", regime="ragged", dtype="fp32", invariance=True, device="cpu")
    runner, case = plan.runner, plan.cases[0]
    with monkeypatch.context() as patched:
        ran = _record_calls(patched, computed=True)
        result = runner(case, lambda: None)
    assert [check.status.value for check in result.invariance] == ["pass", "pass", "pass", "skipped"]
    assert any(s[0] == "decode" for s in ran) and any(s[0] == "scan" and not s[3] for s in ran)

    @contextmanager
    def counting(threads):
        yield Launches(supported=True, count=1)  # (the interpreter launches nothing through compile_only)

    monkeypatch.setattr(scan_run, "compile_only", counting)
    made = []
    for serving in (runner.serving(), None):
        with monkeypatch.context() as patched:
            made.append(_record_calls(patched, computed=False))
            scan_run.compile_ahead(runner.adapter(), [case], runner.pins, "cpu", 1, serving, runner.tolerance)
    with_checks, without = made
    assert with_checks == ran
    assert len(without) == 1 and without < ran  # the case's own call alone


# ---------------------------------------------------------------------------- helper processes, api.run


def _as_on_a_gpu(plan):
    """The plan as api.run sees a GPU's (its cases still run on the CPU): only there does it compile ahead."""
    return replace(plan, env=replace(plan.env, device="cuda", interpreter=False))


def test_helpers_compile_contiguous_slices_and_give_their_records_when_waited_for():
    cases = [f"case {i}" for i in range(5)]
    helpers = isolation.CompilingHelpers(AheadRunner(), cases, helpers=2, threads=3)
    assert len(helpers.workers) == 2
    records = helpers.wait()
    assert [r["launches"] for r in records] == [30, 20] and all(r["processes"] == 1 for r in records)
    assert multiprocessing.active_children() == []


def test_helpers_take_the_runners_compile_groups_whole():
    # Odd and even cases are the runner's two groups: one helper each, not the contiguous [1, 2] and [3, 4].
    helpers = isolation.CompilingHelpers(GroupedAheadRunner(), [1, 2, 3, 4], helpers=2, threads=1)
    assert sorted(r["launches"] for r in helpers.wait()) == [1 + 3, 2 + 4]


@given(st.lists(st.integers(0, 5), max_size=40), st.integers(1, 6))
def test_shares_hold_every_case_once_in_order_and_keep_groups_that_fit_whole(groups, parts):
    cases = list(enumerate(groups))  # (position, group)
    shares = isolation._shares(cases, parts, group=lambda case: case[1])
    assert sorted(c for share in shares for c in share) == cases
    assert len(shares) <= parts and bool(shares) == bool(cases) and all(share == sorted(share) and share for share in shares)
    fair = -(-len(cases) // parts) if cases else 0
    for g in set(groups):
        members = [share for share in shares if any(c[1] == g for c in share)]
        if groups.count(g) <= fair:
            assert len(members) == 1, f"group {g} ({groups.count(g)} cases, shares of {fair}) was cut: {shares}"
    assert isolation._shares(cases, parts) == [cases[i:i + fair] for i in range(0, len(cases), fair or 1)]


@given(st.lists(st.integers(0, 5), max_size=40))
def test_interleaved_takes_one_case_of_each_group_in_turn_each_groups_in_order(groups):
    cases = list(enumerate(groups))  # (position, group)
    order = isolation.interleaved(cases, group=lambda case: case[1])
    assert sorted(order) == cases
    for g in set(groups):
        assert [c for c in order if c[1] == g] == [c for c in cases if c[1] == g]
    rounds = [[c for c in cases if c[1] == g].index(c) for c in order for g in [c[1]]]  # each case's turn
    assert rounds == sorted(rounds)
    first = order[:len(set(groups))]
    assert len({c[1] for c in first}) == len(first)  # the first cases: as many groups as there are cases
    assert isolation.interleaved(cases) == cases


def test_workers_and_their_helpers_take_the_compile_groups_in_turn(monkeypatch):
    # Two seqlens of each dtype, which the sweep orders one dtype after the other.
    plan = api.plan_scan("torch", "smoke", regime="normal", dtype="fp32,fp16", seqlen="40,41")
    taken = []
    monkeypatch.setattr(api, "start_compiling_ahead", lambda plan, cases, running=1: taken.append(
        [c.id for c in cases]))
    run_isolated = isolation.run_isolated

    def recorded(runner, cases, *args):
        taken.append([c.id for c in cases])
        return run_isolated(runner, cases, *args)

    monkeypatch.setattr(isolation, "run_isolated", recorded)
    report = api.run(plan, workers=2)
    assert report.summary["pass"] == 4
    assert [c.id for c in plan.cases] == ["normal-fp32-c16-L40-b2-h2x8n8g1", "normal-fp32-c16-L41-b2-h2x8n8g1",
                                          "normal-fp16-c16-L40-b2-h2x8n8g1", "normal-fp16-c16-L41-b2-h2x8n8g1"]
    interleaved = [plan.cases[i].id for i in (0, 2, 1, 3)]
    assert taken == [interleaved, interleaved]
    taken.clear()
    api.run(plan)  # one process runs them in the sweep's order
    assert taken == [[c.id for c in plan.cases]]


def test_ending_the_helpers_kills_those_still_compiling_and_keeps_the_others_records():
    helpers = isolation.CompilingHelpers(AheadRunner(), ["a", "b"], helpers=1, threads=1)
    slow = isolation.CompilingHelpers(SlowAheadRunner(), ["c"], helpers=1, threads=1)
    deadline = time.monotonic() + 120
    while not helpers.workers[0].conn.poll() and time.monotonic() < deadline:  # its record is on its way
        time.sleep(0.05)
    start = time.monotonic()
    assert [r["launches"] for r in helpers.end()] == [20]
    assert slow.end() == [] and time.monotonic() - start < 30
    assert multiprocessing.active_children() == []


def test_a_runner_that_cannot_be_pickled_gets_no_helpers():
    assert isolation.CompilingHelpers(lambda case, advance: None, ["a", "b"], helpers=2, threads=1).workers == []
    plan = _as_on_a_gpu(api.plan_scan(lambda *args, **kwargs: None, "smoke", regime="normal", dtype="fp32"))
    assert api.start_compiling_ahead(plan, plan.cases) is None


UNGUARDED_SCRIPT = """
import sys
sys.path[:0] = {path!r}
from ssmcheck.core import isolation
from tests.pool_helpers import AheadRunner

print("the script ran", flush=True)


class ScriptRunner(AheadRunner):  # a kernel of the script's own
    pass


print("helpers for the script's runner:", len(isolation.CompilingHelpers(ScriptRunner(), ["a"], 1, 1).workers))
print("records:", [r["launches"] for r in isolation.CompilingHelpers(AheadRunner(), ["a", "b"], 1, 1).wait()])
results = isolation.run_isolated(AheadRunner(), ["c", "d"], 60, lambda: None, [None, None])
print("cases:", sorted(r[0] for r in results))
"""


def test_helpers_and_workers_started_from_a_script_without_a_main_guard_do_not_run_it_again(tmp_path):
    script = tmp_path / "sweep.py"
    script.write_text(UNGUARDED_SCRIPT.format(path=sys.path))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert (run.stdout + run.stderr).count("the script ran") == 1  # spawn would have run it in the helper too
    assert "helpers for the script's runner: 0" in run.stdout and "records: [20]" in run.stdout
    assert "cases: ['c', 'd']" in run.stdout


class _Started:
    """Stands in for core.isolation.CompilingHelpers: records what it was started with."""

    started: list = []

    def __init__(self, runner, cases, helpers, threads, running):
        self.workers = ["a helper"]
        _Started.started.append((len(cases), helpers, threads))


@pytest.mark.parametrize(("cores", "ranks", "running", "started"), [
    (16, 1, 1, (40 - 4, 3, 5)),  # 15 cores spared: 3 helpers of 5; this process keeps 40 // (1 + 3 x 3) cases
    (16, 1, 0, (40, 3, 5)),  # a harness waiting for the helpers keeps none, nor a core
    (16, 1, 4, (40 - 12, 3, 4)),  # four workers: 12 cores spared; 40 x 4 // (4 + 3 x 3) kept
    (16, 1, 8, (40 - 22, 2, 4)),  # eight workers: 8 cores, 2 helpers; 40 x 8 // (8 + 3 x 2) kept
    (8, 1, 1, (40 - 10, 1, 7)),  # one helper: 40 // (1 + 3) kept
    (4, 1, 1, None),  # too few cores to spare four: nothing ahead
    (4, 1, 0, (40, 1, 4)),  # (waited for: one helper, whatever the cores)
    (16, 4, 1, None),  # torchrun's four ranks on this machine: 4 cores each, none to spare
    (2, 1, 3, None),  # more workers than cores
])
def test_helpers_take_the_sweep_after_the_cases_this_process_keeps(monkeypatch, cores, ranks, running, started):
    monkeypatch.setattr(api, "cpu_cores", lambda: cores)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(ranks))
    monkeypatch.setattr(isolation, "CompilingHelpers", _Started)
    monkeypatch.setattr(_Started, "started", [])
    plan = _as_on_a_gpu(api.plan_scan("torch", "smoke", regime="normal", dtype="fp32"))
    helpers = api.start_compiling_ahead(plan, [plan.cases[0]] * 40, running)
    assert _Started.started == ([] if started is None else [started]) and (helpers is None) == (started is None)


@pytest.mark.parametrize(("running", "kept"), [(1, 0), (4, 12)])
def test_helpers_the_command_started_race_a_lone_process_from_the_first_case(monkeypatch, running, kept):
    monkeypatch.setattr(api, "cpu_cores", lambda: 16)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setattr(isolation, "CompilingHelpers", _Started)
    monkeypatch.setattr(_Started, "started", [])
    monkeypatch.setattr(prestart, "waiting", lambda device: 3 if device == "cuda" else 0)
    plan = _as_on_a_gpu(api.plan_scan("torch", "smoke", regime="normal", dtype="fp32"))
    api.start_compiling_ahead(plan, [plan.cases[0]] * 40, running)
    assert [started[0] for started in _Started.started] == [40 - kept]  # workers keep their share still


def test_helpers_leave_out_the_drift_groups_of_the_cases_this_process_keeps(monkeypatch):
    """Drift's compile groups are exact: this process compiles the groups of the cases it keeps, and the helpers
    compile every other group (a scan's groups are not, and its helpers take every case after those kept)."""
    from ssmcheck.drift.ahead import compile_group  # noqa: PLC0415

    given = []

    class Recording(_Started):
        def __init__(self, runner, cases, helpers, threads, running):
            super().__init__(runner, cases, helpers, threads, running)
            given.append(cases)

    monkeypatch.setattr(api, "cpu_cores", lambda: 16)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setattr(isolation, "CompilingHelpers", Recording)
    monkeypatch.setattr(_Started, "started", [])
    monkeypatch.setattr(prestart, "waiting", lambda device: 0)
    drift = _as_on_a_gpu(api.plan_drift("builtin", "default", device="cpu"))
    api.start_compiling_ahead(drift, drift.cases, 1)
    kept = len(drift.cases) // (1 + api.HELPER_PACE * 3)
    held = {compile_group(c) for c in drift.cases[:kept]}
    rest = drift.cases[kept:]
    assert kept == 5 and len(held) == 5
    assert given[0] == [c for c in rest if compile_group(c) not in held]
    assert 0 < len(given[0]) < len(rest)  # the default drift's stagnation, overflow, ... of the kept groups: left out
    assert {compile_group(c) for c in given[0]} == {compile_group(c) for c in rest} - held  # every other group
    scan = _as_on_a_gpu(api.plan_scan("torch", "smoke", regime="normal", dtype="fp32"))
    api.start_compiling_ahead(scan, [scan.cases[0]] * 40, 1)
    assert given[1] == [scan.cases[0]] * 36


def test_no_helpers_for_the_cpu_or_no_cases_but_for_a_gpus_scan_or_drift(monkeypatch):
    monkeypatch.setattr(isolation, "CompilingHelpers", _Started)
    monkeypatch.setattr(_Started, "started", [])
    cpu = api.plan_scan("torch", "smoke", regime="normal", dtype="fp32")
    drift = api.plan_drift("torch", "smoke")
    assert api.start_compiling_ahead(cpu, cpu.cases, 0) is None
    assert api.start_compiling_ahead(drift, drift.cases, 0) is None
    assert api.start_compiling_ahead(_as_on_a_gpu(cpu), [], 0) is None
    assert _Started.started == []
    assert api.start_compiling_ahead(_as_on_a_gpu(drift), drift.cases, 0) is not None
    assert api.start_compiling_ahead(_as_on_a_gpu(cpu), cpu.cases, 0) is not None
    assert [started[0] for started in _Started.started] == [len(drift.cases), len(cpu.cases)]


class _Helping:
    """Stands in for the helpers api.run starts: they finished with one record each."""

    def __init__(self):
        self.ended = False

    def end(self):
        self.ended = True
        return [Launches(supported=True, count=7, compilations=[0.5], calls=[1]).record(2.0)] * 2


@pytest.mark.parametrize(("options", "running"), [({}, 1), ({"compile_ahead": False}, None), ({"workers": 2}, 2),
                                                  ({"isolate": True}, 1)])
def test_the_run_ends_its_helpers_after_the_cases_and_reports_their_records(monkeypatch, options, running):
    helping, asked = _Helping(), []
    monkeypatch.setattr(api, "start_compiling_ahead", lambda plan, cases, running=1: asked.append(
        ([c.id for c in cases], running)) or helping)
    plan = api.plan_scan("torch", "smoke", regime="normal,ragged", dtype="fp32")
    report = api.run(plan, **options)
    assert report.summary["pass"] == 2
    if running:  # started with the processes that run the cases: this one, or the workers
        assert asked == [([c.id for c in plan.cases], running)] and helping.ended
        assert report.data["compiled_ahead"] == {"seconds": 2.0, "launches": 14, "compilations": 2, "compiled": 2,
                                                 "processes": 2, "cache_warm": False}
    else:
        assert asked == [] and report.data["compiled_ahead"] is None


def test_compile_ahead_through_the_api_waits_for_its_helpers(monkeypatch):
    monkeypatch.setattr(api, "cpu_cores", lambda: 2)  # one helper
    plan = _as_on_a_gpu(api.plan_scan("torch", "smoke", regime="normal,ragged", dtype="fp32"))
    record = api.compile_ahead(replace(plan, runner=AheadRunner()), plan.cases[1:])
    assert record["launches"] == 10 and record["processes"] == 1
    assert multiprocessing.active_children() == []
    assert api.compile_ahead(api.plan_scan("torch", "smoke", regime="normal", dtype="fp32")) is None  # the CPU


@pytest.mark.parametrize(("flag", "asked"), [((), True), (("--no-compile-ahead",), False)])
def test_the_cli_flag_reaches_the_run(monkeypatch, flag, asked):
    from cli_invoke import invoke  # noqa: PLC0415

    seen = []
    run = api.run

    def recording(plan, **options):
        seen.append(options["compile_ahead"])
        return run(plan, **options)

    monkeypatch.setattr(api, "run", recording)
    result, _ = invoke("scan", "--preset", "smoke", "--kernel", "torch", "--regime", "normal", "--dtype", "fp32",
                       "--quiet", *flag)
    assert result.exit_code == 0 and seen == [asked]


def test_the_api_takes_compile_ahead(monkeypatch):
    seen = []
    run = api.run
    monkeypatch.setattr(api, "run",
                        lambda plan, **options: seen.append(options["compile_ahead"]) or run(plan, **options))
    api.scan(kernel="torch", preset="smoke", regime="normal", dtype="fp32", compile_ahead=False)
    assert seen == [False]


def test_the_cpu_compiles_nothing_ahead():
    report = api.run(api.plan_scan("builtin", "smoke", regime="normal", dtype="fp32", device="cpu"))
    assert report.data["compiled_ahead"] is None and report.summary["pass"] == 1


# ---------------------------------------------------------------------------- on the GPU: real compilations


@pytest.mark.gpu
def test_a_kernel_compiled_ahead_ran_nothing_and_its_variants_are_compiled(monkeypatch, tmp_path):
    import triton  # noqa: PLC0415
    import triton.language as tl  # noqa: PLC0415

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))

    @triton.jit
    def double(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) * 2, mask=offsets < n)

    x = torch.randn(100, device="cuda")
    outs = {dtype: torch.full((100,), float("nan"), device="cuda", dtype=dtype)
            for dtype in (torch.float32, torch.float16)}
    with compile_only(4) as launches:
        for out in outs.values():
            double[(4,)](x, out, 100, BLOCK=32)
    torch.cuda.synchronize()
    assert launches.count == 2 and all(out.isnan().all() for out in outs.values())  # nothing ran
    assert len(launches.compilations) == 2 and None not in launches.compilations
    assert len(_cubins(tmp_path)) == 2  # on disk, for the sweep's process
    for out in outs.values():
        double[(4,)](x, out, 100, BLOCK=32)
        torch.testing.assert_close(out, (x * 2).to(out.dtype))


def _cubins(cache) -> set[str]:
    """The compiled kernels in Triton cache folder `cache`: a variant's cubin lies in a folder named by its hash, so one
    path per variant (the file name is the kernel's)."""
    return {str(p.relative_to(cache)) for p in cache.rglob("*.cubin")}


@pytest.mark.gpu
def test_the_smoke_drifts_cases_compile_nothing_its_helpers_did_not(monkeypatch, tmp_path):
    """As the scan's test below, for drift: its helpers rehearse each case (drift.ahead), so that the state update's
    Triton variants and the float64 step's (drift.follow_kernel) are on disk before the sweep, run then in a process
    of its own, adds none; nor does anyone compile torch.compile's float64 step (inductor's FX graph cache), the
    fallback for a Triton step that disagrees."""
    triton_cache, inductor_cache = tmp_path / "triton", tmp_path / "inductor"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(triton_cache))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor_cache))

    def cached():
        return (_cubins(triton_cache),
                {p.name for p in inductor_cache.rglob("*") if p.is_file() and "fxgraph" in p.parts})

    record = api.compile_ahead(api.plan_drift("builtin", "smoke", device="cuda"))
    kernels, graphs = cached()
    assert record["compiled"] > 0 and not record["cache_warm"] and not graphs
    assert any("_follow_kernel" in name for name in kernels) and any("state_update" in name for name in kernels)
    run = subprocess.run([sys.executable, "-m", "ssmcheck", "drift", "--preset", "smoke", "--quiet",
                          "--no-compile-ahead"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert run.returncode == 0, run.stdout + run.stderr
    assert cached() == (kernels, graphs)


@pytest.mark.gpu
def test_an_autotuned_kernel_compiled_ahead_has_every_config_and_its_first_for_a_choice():
    import triton  # noqa: PLC0415
    import triton.language as tl  # noqa: PLC0415

    @triton.autotune(configs=[triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64})], key=["n"])
    @triton.jit
    def triple(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) * 3, mask=offsets < n)

    x = torch.randn(100, device="cuda")
    out = torch.full_like(x, float("nan"))
    with compile_only(4):
        triple[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](x, out, 100)
    torch.cuda.synchronize()
    assert out.isnan().all() and triple.cache == {}  # nothing ran, nothing benchmarked
    assert triple.best_config is triple.configs[0]
    assert len(triple.fn.device_caches[torch.cuda.current_device()][0]) == 2


@pytest.mark.gpu
@pytest.mark.parametrize("invariance", [False, True])
def test_the_smoke_sweeps_cases_compile_nothing_its_helpers_did_not(monkeypatch, tmp_path, invariance):
    """The helpers of api.compile_ahead fill a fresh Triton cache; the smoke sweep, run then in a process of its
    own as a user runs it, adds no compiled kernel to it (every variant it launched was there), with the
    invariance checks' calls too (the state update's among them)."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # cold: the helpers compile the whole sweep
    record = api.compile_ahead(api.plan_scan("builtin", "smoke", device="cuda", invariance=invariance))
    compiled = _cubins(tmp_path)
    assert record["compiled"] > 0 and compiled and not record["cache_warm"]
    run = subprocess.run([sys.executable, "-m", "ssmcheck", "scan", "--preset", "smoke", "--quiet",
                          "--no-compile-ahead", *(["--invariance"] if invariance else [])],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert run.returncode == 0, run.stdout + run.stderr
    assert _cubins(tmp_path) == compiled
