"""Compiling a sweep's Triton kernels ahead (core.precompile, scan.run.compile_ahead, api.run).

On the CPU the launches are Triton's own entry points with their originals replaced by recorders (the
interpreter compiles nothing); the GPU tests compile real kernels, plain and autotuned, and check that
nothing ran inside and everything was compiled on leaving."""

from __future__ import annotations

import multiprocessing
import threading
import time
from dataclasses import dataclass, replace

import pytest
import torch
from triton.runtime import autotuner, jit

from ssmcheck import api
from ssmcheck.core import isolation, precompile
from ssmcheck.core.isolation import run_isolated
from ssmcheck.core.precompile import Launches, compile_only
from ssmcheck.scan import run as scan_run
from ssmcheck.scan.spec import ScanCase
from tests.pool_helpers import AheadRunner, SpreadingRunner


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
    with compile_only(2) as launches:
        assert launches.supported
        jit.JITFunction.run("kernel", 1, 2, grid=(4,), warmup=False, BLOCK=16)
        jit.JITFunction.run("kernel", 3, grid=(4,), warmup=False)
    assert launches.count == 2
    assert [c[2]["warmup"] for c in run.calls] == [True, True]
    assert run.calls[0][1] == (1, 2) and run.calls[0][2]["BLOCK"] == 16 and run.calls[0][2]["grid"] == (4,)
    assert jit.JITFunction.run is run and autotuner.Autotuner.run is tune
    jit.JITFunction.run("kernel", grid=(1,), warmup=False)  # outside: launched as asked
    assert run.calls[-1][2]["warmup"] is False


def test_an_autotuned_launch_inside_warms_up_every_config_without_benchmarking(recorded):
    _, tune = recorded
    warmed = []

    class Tuner:
        def warmup(self, *args, **kwargs):
            warmed.append((args, kwargs))

    with compile_only(2):
        autotuner.Autotuner.run(Tuner(), "x", grid=(2,), warmup=False, N=8)
    assert warmed == [(("x",), {"grid": (2,), "N": 8})]  # Autotuner.warmup adds warmup=True itself
    assert tune.calls == []  # the autotuner's own run (which benchmarks) never ran


def test_another_threads_launches_run_as_usual(recorded):
    run, _ = recorded
    with compile_only(2) as launches:
        other = threading.Thread(target=lambda: jit.JITFunction.run("kernel", grid=(1,), warmup=False))
        other.start()
        other.join()
    assert launches.count == 0 and run.calls[0][2]["warmup"] is False


def test_an_error_inside_restores_the_launches_and_propagates(recorded):
    run, tune = recorded
    with pytest.raises(KeyboardInterrupt), compile_only(2):
        raise KeyboardInterrupt
    assert jit.JITFunction.run is run and autotuner.Autotuner.run is tune


def test_leaving_settles_the_placeholders_of_compilations_left_over(recorded):
    from concurrent.futures import Future  # noqa: PLC0415

    from triton.runtime._async_compile import FutureKernel  # noqa: PLC0415

    def future(result=None, error=None, cancel=False):
        f = Future()
        if cancel:
            f.cancel()
        elif error is not None:
            f.set_exception(error)
        elif result is not None:
            f.set_result(result)
        return f

    kernels = {}

    def placeholder(key, f):
        return FutureKernel(lambda compiled: kernels.__setitem__(key, compiled), lambda fk: None, f)

    kernels.update(cancelled=placeholder("cancelled", future(cancel=True)),
                   failed=placeholder("failed", future(error=RuntimeError("ptxas"))),
                   running=placeholder("running", future()),
                   done=placeholder("done", future(result="compiled")), plain="a kernel")

    class Function:  # as a JITFunction keeps them: per device, the kernels first
        device_caches = {0: (kernels, "key cache", "target")}

    with compile_only(2):
        jit.JITFunction.run(Function(), grid=(1,), warmup=False)
    assert kernels == {"done": "compiled", "plain": "a kernel"}


