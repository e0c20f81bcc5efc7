"""The seed check of a stochastically rounded scan case (scan.draws): two seeds must store different bits."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ssmcheck import api
from ssmcheck.ops.rounding.naive import round_to
from ssmcheck.scan import draws

BROKEN = Path(__file__).with_name("broken_scan_kernels.py")
SR = dict(regime="ragged", dtype="fp32", chunk_size="64", seqlen="40", batch="3", nheads="2", headdim="16",
          dstate="16", ngroups="1", state_dtype="fp16,bf16", rounding="stochastic")


def test_a_kernel_that_rounds_to_nearest_when_told_stochastic_fails():
    report = api.scan(kernel=f"{BROKEN}:stochastic_rounding_to_nearest", **SR)
    assert [c.status for c in report.cases] == ["fail", "fail"], [c.message for c in report.cases]
    for case in report.cases:
        assert "stochastic rounding: its states stored with two seeds are the same bits in all 1536 elements" \
               in case.message, case.message


def test_a_kernel_that_keys_its_rounding_on_a_byte_of_its_seed_fails_on_bit_30():
    """seed + 1 gives it other bits; the seed with bit 30 flipped, the same ones."""
    report = api.scan(kernel=f"{BROKEN}:stochastic_rounding_from_an_8_bit_seed", **SR)
    assert [c.status for c in report.cases] == ["fail", "fail"], [c.message for c in report.cases]
    for case in report.cases:
        assert case.message.startswith("stochastic rounding: its states stored with seeds that differ only in bit 30 "
                                       "are the same bits in all 1536 elements, where independent draws differ in "), \
            case.message
        assert case.message.endswith("the rounding does not depend on bit 30 of the seed (a seed cut to fewer bits: "
                                     "prefills whose seeds agree in the rest round their states alike)"), case.message


def test_the_baseline_run_as_the_kernel_draws_on_its_seed():
    report = api.scan(kernel="torch", **SR)
    assert [c.status for c in report.cases] == ["pass", "pass"], [c.message for c in report.cases]


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), dtype=st.sampled_from([torch.float16, torch.bfloat16]),
       size=st.integers(256, 1024))
def test_two_independent_draws_pass_and_one_draw_twice_fails(seed, dtype, size):
    generator = torch.Generator().manual_seed(seed)
    exact = torch.randn(size, generator=generator, dtype=torch.float64) * 2.0 ** torch.randint(-8, 8, (size,),
                                                                                                generator=generator)
    first, second = (round_to(exact, dtype, "stochastic", generator) for _ in range(2))
    expected = draws.expected_differences(exact, dtype)
    assert expected > 21  # size >= 256 values: about a third of them differ on average
    assert draws.seed_ignored(first, second, exact, dtype) is None
    assert "same bits in all" in draws.seed_ignored(first, first.clone(), exact, dtype)


def test_states_the_format_holds_exactly_cannot_tell_and_pass():
    exact = torch.tensor([1.0, 0.5, -2.0, 0.0], dtype=torch.float64)  # representable: no draw changes them
    stored = exact.to(torch.float16)
    assert draws.expected_differences(exact, torch.float16) == 0.0 and math.exp(-0.0) >= draws.FALSE_ALARM
    assert draws.seed_ignored(stored, stored.clone(), exact, torch.float16) is None
