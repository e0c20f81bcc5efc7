"""The state-update kernel under test, behind one adapter: what it can do, how it is called, what it returned.

`--kernel` is `builtin` (the Triton kernel), `torch` (a plain-PyTorch step
computed in fp32 that stores the state with the reference rounding, i.e. the
same-precision implementation run as the kernel under test), `mamba_ssm` or
`vllm` (the installed peers' `selective_state_update`, through ssmcheck.peers), or
`MODULE:FUNCTION` / `path.py:FUNCTION` naming any callable with the
state-spaces/mamba `selective_state_update` signature (DESIGN §2).

The adapter owns:
- capability discovery: a callable that takes a `rounding` keyword is told the
  mode (and `seed`, when it takes one: a new seed every step); one that does
  not is run as it is, and `--rounding` declares what it is supposed to do.
  For the built-in kernel, whether hardware stochastic rounding can run here. One that takes
  `state_batch_indices` runs on a state pool with a slot per row (drift.slots checks it), its pad
  rows marked with its `pad_slot_id` keyword's default (vLLM's wrapper: 0, its null block) or -1;
- the call, with the mamba signature: state, x, dt, A, B, C by position, and D, z, dt_bias, dt_softplus by name
  where the signature names any of them (vLLM's takes D and dt_bias before z; one it does not name only where
  the step sets it), else by position in mamba's order; a MODULE:FUNCTION kernel with an `out` keyword gets a NaN-filled
  out every call, as engines pass one, and that out is judged whatever it returns (vLLM's convention:
  it may return nothing; one returning a tensor of its own with the given out unwritten is named;
  the runner seeds torch's generator at the
  start of every trial, so a callable drawing its random bits from torch is
  reproducible and independent across trials), under guards: what the kernel
  prints is captured (core.capture), and SystemExit or KeyboardInterrupt raised
  by the kernel is KernelRaised like any exception, one case's error;
- output validation: out of the promised shape, dtype and device, and the
  inputs unchanged after the call; anything else raises KernelRaised with one
  line saying what was expected and what came back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace

import torch

from ssmcheck.core.callables import (
    kernel_name,
    keyword_default,
    keywords,
    keywords_not_taken,
    load_callable,
    takes_any_keyword,
    unset,
)
from ssmcheck.core.capture import Transcript
from ssmcheck.core.fences import Fenced, storages
from ssmcheck.core.formats import dtype_name, saturate
from ssmcheck.core.guard import KernelExit, describe, guarded_call
from ssmcheck.core.pool import nan_filled, poisoned
from ssmcheck.drift.regimes import DecodeProblem, DecodeShape, StepInputs, make_problem
from ssmcheck.ops.rounding.naive import round_to
from ssmcheck.ops.state_update.naive import state_update_step

BUILTIN, TORCH = "builtin", "torch"
# The slot index of a pad row where a kernel's signature names no pad_slot_id default: serving engines'
# PAD_SLOT_ID (mamba_ssm skips any negative index).
PAD_SLOT_ID = -1
# The peers, named: the installed packages' selective_state_update (ssmcheck.peers).
MAMBA_SSM, VLLM = "mamba_ssm", "vllm"
# A kernel that takes `rounding` may carry a function by this name, state dtype -> why it cannot round into it
# stochastically here, or None: those cases are skipped with its reason (vLLM's: hardware SR, fp16 only).
STOCHASTIC_UNAVAILABLE = "stochastic_rounding_unavailable"
# The keywords beyond slot indices of a kernel that verifies several tokens per row in one call (vLLM's).
DRAFT_KEYWORDS = ("dst_state_batch_indices", "num_accepted_tokens", "cu_seqlens")


class KernelRaised(Exception):
    """The kernel under test raised, returned something that is not its output, or changed its inputs."""


def refused(exc: KernelRaised) -> bool:
    """Whether the kernel itself raised (refusing its arguments), not ssmcheck on what the call did: a program
    outside its memory, an exit, an output of the wrong kind or inputs the call changed (which have no cause)."""
    return exc.__cause__ is not None and not isinstance(exc.__cause__, KernelExit)


def torch_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *,
                       rounding="nearest", seed=0):
    """One decode step in fp32 with plain PyTorch; the state is stored rounded per `rounding`
    (random bits from a generator seeded with `seed`). Updates `state` in place, returns out (saturated in
    x's dtype: core.formats.saturate)."""
    f32 = {name: None if t is None else t.float() for name, t in (("D", D), ("z", z), ("dt_bias", dt_bias))}
    new_state, out = state_update_step(
        state.float(), x.float(), dt.float(), A.float(), B.float(), C.float(), dt_softplus=dt_softplus, **f32
    )
    generator = torch.Generator(device=state.device).manual_seed(seed) if rounding == "stochastic" else None
    state.copy_(round_to(new_state, state.dtype, rounding, generator))
    return saturate(out, x.dtype).to(x.dtype)


@dataclass(frozen=True)
class DriftAdapter:
    name: str  # the --kernel value
    fn: Callable
    takes_rounding: bool  # implements --rounding itself (has a `rounding` keyword)
    takes_seed: bool
    options: dict = field(default_factory=dict)  # further keywords (builtin: philox_rounds, rounding_impl, interpret)
    # Takes a pool of states and a slot per row (a `state_batch_indices` keyword): the slot index of its pad
    # rows, the default of its `pad_slot_id` keyword or PAD_SLOT_ID (None: it takes no slot indices).
    pad_slot_id: int | None = None
    takes_pad_slot_id: bool = False  # is told pad_slot_id (a keyword of its own)
    takes_out: bool = False  # writes out into a preallocated `out` keyword (which the slot check NaN-fills)
    # Every call gets a preallocated out, NaN-filled, as an engine passes one: a MODULE:FUNCTION kernel with an
    # `out` keyword (of vLLM's convention: it writes out and may return nothing, which is then the output).
    given_out: bool = False
    # Verifies draft tokens in one call (DRAFT_KEYWORDS, vLLM's speculative decoding): drift.speculative checks it.
    takes_draft_tokens: bool = False
    # Reads its seed from a one-element int64 tensor on the device when given one (a CUDA graph replay
    # then advances it: drift.lockstep); a kernel that takes an int is given an int.
    takes_seed_tensor: bool = False
    # May run as CUDA graph replays (drift.lockstep): a kernel ssmcheck knows keeps nothing between calls
    # on the host. A MODULE:FUNCTION kernel might (a call counter, a seed of its own), which a graph would
    # freeze at the captured call, so it runs eagerly.
    graphable: bool = False
    # The kernel's STOCHASTIC_UNAVAILABLE function, where it has one.
    stochastic_unavailable: Callable[[torch.dtype], str | None] | None = None

    @functools.cached_property
    def named(self) -> frozenset[str]:
        """Which of D, z, dt_bias and dt_softplus the kernel's signature names. Where it names any, the call passes
        them by name, whatever their order (mamba's D, z, dt_bias; vLLM's D, dt_bias, z), and one it does not name
        only where the step sets it (not None, not False: a kernel without a gate runs every case without one, and
        a regime with one is skipped naming z, `skip_reason`); where it names none (no signature, a `*args`
        wrapper), all four by position in mamba's order."""
        return keywords(self.fn) & frozenset(_OPTIONAL)

    def skip_reason(self, state_dtype: torch.dtype, rounding: str, regime: str | None = None) -> str | None:
        """Why this kernel cannot run a case of `state_dtype`, `rounding` and `regime` here, or None: a keyword the
        regime's steps set that the kernel's signature does not name (and no `**kwargs` takes), or stochastic
        rounding it cannot do here."""
        if regime is not None and 0 < len(self.named) < len(_OPTIONAL) and not takes_any_keyword(self.fn):
            missing = [name for name in _set_arguments(regime) if name not in self.named]
            if missing:
                return keywords_not_taken(self.name, missing, regime)
        if rounding != "stochastic" or not self.takes_rounding or self.stochastic_unavailable is None:
            return None
        return self.stochastic_unavailable(state_dtype)

    def call(self, state: torch.Tensor, problem: DecodeProblem, step: StepInputs, rounding: str,
             seed: int | torch.Tensor,
             where: str, check_inputs: bool = False, transcript: Transcript | None = None,
             nan_fences: Collection[str] | None = None, slots: torch.Tensor | None = None) -> torch.Tensor:
        """Run one step of `problem` on `state` in place; return out. Raises KernelRaised. With `slots` (a kernel
        that takes slot indices), `state` is a pool and row i's state lies on slot slots[i] (state_batch_indices).

        With `check_inputs` (the runner asks at the first step and the checkpoints, not every step: eager
        steps, never a graph replay), the kernel gets copies of the inputs between NaN fences (core.fences): a
        read past one is NaN in the step's results, a write into an input or past one raises (`nan_fences`:
        the inputs fenced with NaN, None for all; the others' fences are 0, as core.outside asks). The state
        is the caller's tensor (drift.lockstep keeps it between fences of its own for the whole trial: a
        kernel may key what it keeps on the tensor). What the kernel prints goes to `transcript`.
        """
        arguments = {**_inputs(problem, step), "dt_softplus": problem.dt_softplus}
        arguments.setdefault("z", None)  # after the inputs given: fenced in their order
        extra = None if slots is None else {"state_batch_indices": slots}
        if check_inputs:
            return self.fenced_update(state, arguments, rounding, seed, where, transcript, extra, nan_fences)
        return self.update(state, arguments, rounding, seed, where, transcript, extra)

    def fenced_storages(self, problem: DecodeProblem, step: StepInputs) -> list[tuple[str, ...]]:
        """The names of the inputs a checked step fences, grouped by the storage they share."""
        return storages(_inputs(problem, step))

    def update_slots(self, pool: torch.Tensor, slots: torch.Tensor, arguments: dict, out: torch.Tensor,
                     rounding: str, seed: int, where: str, transcript: Transcript | None = None,
                     pad_slot_id: int | None = None) -> torch.Tensor:
        """One call on the state `pool` (in place), row i on slot slots[i] (the pad slot id, the kernel's or
        `pad_slot_id` where it takes the keyword: a pad row), y into `out` where the kernel takes one; return
        out. Raises KernelRaised."""
        extra = {"state_batch_indices": slots}
        if self.takes_pad_slot_id:
            extra["pad_slot_id"] = self.pad_slot_id if pad_slot_id is None else pad_slot_id
        if self.takes_out:
            extra["out"] = out
        return self.fenced_update(pool, arguments, rounding, seed, where, transcript, extra)

    def fenced_update(self, state: torch.Tensor, arguments: dict, rounding: str, seed: int, where: str,
                      transcript: Transcript | None = None, extra: dict | None = None,
                      nan_fences: Collection[str] | None = None) -> torch.Tensor:
        """`update` on copies of the tensor arguments between fences (core.fences; NaN around those `nan_fences`
        names, None: all, 0 around the others): a read past one is NaN in the results, a write into or past one
        raises KernelRaised."""
        # In the arguments' order: which input a violation names first. The slot indices are an input too: an
        # engine passes one index tensor to every layer's call, so a kernel that rewrites them (pad rows' -1
        # clamped in place) sends the next layer's rows to other slots. Their fences are 0 (no integer NaN).
        checked = {name: t for name, t in arguments.items() if name in _TENSOR_ARGUMENTS}
        indices = {name: t for name, t in (extra or {}).items() if name == "state_batch_indices"}
        fenced = Fenced({**checked, **indices}, checked.keys() if nan_fences is None else nan_fences)
        out = self.update(state, {**arguments, **{name: fenced.tensors[name] for name in checked}}, rounding, seed,
                          where, transcript, {**(extra or {}), **{name: fenced.tensors[name] for name in indices}})
        violation = fenced.violation()
        if violation is not None:
            raise KernelRaised(f"{violation} ({where})")
        return out

    def update(self, state: torch.Tensor, arguments: dict, rounding: str, seed: int, where: str,
               transcript: Transcript | None = None, extra: dict | None = None) -> torch.Tensor:
        """One call on `state` (in place) with the selective_state_update `arguments` (x, dt, A, B, C, D,
        z, dt_bias, dt_softplus) and `extra` keywords; return out. Raises KernelRaised."""
        keywords = {**self.options, **(extra or {})}
        # The slot check passes an out of its own in `extra` and judges it itself (drift.slots).
        judged_out = self.given_out and "out" not in keywords
        if judged_out:
            keywords["out"] = nan_filled(tuple(arguments["x"].shape), arguments["x"])
        if self.takes_rounding:
            keywords["rounding"] = rounding
        if self.takes_seed:
            keywords["seed"] = seed
        if self.named:
            args = (state, *(arguments[name] for name in _ARGUMENTS if name not in _OPTIONAL))
            keywords.update({name: arguments[name] for name in _OPTIONAL
                             if name in self.named or not unset(arguments[name])})
        else:
            args = (state, *(arguments[name] for name in _ARGUMENTS))
        try:
            out = guarded_call(self.fn, args, keywords, transcript)
        except KernelExit as exc:
            raise KernelRaised(f"{exc} ({where})") from exc
        except Exception as exc:  # any failure of the kernel under test is its verdict, not ours
            raise KernelRaised(f"{describe(exc)} ({where})") from exc
        if judged_out:  # an engine reads the out it passed, whatever the kernel returns
            _check_given_out_written(keywords["out"], out, where)
            out = keywords["out"]
        elif out is None and "out" in keywords:  # it wrote the out it was given, and returned nothing
            out = keywords["out"]
        _check_out(out, arguments["x"], where)
        return out


def _inputs(problem: DecodeProblem, step: StepInputs) -> dict[str, torch.Tensor | None]:
    """A step's tensor inputs by name (z only where there is one; D and dt_bias None where the regime leaves them
    out)."""
    return {**dict(step.given()), **problem.parameters()}


# selective_state_update's arguments after the state, in order, and those of them that are tensors (or None).
_ARGUMENTS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "dt_softplus")
_TENSOR_ARGUMENTS = _ARGUMENTS[:-1]
_OPTIONAL = ("D", "z", "dt_bias", "dt_softplus")  # passed by name where the signature names any (DriftAdapter.named)


