"""Finding a kernel's autotuners across its package, and pinning one config at a time."""

import pytest
import torch

from ssmcheck.core import autotune
from tests.tuned_kernels import entry


def test_autotuners_are_found_through_the_modules_a_kernel_imports():
    (tuned,) = autotune.find(entry.run)
    assert (tuned.name, tuned.module) == ("_copy_kernel", "tests.tuned_kernels.copy")
    assert [autotune.describe(c) for c in tuned.configs] == [
        {"kwargs": {"BLOCK": 16}, "num_warps": 1, "num_stages": 3},
        {"kwargs": {"BLOCK": 32}, "num_warps": 2, "num_stages": 3},
    ]
    assert autotune.described_text(autotune.describe(tuned.configs[1])) == "BLOCK=32, num_warps=2, num_stages=3"


def test_pinning_runs_one_config_and_restores_the_list(device):
    (tuned,) = autotune.find(entry.run)
    x = torch.arange(1, 41, dtype=torch.float32, device=device)
    with autotune.pinned({tuned: 0}):
        assert torch.equal(entry.run(x), x)
    with autotune.pinned({tuned: 1}):
        out = entry.run(x)
    assert torch.equal(out[:39], x[:39]) and out[39].isnan()  # the bug only BLOCK=32 has
    assert len(tuned.autotuner.configs) == 2


def test_a_wrapper_is_searched_from_the_kernel_it_names_as_its_origin():
    """The peers' adapters wrap vLLM's kernels in functions of ssmcheck.peers: the search must start from
    the wrapped kernel's module, which the wrapper names in autotune.ORIGIN."""
    import sys
    import types

    module = types.ModuleType("wrapperpkg.wrap")
    exec("def wrapper(x, _run=None):\n    return _run(x)\n", module.__dict__)  # noqa: S102 (a module with no imports)
    sys.modules["wrapperpkg.wrap"] = module
    try:
        wrapper = module.wrapper
        assert autotune.find(wrapper) == []
        setattr(wrapper, autotune.ORIGIN, entry.run)
        assert [(t.name, t.module) for t in autotune.find(wrapper)] == [("_copy_kernel", "tests.tuned_kernels.copy")]
    finally:
        del sys.modules["wrapperpkg.wrap"]



def test_the_picks_recorded_are_the_configs_launched_from_the_autotuners_cache():
    import triton

    class Tuner:  # as Triton's Autotuner.run: tune a new key into the cache, then launch the cache's pick
        def __init__(self, configs, cache=None):
            self.configs = configs
            if cache is not None:
                self.cache = cache

        def launch(self, key, tuned=None):
            if key not in self.cache:
                self.cache[key] = tuned
            return self.cache[key]

    first, second = triton.Config({"BLOCK": 16}, num_warps=1), triton.Config({"BLOCK": 32}, num_warps=2)
    tuner = Tuner([first, second], {"n=40": first, "n=64": first})
    table = Tuner([first])  # a launch table: no cache
    tuned = [autotune.Tuned("_kernel", "m", tuner), autotune.Tuned("_table", "m", table)]
    with autotune.recorded_picks(tuned) as picks:
        pass
    assert picks == {}
    with autotune.recorded_picks(tuned) as picks:
        tuner.launch("n=80", tuned=second)  # a new key, tuned here
        tuner.launch("n=80")
        tuner.launch("n=40")  # a key tuned before: its pick too
    assert picks == {"_kernel": [{"index": 1, "kwargs": {"BLOCK": 32}, "num_warps": 2, "num_stages": 3},
                                 {"index": 0, "kwargs": {"BLOCK": 16}, "num_warps": 1, "num_stages": 3}]}
    assert type(tuner.cache) is dict and tuner.cache["n=80"] is second  # its own cache again, with the new key
    text = "_kernel config 1 (BLOCK=32, num_warps=2, num_stages=3)"
    assert autotune.picks_text({"_kernel": picks["_kernel"][:1]}) == text
    with autotune.recorded_picks(tuned) as picks:
        tuner.launch("n=8", tuned=triton.Config({"BLOCK": 8}))  # not one of the list's (a pruner's): no index
    assert picks["_kernel"][0]["index"] is None


