"""drift.follow: compiled on CUDA, it computes what the plain-PyTorch references compute eagerly; a compiled
step that does not (or does not compile) is found on the first step and replaced by the eager one."""

import pytest
import torch

from ssmcheck.core import runtime
from ssmcheck.drift import follow as follow_module
from ssmcheck.drift import lockstep
from ssmcheck.drift import run as drift_run
from ssmcheck.drift.adapter import resolve as resolve_kernel
from ssmcheck.drift.follow import AGREEMENT_RTOL, Follower, follow, sums_agree
from ssmcheck.drift.spec import build_cases, resolve
from ssmcheck.drift.stats import STORE_SUMS

gpu = pytest.mark.gpu
DEVICE = runtime.environment().device  # the Triton step runs compiled on a GPU, through the interpreter on the CPU


def _step_tensors(seed: int, dtype: torch.dtype, device: str = "cuda", b=2, h=4, p=64, n=128, gated=False) -> dict:
    """One step's arguments of `follow` (Mamba2-like widths by default; with a gate z where `gated`), drawn on
    `device`; the kernel's stored state is near the exact update, with a few elements set to NaN and inf (what
    the flag looks for)."""
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape, dt=torch.float64):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float64).to(dt)

    ref = randn(b, h, p, n)
    before = (ref + 1e-3 * randn(b, h, p, n)).to(dtype)
    after = (before.double() * 0.97 + 0.01 * randn(b, h, p, n)).to(dtype)
    after.view(-1)[[5, 77]] = torch.tensor([float("nan"), float("inf")], dtype=dtype, device=device)
    return dict(ref=ref, baseline=ref.to(dtype).double(), before=before, after=after, out=randn(b, h, p, dt=dtype),
                x=randn(b, h, p, dt=dtype), dt=randn(b, h, 1, dt=dtype).expand(b, h, p),
                z=randn(b, h, p, dt=dtype) if gated else None,
                A=-torch.rand(h, 1, 1, generator=g, device=device, dtype=torch.float64).expand(h, p, n),
                B=randn(b, 1, n, dt=dtype), C=randn(b, 1, n, dt=dtype),
                D=randn(h, 1).expand(h, p), dt_bias=randn(h, 1).expand(h, p),
                sums=torch.zeros(len(STORE_SUMS), b, h, p, dtype=torch.float64, device=device),
                tripped=torch.zeros(b, h, p, dtype=torch.bool, device=device),
                uniform=torch.rand(b, h, p, n, generator=g, device=device, dtype=torch.float64))


OPTIONS = dict(dt_softplus=True, dtype=torch.float16, rounding="nearest")


def _follower_with(monkeypatch, *steps) -> Follower:
    """A CUDA Follower whose fast steps are `steps`, (name, a function making the step) tried in turn (the check
    runs wherever its tensors are)."""
    monkeypatch.setattr(follow_module, "_fast_steps", lambda: list(steps))
    return Follower("cuda")


def counted_calls(calls: list, step=follow):
    """`step`, appending its rounding to `calls` at each call."""
    def counted(**arguments):
        calls.append(arguments["rounding"])
        return step(**arguments)

    return counted


def _after_steps(follower, steps: int = 3) -> list[tuple[dict, dict]]:
    """Each step's arguments after `follower` ran them, beside copies that eager `follow` ran (on the configured
    device)."""
    ran = []
    for seed in range(steps):
        arguments = _step_tensors(seed, torch.float16, DEVICE, 1, 2, 8, 16, gated=seed == 1)
        expected = {k: None if v is None else v.clone() for k, v in arguments.items()}
        follower(**arguments, **OPTIONS)
        follow(**expected, **OPTIONS)
        ran.append((arguments, expected))
    return ran


def _same_as_eager(ran: list) -> bool:
    return all(torch.equal(arguments[name], expected[name])
               for arguments, expected in ran for name in ("ref", "baseline", "sums", "tripped"))


def test_sums_agree_to_within_the_largest_of_them_not_each():
    g = torch.Generator().manual_seed(3)
    terms = torch.randn(64, 128, generator=g, dtype=torch.float64)
    terms[::2, -1] = -terms[::2, :-1].sum(1)  # every other row cancels to its rounding residue
    forward, backward = terms.sum(1), terms.flip(1).sum(1)  # the same sums, added up in two orders
    assert not torch.allclose(forward, backward, rtol=AGREEMENT_RTOL, atol=0)  # each, relative to itself
    assert sums_agree(forward, backward)
    assert not sums_agree(forward + 1e-9 * forward.abs().max(), backward)
    assert not sums_agree(torch.where(torch.arange(64) == 5, float("nan"), forward), backward)