def test_without_async_compilation_nothing_is_patched(recorded, monkeypatch):
    import triton.runtime._async_compile as async_compile  # noqa: PLC0415

    monkeypatch.delattr(async_compile, "AsyncCompileMode")
    run, _ = recorded
    with compile_only(2) as launches:
        assert not launches.supported and jit.JITFunction.run is run


def test_the_pool_times_each_compilation():
    launches = Launches(supported=True)
    with precompile._TimedPool(2, launches) as pool:
        futures = [pool.submit(time.sleep, 0.0), pool.submit(time.sleep, 0.15)]
    assert [f.result() for f in futures] == [None, None]
    assert launches.compilations[0] < precompile.CACHED_SECONDS <= launches.compilations[1]


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
        assert inputs.D is None and inputs.z is None
        self.calls.append(("call_y", _name(case)))


@pytest.fixture
def ahead(monkeypatch):
    """compile_ahead over fake cases and inputs (each case's seqlen its x's length; D only where headdim is 4)."""
    from contextlib import contextmanager  # noqa: PLC0415

    kernel = _Kernel()

    @contextmanager
    def counting(threads):
        kernel.counter = Launches(supported=True)
        yield kernel.counter

    class Regime:
        def generate(self, shape, dtype, seed, state_dtype):
            x = torch.randn(shape.seqlen, shape.headdim, generator=torch.Generator().manual_seed(seed))
            return _Inputs(x, x[:, :1], torch.ones(1) if shape.headdim == 4 else None, None)

    monkeypatch.setattr(scan_run, "compile_only", counting)
    monkeypatch.setattr(scan_run, "REGIMES", {"normal": Regime(), "dt-extreme": Regime()})
    monkeypatch.setattr(scan_run, "_shape_key", lambda k, inputs, case: (tuple(inputs.x.shape), inputs.D is None))
    return kernel


def _case(seqlen, headdim=8, seed=1, regime="normal"):
    return ScanCase(kernel="fake", regime=regime, dtype="fp32", chunk_size=16, seqlen=seqlen, batch=1, nheads=1,
                    headdim=headdim, dstate=4, ngroups=1, state_dtype="fp32", rounding="nearest", model=None, seed=seed)


def _name(case):
    return f"c{case.seqlen}-{case.headdim}-{case.seed}"


def test_one_call_per_regime_and_shape_and_the_ssm_part_where_d_or_z(ahead):
    cases = [_case(40), _case(40, seed=2), _case(13), _case(24, headdim=4), _case(40, seed=3, regime="dt-extreme")]
    launches = scan_run.compile_ahead(ahead, cases, lambda case: {}, "cpu", 2)
    # (a regime sets the call's flags: another regime of the same shapes is another call)
    assert ahead.calls == [("call", "c40-8-1"), ("call", "c24-4-1"), ("call_y", "c24-4-1"), ("call", "c40-8-3")]
    assert launches.count == 3


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


# ---------------------------------------------------------------------------- api.run


class _CompilingRunner:
    """A scan runner that also compiles ahead, counting its calls."""

    def __init__(self, runner):
        self.runner, self.asked = runner, []

    def __call__(self, case, advance):
        return self.runner(case, advance)

    def precompile(self, cases, threads=None, spread=None):
        self.asked.append([c.id for c in cases])
        return Launches(supported=True, count=7)  # (compiled nothing: `compilations` empty)


def _as_on_a_gpu(plan):
    """The plan as api.run sees a GPU's (its cases still run on the CPU): only there does it compile ahead."""
    return replace(plan, env=replace(plan.env, device="cuda", interpreter=False))