def test_a_case_reports_its_autotuners_picks_and_a_failing_case_names_them(monkeypatch):
    """On a GPU the autotuner tunes at each shape's first call and launches its pick from its cache; here (the
    interpreter runs the first config without tuning) the copy's autotuner does that by hand, and its first
    config is BLOCK=32, whose planted bug fails the case."""
    from dataclasses import replace

    from ssmcheck import api

    plan = api.plan_scan("tests.tuned_kernels.scan:chunk_scan", "smoke", regime="normal,ragged", dtype="fp32",
                         device="cpu")
    (tuned,) = plan.runner.autotuned()
    monkeypatch.setattr(tuned.autotuner, "configs", tuned.autotuner.configs[::-1])  # BLOCK=32 first
    run = tuned.autotuner.run

    def tuning(*args, **kwargs):
        key = (args[2],)  # n
        if key not in tuned.autotuner.cache:
            tuned.autotuner.cache[key] = tuned.autotuner.configs[0]
        tuned.autotuner.cache[key]  # the launch's pick  # noqa: B018
        return run(*args, **kwargs)

    monkeypatch.setattr(tuned.autotuner, "run", tuning)
    monkeypatch.setattr(tuned.autotuner, "cache", {})
    report = api.run(replace(plan, runner=replace(plan.runner, warmup=True)))  # warm-up calls: a GPU's default
    picked = {"_copy_kernel": [{"index": 0, "kwargs": {"BLOCK": 32}, "num_warps": 2, "num_stages": 3}]}
    for case in report.cases:  # the second case's key was tuned by the first: its pick is still named
        assert case.data["autotune_picks"] == picked, case.message
        assert case.status in ("fail", "nonfinite")
        assert "the autotuner's picks: _copy_kernel config 0 (BLOCK=32, num_warps=2, num_stages=3)" in case.message
    assert type(tuned.autotuner.cache) is dict


def test_a_pinned_case_names_the_other_functions_picks_and_not_its_pinned_ones(monkeypatch):
    """With --configs all a case pins one function's config and the others autotune. Its picks are those of its
    own first call: the pinned function runs its one config without a pick (as Triton's Autotuner does with
    one config), and an earlier case's pick of that function, made while another was pinned, is not this case's."""
    from dataclasses import replace

    from ssmcheck import api

    plan = api.plan_scan("tests.tuned_kernels.twice:chunk_scan", "smoke", regime="normal", dtype="fp32",
                         device="cpu", configs="all")
    tuned = {t.name: t for t in plan.runner.autotuned()}
    assert sorted(tuned) == ["_copy_kernel", "_scale_kernel"]
    for t in tuned.values():
        run = t.autotuner.run

        def tuning(*args, _t=t, _run=run, **kwargs):
            configs = _t.autotuner.configs
            if len(configs) > 1:  # Triton's Autotuner: one config runs without a pick
                key = (args[2],)  # n
                if key not in _t.autotuner.cache:
                    _t.autotuner.cache[key] = configs[0]
                picked = _t.autotuner.cache[key]  # the launch's pick
                _t.autotuner.configs = [picked]  # the interpreter runs it, where it cannot benchmark
            try:
                return _run(*args, **kwargs)
            finally:
                _t.autotuner.configs = configs

        monkeypatch.setattr(t.autotuner, "run", tuning)
        monkeypatch.setattr(t.autotuner, "cache", {})
    pins = autotune.pins
    monkeypatch.setattr(autotune, "pins", lambda t, config, interpreter: pins(t, config, False))  # a GPU's pins
    report = api.run(replace(plan, runner=replace(plan.runner, warmup=True)))
    first = {"index": 0, "kwargs": {"BLOCK": 16}, "num_warps": 1, "num_stages": 3}
    seen = set()
    for case in report.cases:
        pinned = case.data["params"]["config"]["function"]
        other = next(name for name in tuned if name != pinned)
        assert case.data["autotune_picks"] == {other: [first]}, (case.id, case.data["autotune_picks"])
        seen.add(pinned)
        if case.status == "fail":  # copy's BLOCK=32 pinned: the message names scale's pick, not copy's
            assert "the autotuner's picks: _scale_kernel config 0 (BLOCK=16" in case.message
            assert "_copy_kernel config" not in case.message
    assert seen == set(tuned)
    assert report.summary["fail"] + report.summary["nonfinite"] == 1


