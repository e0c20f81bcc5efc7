"""The launchers' integer helpers (ssmcheck.ops.host) against Triton's own, which they replace on the host."""

import triton
from hypothesis import given
from hypothesis import strategies as st

from ssmcheck.ops.host import cdiv, next_power_of_2


@given(st.integers(0, 2**40), st.integers(1, 2**20))
def test_cdiv_is_tritons(a, b):
    assert cdiv(a, b) == triton.cdiv(a, b) == -(-a // b)


@given(st.integers(1, 2**40))
def test_next_power_of_2_is_tritons(n):
    p = next_power_of_2(n)
    assert p == triton.next_power_of_2(n)
    assert p >= n and p & (p - 1) == 0 and (p == 1 or p // 2 < n)
