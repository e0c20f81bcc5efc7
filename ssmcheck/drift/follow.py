"""The float64 side of one lockstep decode step, as one function of tensors.

After the kernel has stored its new state, `follow` advances the three float64 recurrences (the
reference, the baseline before its rounding, and the exact update of the kernel's previous state) as
one stacked step, rounds the baseline, adds the kernel's store errors to the running sums and sets the
non-finite flag; all in place, so a CUDA graph that captured it keeps doing the same.

Eagerly that is about a hundred device kernels, and in a CUDA graph each costs a launch: they, not the
kernel under test, set the time of a drift step on a GPU. On CUDA `Follower` runs a fast step instead,
checked against this one at a trial's first step: the same step as one Triton kernel (drift.follow_kernel),
or, where that one disagrees or fails, this function compiled by torch.compile, which fuses it into a few
kernels (with the sums and the flag kept per state row, no reduction over the whole state: a replayed step
is 10 kernels in all, 0.16 -> 0.02 ms on an H200, README "Measured"). The truth stays this source, the
plain-PyTorch references (ops.*.naive) in float64.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ssmcheck.core.precompile import compiling_ahead
from ssmcheck.core.tensors import nonfinite_mask
from ssmcheck.drift.follow_kernel import follow_triton
from ssmcheck.drift.stats import STORE_SUMS, row_totals, store_allowance, store_sums
from ssmcheck.ops.rounding.naive import round_to
from ssmcheck.ops.state_update.naive import state_update_parts

RECOMPILE_LIMIT = 1024  # compilations of `follow` per process (one per shape, state dtype, rounding mode)
MUTATED = ("ref", "baseline", "sums", "tripped")  # the arguments `follow` updates in place
# How far the compiled step's float64 values may be from the eager ones (relative): last bits only. One
# step's float64 rounding is ~1e-16; the drift judged is measured in fp16/bf16 ulps (1e-3, 1e-2).
AGREEMENT_RTOL = 1e-12


def follow(*, ref, baseline, before, after, out, x, dt, z, A, B, C, D, dt_bias, sums, tripped, uniform,
           dt_softplus: bool, dtype: torch.dtype, rounding: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step of the float64 recurrences beside the kernel's; returns (reference out, baseline out, exact out):
    the baseline's before its rounding to the kernel's out dtype (output_rounded, outside the compiled step:
    drift.run rounds it where it measures it, at the checkpoints, not at every step), and the exact output of the
    kernel's own previous state (what its out rounds, free of the drift before the step: core.output_bias).

    ref, baseline: float64 states, advanced in place (the baseline rounded into `dtype` per `rounding`,
    against `uniform`'s draws when stochastic); before, after: the kernel's state before and after its
    call; out: the kernel's output; x, dt, B, C, z: the step's inputs (any float dtype; z, the output's
    gate, may be None); A, D, dt_bias: float64 parameters; sums: the running store-error sums
    (stats.store_sums' layout: per state row), added to in place; tripped: a bool flag per state row (the
    output's shape), set where the kernel's state or output is non-finite and the reference's is finite. Per row,
    with no sum over the whole state, the compiled step fuses into fewer kernels (stats.store_sums).
    """
    step = state_update_parts(torch.stack([ref, baseline, before.double()]), x.double(), dt.double(), A, B.double(),
                              C.double(), D=D, z=None if z is None else z.double(), dt_bias=dt_bias,
                              dt_softplus=dt_softplus)
    new, outs = step.new_state, step.out
    ref.copy_(new[0])
    baseline.copy_(round_to(new[1], dtype, rounding, uniform=uniform))
    # The kernel's store against the exact update of its own previous state: its rounding error, in ulps,
    # signed along the exact value (free of the drift accumulated before it), its subnormals kept or flushed, and
    # whether a rounding of that value, within what float32 arithmetic explains, gives it.
    exact, stored = new[2], after.double()
    xB = x.double().abs()[..., None] * step.Bh.abs()[..., None, :]
    allowance = store_allowance(step.decayed[2], step.drive, step.dt, A, xB)
    sums.add_(store_sums(exact, stored, dtype, allowance, rounding))
    tripped |= nonfinite_mask(stored, new[0]).any(-1) | nonfinite_mask(out, outs[0])
    return outs[0], outs[1], outs[2]