def test_the_run_compiles_ahead_first_and_reports_it():
    plan = _as_on_a_gpu(api.plan_scan("torch", "smoke", regime="normal,ragged", dtype="fp32"))
    runner = _CompilingRunner(plan.runner)
    phases = []
    report = api.run(replace(plan, runner=runner), on_phase=phases.append)
    assert runner.asked == [[c.id for c in plan.cases]]
    assert phases == [api.COMPILING, plan.cases[0].id]
    assert report.data["compiled_ahead"]["launches"] == 7 and report.data["compiled_ahead"]["processes"] == 1
    assert report.data["compiled_ahead"]["compilations"] == 0
    assert report.data["compiled_ahead"]["seconds"] >= 0 and report.summary["pass"] == 2


def test_no_compile_ahead_asks_nothing():
    plan = _as_on_a_gpu(api.plan_scan("torch", "smoke", regime="normal", dtype="fp32"))
    runner = _CompilingRunner(plan.runner)
    report = api.run(replace(plan, runner=runner), compile_ahead=False)
    assert runner.asked == [] and report.data["compiled_ahead"] is None


def test_each_worker_compiles_its_slice_of_the_sweep_ahead_before_its_first_case():
    cases = [f"case {i}" for i in range(6)]
    records = []
    results = list(run_isolated(AheadRunner(), cases, timeout=60, advance=lambda: None, devices=[None, None],
                                ahead=3, compiled=records.append))
    assert sorted(r[0] for r in results) == cases
    slices = {tuple(r[3][0]) for r in results}
    assert slices == {tuple(cases[:3]), tuple(cases[3:])} and {r[3][1] for r in results} == {3}
    assert len(records) == 2 and sorted((r["launches"], r["compiled"]) for r in records) == [(30, 3), (30, 3)]
    by_pid = {}
    for case, pid, _, (given, _) in results:
        by_pid.setdefault(pid, set()).add(tuple(given))
    assert all(len(given) == 1 for given in by_pid.values())  # a worker compiled one slice, before all its cases


def test_a_cold_pass_spreads_the_cases_left_over_helper_processes(monkeypatch):
    monkeypatch.setattr(api, "cpu_cores", lambda: 16)  # 3 helpers of 4 cores, and this process
    assert isolation.SPREAD_SLICE == 8
    cases = [f"case {i}" for i in range(26)]
    records = api._compile_ahead_here(SpreadingRunner(), cases)
    assert [r["launches"] for r in records] == [10, 9, 7]  # here case 0 and 9 of the 25 left; two helpers (8+)
    assert SpreadingRunner.kept == cases[:10] and SpreadingRunner.threads == 4
    assert records[0]["seconds"] >= max(r["seconds"] for r in records[1:])  # the wait for the helpers included
    assert multiprocessing.active_children() == []


def test_a_runner_that_cannot_be_pickled_compiles_here_alone():
    workers = isolation.CompilingWorkers(lambda case, advance: None, helpers=2, threads=1)
    cases = [f"case {i}" for i in range(30)]
    assert workers.spread(cases) == cases and workers.workers == []
    assert workers.finish() == []


@pytest.mark.parametrize(("cores", "cases", "threads"), [(6, 40, 6), (16, 16, 4)])
def test_a_small_machine_or_sweep_compiles_ahead_in_this_process_alone(monkeypatch, cores, cases, threads):
    monkeypatch.setattr(api, "cpu_cores", lambda: cores)
    names = [f"case {i}" for i in range(cases)]
    records = api._compile_ahead_here(SpreadingRunner(), names)
    assert [r["launches"] for r in records] == [cases] and SpreadingRunner.kept == names
    assert SpreadingRunner.threads == threads  # (with helpers planned, this process's share even if none start)


def test_ranks_on_one_machine_share_its_cores(monkeypatch):
    monkeypatch.setattr(api, "cpu_cores", lambda: 16)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun's four ranks here: 4 cores each, no helpers
    names = [f"case {i}" for i in range(40)]
    records = api._compile_ahead_here(SpreadingRunner(), names)
    assert [r["launches"] for r in records] == [40] and SpreadingRunner.threads == 4