@functools.lru_cache(maxsize=64)
def _set_arguments(regime: str) -> tuple[str, ...]:
    """Which of D, z, dt_bias and dt_softplus a step of `regime` sets (not `unset`), read off one step drawn small."""
    problem = make_problem(regime, DecodeShape(1, 1, 2, 2, 1), torch.float16, 1, 0, "cpu")
    step = {**_inputs(problem, next(problem.host_steps())), "dt_softplus": problem.dt_softplus}
    return tuple(name for name in _OPTIONAL if not unset(step.get(name)))


def _check_given_out_written(given: torch.Tensor, returned, where: str) -> None:
    """A kernel that returns its output in a tensor of its own and leaves the NaN-filled `out` it was given
    (partly) unwritten: named, where the judge would only see NaN in out."""
    if not isinstance(returned, torch.Tensor) or returned.data_ptr() == given.data_ptr():
        return
    left = poisoned(given)  # still the poison NaN it was filled with (drift.slots reads its out so)
    if returned.shape == given.shape:
        unwritten = int((left & ~torch.isnan(returned)).sum())
    else:
        unwritten = int(left.sum())
    if unwritten:
        raise KernelRaised(f"it returned its output in a tensor of its own and left {unwritten} of the "
                           f"{given.numel()} elements of the out it was given unwritten ({where})")