def output_rounded(out: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A float64 output as a kernel returns it in `dtype` (its x's), back in float64: the baseline's out is
    rounded there as its state is into the storage dtype (a bf16 out errs by up to 2**-9 of itself). Through
    float32, as a kernel computing in float32 rounds it. Never inside the compiled step: rounded there, the
    compiled step's baseline output differed from the eager one's on the H200 (torch 2.11, emulate_precision_casts
    on), every step of every case, so every GPU drift ran its float64 side eagerly.
    """
    return out.float().to(dtype).double()


@functools.cache
def _compiled() -> Callable:
    """`follow` compiled, once per process: every Follower shares it, and so its compilations (one per
    shape, state dtype and rounding mode; a new torch.compile would compile them all again)."""
    # emulate_precision_casts: without it a fused kernel skips the rounding of a float32 value converted
    # to fp16/bf16 and straight back (the baseline's round to nearest, lost).
    return unlimited(torch.compile(follow, fullgraph=True, dynamic=False, options={"emulate_precision_casts": True}))


def unlimited(compiled: Callable) -> Callable:
    """`compiled` (a torch.compile of `follow`) called with room for RECOMPILE_LIMIT compilations: a sweep has more
    variants than torch's default limit of eight, past which it would quietly run the rest eagerly (the setting's
    name before torch 2.7: cache_size_limit)."""
    config = torch._dynamo.config
    limit = {"recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit": RECOMPILE_LIMIT}

    def run(**arguments):
        with config.patch(**limit):
            return compiled(**arguments)

    return run


class Follower:
    """Runs `follow` as a fast step on CUDA, where that step computes what the eager references compute: checked on
    the first step it is given (as drift.lockstep keeps a CUDA graph only if it replays the eager step). The fast
    steps are tried in turn (_fast_steps): the first that agrees is kept; where none does, or none runs, the eager
    step runs from then on."""

    def __init__(self, device: str):
        self._fast: Callable | None = None
        self._pending = torch.device(device).type == "cuda"  # choose and check at the first step
        self.kept: str | None = None  # the fast step that runs (its name in _fast_steps); None: the eager step
        self.rejected: list[str] = []  # why each fast step tried before it (or every one) was not kept

    @property
    def note(self) -> str | None:
        """How the float64 side runs where that is not the first fast step: "eager: why", or the kept step's name
        and why those before it were not kept; None where the first runs (or off CUDA, eager by design)."""
        if not self.rejected:
            return None
        return f"{self.kept or 'eager'}: {'; '.join(self.rejected)}"

    def __call__(self, **arguments) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self._pending:
            self._pending = False
            self._choose(arguments)
        return (follow if self._fast is None else self._fast)(**arguments)

    def _choose(self, arguments: dict) -> None:
        if compiling_ahead():
            # In a compiling helper (drift.ahead) Triton's launch only compiles: the Triton step's variant goes to
            # Triton's disk cache, where the sweep's process loads it, and nothing it returns can be checked. The
            # helper goes on eagerly; torch.compile's step is compiled only by a sweep's process that needs it.
            follow_triton(**written_copies(arguments))
            self.rejected.append("Triton compiled ahead only")
            return
        eager = written_copies(arguments)
        eager_outs = follow(**eager)
        for name, make in _fast_steps():
            step, why = _checked(make, arguments, eager, eager_outs)
            if step is not None:
                self._fast, self.kept = step, name
                return
            self.rejected.append(f"{name} {why}")


def _fast_steps() -> list[tuple[str, Callable[[], Callable]]]:
    """The fast steps a Follower tries, in order, each named and made on demand: the one Triton kernel (Triton's disk
    cache loads it in milliseconds), then torch.compile's (a dynamo trace in every process, 0.3-0.7 s a compile
    group, and ~10 kernels a step; benchmarks/RESULTS.md, forty-second session)."""
    return [("Triton", lambda: follow_triton), ("torch.compile", _compiled)]


def written_copies(arguments: dict) -> dict:
    """`arguments` with copies of what `follow` writes; the rest as it is (a copy's strides would compile anew)."""
    return {**arguments, **{name: arguments[name].clone() for name in MUTATED}}


def _checked(make: Callable[[], Callable], arguments: dict, eager: dict,
             eager_outs: tuple) -> tuple[Callable | None, str | None]:
    """(the step `make` returns, None) where it, run on copies of `arguments`, does what the eager step did to
    `eager` (and returned, `eager_outs`): the same baseline and flag bit for bit, float64 values equal to within a
    few last bits (fused arithmetic contracts into FMAs and may have its own exp; sums add up in another order:
    sums_agree); else (None, what differs, or what it raised)."""
    mine = written_copies(arguments)
    try:
        step = make()
        outs = step(**mine)
    except Exception as exc:  # noqa: BLE001 (no compiler, or one that fails: the next step is tried)
        return None, f"raised {type(exc).__name__}: {exc}".splitlines()[0]
    for name in ("baseline", "tripped"):
        if not torch.equal(mine[name], eager[name]):
            return None, f"ran, its {name} differs from the eager step's"
    # The state element by element; the sums as they are read, over every row (stats.SignedErrorMoments).
    if not torch.allclose(mine["ref"], eager["ref"], rtol=AGREEMENT_RTOL, atol=0.0, equal_nan=True):
        return None, "ran, its reference differs from the eager step's"
    if not store_totals_agree(row_totals(mine["sums"]), row_totals(eager["sums"])):
        return None, "ran, its store-error sums differ from the eager step's"
    for name, value, expected in zip(("reference output", "baseline output", "exact output"), outs, eager_outs):
        if not sums_agree(value, expected):
            return None, f"ran, its {name} differs from the eager step's"
    return step, None


def store_totals_agree(value: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether `value`, the store sums' totals (stats.STORE_SUMS) the fast step added up, are the eager step's
    `expected`: counts and squares to within AGREEMENT_RTOL of themselves; the signed errors' totals, which cancel
    (a correct rounding's errors sum to about 0), to within AGREEMENT_RTOL of the sum of their magnitudes, at most
    sqrt(count * total of squares): each error may differ in its last bits where the two steps' exact values do."""
    count, squares = expected[STORE_SUMS.index("count")], expected[STORE_SUMS.index("total of squares")]
    scale = torch.zeros_like(expected)
    for name in ("total", "total up"):
        scale[STORE_SUMS.index(name)] = AGREEMENT_RTOL * (count * squares).sqrt()
    return bool(((value - expected).abs() <= AGREEMENT_RTOL * expected.abs() + scale).all())


def sums_agree(value: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether `value`, sums the compiled step computed, are the eager step's `expected` to within AGREEMENT_RTOL of
    the largest finite magnitude among them (NaN where NaN, infinities equal). Not element by element: an output
    is a sum over dstate, which the compiled step adds up in another order (in the kernel that computes the state),
    and a sum that cancels keeps an error of ~1e-16 of its terms, not of itself: on an H200, `stagnation` and `long`
    outputs differed by more than 1e-12 of themselves in 6 of the default drift's 45 cases (thirty-ninth session)."""
    finite = expected[expected.isfinite()]
    scale = finite.abs().max().item() if finite.numel() else 0.0
    return torch.allclose(value, expected, rtol=AGREEMENT_RTOL, atol=AGREEMENT_RTOL * scale, equal_nan=True)