def test_the_flag_and_the_sums_are_kept_per_state_row():
    # 2 x 2 x 8 rows of 16: the NaN and the inf at flat elements 5 and 77 lie in rows 0 and 4.
    arguments = _step_tensors(0, torch.float16, "cpu", 2, 2, 8, 16)
    follow(**arguments, **OPTIONS)
    went_bad = torch.zeros(32, dtype=torch.bool)
    went_bad[[0, 4]] = True
    assert torch.equal(arguments["tripped"].flatten(), went_bad)
    counted = arguments["sums"][0].flatten()
    assert torch.equal(counted, torch.where(went_bad, 15.0, 16.0).double())


def test_a_compiled_step_that_skips_the_baselines_rounding_is_replaced_by_the_eager_one(monkeypatch):
    calls = []

    def unrounded(**arguments):  # what inductor does to float32 -> fp16 -> float64 without emulated casts
        calls.append(1)
        outs = follow(**arguments)
        arguments["baseline"].copy_(arguments["ref"])
        return outs

    follower = _follower_with(monkeypatch, ("torch.compile", lambda: unrounded))
    assert _same_as_eager(_after_steps(follower))
    assert follower.kept is None
    assert follower.note == "eager: torch.compile ran, its baseline differs from the eager step's"
    assert calls == [1]  # the check only


def test_a_step_that_does_not_compile_runs_eagerly_and_says_why(monkeypatch):
    def fails(**arguments):
        raise RuntimeError("no working C compiler\nmore lines")

    follower = _follower_with(monkeypatch, ("torch.compile", lambda: fails))
    assert _same_as_eager(_after_steps(follower))
    assert follower.note == "eager: torch.compile raised RuntimeError: no working C compiler"


def test_a_torch_that_cannot_compile_the_step_runs_it_eagerly(monkeypatch):
    def refuses():  # torch.compile itself raising (an inductor option an older torch does not know)
        raise KeyError("emulate_precision_casts")

    monkeypatch.setattr(follow_module, "_compiled", refuses)
    monkeypatch.setattr(follow_module, "follow_triton", lambda **arguments: 1 / 0)  # the Triton step fails too
    follower = Follower("cuda")
    assert _same_as_eager(_after_steps(follower))
    assert follower.note == ("eager: Triton raised ZeroDivisionError: division by zero; "
                             "torch.compile raised KeyError: 'emulate_precision_casts'")


@pytest.mark.parametrize("relative, kept", [(2e-16, True), (1e-9, False)])
def test_float64_values_may_differ_in_their_last_bits_only(monkeypatch, relative, kept):
    calls = []

    def perturbed(**arguments):
        calls.append(1)
        outs = follow(**arguments)
        arguments["ref"].mul_(1 + relative)
        return outs

    follower = _follower_with(monkeypatch, ("torch.compile", lambda: perturbed))
    assert _same_as_eager(_after_steps(follower)) is not kept
    assert follower.kept == ("torch.compile" if kept else None)
    assert follower.note == (None if kept else "eager: torch.compile ran, its reference differs from the eager step's")
    assert len(calls) == (4 if kept else 1)  # the check, then every step; or the check only


def test_the_first_fast_step_that_agrees_runs_and_those_before_it_are_named(monkeypatch):
    wrong, right = [], []

    def unflagged(**arguments):  # a step that never sets the non-finite flag
        outs = follow(**arguments)
        arguments["tripped"].zero_()
        return outs

    follower = _follower_with(monkeypatch, ("Triton", lambda: counted_calls(wrong, unflagged)),
                              ("torch.compile", lambda: counted_calls(right)), ("third", lambda: 1 / 0))
    assert _same_as_eager(_after_steps(follower))
    assert follower.kept == "torch.compile"
    assert follower.note == "torch.compile: Triton ran, its tripped differs from the eager step's"
    assert len(wrong) == 1 and len(right) == 4  # the check; the check and every step


def test_the_triton_step_is_tried_first_and_kept_where_it_agrees(monkeypatch):
    """The Follower's own fast steps: the Triton kernel (through the interpreter on the CPU) comes first, and where it
    agrees torch.compile's step is never made."""
    calls = []
    monkeypatch.setattr(follow_module, "follow_triton", counted_calls(calls, follow_module.follow_triton))
    monkeypatch.setattr(follow_module, "_compiled", lambda: 1 / 0)
    follower = Follower("cuda")
    for arguments, expected in _after_steps(follower):
        assert torch.equal(arguments["baseline"], expected["baseline"])
        assert torch.equal(arguments["tripped"], expected["tripped"])
        torch.testing.assert_close(arguments["ref"], expected["ref"], rtol=AGREEMENT_RTOL, atol=0.0)
    assert follower.kept == "Triton" and follower.note is None
    assert len(calls) == 4


