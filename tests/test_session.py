"""cli.session's progress: decode steps reach the bar a few times a second, every step counted."""

from ssmcheck.cli.session import _Batched


def test_steps_reach_the_bar_every_interval_and_none_is_lost():
    told, now = [], [0.0]
    advance = _Batched(told.append, clock=lambda: now[0])
    for step in range(1000):
        now[0] = step * 0.001  # a step a millisecond: the bar is told every INTERVAL
        advance()
    assert sum(told) + advance.pending == 1000
    assert len(told) == 9 and all(abs(n - _Batched.INTERVAL * 1000) <= 1 for n in told)
