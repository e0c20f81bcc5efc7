"""The row-independence check of stochastic-rounding drift cases (drift.independence): two rows given the same
state and inputs must be rounded with bits of their own."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cli_invoke import invoke
from hypothesis import given, settings
from hypothesis import strategies as st

import ssmcheck
from ssmcheck.drift.independence import SIGMAS
from ssmcheck.ops.rounding.naive import fraction_between_neighbours

BROKEN = str(Path(__file__).with_name("broken_state_update_kernels.py"))
SMALL = dict(preset="smoke", regime=["normal", "stagnation"], state_dtype=["fp16", "bf16"],
             rounding=["nearest", "stochastic"], steps=2, trials=1, batch=[1], nheads=[2], headdim=[8], dstate=[16])


def _cases(kernel: str) -> list[dict]:
    return ssmcheck.drift(kernel=kernel, **SMALL).to_json()["cases"]


@pytest.mark.parametrize("kernel", ["builtin", f"{BROKEN}:plain_stochastic"])
def test_rows_of_a_correct_stochastic_rounding_differ_as_independent_draws_do(kernel):
    for case in _cases(kernel):
        check = case["independence"]
        if case["params"]["rounding"] == "nearest":
            assert check is None
            continue
        assert case["status"] == "pass", case["message"]
        # 2 heads x 8 channels x dstate 16 elements a row, a third of them expected to differ.
        assert check["elements"] == 256 and check["expected"] > 40, check
        assert abs(check["differ"] - check["expected"]) < SIGMAS * check["sigma"], check


def test_rows_rounded_with_the_same_bits_fail_every_stochastic_case():
    cases = _cases(f"{BROKEN}:random_bits_shared_by_rows")
    stochastic = [c for c in cases if c["params"]["rounding"] == "stochastic"]
    assert len(stochastic) == 4
    for case in stochastic:
        check = case["independence"]
        assert case["status"] == "fail" and check["status"] == "fail" and check["differ"] == 0, case["message"]
        assert (f"rows' random bits: rows 0 and 1, given the same state and inputs, stored the same bits in 256 of "
                f"256 elements where independent draws differ in {check['expected']:.0f} ± ") in case["message"]
    # To nearest the kernel is right: the check does not run.
    assert all(c["status"] == "pass" and c["independence"] is None for c in cases if c not in stochastic)


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