def test_a_compiling_helper_compiles_the_triton_step_only_and_goes_on_eagerly(monkeypatch):
    """Inside core.precompile.compile_only a launch computes nothing: the Triton step is launched once (so its variant
    is compiled) and not checked, torch.compile's step is not made, and the eager step runs."""
    launched, made = [], []
    monkeypatch.setattr(follow_module, "compiling_ahead", lambda: True)
    monkeypatch.setattr(follow_module, "follow_triton", counted_calls(launched))
    monkeypatch.setattr(follow_module, "_compiled", lambda: made.append(1))
    follower = Follower("cuda")
    assert _same_as_eager(_after_steps(follower))
    assert follower.kept is None and follower.note == "eager: Triton compiled ahead only"
    assert len(launched) == 1 and made == []


def test_off_cuda_the_eager_step_runs_and_nothing_is_tried(monkeypatch):
    monkeypatch.setattr(follow_module, "_fast_steps", lambda: 1 / 0)
    follower = Follower("cpu")
    assert _same_as_eager(_after_steps(follower))
    assert follower.kept is None and follower.note is None


def _only(monkeypatch, name: str) -> None:
    """The Follower's own fast step `name` alone (drift.follow._fast_steps)."""
    steps = dict(follow_module._fast_steps())
    monkeypatch.setattr(follow_module, "_fast_steps", lambda: [(name, steps[name])])


@gpu
@pytest.mark.parametrize("step", ["Triton", "torch.compile"])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_each_fast_step_computes_the_eager_references(monkeypatch, dtype, rounding, gated, step):
    _only(monkeypatch, step)
    compiled = Follower("cuda")
    for seed in range(3):
        eager_args = _step_tensors(seed, dtype, gated=gated)
        compiled_args = {k: None if v is None else v.clone() for k, v in eager_args.items()}
        options = dict(dt_softplus=True, dtype=dtype, rounding=rounding)
        eager_outs = follow(**eager_args, **options)
        compiled_outs = compiled(**compiled_args, **options)
        assert compiled.kept == step, compiled.note
        # Fused float64 arithmetic (contractions into FMAs, its own exp) may differ in the last bits; the
        # baseline, rounded into fp16/bf16 from values that close, and the flag may not.
        torch.testing.assert_close(compiled_args["ref"], eager_args["ref"], rtol=1e-13, atol=1e-300)
        assert torch.equal(compiled_args["baseline"], eager_args["baseline"])
        totals = [args["sums"].flatten(1).sum(1) for args in (compiled_args, eager_args)]
        torch.testing.assert_close(*totals, rtol=1e-12, atol=0)
        # Every store counted but the NaN and the inf (both in the first row, whose flag alone is set).
        assert compiled_args["sums"][0].sum() == eager_args["sums"][0].sum() == eager_args["after"].numel() - 2
        flagged = eager_args["after"].isfinite().logical_not().any(-1)
        assert torch.equal(compiled_args["tripped"], flagged) and torch.equal(eager_args["tripped"], flagged)
        # The outputs are sums over dstate, added up in another order when compiled: within 1e-13 of the largest
        # (follow.sums_agree says why not of each).
        for mine, theirs in zip(compiled_outs, eager_outs):
            torch.testing.assert_close(mine, theirs, rtol=1e-13, atol=1e-13 * theirs.abs().max().item())


@gpu
@pytest.mark.parametrize("step", ["Triton", "torch.compile"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_a_graph_run_with_a_fast_step_judges_as_the_eager_references_do(monkeypatch, rounding, step):
    _only(monkeypatch, step)
    settings_ = resolve({"nheads": "2", "headdim": "64", "dstate": "128", "batch": "2", "regime": "normal",
                         "state_dtype": "fp16", "rounding": rounding, "steps": 300, "trials": 2}, {}, "test")
    [case] = build_cases(settings_, "builtin")
    kernel = resolve_kernel("builtin", 10, "software", False)
    compiled = drift_run.run_case(case, kernel, settings_.tolerance, "cuda")
    monkeypatch.setattr(lockstep, "Follower", lambda device: Follower("cpu"))  # eager on any device
    eager = drift_run.run_case(case, kernel, settings_.tolerance, "cuda")
    assert compiled.run.decode_loop == eager.run.decode_loop == "graph"
    assert compiled.verdict.status == eager.verdict.status
    assert compiled.run.store_errors.count == eager.run.store_errors.count > 0
    # The kernel's state is the same bits either way; the references it is measured against differ in
    # float64's last bits at most.
    pairs = ((compiled.run.checkpoints, eager.run.checkpoints), (compiled.run.baseline, eager.run.baseline))
    for mine, theirs in pairs:
        assert [c.step for c in mine] == [c.step for c in theirs]
        for a, b in zip(mine, theirs):
            assert (a.state_rel, a.out_rel) == pytest.approx((b.state_rel, b.out_rel), rel=1e-6)
    assert compiled.run.store_errors.mean == pytest.approx(eager.run.store_errors.mean, rel=1e-9, abs=1e-12)