def _check_out(out, x: torch.Tensor, where: str) -> None:
    if not isinstance(out, torch.Tensor):
        raise KernelRaised(f"the kernel returned {type(out).__name__}, expected out of shape {tuple(x.shape)} ({where})")
    if out.shape != x.shape:
        raise KernelRaised(f"the kernel returned {tuple(out.shape)}, expected out of shape {tuple(x.shape)} ({where})")
    if out.dtype != x.dtype:
        raise KernelRaised(
            f"out has dtype {dtype_name(out.dtype)}, expected {dtype_name(x.dtype)} (x's dtype) ({where})"
        )
    if out.device != x.device:
        raise KernelRaised(f"out is on {out.device}, expected {x.device} (where the inputs are) ({where})")


def resolve(spec: str | Callable, philox_rounds: int, rounding_impl: str, interpreter: bool) -> DriftAdapter:
    """The adapter of a --kernel value, or of a callable passed through the Python API. Raises
    core.callables.KernelSpecError for a bad spec.

    `builtin` imports the Triton kernel (and so triton), `mamba_ssm` and `vllm` the peer's package
    (KernelSpecError when it cannot be imported): configure the runtime first. mamba_ssm takes no rounding
    keyword (--rounding declares what it does); vLLM's wrapper does, where its ops have stochastic rounding.
    """
    if spec == BUILTIN:
        from ssmcheck.ops.state_update.fused_recurrent import selective_state_update  # noqa: PLC0415

        return DriftAdapter(
            BUILTIN, selective_state_update, takes_rounding=True, takes_seed=True, takes_seed_tensor=True, graphable=True,
            options={"philox_rounds": philox_rounds, "rounding_impl": rounding_impl, "interpret": interpreter},
            **_slot_capabilities(selective_state_update),
        )
    if spec == TORCH:
        return DriftAdapter(TORCH, torch_state_update, takes_rounding=True, takes_seed=True, graphable=True)
    if spec in (MAMBA_SSM, VLLM):
        from ssmcheck.peers import mamba_ssm, vllm  # noqa: PLC0415

        # The peers' wrappers allocate out themselves (ssmcheck.peers): called as they were verified.
        return replace(_discovered(spec, (mamba_ssm if spec == MAMBA_SSM else vllm).state_update()), graphable=True,
                       given_out=False)
    fn = spec if callable(spec) else load_callable(spec)
    return _discovered(kernel_name(fn) if callable(spec) else spec, fn)


