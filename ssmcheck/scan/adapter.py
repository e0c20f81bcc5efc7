"""The chunk-scan kernel under test, behind one adapter: what it can do, how it is called, what it returned.

`builtin` is ssmcheck's Triton kernel, `torch` the same-precision baseline run
as a kernel, `mamba_ssm` and `vllm` the installed peers' chunk scans (ssmcheck.peers),
anything else a `MODULE:FUNCTION` or `file.py:FUNCTION` with the
state-spaces/mamba `mamba_chunk_scan_combined` signature (DESIGN §2).

The adapter owns:
- capability discovery: whether the kernel takes our state_dtype/rounding/seed
  keywords (named in its signature), or state_dtype alone; what it stores its states
  in when told nothing (`default_state_dtype`); which chunk sizes it supports;
- the call, with the mamba signature, under guards: what the kernel prints is captured
  (core.capture), and a kernel calling sys.exit or raising KeyboardInterrupt raises
  KernelExit, one case's error rather than the end of the tool;
- output validation: a tuple (out, states) of the promised shapes, dtypes and
  device, and the inputs unchanged after the call, their NaN fences too (core.fences: each call gets
  copies of the inputs between NaN, so that a read past one shows as NaN). Anything else raises
  KernelOutputError with one line saying what was expected and what came back;
- the kernel's SSD stages, where it offers them (`stages`: the built-in kernel's
  `chunk_scan_stages`, the peers' stage functions composed in ssmcheck.peers, or a
  callable's `ssd_stages` attribute), for scan.stages.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace

import torch

from ssmcheck.core.callables import kernel_name, keywords, keywords_not_taken, load_callable, takes_any_keyword, unset
from ssmcheck.core.capture import Transcript
from ssmcheck.core.fences import Fenced, storages
from ssmcheck.core.formats import DTYPES, dtype_name
from ssmcheck.core.guard import guarded_call
from ssmcheck.core.tensors import laid_out_as
from ssmcheck.ops.naive import NO_DT_LIMIT
from ssmcheck.scan.inputs import ScanInputs, ScanShape
from ssmcheck.scan.padding import PaddedCall, padded
from ssmcheck.scan.regimes import REGIMES
from ssmcheck.scan.spec import ScanCase

BUILTIN, TORCH = "builtin", "torch"
# The peers, named: the installed packages' chunk scans (ssmcheck.peers).
MAMBA_SSM, VLLM = "mamba_ssm", "vllm"
# Keywords beyond the mamba signature: how the chunk states are stored.
STATE_OPTIONS = ("state_dtype", "rounding", "seed")
# ScanAdapter.default_state_dtype: told no state_dtype, the kernel stores its states in its inputs' dtype (C's).
INPUTS = "inputs"
# The stages a kernel's `stages` callable returns (scan.stages describes them), and the attribute through which a
# MODULE:FUNCTION kernel offers such a callable: the chunk-scan arguments and state keywords, without the return_*
# flags.
STAGE_NAMES = ("cumsum", "chunk_states", "passed_states", "cb", "y")
STAGES_ATTRIBUTE = "ssd_stages"
# The attribute through which a MODULE:FUNCTION kernel declares (True) that it takes pad tokens: seq_idx -1
# between its varlen sequences, tokens of no sequence that change no state (the `padded` regime).
PAD_TOKENS_ATTRIBUTE = "pad_tokens"
# The keywords through which a chunk scan writes each sequence's final state straight into a state cache (vLLM
# 0.33's fused write in its state passing): final_states_out, the cache (slots, nheads, headdim, dstate), and
# final_state_indices, sequence i's slot. Called so, the kernel returns y alone.
CACHE_WRITE_KEYWORDS = ("final_states_out", "final_state_indices")
# vLLM's chunk scan asserts a power-of-two chunk size.
_POWERS_OF_TWO = tuple(2**k for k in range(17))


# The keywords of mamba_chunk_scan_combined's signature after chunk_size, as ScanAdapter passes them.
MAMBA_KEYWORDS = ("D", "z", "dt_bias", "initial_states", "seq_idx", "cu_seqlens", "dt_softplus", "dt_limit",
                  "return_final_states", "return_varlen_states")


@functools.lru_cache(maxsize=256)
def _set_keywords(regime: str, shape: ScanShape, dtype: str) -> tuple[str, ...]:
    """The MAMBA_KEYWORDS a case of `regime` at `shape` sets in its call (not `_unset`), read off its inputs drawn
    at a few chunks a row: which ones a regime sets does not depend on the length or the seed."""
    small = replace(shape, seqlen=shape.chunk_size * max(2, REGIMES[regime].min_chunks))
    inputs = REGIMES[regime].generate(small, DTYPES[dtype], 0)
    passed = {**inputs.kwargs(), "seq_idx": inputs.seq_idx, "return_final_states": not inputs.varlen,
              "return_varlen_states": inputs.varlen}
    return tuple(name for name in MAMBA_KEYWORDS if not _unset(name, passed[name]))


def _unset(name: str, value) -> bool:
    """Whether a keyword of the mamba signature carries nothing in a call: None, a flag off (core.callables.unset),
    no dt_limit."""
    return unset(value) or (name == "dt_limit" and tuple(value) == NO_DT_LIMIT)


class KernelOutputError(RuntimeError):
    """The kernel returned something other than the mamba signature promises, or changed its inputs."""


@dataclass(frozen=True)
class ScanAdapter:
    name: str  # as given to --kernel
    fn: Callable
    takes_state_options: bool  # accepts state_dtype=, rounding=, seed=
    chunk_sizes: tuple[int, ...] | None = None  # the chunk sizes it supports (None: any)
    chunk_size_rule: str = ""  # those in words, for skip reasons
    options: dict = field(default_factory=dict)  # further keywords of every call (builtin: interpret)
    # Accepts state_dtype= (alone, or with rounding= and seed=). Without rounding/seed it is told the
    # storage format of round-to-nearest cases; stochastic cases are skipped.
    takes_state_dtype: bool = False
    # What a kernel taking state_dtype stores its states in when called without one: None, nothing of
    # its own (it is always told the case's state_dtype); INPUTS, its inputs' dtype (C's): vLLM's
    # convention, the way its model code runs it. Such a kernel is called without state_dtype in the
    # cases that keep the default storage (fp32, nearest: no --state-dtype asked), so its states come
    # back in C's dtype; a case asking for a format passes it, and so does every case when
    # `state_dtype_given` (--state-dtype was on the command line, fp32 included).
    default_state_dtype: str | None = None
    state_dtype_given: bool = False
    # Reads its initial states as a state cache holds them: in its storage dtype (vLLM's kernel takes
    # them in the dtype it stores states in; fp32 initial states with bf16 storage do not compile).
    # The case's initial states are then values that dtype holds exactly (`cached_inputs`), so the
    # kernel and the references start from the same states, as a served model's prefill does.
    initial_states_stored: bool = False
    stages: Callable | None = None  # the kernel's SSD stages (STAGE_NAMES), where it offers them
    # Takes pad tokens (seq_idx -1) between its varlen sequences, as the `padded` regime gives them
    # (scan.padding); else why not, for the skip reason.
    pad_tokens: bool = False
    no_pad_tokens: str = f"it does not declare that it takes pad tokens (seq_idx -1) (attribute {PAD_TOKENS_ATTRIBUTE})"
    # Writes the final states into a state cache at given slots (CACHE_WRITE_KEYWORDS): scan.invariance checks it.
    writes_cache: bool = False
    # Weak references to what the latest calls returned (ReturnedBuffers): an output in the memory of one the
    # caller still holds is a buffer the kernel keeps and returns again.
    returned: ReturnedBuffers = field(default_factory=lambda: ReturnedBuffers())

    def skip_reason(self, case: ScanCase) -> str | None:
        """Why this kernel cannot run `case` (None: it can)."""
        if self.chunk_sizes is not None and case.chunk_size not in self.chunk_sizes:
            return f"{self.chunk_size_rule}, not {case.chunk_size}"
        if REGIMES[case.regime].pad_tokens and not self.pad_tokens:
            return f"{self.name} takes no pad tokens: {self.no_pad_tokens}"
        if missing := self._missing_keywords(case):
            return keywords_not_taken(self.name, missing, case.regime)
        if self.takes_state_options:
            return None
        if self.takes_state_dtype:
            if case.rounding != "nearest":
                return (
                    f"{self.name} takes a state_dtype keyword but no rounding/seed, so it cannot store "
                    f"{case.state_dtype} states with {case.rounding} rounding"
                )
            return None
        if case.rounding != "nearest" or (case.state_dtype != "fp32" and not self.state_dtype_given):
            return (
                f"{self.name} takes no state_dtype/rounding/seed keywords, so it cannot store "
                f"{case.state_dtype} states with {case.rounding} rounding"
                + ("" if case.rounding != "nearest" else " (declare how it stores them with --state-dtype)")
            )
        return None

    def judged_storage(self, case: ScanCase, returned: torch.dtype) -> torch.dtype:
        """The format the kernel's states are judged as stored in, for the baseline to store its own so.

        A kernel told its storage (state options, or state_dtype) stores the case's state dtype; so
        does one the user declared it for on the command line (--state-dtype: a declaration for a
        kernel that takes no such keyword, as --rounding is for drift). Otherwise the dtype of the
        states it returned says how it stores them: vLLM, told nothing, keeps them in C's dtype."""
        if self.takes_state_options or self.state_dtype_given:
            return DTYPES[case.state_dtype]
        if self.takes_state_dtype and not self.uses_default_storage(case):
            return DTYPES[case.state_dtype]
        return returned

    def uses_default_storage(self, case: ScanCase) -> bool:
        """Whether `case` calls the kernel without state_dtype, to store its states its own way."""
        return (self.default_state_dtype == INPUTS and self.takes_state_dtype and not self.takes_state_options
                and not self.state_dtype_given and (case.state_dtype, case.rounding) == ("fp32", "nearest"))

    def cached_inputs(self, inputs: ScanInputs, case: ScanCase) -> ScanInputs:
        """`inputs` with the initial states a kernel that reads them from its state cache can be given
        (see initial_states_stored): rounded to its storage dtype, kept in their own dtype."""
        storage = self._storage(inputs, case)[1]
        if not self.initial_states_stored or inputs.initial_states is None or len(storage) != 1:
            return inputs
        initial = inputs.initial_states
        return replace(inputs, initial_states=laid_out_as(initial, initial.to(storage[0]).to(initial.dtype)))

    def _storage(self, inputs: ScanInputs, case: ScanCase) -> tuple[dict, tuple, str]:
        """(the state keywords of the call, the dtypes the states may come back in, why those)."""
        state_dtype = DTYPES[case.state_dtype]
        if self.takes_state_options:
            return ({"state_dtype": state_dtype, "rounding": case.rounding, "seed": case.seed}, (state_dtype,),
                    "the requested --state-dtype")
        if self.uses_default_storage(case):
            return {}, (inputs.C.dtype,), f"C's dtype: {self.name} stores its states so when told no state_dtype"
        if self.takes_state_dtype:
            return {"state_dtype": state_dtype}, (state_dtype,), "the requested --state-dtype"
        return {}, tuple(DTYPES.values()), "a storage format"

    def call(self, inputs: ScanInputs, case: ScanCase, transcript: Transcript | None = None,
             nan_fences: Collection[str] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the kernel on `inputs`; return (y, states): final states per row, or per sequence for varlen.

        What the kernel prints goes to `transcript` (discarded without one). The kernel gets copies of the
        inputs between fences (core.fences), NaN around those `nan_fences` names (None: all), 0 around
        the others. Raises what the kernel raised, core.guard.KernelExit for SystemExit and
        KeyboardInterrupt, KernelOutputError.
        """
        storage, why = self._storage(inputs, case)[1:]
        result, sent, fenced = self._fenced_call(self.fn, inputs, case, True, transcript, nan_fences)
        y, states = _unpack(result)
        self.returned.check_and_add(y=y, states=states)
        x = fenced.originals["x"]
        state_shape = (inputs.nsequences, *x.shape[2:], inputs.B.shape[-1])
        _check_tensor("y", y, tuple(x.shape), (x.dtype,), x.device, "x's dtype")
        _check_tensor("states", states, state_shape, storage, x.device, why)
        _check_inputs(fenced)
        return (sent.case_y(y) if sent else y), states

    def call_both(self, inputs: ScanInputs, case: ScanCase,
                  transcript: Transcript | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the kernel on varlen `inputs` with both return flags, as Mamba2's inference prefill calls it on packed
        sequences; return (y, final_states, varlen_states), the final states the row's (1, ...). Checked as `call`
        checks its outputs. Raises as `call` does."""
        def both_flags(*args, **kwargs):
            return self.fn(*args, **{**kwargs, "return_final_states": True})

        storage, why = self._storage(inputs, case)[1:]
        result, sent, fenced = self._fenced_call(both_flags, inputs, case, True, transcript)
        if not (isinstance(result, tuple) and len(result) == 3 and all(isinstance(t, torch.Tensor) for t in result)):
            raise KernelOutputError("expected a tuple (out, final_states, varlen_states) of tensors from a call with "
                                    f"both return flags, got {_described(result)}")
        y, final, states = result
        self.returned.check_and_add(y=y, states=states)
        x = fenced.originals["x"]
        _check_tensor("y", y, tuple(x.shape), (x.dtype,), x.device, "x's dtype")
        _check_tensor("final_states", final, (1, *x.shape[2:], inputs.B.shape[-1]), storage, x.device, why)
        _check_tensor("varlen_states", states, (inputs.nsequences, *x.shape[2:], inputs.B.shape[-1]), storage,
                      x.device, why)
        _check_inputs(fenced)
        return (sent.case_y(y) if sent else y), final, states

    def call_y(self, inputs: ScanInputs, case: ScanCase, transcript: Transcript | None = None) -> torch.Tensor:
        """Run the kernel on `inputs` without the return flags, as a caller that wants y alone calls it (Mamba2's
        training forward, a prefill that keeps no state); return y. A kernel that uses its initial states, or its
        sequences' boundaries, only when asked for states gives another y here. A tuple back is taken for
        (y, ...). Raises as `call` does."""
        def y_first(*args, **kwargs):
            result = self.fn(*args, **kwargs)
            return result[0] if isinstance(result, tuple) and result else result

        return self._y_alone(y_first, inputs, case, transcript, "a call without the return flags")

    def write_cache(self, inputs: ScanInputs, case: ScanCase, cache: torch.Tensor, slots: torch.Tensor,
                    transcript: Transcript | None = None) -> torch.Tensor:
        """Run the kernel on `inputs` writing sequence i's final state into cache[slots[i]] (CACHE_WRITE_KEYWORDS);
        return y. Raises as `call` does."""
        def into_cache(*args, **kwargs):
            return self.fn(*args, **kwargs, final_states_out=cache, final_state_indices=slots)

        return self._y_alone(into_cache, inputs, case, transcript,
                             f"a call with {', '.join(CACHE_WRITE_KEYWORDS)}")

    def _y_alone(self, fn: Callable, inputs: ScanInputs, case: ScanCase, transcript: Transcript | None,
                 called: str) -> torch.Tensor:
        """`fn`'s fenced call on `inputs` without the return flags, which returns y alone (checked, on the case's
        own tokens); `called` names the call in the error for anything else."""
        y, sent, fenced = self._fenced_call(fn, inputs, case, False, transcript)
        if not isinstance(y, torch.Tensor):
            raise KernelOutputError(f"expected y alone (a tensor) from {called}, got {type(y).__name__}")
        self.returned.check_and_add(y=y)
        x = fenced.originals["x"]
        _check_tensor("y", y, tuple(x.shape), (x.dtype,), x.device, "x's dtype")
        _check_inputs(fenced)
        return sent.case_y(y) if sent else y

    def fenced_storages(self, inputs: ScanInputs) -> list[tuple[str, ...]]:
        """The names of the inputs a call fences, grouped by the storage they share (core.fences.storages)."""
        return storages(self._called(inputs)[1])

    def _called(self, inputs: ScanInputs) -> tuple[PaddedCall | None, dict[str, torch.Tensor | None]]:
        """(the padded call or None, the input tensors the kernel is called on, by name)."""
        sent = padded(inputs) if inputs.pad_after is not None else None
        called = sent.inputs if sent else inputs
        # seq_idx too: an engine builds it once a batch and passes it to every layer's call, so a kernel that
        # changes it (clamping pad ids in place) corrupts the next layer's scan.
        return sent, {**{name: getattr(called, name) for name in _INPUTS},
                      "seq_idx": sent.seq_idx if sent else called.seq_idx}

    def _fenced_call(self, fn: Callable, inputs: ScanInputs, case: ScanCase, returns: bool,
                     transcript: Transcript | None,
                     nan_fences: Collection[str] | None = None) -> tuple[object, PaddedCall | None, Fenced]:
        """fn's guarded call on fenced copies of `inputs` (core.fences; a padded case's with its pad tokens):
        (what it returned, the padded call or None, the copies)."""
        sent, tensors = self._called(inputs)
        called = sent.inputs if sent else inputs
        fenced = Fenced(tensors, nan_fences)
        copies = dict(fenced.tensors)
        seq_idx = copies.pop("seq_idx")
        given = replace(called, **copies)
        sent_given = replace(sent, inputs=given) if sent else None
        result = guarded_call(fn, *self._arguments(inputs if sent else given, case, returns, sent_given, seq_idx),
                              transcript)
        return result, sent, fenced

    def arguments(self, inputs: ScanInputs, case: ScanCase, returns: bool = True) -> tuple[tuple, dict]:
        """(positional, keyword) arguments of the kernel's call on `inputs` (a padded case's with its pad
        tokens, scan.padding); `returns`: with the return_final_states/return_varlen_states flags (a
        stages callable takes none)."""
        return self._arguments(inputs, case, returns, padded(inputs) if inputs.pad_after is not None else None)

    def _arguments(self, inputs: ScanInputs, case: ScanCase, returns: bool, sent: PaddedCall | None,
                   seq_idx: torch.Tensor | None = None):
        """`seq_idx`: the one to pass (a checked copy), else the inputs' own."""
        flags = {"return_final_states": not inputs.varlen, "return_varlen_states": inputs.varlen} if returns else {}
        called = sent.inputs if sent else inputs
        if seq_idx is None:
            seq_idx = sent.seq_idx if sent else inputs.seq_idx
        named = {**called.kwargs(), "seq_idx": seq_idx, **flags, **self.options, **self._storage(inputs, case)[0]}
        return ((called.x, called.dt, called.A, called.B, called.C, case.chunk_size),
                {name: value for name, value in named.items() if name in self.named or not _unset(name, value)})

    def _missing_keywords(self, case: ScanCase) -> list[str]:
        """The keywords of the mamba signature `case` sets in its call and the kernel's signature does not name (none
        where it takes any keyword)."""
        if set(MAMBA_KEYWORDS) <= self.named or takes_any_keyword(self.fn):
            return []
        return [name for name in _set_keywords(case.regime, case.shape(), case.dtype) if name not in self.named]

    @functools.cached_property
    def named(self) -> frozenset[str]:
        """The keywords the kernel's signature names. One it does not name is passed only where the case sets it
        (`_unset`): a kernel of an older signature (no cu_seqlens, no dt_limit, no return_varlen_states) runs
        every case that needs none of them, and a case that does is skipped naming the keyword (`skip_reason`)."""
        return keywords(self.fn)

    def call_stages(self, inputs: ScanInputs, case: ScanCase, transcript: Transcript | None = None) -> dict:
        """The kernel's SSD stages on `inputs` (STAGE_NAMES, in the built-in kernel's layout; y on the case's
        own tokens), checked for presence and device. Raises what the kernel raises, KernelOutputError."""
        stages, sent, fenced = self._fenced_call(self.stages, inputs, case, False, transcript)
        if not isinstance(stages, dict) or set(STAGE_NAMES) - set(stages):
            raise KernelOutputError(f"the stages callable returned no dict of {', '.join(STAGE_NAMES)}")
        for name in STAGE_NAMES:
            if not isinstance(stages[name], torch.Tensor) or stages[name].device != inputs.x.device:
                raise KernelOutputError(f"stage {name} is not a tensor on {inputs.x.device}")
        _check_inputs(fenced)
        return {**stages, "y": sent.case_y(stages["y"])} if sent else stages


class ReturnedBuffers:
    """The outputs of a kernel's latest calls, held weakly. A new output whose memory is that of one still alive
    (so held by its caller: the allocator cannot have handed that memory out again) is a buffer the kernel keeps
    and returns again: its next call overwrites what the caller of the earlier one still reads."""

    KEPT = 8  # the latest outputs looked at

    def __init__(self):
        self._refs: list[tuple[str, weakref.ref]] = []

    def check_and_add(self, **outputs: torch.Tensor) -> None:
        """Raise KernelOutputError where one of `outputs` (name -> tensor) lies in an earlier output's memory."""
        alive = [(name, t) for name, ref in self._refs if (t := ref()) is not None]
        for name, t in outputs.items():
            for earlier_name, earlier in alive:
                if _same_memory(t, earlier):
                    verb = "lie" if name == "states" else "lies"
                    raise KernelOutputError(
                        f"its {name} {verb} in the memory of the {earlier_name} an earlier call returned, which its "
                        "caller still holds: a buffer the kernel keeps and returns again, so each call overwrites "
                        "the last one's output")
        self._refs = [(name, weakref.ref(t)) for name, t in alive][-self.KEPT:] + [
            (name, weakref.ref(t)) for name, t in outputs.items()]


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a's and b's storages overlap (an empty tensor owns no memory)."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    sa, sb = a.untyped_storage(), b.untyped_storage()
    return sa.data_ptr() < sb.data_ptr() + sb.nbytes() and sb.data_ptr() < sa.data_ptr() + sa.nbytes()


def _unpack(result) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(result, tuple):
        raise KernelOutputError(f"expected a tuple (out, states), got {type(result).__name__}")
    if len(result) != 2:
        raise KernelOutputError(f"expected a tuple (out, states), got a tuple of {len(result)}")
    for what, value in zip(("out", "states"), result):
        if not isinstance(value, torch.Tensor):
            raise KernelOutputError(f"expected a tuple (out, states) of tensors, got {what} of type {type(value).__name__}")
    return result


def _described(result) -> str:
    """What a kernel returned, in a few words: its type, a tuple's length and its members' types."""
    if not isinstance(result, tuple):
        return type(result).__name__
    return f"a tuple of {len(result)} ({', '.join(type(t).__name__ for t in result)})"


def _check_tensor(what: str, tensor: torch.Tensor, shape: tuple, dtypes: tuple, device: torch.device,
                  why: str) -> None:
    if tuple(tensor.shape) != shape:
        raise KernelOutputError(f"{what} has shape {tuple(tensor.shape)}, expected {shape}")
    if tensor.dtype not in dtypes:
        expected = " or ".join(dtype_name(d) for d in dtypes)
        raise KernelOutputError(f"{what} has dtype {dtype_name(tensor.dtype)}, expected {expected} ({why})")
    if tensor.device != device:
        raise KernelOutputError(f"{what} is on {tensor.device}, expected {device} (where the inputs are)")


_INPUTS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states", "cu_seqlens")


def _check_inputs(fenced: Fenced) -> None:
    """Raise KernelOutputError where the call wrote into an input, or past one (into its fences)."""
    violation = fenced.violation()
    if violation is not None:
        raise KernelOutputError(violation)


def torch_kernel(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                 cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
                 return_varlen_states=False, *, state_dtype=torch.float32, rounding="nearest", seed=0):
    """The same-precision baseline behind the mamba signature (seq_idx is implied by cu_seqlens)."""
    from ssmcheck.ops.chunk_scan.baseline import scan_baseline  # noqa: PLC0415

    out = scan_baseline(
        x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
        cu_seqlens=cu_seqlens, dt_softplus=dt_softplus, dt_limit=dt_limit, state_dtype=state_dtype,
        rounding=rounding, seed=seed,
    )
    extra = ([out.final_states] if return_final_states else []) + ([out.varlen_states] if return_varlen_states else [])
    return (out.y, *extra) if extra else out.y


def resolve(spec: str | Callable, interpreter: bool, state_dtype_given: bool = False) -> ScanAdapter:
    """The adapter of a --kernel value, or of a callable passed through the Python API. Raises
    core.callables.KernelSpecError for a spec that names nothing callable, or a peer (`mamba_ssm`,
    `vllm`) that cannot be imported. `builtin` and the peers import triton: configure the runtime
    first. `state_dtype_given`: --state-dtype was on the command line (see ScanAdapter)."""
    if spec == BUILTIN:
        from ssmcheck.ops.chunk_scan.chunk import CHUNK_SIZES, chunk_scan_combined, chunk_scan_stages  # noqa: PLC0415

        sizes = sorted(CHUNK_SIZES)
        return ScanAdapter(
            spec, chunk_scan_combined, takes_state_options=True, chunk_sizes=tuple(sizes),
            chunk_size_rule=f"the built-in kernel takes power-of-two chunk sizes {sizes[0]}..{sizes[-1]}",
            options={"interpret": interpreter}, takes_state_dtype=True, stages=chunk_scan_stages, pad_tokens=True,
        )
    if spec == MAMBA_SSM:
        from ssmcheck.peers import mamba_ssm  # noqa: PLC0415

        # mamba_ssm takes seq_idx per token and leaves a chunk that ends in a pad token (-1) out of the state.
        return replace(_discovered(spec, mamba_ssm.chunk_scan(), state_dtype_given), stages=mamba_ssm.chunk_scan_stages(),
                       pad_tokens=True)
    if spec == VLLM:
        from ssmcheck.peers import vllm  # noqa: PLC0415

        fn = vllm.chunk_scan()
        return ScanAdapter(
            spec, fn, takes_state_options=False, chunk_sizes=_POWERS_OF_TWO,
            chunk_size_rule="vLLM's chunk scan takes power-of-two chunk sizes", takes_state_dtype=True,
            default_state_dtype=INPUTS, state_dtype_given=state_dtype_given, initial_states_stored=True,
            stages=vllm.chunk_scan_stages(), writes_cache=set(CACHE_WRITE_KEYWORDS) <= keywords(fn),
            no_pad_tokens="its varlen chunk scan builds its chunks and their seq_idx from cu_seqlens alone, one id "
                          "per chunk, so a token cannot be marked as belonging to no sequence",
        )
    if callable(spec):
        return _discovered(kernel_name(spec), spec, state_dtype_given)
    if spec == TORCH:
        return replace(_discovered(spec, torch_kernel, state_dtype_given),
                       no_pad_tokens="the baseline reads its sequences from cu_seqlens alone")
    return _discovered(spec, load_callable(spec), state_dtype_given)


def _discovered(name: str, fn: Callable, state_dtype_given: bool) -> ScanAdapter:
    """The adapter of a kernel whose capabilities are the keywords its signature names."""
    named = keywords(fn)
    return ScanAdapter(name, fn, set(STATE_OPTIONS) <= named, takes_state_dtype="state_dtype" in named,
                       state_dtype_given=state_dtype_given, stages=getattr(fn, STAGES_ATTRIBUTE, None),
                       pad_tokens=getattr(fn, PAD_TOKENS_ATTRIBUTE, False) is True,
                       writes_cache=set(CACHE_WRITE_KEYWORDS) <= named)