def test_compile_ahead_spreads_once_the_cache_shows_cold(ahead):
    cases = [_case(16 * i + 1) for i in range(1, 9)]
    spread = []

    def keep_half(left):
        spread.append([c.seqlen for c in left])
        return left[:len(left) // 2]

    scan_run.compile_ahead(ahead, cases, lambda case: {}, "cpu", 2, keep_half)
    assert spread == [[16 * i + 1 for i in range(2, 9)]]  # after the first call's compilations came back slow
    assert [name for _, name in ahead.calls] == [f"c{16 * i + 1}-8-1" for i in (1, 2, 3, 4)]


def test_workers_given_nothing_compile_nothing_ahead():
    records = []
    results = list(run_isolated(AheadRunner(), ["a", "b"], timeout=60, advance=lambda: None, devices=[None, None],
                                compiled=records.append))
    assert records == [] and {r[3] for r in results} == {None}


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


def test_compile_ahead_through_the_api_on_a_gpu_plan():
    plan = _as_on_a_gpu(api.plan_scan("torch", "smoke", regime="normal,ragged", dtype="fp32"))
    runner = _CompilingRunner(plan.runner)
    record = api.compile_ahead(replace(plan, runner=runner), plan.cases[1:])
    assert runner.asked == [[plan.cases[1].id]] and record["launches"] == 7 and record["processes"] == 1
    assert api.compile_ahead(replace(plan, runner=runner), []) is None
    assert api.compile_ahead(api.plan_scan("torch", "smoke", regime="normal", dtype="fp32")) is None  # the CPU


def test_the_cpu_compiles_nothing_ahead():
    report = api.run(api.plan_scan("builtin", "smoke", regime="normal", dtype="fp32", device="cpu"))
    assert report.data["compiled_ahead"] is None and report.summary["pass"] == 1


# ---------------------------------------------------------------------------- on the GPU: real compilations


@pytest.mark.gpu
def test_a_kernel_compiled_ahead_ran_nothing_and_launches_warm():
    import triton  # noqa: PLC0415
    import triton.language as tl  # noqa: PLC0415

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
    cache = double.device_caches[torch.cuda.current_device()][0]
    from triton.runtime._async_compile import FutureKernel  # noqa: PLC0415

    assert len(cache) == 2 and not any(isinstance(k, FutureKernel) for k in cache.values())
    compiled = []
    from triton import knobs  # noqa: PLC0415

    knobs.runtime.jit_post_compile_hook = lambda *a, **k: compiled.append(1)
    try:
        for out in outs.values():
            double[(4,)](x, out, 100, BLOCK=32)
    finally:
        knobs.runtime.jit_post_compile_hook = None
    assert compiled == []  # both launches found their variant compiled
    for out in outs.values():
        torch.testing.assert_close(out, (x * 2).to(out.dtype))


@pytest.mark.gpu
def test_an_autotuned_kernel_compiled_ahead_has_every_config_and_no_choice():
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
    assert out.isnan().all() and triple.cache == {}
    assert len(triple.fn.device_caches[torch.cuda.current_device()][0]) == 2
    triple[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](x, out, 100)
    torch.testing.assert_close(out, x * 3)


@pytest.mark.gpu
def test_the_smoke_sweeps_cases_launch_no_variant_the_pass_did_not_compile(monkeypatch):
    monkeypatch.setattr(precompile, "WARM_CALLS", 10**6)  # never taken for warm: the pass covers the whole sweep
    plan = api.plan_scan("builtin", "smoke", device="cuda")
    runner = plan.runner
    scan_run.compile_ahead(runner.adapter(), plan.cases, runner.pins, "cuda", 4)
    compiled = []
    do_compile = jit.JITFunction._do_compile

    def counting(self, *args, **kwargs):
        compiled.append(self.fn.__name__)
        return do_compile(self, *args, **kwargs)

    monkeypatch.setattr(jit.JITFunction, "_do_compile", counting)
    statuses = [runner(case, lambda: None).status.value for case in plan.cases]
    assert statuses == ["pass"] * len(plan.cases)
    assert compiled == []  # every variant the cases launched was in memory: the pass had compiled it
