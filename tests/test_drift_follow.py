"""drift.follow compiled on CUDA computes what the plain-PyTorch references compute eagerly."""

import pytest
import torch

from ssmcheck.drift import lockstep
from ssmcheck.drift import run as drift_run
from ssmcheck.drift.adapter import resolve as resolve_kernel
from ssmcheck.drift.follow import follow, follower
from ssmcheck.drift.spec import build_cases, resolve

gpu = pytest.mark.gpu


def _step_tensors(seed: int, dtype: torch.dtype) -> dict:
    """One step's arguments of `follow` at a Mamba2-like shape, drawn on CUDA; the kernel's stored state
    is the exact update rounded, with a few elements set to NaN and inf (what the flag looks for)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    b, h, p, n = 2, 4, 64, 128

    def randn(*shape, dt=torch.float64):
        return torch.randn(*shape, generator=g, device="cuda", dtype=torch.float64).to(dt)

    ref = randn(b, h, p, n)
    before = (ref + 1e-3 * randn(b, h, p, n)).to(dtype)
    after = (before.double() * 0.97 + 0.01 * randn(b, h, p, n)).to(dtype)
    after.view(-1)[[5, 777]] = torch.tensor([float("nan"), float("inf")], dtype=dtype, device="cuda")
    return dict(ref=ref, baseline=ref.to(dtype).double(), before=before, after=after, out=randn(b, h, p, dt=dtype),
                x=randn(b, h, p, dt=dtype), dt=randn(b, h, 1, dt=dtype).expand(b, h, p),
                A=-torch.rand(h, 1, 1, generator=g, device="cuda", dtype=torch.float64).expand(h, p, n),
                B=randn(b, 1, n, dt=dtype), C=randn(b, 1, n, dt=dtype),
                D=randn(h, 1).expand(h, p), dt_bias=randn(h, 1).expand(h, p),
                sums=torch.zeros(3, dtype=torch.float64, device="cuda"),
                tripped=torch.zeros((), dtype=torch.bool, device="cuda"),
                uniform=torch.rand(b, h, p, n, generator=g, device="cuda", dtype=torch.float64))


@gpu
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_compiled_step_computes_the_eager_references(dtype, rounding):
    compiled = follower("cuda")
    assert compiled is not follow
    for seed in range(3):
        eager_args = _step_tensors(seed, dtype)
        compiled_args = {k: v.clone() for k, v in eager_args.items()}
        options = dict(dt_softplus=True, dtype=dtype, rounding=rounding)
        eager_outs = follow(**eager_args, **options)
        compiled_outs = compiled(**compiled_args, **options)
        # Fused float64 arithmetic (contractions into FMAs, its own exp) may differ in the last bits; the
        # baseline, rounded into fp16/bf16 from values that close, and the flag may not.
        torch.testing.assert_close(compiled_args["ref"], eager_args["ref"], rtol=1e-13, atol=1e-300)
        assert torch.equal(compiled_args["baseline"], eager_args["baseline"])
        torch.testing.assert_close(compiled_args["sums"], eager_args["sums"], rtol=1e-12, atol=0)
        assert compiled_args["sums"][0] == eager_args["sums"][0] == eager_args["after"].numel() - 2
        assert bool(compiled_args["tripped"]) and bool(eager_args["tripped"])
        for mine, theirs in zip(compiled_outs, eager_outs):
            torch.testing.assert_close(mine, theirs, rtol=1e-13, atol=1e-300)


@gpu
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_a_graph_run_with_the_compiled_step_judges_as_the_eager_references_do(monkeypatch, rounding):
    settings_ = resolve({"nheads": "2", "headdim": "64", "dstate": "128", "batch": "2", "regime": "normal",
                         "state_dtype": "fp16", "rounding": rounding, "steps": "300", "trials": "2"}, {}, "test")
    [case] = build_cases(settings_, "builtin")
    kernel = resolve_kernel("builtin", 10, "software", False)
    compiled = drift_run.run_case(case, kernel, settings_.tolerance, "cuda")
    monkeypatch.setattr(lockstep, "follower", lambda device: follow)
    eager = drift_run.run_case(case, kernel, settings_.tolerance, "cuda")
    assert compiled.run.decode_loop == eager.run.decode_loop == "graph"
    assert compiled.verdict.status == eager.verdict.status
    assert compiled.run.store_errors.count == eager.run.store_errors.count > 0
    # The kernel's state is the same bits either way; the references it is measured against differ in
    # float64's last bits at most.
    for mine, theirs in ((compiled.run.checkpoints, eager.run.checkpoints), (compiled.run.baseline, eager.run.baseline)):
        assert [c.step for c in mine] == [c.step for c in theirs]
        for a, b in zip(mine, theirs):
            assert (a.state_rel, a.out_rel) == pytest.approx((b.state_rel, b.out_rel), rel=1e-6)
    assert compiled.run.store_errors.mean == pytest.approx(eager.run.store_errors.mean, rel=1e-9, abs=1e-12)
