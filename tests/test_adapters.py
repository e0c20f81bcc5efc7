"""The kernel adapters: capability discovery and output validation, on tiny inputs without a Triton kernel.

Every wrong output gets one line that says what was expected and what came back: a dtype the
kernel should not return (float64, complex, a state dtype other than the one asked for), a
tensor on another device, a tuple of the wrong length, or inputs the call wrote into.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ssmcheck.core.status import Status
from ssmcheck.core.tolerance import Tolerance
from ssmcheck.drift import adapter as drift_adapter
from ssmcheck.drift.regimes import DecodeShape, make_problem
from ssmcheck.drift.run import run_case as run_drift_case
from ssmcheck.drift.spec import build_cases as drift_cases
from ssmcheck.drift.spec import resolve as drift_settings
from ssmcheck.scan import adapter as scan_adapter
from ssmcheck.scan.adapter import KernelOutputError, ScanAdapter, torch_kernel
from ssmcheck.scan.regimes import REGIMES
from ssmcheck.scan.run import ScanRunner
from ssmcheck.scan.run import run_case as run_scan_case
from ssmcheck.scan.spec import build_cases as scan_cases
from ssmcheck.scan.spec import resolve as scan_settings

SMALL_SCAN = {"regime": "normal,ragged", "dtype": "fp16", "chunk_size": "8", "seqlen": "12", "batch": "2",
              "nheads": "2", "headdim": "4", "dstate": "4", "ngroups": "1"}


def _scan_case(**options):
    return scan_cases(scan_settings({**SMALL_SCAN, **options}, {}, "test"), "k")[0]


def _inputs(case):
    return REGIMES[case.regime].generate(case.shape(), torch.float16, case.seed)


def _returning(transform, takes_state_options=False):
    """A correct kernel (the baseline) whose (y, states) pass through `transform` before returning."""

    def kernel(*args, **kwargs):
        return transform(*torch_kernel(*args, **kwargs))

    return ScanAdapter("test", kernel, takes_state_options=takes_state_options)


@pytest.mark.parametrize(("transform", "expected"), [
    (lambda y, s: (y.double(), s), "y has dtype torch.float64, expected fp16 (x's dtype)"),
    (lambda y, s: (y.to(torch.complex64), s), "y has dtype torch.complex64, expected fp16"),
    (lambda y, s: (y, s.double()), "states has dtype torch.float64, expected fp32 or fp16 or bf16"),
    (lambda y, s: (y, s, s), "expected a tuple (out, states), got a tuple of 3"),
    (lambda y, s: y, None),  # a bare tensor: the shape of the call was not honoured
    (lambda y, s: (y.to("meta"), s), "y is on meta, expected cpu (where the inputs are)"),
    (lambda y, s: (y[:, :-1], s), "y has shape"),
])
def test_scan_outputs_are_validated(transform, expected):
    case = _scan_case()
    adapter = _returning(transform)
    with pytest.raises(KernelOutputError) as info:
        adapter.call(_inputs(case), case)
    assert "\n" not in str(info.value)
    assert (expected or "expected a tuple (out, states), got Tensor") in str(info.value)


def test_a_declared_state_dtype_must_come_back():
    case = _scan_case(state_dtype="bf16")
    adapter = ScanAdapter("test", lambda *a, **k: torch_kernel(*a, **{**k, "state_dtype": torch.float16}),
                          takes_state_options=True)
    with pytest.raises(KernelOutputError, match="states has dtype fp16, expected bf16 .the requested --state-dtype"):
        adapter.call(_inputs(case), case)


def test_a_kernel_that_writes_into_its_inputs_is_caught():
    def kernel(x, dt, A, B, C, chunk_size, **kwargs):
        out = torch_kernel(x, dt, A, B, C, chunk_size, **kwargs)
        B.mul_(2)
        return out

    case = _scan_case()
    with pytest.raises(KernelOutputError, match="wrote into its input B"):
        ScanAdapter("test", kernel, takes_state_options=False).call(_inputs(case), case)


def test_a_correct_kernel_passes_validation_and_a_bad_one_is_one_error_case():
    case = _scan_case()
    good = ScanAdapter("test", torch_kernel, takes_state_options=True)
    y, states = good.call(_inputs(case), case)
    assert y.dtype == torch.float16 and states.dtype == torch.float32
    bad = _returning(lambda y, s: (y.double(), s))
    result = run_scan_case(case, bad, Tolerance(), "fp64", "cpu")
    assert result.status is Status.ERROR and "dtype torch.float64" in result.message


def test_capabilities_decide_skips():
    builtin = scan_adapter.resolve("builtin", interpreter=True)
    assert "power-of-two chunk sizes 16..256, not 48" in builtin.skip_reason(_scan_case(chunk_size="48"))
    assert builtin.skip_reason(_scan_case(chunk_size="16")) is None
    plain = ScanAdapter("mine", lambda *a, **k: None, takes_state_options=False)
    assert plain.skip_reason(_scan_case(chunk_size="48")) is None  # a callable takes any chunk size
    assert "mine takes no state_dtype/rounding/seed keywords" in plain.skip_reason(_scan_case(state_dtype="fp16"))


# ---------------------------------------------------------------------------- drift


def _step_kernel(transform):
    def kernel(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
        return transform(drift_adapter.torch_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus), x, A)

    return drift_adapter.DriftAdapter("test", kernel, takes_rounding=False, takes_seed=False)


@pytest.mark.parametrize(("transform", "expected"), [
    (lambda out, x, A: out.double(), "out has dtype torch.float64, expected fp32 (x's dtype)"),
    (lambda out, x, A: out.to("meta"), "out is on meta, expected cpu"),
    (lambda out, x, A: (out, out), "the kernel returned tuple, expected out of shape"),
    (lambda out, x, A: (x.mul_(0.5), out)[1], "wrote into its input x"),
])
def test_drift_outputs_are_validated(transform, expected):
    problem = make_problem("normal", DecodeShape(1, 2, 4, 8, 1), torch.float16, 3, 7, "cpu")
    step = next(problem.steps())
    state = problem.initial_state.clone()
    with pytest.raises(drift_adapter.KernelRaised) as info:
        _step_kernel(transform).call(state, problem, step, "nearest", 0, "trial 0, step 1", check_inputs=True)
    assert expected in str(info.value) and "(trial 0, step 1)" in str(info.value)


def _out_kernel(write):
    """A kernel of vLLM's convention (an `out` keyword) that returns a correct out of its own and writes
    `write(out_given, correct)` into the one it is given."""
    def kernel(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, out=None):
        correct = drift_adapter.torch_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
        write(out, correct)
        return correct.clone()

    return drift_adapter.resolve(kernel, 7, "software", True)


def _first_row_only(out, correct):
    out[:1] = correct[:1]


@pytest.mark.parametrize(("write", "unwritten"), [(lambda out, correct: None, 2 * 2 * 4), (_first_row_only, 2 * 4)])
def test_drift_judges_the_out_it_passes_not_a_tensor_returned_beside_it(write, unwritten):
    problem = make_problem("normal", DecodeShape(2, 2, 4, 8, 1), torch.float32, 3, 7, "cpu")
    step = next(problem.steps())
    with pytest.raises(drift_adapter.KernelRaised, match=f"left {unwritten} of the 16 elements of the out it was given"):
        _out_kernel(write).call(problem.initial_state.clone(), problem, step, "nearest", 0, "step 1", check_inputs=True)
    # written whole, the same kernel passes, whatever it returns beside it
    state = problem.initial_state.clone()
    out = _out_kernel(lambda out, correct: out.copy_(correct)).call(state, problem, step, "nearest", 0, "step 1",
                                                                     check_inputs=True)
    assert not torch.isnan(out).any()


def test_drift_reports_a_wrong_output_as_one_error_case():
    settings = drift_settings({"regime": "normal", "state_dtype": "fp16", "rounding": "nearest", "steps": 4,
                               "nheads": "1", "headdim": "4", "dstate": "8"}, {}, "test")
    (case,) = drift_cases(settings, "test")
    result = run_drift_case(case, _step_kernel(lambda out, x, A: out.double()), settings.tolerance, "cpu")
    assert result.status is Status.ERROR and "expected fp32" in result.verdict.message



def test_a_first_call_wrong_alone_fails_the_case_it_warms_up():
    # On a GPU the first call of a shape (compiling, autotuning) is made apart from the timed one: judged too.
    broken = Path(__file__).with_name("broken_scan_kernels.py")
    runner = ScanRunner(f"{broken}:first_call_accumulates", Tolerance(), "fp64", "cpu", True, warmup=True)
    first, again = (runner(case, lambda: None) for case in [_scan_case(seed=3), _scan_case(seed=4)])
    assert first.status is Status.FAIL and first.message.startswith(
        "the first call of this shape (compiling and autotuning; untimed) returned y 1 off the timed call's"), \
        first.message
    assert again.status is Status.PASS, again.message  # its shape warm: no first call


def test_the_first_call_per_shape_is_timed_apart_as_warm_up():
    slow = Path(__file__).with_name("slow_kernels.py")
    runner = ScanRunner(f"{slow}:compiles_on_first_call", Tolerance(), "fp64", "cpu", True, warmup=True)
    first, again = (runner(case, lambda: None) for case in [_scan_case(seed=1), _scan_case(seed=2)])
    assert first.status is again.status is Status.PASS
    assert first.warmup_seconds >= 1.0 > first.seconds  # the compile is shown apart, not in the case's time
    assert again.warmup_seconds is None and again.seconds < 1.0  # same shape: warm already
