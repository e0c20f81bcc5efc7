"""Whether a scan's stochastically rounded states draw on their seed: the seed check.

A case that stores its states stochastically in a narrower dtype is judged by the tolerance rule against a
baseline that rounds stochastically too, so a kernel that rounds to nearest (never worse) passes it, and so does
one whose random bits ignore the `seed` it is given: every prefill would round its states alike. The kernel is
called again on the same inputs with another seed. A state element whose float64 value lies a fraction p of the
way from its lower to its upper neighbour in the storage dtype is stored differently by two independent draws
with probability q = 2p(1 - p); over the states E = Σq of them are expected to differ. Where none does, and e^-E
(the chance that independent draws differ nowhere) is below FALSE_ALARM, the case fails: its stochastic rounding
does not depend on the seed. It is called once more with the case's seed with bit 30 flipped (OTHER_SEEDS; case
seeds are 31 bits): a kernel that keeps fewer bits of its seed (a key of `seed % 256`) stores other bits for seed + 1
but rounds every prefill whose seed agrees in the bits it keeps alike. Pure functions of tensors.
"""

from __future__ import annotations

import math

import torch

from ssmcheck.core.tensors import bits
from ssmcheck.ops.rounding.naive import fraction_between_neighbours

# The chance, at most, that a kernel whose draws do depend on the seed fails (e^-21: 7.6e-10).
FALSE_ALARM = 1e-9


# The other seeds a case is called with, each as (how the message names the two seeds, what equal bits show the
# rounding does not depend on, the seed from the case's): seed + 1, and the seed with bit 30 flipped.
FLIPPED_SEED_BIT = 30
OTHER_SEEDS = (
    ("two seeds", "the seed (rounded to nearest, or random bits that ignore it)", lambda seed: seed + 1),
    (f"seeds that differ only in bit {FLIPPED_SEED_BIT}",
     f"bit {FLIPPED_SEED_BIT} of the seed (a seed cut to fewer bits: prefills whose seeds agree in the rest round "
     "their states alike)",
     lambda seed: seed ^ (1 << FLIPPED_SEED_BIT)),
)


def expected_differences(reference_states: torch.Tensor, storage: torch.dtype) -> float:
    """E: how many stored elements two independent stochastic roundings of the float64 states store differently,
    on average."""
    p = fraction_between_neighbours(reference_states, storage)
    return float((2 * p * (1 - p)).sum())


def seed_ignored(first: torch.Tensor, second: torch.Tensor, reference_states: torch.Tensor,
                 storage: torch.dtype, seeds: str = OTHER_SEEDS[0][0], depends: str = OTHER_SEEDS[0][1]) -> str | None:
    """The failing clause where the states stored with two seeds (`first`, `second`; `seeds` and `depends` as
    OTHER_SEEDS names them) are the same bits everywhere and independent draws would almost surely have differed
    somewhere; None otherwise."""
    if not torch.equal(bits(first), bits(second)):
        return None
    expected = expected_differences(reference_states, storage)
    if math.exp(-expected) >= FALSE_ALARM:
        return None
    return (f"stochastic rounding: its states stored with {seeds} are the same bits in all {first.numel()} "
            f"elements, where independent draws differ in {expected:.0f} on average: the rounding does not depend "
            f"on {depends}")
