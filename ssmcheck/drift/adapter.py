"""The state-update kernels `ssmcheck drift` runs, and how each is called.

`--kernel` is `builtin` (the Triton kernel), `torch` (a plain-PyTorch step
computed in fp32 that stores the state with the reference rounding, i.e. the
same-precision implementation run as the kernel under test), or
`MODULE:FUNCTION` / `path.py:FUNCTION` naming any callable with the
state-spaces/mamba `selective_state_update` signature (DESIGN §2).

A callable that takes a `rounding` keyword is told the mode (and `seed`, when
it takes one: a new seed every step). One that does not is run as it is, and
`--rounding` declares what it is supposed to do. Either way the runner seeds
torch's generator at the start of every trial, so a callable drawing its
random bits from torch is reproducible and independent across trials.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ssmcheck.kernels import keywords, load_callable
from ssmcheck.ops.rounding.naive import round_to
from ssmcheck.ops.state_update.naive import state_update_step

BUILTIN, TORCH = "builtin", "torch"
ROUNDING_IMPLS = ("software", "hardware")  # the built-in kernel's stochastic rounding (--rounding-impl)


def torch_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                       rounding="nearest", seed=0):
    """One decode step in fp32 with plain PyTorch; the state is stored rounded per `rounding`
    (random bits from a generator seeded with `seed`). Updates `state` in place, returns out."""
    f32 = {name: None if t is None else t.float() for name, t in (("D", D), ("z", z), ("dt_bias", dt_bias))}
    new_state, out = state_update_step(
        state.float(), x.float(), dt.float(), A.float(), B.float(), C.float(), dt_softplus=dt_softplus, **f32
    )
    generator = torch.Generator(device=state.device).manual_seed(seed) if rounding == "stochastic" else None
    state.copy_(round_to(new_state, state.dtype, rounding, generator))
    return out.to(x.dtype)


@dataclass(frozen=True)
class StateUpdateKernel:
    name: str  # the --kernel value
    fn: Callable
    takes_rounding: bool  # implements --rounding itself (has a `rounding` keyword)
    takes_seed: bool
    options: dict = field(default_factory=dict)  # further keywords (builtin: philox_rounds, rounding_impl)

    def __call__(self, state, problem, step, rounding: str, seed: int):
        """Run one step of `problem` (a DecodeProblem) on `state` in place; return out."""
        keywords = dict(self.options)
        if self.takes_rounding:
            keywords["rounding"] = rounding
        if self.takes_seed:
            keywords["seed"] = seed
        return self.fn(
            state, step.x, step.dt, problem.A, step.B, step.C, problem.D, None, problem.dt_bias,
            problem.dt_softplus, **keywords,
        )


def resolve_kernel(spec: str, philox_rounds: int, rounding_impl: str) -> StateUpdateKernel:
    """The kernel named by --kernel. Raises kernels.KernelSpecError for a bad spec.

    Imports the built-in kernel (and so triton): call runtime.configure first.
    """
    if spec == BUILTIN:
        from ssmcheck.ops.state_update.fused_recurrent import selective_state_update  # noqa: PLC0415

        return StateUpdateKernel(
            BUILTIN, selective_state_update, takes_rounding=True, takes_seed=True,
            options={"philox_rounds": philox_rounds, "rounding_impl": rounding_impl},
        )
    if spec == TORCH:
        return StateUpdateKernel(TORCH, torch_state_update, takes_rounding=True, takes_seed=True)
    fn = load_callable(spec)
    named = keywords(fn)
    return StateUpdateKernel(spec, fn, takes_rounding="rounding" in named, takes_seed="seed" in named)
