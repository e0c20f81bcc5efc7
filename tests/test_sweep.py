"""Sweep mechanics: option parsing, cartesian product, seeds, presets."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ssmcheck.core import presets, sweep


def test_parse_list_converts_and_deduplicates():
    assert sweep.parse_list("--chunk-size", "64, 128,64", sweep.positive_int) == [64, 128]


@pytest.mark.parametrize("text", ["", "64,abc", "0", "-3"])
def test_parse_list_names_the_option_and_value(text):
    with pytest.raises(sweep.SweepError, match="--chunk-size"):
        sweep.parse_list("--chunk-size", text, sweep.positive_int)


@pytest.mark.parametrize("text", ["40,,", ",40", "40, ,8", ","])
def test_parse_list_refuses_an_empty_item(text):
    with pytest.raises(sweep.SweepError, match=r"^--seqlen: an empty item was given in "):
        sweep.parse_list("--seqlen", text, sweep.positive_int)


def test_a_preset_list_with_an_empty_item_is_refused_too():
    with pytest.raises(sweep.SweepError, match="empty item"):
        sweep.parse_axis("--preset p: dtype", ["bf16", ""])


def test_parse_list_rejects_values_outside_the_choices():
    with pytest.raises(sweep.SweepError, match="'fp8'.*choose from fp32, fp16, bf16"):
        sweep.parse_list("--dtype", "fp16,fp8", allowed=("fp32", "fp16", "bf16"))


def test_parse_axis_takes_a_toml_list_or_comma_text():
    assert sweep.parse_axis("--batch", [2, 4, 2], sweep.positive_int) == [2, 4]
    assert sweep.parse_axis("--batch", "2,4", sweep.positive_int) == [2, 4]
    assert sweep.option_name("state_dtype") == "--state-dtype"


def test_parse_fail_on_names_the_categories():
    assert sweep.parse_fail_on("--fail-on", ["tolerance", "error"]) == ("tolerance", "error")
    with pytest.raises(sweep.SweepError, match="'warn'.*choose from nonfinite, tolerance, error"):
        sweep.parse_fail_on("--fail-on", "nonfinite,warn")


@given(st.floats(min_value=1e-300, max_value=1e300))
def test_parse_number_takes_finite_positive_numbers(value):
    assert sweep.parse_number("--tol-factor", value) == value
    assert sweep.parse_number("--tol-factor", str(value)) == value


@pytest.mark.parametrize("value", [0, 0.0, -1, "-0.5", float("inf"), "inf", float("nan"), "abc", None, True])
def test_parse_number_refuses_the_rest_and_names_the_option(value):
    with pytest.raises(sweep.SweepError, match=r"^--tol-factor: invalid value .*expected a finite number > 0"):
        sweep.parse_number("--tol-factor", value)


def test_parse_number_not_strict_takes_zero():
    assert sweep.parse_number("--floor", 0.0, strict=False) == 0.0
    with pytest.raises(sweep.SweepError, match=">= 0"):
        sweep.parse_number("--floor", -1e-9, strict=False)


@pytest.mark.parametrize("value, minimum, ok", [
    (0, 0, True), (3, 1, True), (0, 1, False), (-1, 0, False), (2.0, 1, False), ("3", 1, False), (True, 0, False),
])
def test_parse_count_takes_integers_from_the_minimum(value, minimum, ok):
    if ok:
        assert sweep.parse_count("--steps", value, minimum) == value
    else:
        with pytest.raises(sweep.SweepError, match=f"--steps: invalid value .*expected an integer >= {minimum}"):
            sweep.parse_count("--steps", value, minimum)


def test_product_order_and_size():
    cases = sweep.product({"a": [1, 2], "b": ["x", "y", "z"]})
    assert len(cases) == 6
    assert cases[0] == {"a": 1, "b": "x"} and cases[-1] == {"a": 2, "b": "z"}


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**31 - 1), st.dictionaries(st.sampled_from("abcde"), st.integers(-5, 5)))
def test_case_seed_is_deterministic_and_in_range(seed, params):
    s = sweep.case_seed(seed, params)
    assert s == sweep.case_seed(seed, dict(reversed(list(params.items()))))
    assert 0 <= s < 2**31


def test_case_seed_depends_on_the_parameters():
    seeds = {sweep.case_seed(0, {"seqlen": n}) for n in range(200)}
    assert len(seeds) == 200


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(0, 2**40), st.integers(0, 300))
def test_step_seeds_are_case_seeds_of_each_step(seed, first, count):
    assert sweep.step_seeds(seed, first, count) == [sweep.case_seed(seed, {"step": n})
                                                    for n in range(first, first + count)]


def test_presets_exist_for_both_commands():
    names = presets.preset_names()
    assert {"smoke", "default", "thorough"} <= set(names)
    for name in ("smoke", "default", "thorough"):
        assert isinstance(presets.load_preset(name, "scan"), dict)
        assert isinstance(presets.load_preset(name, "drift"), dict)


def test_unknown_preset_lists_the_available_ones():
    with pytest.raises(sweep.SweepError, match="unknown preset 'nope'.*default"):
        presets.load_preset("nope", "scan")


def test_device_overrides_apply_only_on_that_device(tmp_path, monkeypatch):
    (tmp_path / "p.toml").write_text("[drift]\nsteps = 32\ntrials = 2\n\n[drift.cuda]\nsteps = 1024\n")
    monkeypatch.setattr(presets, "_configs_dir", lambda: tmp_path)
    assert presets.load_preset("p", "drift", "cpu") == {"steps": 32, "trials": 2}
    assert presets.load_preset("p", "drift", "cuda") == {"steps": 1024, "trials": 2}
    assert presets.load_preset("p", "drift") == {"steps": 32, "trials": 2}
