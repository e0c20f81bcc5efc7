"""ssmcheck.testing.assert_stable: a Report when every case is stable, else an AssertionError listing the cases."""

import functools
from pathlib import Path

import pytest
from plugin_kernels import nan_in_varlen_partial_chunk

from ssmcheck import Report, UsageError
from ssmcheck.testing import assert_stable

NAN_KERNEL = f"{Path(__file__).with_name('plugin_kernels.py')}:nan_in_varlen_partial_chunk"
RAGGED = "ragged-bf16-c16-L40-b2-h2x8n8g1"
LOCATION = "y non-finite from sequence 0 token 0 (chunk 0) head 1 channel 0"


@functools.wraps(nan_in_varlen_partial_chunk)  # keeps the signature: ssmcheck still passes the state options
def nan_or_raise_on_long(x, *args, **kwargs):
    """NaN in the ragged case, and raises in the long one (its 130 tokens)."""
    if x.shape[1] == 130:
        raise RuntimeError("out of resource: shared memory")
    return nan_in_varlen_partial_chunk(x, *args, **kwargs)


def test_a_stable_kernel_returns_its_report():
    report = assert_stable("torch")
    assert isinstance(report, Report)
    assert report.summary["pass"] == len(report.cases) == 13


def test_a_stable_state_update_kernel_returns_its_report():
    assert assert_stable("torch", command="drift").summary["pass"] == 4


def test_an_unstable_kernel_raises_listing_its_cases_with_the_location():
    with pytest.raises(AssertionError) as excinfo:
        assert_stable(NAN_KERNEL, preset="smoke")
    headline, case, environment = str(excinfo.value).splitlines()
    assert headline == "ssmcheck scan: 1 of 13 cases are not stable (1 nonfinite)"
    assert case.startswith(f"  {RAGGED}: nonfinite: {LOCATION}")
    assert environment.startswith("ssmcheck ") and " scan | device " in environment


def test_the_headline_counts_each_status_most_severe_first():
    with pytest.raises(AssertionError) as excinfo:
        assert_stable(nan_or_raise_on_long)
    lines = str(excinfo.value).splitlines()
    assert lines[0] == "ssmcheck scan: 2 of 13 cases are not stable (1 nonfinite, 1 error)"
    assert [line.split(":")[:2] for line in lines[1:3]] == [
        [f"  {RAGGED}", " nonfinite"], ["  long-bf16-c16-L130-b1-h2x8n8g1", " error"]]
    assert "RuntimeError: out of resource: shared memory" in lines[2]


def test_statuses_that_fail_on_does_not_gate_are_stable():
    report = assert_stable(NAN_KERNEL, regime=["ragged"], fail_on=["tolerance"])
    assert [c.status for c in report.cases] == ["nonfinite"]


def test_a_sweep_in_which_no_case_ran_is_not_stable():
    with pytest.raises(AssertionError, match=r"^ssmcheck drift: no case ran\n  normal-fp32-stochastic-.*: skipped: "):
        assert_stable("torch", command="drift", regime=["normal"], state_dtype=["fp32"], rounding=["stochastic"])


@pytest.mark.parametrize(("options", "message"), [
    ({"command": "compare"}, "command: invalid value 'compare'"),
    ({"bogus": 1}, "unknown option 'bogus' for scan"),
])
def test_bad_options_raise_usage_error(options, message):
    with pytest.raises(UsageError, match=message):
        assert_stable("torch", **options)
