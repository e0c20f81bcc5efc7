"""The independence check of stochastic-rounding drift cases (drift.independence): twin state elements (the same
state and inputs) along each axis must be rounded with bits of their own."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cli_invoke import invoke
from hypothesis import given, settings
from hypothesis import strategies as st

import ssmcheck
from ssmcheck.drift.independence import AXES, FALSE_ALARM, lower_tail_bound
from ssmcheck.ops.rounding.naive import fraction_between_neighbours

BROKEN = str(Path(__file__).with_name("broken_state_update_kernels.py"))
SMALL = dict(preset="smoke", regime=["normal", "stagnation"], state_dtype=["fp16", "bf16"],
             rounding=["nearest", "stochastic"], steps=2, trials=1, batch=[1], nheads=[2], headdim=[8], dstate=[16])


def _cases(kernel: str) -> list[dict]:
    return ssmcheck.drift(kernel=kernel, **SMALL).to_json()["cases"]


@pytest.mark.parametrize("kernel", ["builtin", f"{BROKEN}:plain_stochastic"])
def test_twins_of_a_correct_stochastic_rounding_differ_as_independent_draws_do(kernel):
    for case in _cases(kernel):
        check = case["independence"]
        if case["params"]["rounding"] == "nearest":
            assert check is None
            continue
        assert case["status"] == "pass", case["message"]
        # 2 heads x 8 channels x dstate 16 elements a row: 256 twin pairs of rows, 128 along each axis of row 0.
        assert [check[axis]["pairs"] for axis in AXES] == [256, 128, 128, 128], check
        for axis in AXES:
            figures = check[axis]
            assert figures["expected"] > 20, check  # a third of the pairs, or a sixth (stagnation), differ
            assert abs(figures["differ"] - figures["expected"]) < 6 * figures["sigma"], check


@pytest.mark.parametrize(("axis", "words"), [
    ("rows", "twin batch rows (given the same state and inputs) stored the same bits in 256 of 256 elements"),
    ("heads", "twin heads (given the same state and inputs) stored the same bits in 128 of 128 elements"),
    ("channels", "twin channels (given the same state and inputs) stored the same bits in 128 of 128 elements"),
    ("state_indices", "twin state indices (given the same state and inputs) stored the same bits in 128 of 128"),
])
def test_random_bits_shared_along_an_axis_fail_every_stochastic_case_and_name_it(axis, words):
    cases = _cases(f"{BROKEN}:random_bits_shared_by_{axis}")
    stochastic = [c for c in cases if c["params"]["rounding"] == "stochastic"]
    assert len(stochastic) == 4
    depends = AXES[axis][1]
    for case in stochastic:
        check = case["independence"]
        assert case["status"] == "fail" and check["status"] == "fail" and check[axis]["differ"] == 0, case["message"]
        assert words in case["message"] and f"random bits do not depend on {depends}" in case["message"]
        # The other axes' twins round with bits of their own: only this axis's clause.
        assert check["message"].count("twin ") == 1, check["message"]
    # To nearest the kernel is right: the check does not run.
    assert all(c["status"] == "pass" and c["independence"] is None for c in cases if c not in stochastic)


def test_the_lower_tail_bound_is_a_bound_and_fails_only_far_below_the_mean():
    # Binomial(n, 1/3) lower tails, exactly, against the bound.
    from math import comb  # noqa: PLC0415

    for n, k in ((60, 0), (60, 10), (300, 60), (300, 99)):
        exact = sum(comb(n, i) * (1 / 3) ** i * (2 / 3) ** (n - i) for i in range(k + 1))
        assert exact <= lower_tail_bound(k, n / 3)
    assert lower_tail_bound(0, 21.0) < FALSE_ALARM < lower_tail_bound(0, 20.0)
    assert lower_tail_bound(100, 100.0) == 1.0 and lower_tail_bound(60, 100.0) > FALSE_ALARM


def test_the_cli_exits_1_on_rows_that_share_their_random_bits(tmp_path):
    result, report = invoke("drift", "--kernel", f"{BROKEN}:random_bits_shared_by_rows", "--preset", "smoke",
                            "--regime", "normal", "--state-dtype", "bf16", "--rounding", "stochastic", "--steps", "2",
                            "--quiet", json_path=tmp_path / "r.json")
    assert result.exit_code == 1, result.output
    assert report["cases"][0]["independence"]["status"] == "fail"


@settings(max_examples=200, deadline=None)
@given(dtype=st.sampled_from([torch.float16, torch.bfloat16]), significand=st.integers(0, 1023),
       eighths=st.integers(0, 7), exponent=st.integers(-20, 12), negative=st.booleans())
def test_fraction_between_neighbours_is_the_place_of_the_value_between_them(dtype, significand, eighths, exponent,
                                                                          negative):
    # A value k + f ulps above zero at the spacing 2**(exponent - mantissa bits) (subnormal spacing below the
    # smallest normal exponent): its fraction is f whenever k + f lies in one binade of the format.
    mantissa, emin = (10, -14) if dtype == torch.float16 else (7, -126)
    e = max(exponent, emin)
    k = (1 << mantissa) + significand % (1 << mantissa) if exponent >= emin else significand % (1 << mantissa)
    value = (k + eighths / 8) * 2.0 ** (e - mantissa) * (-1 if negative else 1)
    frac = fraction_between_neighbours(torch.tensor([value], dtype=torch.float64), dtype)
    assert frac.item() == eighths / 8


def test_fraction_between_neighbours_of_non_finite_values_is_zero():
    values = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, 1.0], dtype=torch.float64)
    assert fraction_between_neighbours(values, torch.float16).tolist() == [0.0] * 5


@settings(max_examples=50, deadline=None)
@given(shape=st.tuples(st.integers(1, 3), st.integers(1, 5), st.integers(1, 6), st.integers(1, 7)),
       tied=st.booleans())
def test_twins_are_copies_along_every_axis_and_keep_stride_0_axes(shape, tied):
    from ssmcheck.drift.independence import _twinned  # noqa: PLC0415

    g = torch.Generator().manual_seed(sum(shape))
    t = torch.randn(shape, generator=g)
    if tied:  # a per-(row, head) value expanded over channels and state indices, as dt and tied A are passed
        t = t[..., :1, :1].expand(shape)
    twin = _twinned(t, (0, 1, 2, 3))
    assert twin.shape == t.shape
    assert all(twin.stride(d) == 0 for d in range(4) if t.stride(d) == 0)  # a stride-0 axis stays so
    for axis, size in enumerate(shape):
        index = torch.arange(size) // 2 * 2
        assert torch.equal(twin, twin.index_select(axis, index))  # 2k + 1 holds 2k
    # The even elements are the input's own.
    evens = tuple(slice(0, None, 2) for _ in shape)
    assert torch.equal(twin[evens], t[evens])
