"""The independence check of a stochastic-rounding drift case: state elements given the same value must round
with random bits of their own, along every axis of the state.

Ideal stochastic rounding draws a fresh uniform for every element. A kernel whose random offsets leave an axis
out (Philox counters from the head, channel and state index but not the batch row; one draw per program shared
by its channels; the same offsets for every head) rounds the elements along that axis with the same bits: each
element on its own is exact stochastic rounding, so the bias test and the drift see nothing, but their rounding
errors are one and the same, and what decodes alike drifts alike.

One step, the case's regime, state dtype and kernel call, on inputs made of twins: a batch of 2 whose row 1 is a
copy of row 0 (state and every step input), and within it heads, channels and state indices in twins: along an
axis of n >= 4 elements, with the period P = 2 * (n // 4), element k + P a copy of k and 2j + 1 a copy of 2j below
2P (its state, inputs and parameters; every group's B and C group 0's, so that twin heads read the same ones; an
axis under 4 long all copies of its first). The step's heads are MIN_CHANNELS wide at least, so that channels
have twins 64 apart, past the block of channels a program takes, where offsets that restart with each block
repeat. The twins along each axis (AXES: rows, heads, channels, state indices), neighbours and a period apart,
are compared apart; and so is the step called twice on the same twin state and inputs with two seeds (CALLS), every
element its own twin. A kernel told its seed (a `seed` keyword) is called a third time with the first call's seed,
and must store the same bits (`the same step called twice with the same seed stored other bits in ...`: bits from a
global generator or a counter kept between calls reproduce no run), and twice more with that seed's bit 30 and then
its bit 0 flipped (SEED_BITS: drift's seeds are 31 bits), each call every element the first call's twin: a kernel
that keeps fewer bits of its seed (a key of `seed % 256`, a seed through a 32-bit float, `seed >> 8`) rounds every
two steps whose seeds agree in the bits it keeps with the same bits, and two random seeds agree there too rarely for
the calls above to show it (`twin calls whose seeds differ only in bit 30 ...: the stochastic rounding's random bits
do not depend on bit 30 of the seed`). An element
whose float64 update lies a fraction p of the way from its lower to its upper neighbour in the state dtype is
stored differently by two independent draws with probability q = 2p(1 - p): over an axis's pairs the number
that differ has mean E = Σq (the message gives √(Σq(1 - q)) beside it). So few that independent draws differ
that rarely with probability below FALSE_ALARM (Chernoff's bound on the lower tail: e^-E (eE/k)^k for k < E
differing) fails, and the message has a clause per axis that does (`random bits: twin batch rows (given the
same state and inputs) stored the same bits in 4096 of 4096 elements where independent draws differ in 1413 ± 29:
the stochastic rounding's random bits do not depend on the batch row`; where some twins differ, but too few,
and no axis's twins are all the same (those would explain the shortfall):
`... are correlated across channels`; a period apart: `twin channels 64 apart ...: the stochastic rounding's
random bits are the same channels 64 apart`). Where E is small (below 21 even none differing passes: an axis of one
element, states the step leaves representable) that axis cannot tell, and passes with its figures. The values
themselves are the decode's to judge, not this check's.

Twins at a few distances cannot see bits shared at any other: a random offset computed with a wrong stride (a
headdim where dstate belongs) gives the elements a fixed distance apart in the state's memory one counter, each of
them still exact SR on its own. So one more step (LAGS), of ALIKE_ROWS rows and MIN_HEADS heads at least (so that
rows 4 apart and heads 16 apart show), gives every element the same state and inputs: all of them
round the same exact value, up with probability p, and any two agree with probability a = p² + (1 - p)². For every
distance L in the flattened state (batch, heads, channels, state indices) the n - L pairs L apart are counted (an
FFT's autocorrelation of the rounding decisions); a distance where they agree more often than a allows (z above
LAG_Z, against a variance that allows for the pairs of one distance sharing elements) by at least LAG_EXCESS of the
pairs fails: `elements 1792 apart in the state (row +0, head +1, channel -16, state index +0), every element given
the same state and inputs, stored the same bits in 6283 of 6400 pairs where independent draws agree in 5703 ± 34`.

And the twin step's calls whose seeds differ only in bit 0 (consecutive seeds) are compared at every shift in the
flattened state but none (SEED_SHIFT): a kernel whose random offset is seed + the element's offset (the seed in
Philox's counter, not its key) gives seed s + 1's element i the bits seed s gave element i + 1, each call exact SR
with bits of its own along every axis, and an engine passing a step counter as the seed repeats them a step later
(`calls whose seeds differ only in bit 0 (consecutive seeds s and s + 1, given the same state and inputs) rounded
alike at a shift of 1 element in the state (...)`; since the sixty-third session).

A kernel that takes slot indices runs every step of the check again through them, a slot per row (`state_batch_indices`,
as serving engines call it) and a pad row after them, where it passes as it is: that path is another compiled variant,
whose random offsets may come from the slot, and a padded batch may take a path of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from ssmcheck.core import sweep
from ssmcheck.core.capture import Transcript
from ssmcheck.core.pool import nan_filled
from ssmcheck.core.precompile import compiling_ahead
from ssmcheck.core.status import Status
from ssmcheck.core.tensors import bits
from ssmcheck.drift.adapter import DriftAdapter, KernelRaised
from ssmcheck.drift.regimes import make_problem
from ssmcheck.drift.results import SlotCheck
from ssmcheck.drift.spec import DriftCase
from ssmcheck.ops.rounding.naive import fraction_between_neighbours
from ssmcheck.ops.state_update.naive import state_update_step

NAME, TITLE = "independence", "random bits"
# The chance, at most, that independent twins differ as rarely as a failing axis's did (per axis and case).
FALSE_ALARM = 1e-9
# The axes compared, each as (its name in the message, what a kernel's bits then do not depend on), by the axis
# of the state (batch, nheads, headdim, dstate).
AXES = {"rows": ("batch rows", "the batch row"), "heads": ("heads", "the head"),
        "channels": ("channels", "the channel"), "state_indices": ("state indices", "the state index")}
# And the step called twice on the same state and inputs with two seeds (each call's seed keyword, or torch's
# generator, which the first call advances): a kernel whose bits ignore the seed (a constant Philox key, an
# offset that never advances) rounds every decode step with the same bits.
CALLS = "calls"
# And the first call made again with its seed's top bit (of the 31 that drift's seeds have) and then its lowest bit
# flipped: a kernel that cuts its seed to fewer bits (a key of `seed % 256`, a seed in 32-bit float, `seed >> 8`)
# reads one seed for every step whose seeds agree in what it keeps, and repeats their bits; two random seeds rarely
# agree there (1 in 256 for an 8-bit key), so the two seeds above pass it.
SEED_BITS = {"seed_bit_30": 30, "seed_bit_0": 0}
TWINS = {**AXES, CALLS: ("calls", "the seed"),
         **{name: (f"calls whose seeds differ only in bit {bit}",
                   f"bit {bit} of the seed (a seed cut to fewer bits: steps whose seeds agree in the rest round "
                   "with the same bits)") for name, bit in SEED_BITS.items()}}
# Where each axis lies in each input: (batch, heads, channels, state indices); None where it has none. A, D and
# dt_bias are parameters (no batch axis); B and C have groups for heads (made one group's, below).
_INPUT_AXES = {
    "state": (0, 1, 2, 3), "x": (0, 1, 2, None), "dt": (0, 1, 2, None), "z": (0, 1, 2, None),
    "B": (0, None, None, 2), "C": (0, None, None, 2),
    "A": (None, 0, 1, 2), "D": (None, 0, 1, None), "dt_bias": (None, 0, 1, None),
}


# The step whose elements are all alike, and the distances between its elements: named in figures and messages.
LAGS = "lags"
# A distance fails where its pairs agree more often than independent draws with z above LAG_Z (one of up to ~10**5
# distances: far past any of them by chance) and by at least LAG_EXCESS of its pairs (a material share).
LAG_Z = 8.0
LAG_EXCESS = 0.02
# Distances with fewer pairs than this are not counted (too few to tell).
LAG_MIN_PAIRS = 64
# And the twin step's calls whose seeds differ only in bit 0 (consecutive seeds, as a step counter passed for the
# seed gives them), compared at every shift in the flattened state but none: a kernel whose random offset is seed +
# the element's offset (the seed in the counter, not in the key) gives seed s + 1's element i seed s's bits of element
# i + 1. Their rounding decisions (up or down, centred on p) are correlated at each shift (an FFT's cross-correlation);
# the pairs of one shift are independent (one element of each call each), each product within [-1, 1], so Bernstein's
# inequality bounds the chance that independent draws correlate as much: a shift fails where that bound, times the
# shifts compared, is below FALSE_ALARM (few elements far from a tie could otherwise stand out by one coincidence),
# and the correlation is at least LAG_EXCESS of what identical bits give.
SEED_SHIFT = "seed_shift"

# The twin step's heads are at least this wide: its channels then have twins 64 apart, past a block of 64 (or
# fewer) channels a program, where a kernel whose offsets restart with each block repeats its bits.
MIN_CHANNELS = 128
# The step with every element alike has at least this many heads (the case's times a whole number, so that its groups
# still divide them): distances of 16 heads, past a block of 16 heads a program or a grid axis, where offsets computed
# from the head modulo 16 (a 4-bit field of the counter) repeat, in half of a row's heads at least (at 17, one pair a
# row: an excess under LAG_EXCESS); and this many rows: distances of 4 rows, where offsets computed from the row within
# a block of 4 repeat (9 heads and 2 rows before the fifty-second session); on a GPU, where the step costs nothing,
# ALIKE_ROWS_GPU: distances of 8 and 16 rows too (blocks of 8 or 16 rows; since the sixtieth session). The interpreter
# pays per program: there the 5 rows' 160 programs cost about 4 s a stochastic case, 17 rows would triple it. And
# heads of this many channels at least (wider than a small dstate, where a stride of dstate taken for headdim's makes
# heads overlap), fewer than the twin step's to keep its cost.
MIN_HEADS = 32
ALIKE_ROWS = 5
ALIKE_ROWS_GPU = 17
ALIKE_CHANNELS = 32


def run_check(case: DriftCase, kernel: DriftAdapter, device: str, transcript: Transcript) -> SlotCheck:
    """The verdict of `case` (a stochastic-rounding one) for `kernel`: its steps called as they are, and, for a
    kernel that takes slot indices and passes that way, again with a slot per row and a pad row (`state_batch_indices`, as
    serving engines call it: a path of its own, where its random offsets may be computed from the slot)."""
    steps = _steps(case, device)
    plain = _check(steps, case, kernel, transcript, through_slots=False)
    # Compiling ahead (drift.ahead), nothing the kernel returns is computed: call both ways, whatever the verdict.
    if kernel.pad_slot_id is None or (plain.status is not Status.PASS and not compiling_ahead()):
        return plain
    slotted = _check(steps, case, kernel, transcript, through_slots=True)
    if slotted.status is Status.PASS:
        return plain
    return replace(slotted, message=slotted.message.replace(f"{TITLE}: ", f"{TITLE} (called with a slot per row and a "
                                                                          "pad row, state_batch_indices): ", 1))


@dataclass(frozen=True)
class _Steps:
    """The check's inputs, drawn once for both ways of calling the kernel: the twin step's and the alike step's
    states before the step (the kernel updates copies), arguments, and where each element's float64 update lies
    between its neighbours in the state dtype."""

    seed: int
    state: torch.Tensor
    arguments: dict
    exact: torch.Tensor  # the twin step's float64 update
    p: torch.Tensor
    alike_state: torch.Tensor
    alike_arguments: dict
    alike_p: torch.Tensor


def _steps(case: DriftCase, device: str) -> _Steps:
    seed = sweep.case_seed(case.seed, {"check": NAME})
    # The twin step at MIN_CHANNELS channels at least; the step with every element alike (its shape is free: every
    # element is the same) at ALIKE_ROWS rows, MIN_HEADS heads and ALIKE_CHANNELS channels at least.
    shapes = {"twin": replace(case.shape(), batch=2, headdim=max(case.headdim, MIN_CHANNELS)),
              "alike": replace(case.shape(), batch=ALIKE_ROWS if device == "cpu" else ALIKE_ROWS_GPU,
                               nheads=case.nheads * -(-MIN_HEADS // case.nheads),
                               headdim=max(case.headdim, ALIKE_CHANNELS))}
    copies = {"twin": lambda t, name: _twinned(t, _INPUT_AXES[name]),
              "alike": lambda t, name: _twinned(t, tuple(range(t.dim())), lambda size: 0)}
    made = {}
    for kind, shape in shapes.items():
        problem = make_problem(case.regime, shape, case.dtype, 1, seed, device)
        step = next(problem.steps())
        given = {"state": problem.initial_state, **dict(step.given()), **problem.parameters()}
        for name in ("B", "C"):  # every group group 0's: twin heads read the same B and C, however heads map to groups
            given[name] = given[name][:, :1].expand(given[name].shape).contiguous()
        inputs = {name: None if t is None else copies[kind](t, name) for name, t in given.items()}
        state = inputs.pop("state")
        arguments = {"z": None, **inputs, "dt_softplus": problem.dt_softplus}
        exact = _exact_step(state.double(), arguments)
        made[kind] = (state, arguments, exact, fraction_between_neighbours(exact, case.dtype))
    alike_state, alike_arguments, _, alike_p = made["alike"]  # the lags judge the alike step by its p alone
    return _Steps(seed, *made["twin"], alike_state, alike_arguments, alike_p)


def _step(kernel: DriftAdapter, state: torch.Tensor, arguments: dict, rounding: str, seed: int, where: str,
          transcript: Transcript, through_slots: bool) -> None:
    """One update of `state` in place: as it is, or through slot indices, the rows on the first slots of a pool
    that are not the kernel's pad slot id (vLLM's is 0, its null block), then a pad row (a batch padded to a
    captured size, as every CUDA-graph decode batch of an engine is: a kernel that rounds such a batch on a path of
    its own, to nearest, fails here), its out NaN-filled."""
    if not through_slots:
        kernel.update(state, arguments, rounding, seed, where, transcript)
        return
    rows = state.shape[0]
    slots = [slot for slot in range(rows + 1) if slot != kernel.pad_slot_id][:rows]
    pool = state[:1].repeat(slots[-1] + 1, *([1] * (state.dim() - 1)))
    index = torch.tensor(slots, dtype=torch.int32, device=state.device)
    pool[index.long()] = state
    padded = {name: _with_a_pad_row(t) if name in _PER_ROW else t for name, t in arguments.items()}
    out = nan_filled((rows + 1, *arguments["x"].shape[1:]), arguments["x"])
    kernel.update_slots(pool, torch.cat([index, index.new_tensor([kernel.pad_slot_id])]), padded, out, rounding,
                        seed, where, transcript)
    state.copy_(pool[index.long()])


_PER_ROW = ("x", "dt", "B", "C", "z")  # the step's inputs with a batch axis


def _with_a_pad_row(t: torch.Tensor | None) -> torch.Tensor | None:
    """`t` (batch first) with its row 0 once more at the end, its stride-0 axes (dt's per head) kept so."""
    if t is None:
        return None
    tied = [d for d in range(1, t.dim()) if t.stride(d) == 0]
    base = t[tuple(slice(0, 1) if d in tied else slice(None) for d in range(t.dim()))]
    return torch.cat([base, base[:1]]).expand(t.shape[0] + 1, *t.shape[1:])


def _check(steps: _Steps, case: DriftCase, kernel: DriftAdapter, transcript: Transcript,
           through_slots: bool) -> SlotCheck:
    """The twin steps, the step with every element alike and their verdict (the module docstring), each step
    called through slot indices where `through_slots`."""
    state, again, alike_state = steps.state.clone(), steps.state.clone(), steps.alike_state.clone()
    # A kernel told its seed is called a third time with the first call's: its bits must be the same ones.
    repeated = steps.state.clone() if kernel.takes_seed else None
    # And with the first call's seed, one bit flipped (SEED_BITS).
    flipped = {name: steps.state.clone() for name in SEED_BITS} if kernel.takes_seed else {}
    first_seed = sweep.case_seed(steps.seed, {"step": 1})
    calls = [(state, first_seed), (again, sweep.case_seed(steps.seed, {"step": 2}))]
    if repeated is not None:
        calls.append((repeated, first_seed))
    calls += [(twin, first_seed ^ (1 << SEED_BITS[name])) for name, twin in flipped.items()]
    try:
        for twin, call_seed in calls:  # the same step with two seeds (the first again, and with a bit flipped)
            _step(kernel, twin, steps.arguments, case.rounding, call_seed, "independence check", transcript,
                  through_slots)
        _step(kernel, alike_state, steps.alike_arguments, case.rounding, sweep.case_seed(steps.seed, {"step": 3}),
              "independence check (every element alike)", transcript, through_slots)
    except KernelRaised as exc:
        return SlotCheck(NAME, Status.ERROR, f"{TITLE}: {exc}")
    p = steps.p
    lags = {"widths": list(alike_state.shape), **_lag_figures(alike_state, steps.alike_p)}
    stored = bits(state)
    if repeated is not None and not torch.equal(stored, bits(repeated)):
        moved = int((stored != bits(repeated)).sum())
        return SlotCheck(NAME, Status.FAIL, f"{TITLE}: the same step called twice with the same seed stored other "
                         f"bits in {moved} of {stored.numel()} elements: the stochastic rounding's random bits come "
                         "from elsewhere than its seed (a global generator, a counter kept between calls, a race), so "
                         "no run can be reproduced", {"widths": list(state.shape), "seed_repeat_differs": moved})
    # (name, distance, the first elements' p, their stored bits, their twins'): along each axis, and the call with
    # another seed, every element's twin.
    pairings = [(name, distance, p[first], stored[first], stored[second]) for axis, name in enumerate(AXES)
                for distance, first, second in _pairs(axis, stored.shape[axis])]
    pairings.append((CALLS, 1, p, stored, bits(again)))
    pairings += [(name, 1, p, stored, bits(twin)) for name, twin in flipped.items()]
    figures, failed = {"widths": list(state.shape), **{name: [] for name in TWINS}, LAGS: lags}, []
    if "seed_bit_0" in flipped:
        figures[SEED_SHIFT] = _shift_figures(state, flipped["seed_bit_0"], steps.exact, p)
    for name, distance, *twins_of in pairings:
        pairing, fails = _pairing(distance, *twins_of)
        figures[name].append(pairing)
        if fails:
            failed.append((name, pairing))
    if any(name == CALLS and f["differ"] == 0 for name, f in failed):
        # Bits that ignore the seed ignore each of its bits: the calls' clause says it.
        failed = [(name, f) for name, f in failed if name not in SEED_BITS]
    if not failed:
        if lags["fails"]:
            return SlotCheck(NAME, Status.FAIL, f"{TITLE}: {_lag_failure(lags, lags['widths'])}", figures)
        if figures.get(SEED_SHIFT, {}).get("fails"):
            return SlotCheck(NAME, Status.FAIL, f"{TITLE}: {_shift_failure(figures[SEED_SHIFT], list(state.shape))}",
                             figures)
        return SlotCheck(NAME, Status.PASS, "", figures)
    # Twins that never differ are certain; bits shared along one axis also make the other axes' pairs fail to be
    # independent of each other, and a count over them can then fall short by itself: those go unnamed.
    certain = [(name, f) for name, f in failed if f["differ"] == 0]
    if not certain and {name for name, _ in failed} == {name for name in TWINS if figures[name]}:
        # Alike along every axis at once: not bits shared along one, but stores the draws hardly move (a
        # rounding whose random bits do not reach these values, rounding them to nearest instead).
        return SlotCheck(NAME, Status.FAIL, f"{TITLE}: twins along every axis stored the same bits far more often "
                         f"than independent draws would ({_alike(failed)}): these stores are rounded almost "
                         "deterministically, the random bits do not reach them", figures)
    certain_axes = {name for name, _ in certain}
    if certain_axes == {name for name in AXES if figures[name]} and CALLS not in certain_axes:
        # The same bits for twins wherever they lie, yet other bits for another seed: bits drawn from the value
        # itself (a hash of it and the seed), not from the element's place.
        return SlotCheck(NAME, Status.FAIL, f"{TITLE}: twins along every axis (given the same state and inputs) "
                         f"stored the same bits ({_alike(certain)}): the stochastic rounding's random bits depend on "
                         "no coordinate of the element (a function of its value and the seed)", figures)
    return SlotCheck(NAME, Status.FAIL, f"{TITLE}: " + "; ".join(_failure(name, f) for name, f in certain or failed),
                     figures)


def _exact_step(state: torch.Tensor, arguments: dict) -> torch.Tensor:
    """The float64 update of `state` (float64) under the step's `arguments`."""
    double = {name: None if t is None else t.double() for name, t in arguments.items() if name != "dt_softplus"}
    exact, _ = state_update_step(state, double["x"], double["dt"], double["A"], double["B"], double["C"],
                                 D=double["D"], z=double["z"], dt_bias=double["dt_bias"],
                                 dt_softplus=arguments["dt_softplus"])
    return exact


def _lag_figures(stored: torch.Tensor, p: torch.Tensor) -> dict:
    """The distance in the flattened state whose pairs of a step with every element alike agree most in excess
    of independent draws (stored bits equal), and whether it fails (LAG_Z, LAG_EXCESS). `p`: where each element's
    exact update lies between its neighbours (all the same, up to the float64 step's own rounding)."""
    flat = bits(stored).flatten()
    values, counts = torch.unique(flat, return_counts=True)
    n = flat.numel()
    if len(values) != 2:  # all stored alike (no draw to compare: the twins' counts judge it), or not two neighbours
        return {"distance": None, "fails": False, "stored_values": len(values)}
    ups = (flat == values[counts.argmin()]).double()
    q = float(p.flatten()[0].clamp(0.0, 1.0))
    agree_p = q * q + (1 - q) * (1 - q)
    # Pairs of one distance share elements (chains i, i + L, i + 2L): the count's variance is at most
    # (1 + 2|c| / v) times the independent one's, c the covariance of neighbouring pairs in a chain.
    variance = agree_p * (1 - agree_p)
    covariance = abs(q**3 + (1 - q) ** 3 - agree_p**2)
    signs = 2 * ups - 1
    spectrum = torch.fft.rfft(signs, 2 * n)
    correlation = torch.fft.irfft(spectrum * spectrum.conj(), 2 * n)[:n]
    pairs = torch.arange(n, 0, -1, dtype=torch.float64, device=signs.device)
    agree = (correlation + pairs) / 2
    distances = torch.arange(n, device=signs.device)
    counted = (distances >= 1) & (pairs >= LAG_MIN_PAIRS)
    if variance == 0.0 or not bool(counted.any()):
        return {"distance": None, "fails": False, "stored_values": 2}
    sigma = torch.sqrt(pairs * (variance + 2 * covariance))
    z = torch.where(counted, (agree - agree_p * pairs) / sigma, -math.inf)
    worst = int(z.argmax())
    excess = float(agree[worst] / pairs[worst] - agree_p)
    return {"distance": worst, "pairs": int(pairs[worst]), "agree": round(float(agree[worst])),
            "expected": round(agree_p * float(pairs[worst]), 1), "sigma": round(float(sigma[worst]), 2),
            "z": round(float(z[worst]), 2), "fails": float(z[worst]) > LAG_Z and excess >= LAG_EXCESS,
            "stored_values": 2}


def _lag_failure(lags: dict, widths: list[int]) -> str:
    """A failing distance, in words, with the steps along each axis that make it up."""
    parts = _distance_parts(lags["distance"], widths)
    return (f"elements {lags['distance']} apart in the state ({parts}), every element given the same state and "
            f"inputs, stored the same bits in {lags['agree']} of {lags['pairs']} pairs where independent draws agree "
            f"in {lags['expected']:.0f} ± {lags['sigma']:.0f}: the stochastic rounding's random bits repeat at that "
            "distance (an offset computed with a wrong stride)")


def _distance_parts(distance: int, widths: list[int]) -> str:
    """A distance in the flattened state as steps along each axis: "row +0, head +1, channel -16, state index +0"."""
    steps, rest = [], distance
    for size in reversed(widths[1:]):  # state indices, channels, heads; the rest is rows
        rest, step = divmod(rest, size)
        if step > size // 2:  # the nearer way round: one more along the outer axis, back along this one
            step, rest = step - size, rest + 1
        steps.append(step)
    steps.append(rest)
    names = ("row", "head", "channel", "state index")
    return ", ".join(f"{name} {step:+d}" for step, name in zip(reversed(steps), names))


def _shift_figures(first: torch.Tensor, second: torch.Tensor, exact: torch.Tensor, p: torch.Tensor) -> dict:
    """The shift (in the flattened state, either way, 0 excluded: the seed_bit_0 twins judge it) at which two calls'
    rounding decisions on the same step correlate most (SEED_SHIFT), and whether it fails. `exact` is the step's
    float64 update, `p` where each element's magnitude lies between its neighbours (the chance it is rounded up)."""
    n = exact.numel()
    p = p.flatten().double()
    centred = [((t.double().abs() > exact.abs()).flatten().double() - p) for t in (first, second)]
    variance = p * (1 - p)

    def correlate(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """sum_i a[i + L] b[i] for L = -(n - 1) .. n - 1, in that order."""
        full = torch.fft.irfft(torch.fft.rfft(a, 2 * n) * torch.fft.rfft(b, 2 * n).conj(), 2 * n)
        return torch.cat([full[n + 1:], full[:n]])

    shared = correlate(centred[0], centred[1])
    spread = correlate(variance, variance)
    alike = correlate(variance.sqrt(), variance.sqrt())  # what identical bits give where both elements' p agree
    drawn = (variance > 0).double()
    pairs = correlate(drawn, drawn).round()  # pairs of elements that both calls round with a draw
    shifts = torch.arange(-(n - 1), n, device=p.device)
    counted = (shifts != 0) & (pairs >= LAG_MIN_PAIRS)
    if not bool(counted.any()):
        return {"shift": None, "fails": False}
    # Bernstein: P(sum >= t) <= exp(-t^2 / (2 (variance + t / 3))) for independent terms of mean 0 within [-1, 1].
    exponent = torch.where(counted & (shared > 0), shared**2 / (2 * (spread + shared / 3)), -math.inf)
    worst = int(exponent.argmax())
    share = float(shared[worst] / alike[worst])
    log_bound = -float(exponent[worst]) + math.log(int(counted.sum()))
    return {"shift": int(shifts[worst]), "pairs": int(pairs[worst]), "correlation": round(share, 3),
            "z": round(float(shared[worst] / spread[worst].clamp(min=1e-300).sqrt()), 2),
            "fails": log_bound < math.log(FALSE_ALARM) and share >= LAG_EXCESS}


def _shift_failure(shift: dict, widths: list[int]) -> str:
    """A failing shift between the calls of consecutive seeds, in words."""
    distance = abs(shift["shift"])
    parts = _distance_parts(distance, widths)
    earlier, later = ("s + 1", "s") if shift["shift"] > 0 else ("s", "s + 1")
    elements = "element" if distance == 1 else "elements"
    return (f"calls whose seeds differ only in bit 0 (consecutive seeds s and s + 1, given the same state and inputs) "
            f"rounded alike at a shift of {distance} {elements} in the state ({parts}): their rounding decisions "
            f"correlate {shift['correlation']:.2f} (z = {shift['z']:.0f}; independent draws: 0 ± 1): element i of "
            f"seed {earlier} takes seed {later}'s random bits of element i + {distance}, the seed added to the "
            "element's offset instead of keying the random bits (a step counter passed as the seed repeats them a "
            "step later)")


def _pairing(distance: int, p: torch.Tensor, first: torch.Tensor, second: torch.Tensor) -> tuple[dict, bool]:
    """Twins whose stored bits are `first` and `second`, the first's exact updates a fraction `p` of the way
    between their neighbours: their figures, and whether so few differ that independent draws would differ that
    rarely with probability below FALSE_ALARM."""
    q = 2 * p * (1 - p)
    expected, spread = q.sum().item(), math.sqrt((q * (1 - q)).sum().item())
    differ = int((first != second).sum())
    figures = {"distance": distance, "pairs": q.numel(), "differ": differ, "expected": round(expected, 1),
               "sigma": round(spread, 2)}
    return figures, lower_tail_bound(differ, expected) < FALSE_ALARM


def _alike(failed: list[tuple[str, dict]]) -> str:
    """Each axis's first failing pairing, in words: "rows 15858 of 16384 alike where 5614 ± 58 differ"."""
    first = {}
    for name, f in failed:
        first.setdefault(name, f)
    return ", ".join(f"{TWINS[name][0]} {f['pairs'] - f['differ']} of {f['pairs']} alike where {f['expected']:.0f} ± "
                     f"{f['sigma']:.0f} differ" for name, f in first.items())


def lower_tail_bound(k: int, mean: float) -> float:
    """A bound on P(X <= k) for X a sum of independent Bernoulli variables of mean `mean` (Chernoff's lower tail:
    e^-mean (e mean / k)^k for k < mean; 1 from the mean on)."""
    if k >= mean:
        return 1.0
    return math.exp(-mean + (k * (1 + math.log(mean / k)) if k > 0 else 0.0))


def _failure(name: str, f: dict) -> str:
    what, depends = TWINS[name]
    why = f"do not depend on {depends}" if f["differ"] == 0 else f"are correlated across {what}"
    if f["distance"] > 1:
        what = f"{what} {f['distance']} apart"
        why = f"are the same {what}" if f["differ"] == 0 else f"are correlated {what}"
    return (f"twin {what} (given the same state and inputs) stored the same bits in {f['pairs'] - f['differ']} of "
            f"{f['pairs']} elements where independent draws differ in {f['expected']:.0f} ± {f['sigma']:.0f}: the "
            f"stochastic rounding's random bits {why}")


def _twin_period(size: int) -> int:
    """Along an axis of `size`: elements k and k + period are twins, and so are 2j and 2j + 1 below 2 * period
    (an even period; 0 for an axis under 4 long, all of whose elements are twins)."""
    return size // 4 * 2


def _pairs(axis: int, size: int) -> list[tuple[int, tuple, tuple]]:
    """The state's twins along `axis` (of `size`), as (distance, the first elements, their twins): neighbours,
    and elements a period apart. Rows whole; along the other axes, in row 0."""
    row = () if axis == 0 else (0,) + (slice(None),) * (axis - 1)
    period = _twin_period(size)
    end = 2 * period if period else size // 2 * 2
    pairs = [(1, row + (slice(0, end, 2),), row + (slice(1, end, 2),))] if end else []
    if period > 1:
        pairs.append((period, row + (slice(0, period),), row + (slice(period, 2 * period),)))
    return pairs


def _twinned(t: torch.Tensor | None, axes: tuple[int | None, ...],
             period_of: Callable[[int], int] = _twin_period) -> torch.Tensor | None:
    """`t` with index 2k + 1 a copy of 2k along each of `axes` (the batch's 2 rows: row 1 a copy of row 0), in a
    storage of its own; its stride-0 axes (a per-head parameter's expanded view, dt's per head) kept so. The period
    of an axis of `size` is `period_of(size)` (_twin_period's; 0: every element a copy of the first, the alike
    step's)."""
    if t is None:
        return None
    zero = [d for d in range(t.dim()) if t.stride(d) == 0]
    twin = t[tuple(slice(0, 1) if d in zero else slice(None) for d in range(t.dim()))]
    for axis in axes:
        if axis is not None and axis not in zero:
            size = t.shape[axis]
            period = period_of(size)
            index = torch.arange(size, device=t.device)
            index = index % period // 2 * 2 if period else torch.zeros_like(index)
            twin = twin.index_select(axis, index)
    return twin.contiguous().expand(t.shape)