def _discovered(name: str, fn: Callable) -> DriftAdapter:
    """The adapter of a kernel whose capabilities are the keywords its signature names."""
    named = keywords(fn)
    return DriftAdapter(name, fn, takes_rounding="rounding" in named, takes_seed="seed" in named,
                        stochastic_unavailable=getattr(fn, STOCHASTIC_UNAVAILABLE, None), given_out="out" in named,
                        **_slot_capabilities(fn))


def _slot_capabilities(fn: Callable) -> dict:
    """The DriftAdapter fields of slot indices (a pool of states, pad rows) that `fn`'s signature shows."""
    named = keywords(fn)
    if "state_batch_indices" not in named:
        return {}
    default = keyword_default(fn, "pad_slot_id")
    pad = default if isinstance(default, int) and not isinstance(default, bool) else PAD_SLOT_ID
    return {"pad_slot_id": pad, "takes_pad_slot_id": "pad_slot_id" in named, "takes_out": "out" in named,
            "takes_draft_tokens": all(keyword in named for keyword in DRAFT_KEYWORDS)}


def hardware_sr_unavailable(interpreter: bool) -> str | None:
    """Why the built-in kernel's hardware stochastic rounding cannot run here (None: it can)."""
    from ssmcheck.ops.rounding.stochastic import hardware_sr_unavailable as reason  # noqa: PLC0415

    return reason(interpreter)
