"""cli.session's progress: decode steps reach the bar in batches, every step counted."""

from ssmcheck.cli.session import _Batched


def test_steps_reach_the_bar_in_batches_and_none_is_lost():
    told = []
    advance = _Batched(told.append)
    for _ in range(3 * _Batched.BATCH + 5):
        advance()
    assert told == [_Batched.BATCH] * 3 and advance.pending == 5
