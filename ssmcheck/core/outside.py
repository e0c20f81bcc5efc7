"""Whether a non-finite result was read from past an input or made by the kernel's own arithmetic.

A call's inputs sit between NaN fences (core.fences): every scan call, and drift's checked steps. A call
whose outputs came back non-finite is made again on the same inputs (drift: from the same state), first as
it was, to see that it comes back non-finite again (a kernel that keeps something between calls, or races,
need not), then with zeros in every fence: if its outputs are finite so, the non-finite values were read
from outside the inputs, not computed (an overflow, a division by zero, a NaN the kernel makes stays
non-finite with any fence). Each input's storage alone then gets its NaN fences back (the others' stay 0),
and the inputs whose fences make the outputs non-finite again are the ones the kernel reads past: an
unmasked load at the end of x, a state index past dstate, chunk -1's state.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import torch

# (nan_fences) -> the call's outputs (scan: y and states; drift: out and the state), with NaN fences around
# those inputs (None: all) and 0 around the rest.
FencedCall = Callable[[Collection[str] | None], tuple[torch.Tensor, ...]]


def reads_outside(call: FencedCall, storages: list[tuple[str, ...]]) -> list[tuple[str, ...]] | None:
    """The storages (each the names of the inputs sharing it) the call reads past, for a call whose outputs
    were non-finite with NaN in every fence.

    None when the call made again is finite (not reproduced), or stays non-finite with zero fences (the
    kernel's own non-finite values); [] when no one storage's NaN fences alone make it non-finite (reads
    past several inputs at once). Raises what the call raises.
    """
    if finite(call(None)) or not finite(call(())):
        return None
    return [names for names in storages if not finite(call(names))]


def describe(storages: list[tuple[str, ...]]) -> str:
    """The verdict message's words for reads_outside's answer (not None)."""
    if not storages:
        return ("with zeros instead of NaN in the fences around its inputs its outputs are finite, but no "
                "single input's NaN fences make them non-finite: it reads past several inputs at once")
    named = [f"its input {names[0]}" if len(names) == 1 else f"the buffer holding {'/'.join(names)}"
             for names in storages]
    listed = " and ".join([", ".join(named[:-1]), named[-1]] if len(named) > 1 else named)
    return (f"it reads outside {listed}: the non-finite values are read from the NaN fences ssmcheck puts "
            "either side of each input's memory (with zeros there the outputs are finite), a load past the bounds")


def as_json(storages: list[tuple[str, ...]] | None) -> list[list[str]] | None:
    """reads_outside's answer as a report's JSON holds it."""
    return None if storages is None else [list(names) for names in storages]


def finite(outputs) -> bool:
    """Whether every tensor of `outputs` (None among them: no output) is finite."""
    return all(t is None or bool(torch.isfinite(t).all()) for t in outputs)