def test_without_warm_up_calls_or_autotuning_no_picks_are_reported():
    from ssmcheck import api

    report = api.scan("tests.tuned_kernels.scan:chunk_scan", "smoke", regime="normal", dtype="fp32", device="cpu")
    assert [case.data["autotune_picks"] for case in report.cases] == [None]


@pytest.mark.gpu
def test_on_a_gpu_the_autotuners_pick_is_recorded_for_every_case():
    """BLOCK=32 of the copy re-reads its block 256 times: the autotuner picks BLOCK=16, and every case (the
    second shape's too, whose key the first tuned) names it."""
    from ssmcheck import api

    report = api.scan("tests.tuned_kernels.scan:chunk_scan", "smoke", regime="normal,ragged,long", dtype="fp32",
                      device="cuda")
    assert report.summary["pass"] == 3
    for case in report.cases:
        assert case.data["autotune_picks"] == {
            "_copy_kernel": [{"index": 0, "kwargs": {"BLOCK": 16}, "num_warps": 1, "num_stages": 3}]}


def test_a_launch_past_the_autotuner_under_another_config_than_the_pin_is_noted(device):
    (tuned,) = autotune.find(entry.run)
    second = tuned.configs[1]
    x = torch.arange(1, 41, dtype=torch.float32, device=device)
    with autotune.pinned({tuned: 0}) as bypassed:
        entry.run(x)  # through the autotuner: the pin runs
        tuned.autotuner.fn[(2,)](x, torch.empty_like(x), 40, **tuned.configs[0].all_kwargs())  # directly, the pin
    assert bypassed == []
    with autotune.pinned({tuned: 0}) as bypassed:
        for _ in range(2):  # directly, another config (as a launcher keeping an earlier choice would): noted once
            tuned.autotuner.fn[(2,)](x, torch.empty_like(x), 40, **second.all_kwargs())
    assert bypassed == ["_copy_kernel ran BLOCK=32, num_warps=2, num_ctas=1, num_stages=3 where its config 0 "
                        "(BLOCK=16, num_warps=1, num_stages=3) was pinned"]
    assert "run" not in vars(tuned.autotuner.fn) and len(tuned.autotuner.configs) == 2


def test_a_pinned_config_that_a_launcher_bypassed_makes_the_case_an_error(tmp_path):
    """With --configs all the second config's case would be judged as config 1 while the launcher ran the
    config it kept from the first case (BLOCK=16, which passes): an error that says so, not a pass."""
    from cli_invoke import invoke

    from tests.tuned_kernels import kept

    kept.KEPT.clear()
    result, report = invoke("scan", "--kernel", "tests.tuned_kernels.kept:chunk_scan", "--configs", "all",
                            "--preset", "smoke", "--regime", "normal", "--dtype", "fp32", "--quiet",
                            json_path=tmp_path / "r.json")
    statuses = [(c["params"]["config"]["index"], c["status"]) for c in report["cases"]]
    assert statuses == [(0, "pass"), (1, "error")] and result.exit_code == 4
    message = report["cases"][1]["message"]
    assert message.startswith("the pinned config did not run: _copy_kernel ran BLOCK=16, num_warps=1")
    assert "where its config 1 (BLOCK=32, num_warps=2, num_stages=3) was pinned" in message
    assert "the verdict of what ran: " in message
