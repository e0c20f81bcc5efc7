"""vLLM's Mamba2 ops as `--kernel vllm`, called as vLLM's model code calls them.

vLLM's ops take other signatures than ours (DESIGN §2), so this module wraps them:

- `vllm.model_executor.layers.mamba.ops.ssd_combined.mamba_chunk_scan_combined_varlen(x, dt,
  A, B, C, chunk_size, cu_seqlens, cu_chunk_seqlens, last_chunk_indices, seq_idx, out, D=None,
  z=None, dt_bias=None, initial_states=None, dt_softplus=False, dt_limit=(0.0, inf),
  return_intermediate_states=False, state_dtype=None, ...)` takes one flat token set (x
  (tokens, nheads, headdim), no batch axis), cu_seqlens (nseq + 1,) int32, chunk metadata
  (`chunk_metadata` below), a preallocated `out` it writes y into, and per-sequence
  initial_states (nseq, nheads, headdim, dstate). It returns the final state of every
  sequence, (nseq, nheads, headdim, dstate), stored in `state_dtype`, or in C's dtype when
  state_dtype is None, which is how vLLM runs a model whose state cache has the model's dtype.
  `chunk_scan()` returns a wrapper with our chunk-scan signature plus a `state_dtype=None`
  keyword: batch rows become one sequence each, a varlen row its sequences. vLLM 0.33 also takes
  `final_states_out` (its state cache) and `final_state_indices` (each sequence's slot) and writes the
  final states there itself, as its model code calls it; the wrapper passes them through
  (scan.adapter.CACHE_WRITE_KEYWORDS).
- `vllm.model_executor.layers.mamba.ops.mamba_ssm.selective_state_update(state, x, dt, A, B,
  C, D, dt_bias, z=None, dt_softplus=False, state_batch_indices=None, ..., out=None, ...)`
  requires D and dt_bias (z after them; the CPU implementation vLLM swaps in without CUDA has
  the mamba order D, z, dt_bias, so the wrapper passes them by keyword), writes y into a
  preallocated `out` and returns None (the CPU one returns out); the state is updated in place,
  stored in its own dtype.
  `state_update()` returns a wrapper with our signature: a plain decode step, one token per
  row, the state of row i in slot i, or in slot state_batch_indices[i] of a pool (its pad rows
  carry vLLM's null block id, 0, passed as `pad_slot_id`), zeros for a missing D or dt_bias
  (stride 0, so vLLM's tied-head path still sees tied parameters), y in `out` when given.

On a machine without CUDA, vLLM's modules swap both functions for CPU implementations that
call vLLM's compiled CPU ops (`vllm._custom_ops`) at import time.
"""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ssmcheck.core import autotune
from ssmcheck.core.callables import keywords
from ssmcheck.core.formats import dtype_name
from ssmcheck.drift.adapter import DRAFT_KEYWORDS, STOCHASTIC_UNAVAILABLE
from ssmcheck.peers import import_ops
from ssmcheck.scan.adapter import CACHE_WRITE_KEYWORDS

NAME = "vllm"
# vLLM's NULL_BLOCK_ID (vllm.v1.attention.backends.utils): the pool slot its pad rows point at.
NULL_BLOCK_ID = 0
_WHAT = "vLLM's Mamba2 ops"
_SCAN_MODULE = "vllm.model_executor.layers.mamba.ops.ssd_combined"
_STATE_UPDATE_MODULE = "vllm.model_executor.layers.mamba.ops.mamba_ssm"
# vLLM 0.33's launcher for its autotuned SSD kernels, which keeps the autotuner's choice per key (_forget_launches).
_LAUNCHER_MODULE = "vllm.model_executor.layers.mamba.ops.triton_helpers"


@dataclass(frozen=True)
class ChunkMetadata:
    """vLLM's chunk metadata of a prefill: which tokens each chunk holds and whose they are."""

    cu_chunk_seqlens: torch.Tensor  # (nchunks + 1,) int32: chunk c holds tokens [cu[c], cu[c + 1])
    last_chunk_indices: torch.Tensor  # (nseq,) int32: the index of each sequence's last chunk
    seq_idx: torch.Tensor  # (nchunks,) int32: the sequence of each chunk


def chunk_metadata(cu_seqlens: torch.Tensor | Sequence[int], chunk_size: int,
                   device: torch.device | str | None = None) -> ChunkMetadata:
    """The chunk metadata vLLM's Mamba2 metadata builder makes for a prefill of fresh sequences.

    The rule (vLLM's builder with no tokens computed before): a chunk never holds tokens of two
    sequences, and each sequence is cut into chunks of `chunk_size` tokens from its own first
    token, the last one shorter when the length is not a multiple. So a boundary that falls
    mid-chunk of the packed layout starts a new chunk. Raises ValueError for boundaries that are
    not 0 first and increasing (vLLM has no empty prefill sequence; its kernels would read a
    wrong last chunk for one).
    """
    bounds = [int(b) for b in (cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else cu_seqlens)]
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if len(bounds) < 2 or bounds[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0 and bound at least one sequence, got {bounds}")
    ends, owners, last = [0], [], []
    for sequence, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        if end <= start:
            raise ValueError(f"sequence {sequence} is empty (cu_seqlens {start}, {end}): vLLM takes no empty sequence")
        for lo in range(start, end, chunk_size):
            ends.append(min(lo + chunk_size, end))
            owners.append(sequence)
        last.append(len(owners) - 1)
    if device is None and isinstance(cu_seqlens, torch.Tensor):
        device = cu_seqlens.device

    def int32(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    return ChunkMetadata(int32(ends), int32(last), int32(owners))


# ---------------------------------------------------------------------------- the chunk scan


def chunk_scan() -> Callable:
    """vLLM's `mamba_chunk_scan_combined_varlen` behind our chunk-scan signature (with a
    `state_dtype=None` keyword). Raises KernelSpecError when vLLM's ops cannot be imported."""
    varlen = import_ops(NAME, _WHAT, _SCAN_MODULE).mamba_chunk_scan_combined_varlen

    def vllm_chunk_scan(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                        seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, math.inf),
                        return_final_states=False, return_varlen_states=False, *, state_dtype=None,
                        final_states_out=None, final_state_indices=None):
        _forget_launches()
        return call_chunk_scan(
            varlen, x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
            seq_idx=seq_idx, cu_seqlens=cu_seqlens, dt_softplus=dt_softplus, dt_limit=dt_limit,
            return_final_states=return_final_states, return_varlen_states=return_varlen_states,
            state_dtype=state_dtype, final_states_out=final_states_out, final_state_indices=final_state_indices,
        )

    if not set(CACHE_WRITE_KEYWORDS) <= keywords(varlen):
        # This vLLM (0.31) returns its final states and writes no state cache: so that scan.invariance does not ask.
        _hide_keywords(vllm_chunk_scan, CACHE_WRITE_KEYWORDS)
    setattr(vllm_chunk_scan, autotune.ORIGIN, varlen)  # --configs: vLLM's autotuners, not ours
    return vllm_chunk_scan


def _forget_launches() -> None:
    """Empty vLLM's per-key store of autotuned configs (0.33's `triton_helpers._autotuned_configs`; older
    vLLMs have none). Its launcher keeps the config the autotuner chose for a key and launches the kernel with
    it directly afterwards, past the autotuner: a config that --configs pins later would never run (ssmcheck
    would call that case an error: core.autotune.pinned). Emptied before each call, every launch goes through the
    autotuner, whose own cache keeps its choices (nothing is benchmarked again)."""
    kept = getattr(sys.modules.get(_LAUNCHER_MODULE), "_autotuned_configs", None)
    if isinstance(kept, dict):
        kept.clear()


def _hide_keywords(wrapper: Callable, names: Sequence[str]) -> None:
    """Drop `names` from the wrapper's signature, where the wrapped vLLM op takes no such keywords: ssmcheck finds
    a kernel's capabilities in the keywords its signature names (core.callables.keywords)."""
    signature = inspect.signature(wrapper)
    wrapper.__signature__ = signature.replace(parameters=[
        parameter for name, parameter in signature.parameters.items() if name not in names])


def call_chunk_scan(varlen: Callable, x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                    seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, math.inf),
                    return_final_states=False, return_varlen_states=False, state_dtype=None, final_states_out=None,
                    final_state_indices=None):
    """Call vLLM's varlen chunk scan `varlen` on our layout; return what our signature promises.

    Batch mode (no cu_seqlens): each of the `batch` rows is one sequence. Varlen (batch 1 with
    cu_seqlens): the row's sequences; seq_idx is implied by cu_seqlens and not read. The tokens
    are flattened into vLLM's (tokens, ...) layout (views of contiguous inputs), `out` is
    allocated in x's dtype (NaN-filled), `state_dtype` is passed through (None: vLLM stores the states in C's
    dtype), and initial_states are cast to that storage dtype, as vLLM's model code passes them
    from its state cache (its kernel takes them in no other dtype). The states vLLM returns are per sequence: the final states per row in batch mode,
    the varlen states in varlen mode (the final states of a varlen row are its last sequence's).
    With `final_states_out` (the state cache, slots x nheads x headdim x dstate) and `final_state_indices`
    (each sequence's slot), as vLLM's model code calls it, vLLM writes the states into the cache itself and
    y alone is returned.
    """
    args, kwargs = varlen_arguments(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias,
                                    initial_states=initial_states, seq_idx=seq_idx, cu_seqlens=cu_seqlens,
                                    dt_softplus=dt_softplus, dt_limit=dt_limit, state_dtype=state_dtype)
    if final_states_out is not None:
        varlen(*args, **kwargs, final_states_out=final_states_out, final_state_indices=final_state_indices)
        return kwargs["out"].view(x.shape)
    states = varlen(*args, **kwargs)
    y = kwargs["out"].view(x.shape)
    final = states if cu_seqlens is None else states[-1:]
    extra = ([final] if return_final_states else []) + ([states] if return_varlen_states else [])
    return (y, *extra) if extra else y


def varlen_arguments(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                     cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, math.inf), return_final_states=False,
                     return_varlen_states=False, state_dtype=None) -> tuple[tuple, dict]:
    """The (positional, keyword) arguments of `mamba_chunk_scan_combined_varlen` for a call with our signature
    (the return flags are ours alone: vLLM returns every sequence's state); `out`, y's buffer, is allocated
    NaN-filled, so that an element vLLM leaves unwritten shows as NaN, not as stale memory."""
    layout = _packed(x, C, chunk_size, seq_idx, cu_seqlens, initial_states, state_dtype)
    flat, meta = layout.flat, layout.meta
    out = torch.full((layout.tokens, *x.shape[2:]), math.nan, dtype=x.dtype, device=x.device)
    return (flat(x), flat(dt), A, flat(B), flat(C), chunk_size), dict(
        cu_seqlens=layout.cu_seqlens, cu_chunk_seqlens=meta.cu_chunk_seqlens,
        last_chunk_indices=meta.last_chunk_indices, seq_idx=meta.seq_idx, out=out, D=D, z=flat(z), dt_bias=dt_bias,
        initial_states=layout.initial_states, dt_softplus=dt_softplus, dt_limit=tuple(dt_limit),
        state_dtype=state_dtype,
    )


@dataclass(frozen=True)
class _Packed:
    """Our (batch, seqlen, ...) layout as vLLM's one flat token set."""

    tokens: int
    cu_seqlens: torch.Tensor  # (nseq + 1,) int32
    meta: ChunkMetadata
    initial_states: torch.Tensor | None  # in the storage dtype, as vLLM's state cache holds them

    def flat(self, t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.reshape(self.tokens, *t.shape[2:])


def _packed(x, C, chunk_size, seq_idx, cu_seqlens, initial_states, state_dtype) -> _Packed:
    batch, seqlen = x.shape[:2]
    if cu_seqlens is None:
        if seq_idx is not None:
            raise ValueError("vLLM's chunk scan: seq_idx without cu_seqlens (pass cu_seqlens for packed sequences)")
        cu = torch.arange(0, (batch + 1) * seqlen, seqlen, dtype=torch.int32, device=x.device)
    else:
        if batch != 1:
            raise ValueError(f"vLLM's chunk scan: cu_seqlens needs batch 1 (the packed sequences), got batch {batch}")
        cu = cu_seqlens.to(device=x.device, dtype=torch.int32)
        if int(cu[-1]) != seqlen:
            raise ValueError(f"vLLM's chunk scan: cu_seqlens ends at {int(cu[-1])}, expected seqlen {seqlen}")
    if initial_states is not None:  # as vLLM's state cache holds them: in the dtype its states are stored in
        initial_states = initial_states.to(C.dtype if state_dtype is None else state_dtype)
    return _Packed(batch * seqlen, cu, chunk_metadata(cu, chunk_size, device=x.device), initial_states)


def chunk_scan_stages() -> Callable:
    """vLLM's five SSD stage functions, composed as its `_mamba_chunk_scan_combined_fwd` composes them, behind
    our chunk-scan signature (without the return flags; `state_dtype=None` as for `chunk_scan`): a function
    returning the stages in the built-in kernel's layout (scan.stages). vLLM's chunks are the built-in's
    (each sequence chunked from its own start); its state passing keeps the state *after* each chunk, so
    the state entering a chunk is the previous chunk's, or the sequence's initial state (zero without).
    Raises KernelSpecError when vLLM's ops cannot be imported."""
    ops = import_ops(NAME, _WHAT, _SCAN_MODULE)

    def vllm_stages(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                    cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, math.inf), *, state_dtype=None):
        _forget_launches()
        batch, seqlen, nheads, headdim = x.shape
        dstate = B.shape[-1]
        layout = _packed(x, C, chunk_size, seq_idx, cu_seqlens, initial_states, state_dtype)
        flat, meta = layout.flat, layout.meta
        # The contiguity vLLM's combined function ensures before its stages.
        xf, zf, Bf, Cf = (None if t is None else flat(t).contiguous() for t in (x, z, B, C))
        dA_cumsum, dt_out = ops._chunk_cumsum_fwd(flat(dt), A, chunk_size, meta.cu_chunk_seqlens, dt_bias=dt_bias,
                                                  dt_softplus=dt_softplus, dt_limit=tuple(dt_limit))
        poisoned = torch.full((dA_cumsum.shape[1], nheads, headdim, dstate), math.nan, device=x.device)
        local = ops._chunk_state_fwd(Bf, xf, dt_out, dA_cumsum, meta.cu_chunk_seqlens, states=poisoned,
                                     states_in_fp32=True)
        init = layout.initial_states
        after = ops._state_passing_fwd(
            local.flatten(-2), dA_cumsum, meta.last_chunk_indices,
            initial_states=None if init is None else init.flatten(-2),
            out_dtype=C.dtype if state_dtype is None else state_dtype,
        ).unflatten(-1, (headdim, dstate))
        cb = ops._bmm_chunk_fwd(Cf, Bf, chunk_size, meta.cu_chunk_seqlens, output_dtype=torch.float32)
        out = torch.full((layout.tokens, nheads, headdim), math.nan, dtype=x.dtype, device=x.device)
        ops._chunk_scan_fwd(cb, xf, dt_out, dA_cumsum, Cf, after, meta.cu_chunk_seqlens, out, meta.seq_idx,
                            D=None if D is None else D.contiguous(), z=zf, initial_states=init)
        first = torch.zeros(after.shape[0], dtype=torch.bool, device=x.device)
        first[torch.cat([meta.last_chunk_indices.new_zeros(1), meta.last_chunk_indices[:-1] + 1]).long()] = True
        start = torch.zeros_like(after) if init is None else init[meta.seq_idx.long()].to(after.dtype)
        before = torch.where(first[:, None, None, None], start, after.roll(1, dims=0))
        return {"cumsum": dA_cumsum.transpose(0, 1), "chunk_states": local, "passed_states": before, "cb": cb,
                "y": out.view(batch, seqlen, nheads, headdim)}

    return vllm_stages


# ---------------------------------------------------------------------------- the state update


def state_update() -> Callable:
    """vLLM's `selective_state_update` behind our signature, with a `rounding` keyword: "stochastic" is
    vLLM's own stochastic rounding of the state (`enable_stochastic_rounding`, as vLLM's
    `--enable-mamba-cache-stochastic-rounding` turns it on), which the wrapper's
    `stochastic_rounding_unavailable` says where it cannot run. Raises KernelSpecError when vLLM's ops
    cannot be imported."""
    ops = import_ops(NAME, _WHAT, _STATE_UPDATE_MODULE)
    update = ops.selective_state_update
    named = keywords(update)
    has_sr = "enable_stochastic_rounding" in named

    def vllm_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                          state_batch_indices=None, pad_slot_id=NULL_BLOCK_ID, out=None, rounding="nearest",
                          dst_state_batch_indices=None, num_accepted_tokens=None, cu_seqlens=None):
        # Only asked for where it is wanted: a vLLM without stochastic rounding takes no such keyword.
        extra = {"enable_stochastic_rounding": True} if rounding == "stochastic" else {}
        drafts = {"dst_state_batch_indices": dst_state_batch_indices, "num_accepted_tokens": num_accepted_tokens,
                  "cu_seqlens": cu_seqlens}  # speculative decoding: several tokens per row (drift.speculative)
        extra.update({name: value for name, value in drafts.items() if value is not None})
        return call_state_update(update, state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                                 state_batch_indices=state_batch_indices, pad_slot_id=pad_slot_id, out=out, **extra)

    def unavailable(state_dtype: torch.dtype) -> str | None:
        return stochastic_rounding_unavailable(has_sr, state_dtype, _capability())

    if not set(DRAFT_KEYWORDS) <= named:
        # This vLLM (or the CPU implementation it swaps in without CUDA) verifies no draft tokens: so that
        # drift.speculative does not ask.
        _hide_keywords(vllm_state_update, DRAFT_KEYWORDS)
    setattr(vllm_state_update, autotune.ORIGIN, update)
    setattr(vllm_state_update, STOCHASTIC_UNAVAILABLE, unavailable)
    if hasattr(ops, "_ssm_config_override"):
        setattr(vllm_state_update, autotune.LAUNCH_TABLES,
                [autotune.Tuned("_selective_scan_update_kernel", ops.__name__, LaunchTable(ops),
                                "vLLM's tables by batch x heads, not an autotuner")])
    return vllm_state_update


# The state update's launch configs: vLLM takes (BLOCK_SIZE_M, num_warps) from a tuned table keyed by batch ×
# heads (try_get_optimal_ssm_config), or a heuristic by dstate, not from an autotuner. These are the values its
# shipped tables and its heuristic use (H200's: 4/8/16 x 1/2/4 warps; the heuristic: 32 x 4, 4 x 8, ...).
SSU_BLOCK_SIZE_M = (4, 8, 16, 32)
SSU_NUM_WARPS = (1, 2, 4, 8)


class LaunchTable:
    """vLLM's state-update launch configs as core.autotune pins an autotuner's: `configs` set to one config makes it
    vLLM's override (`_ssm_config_override`, its own hook for benchmarks); the whole list again, vLLM's own pick.
    So `--configs all` runs every config at any batch, where vLLM picks one by batch × heads."""

    def __init__(self, module):
        import triton  # noqa: PLC0415 (vLLM's ops import it anyway)

        self._module = module
        self._configs = [triton.Config({"BLOCK_SIZE_M": m}, num_warps=w) for m in SSU_BLOCK_SIZE_M
                         for w in SSU_NUM_WARPS]

    @property
    def configs(self) -> list:
        return self._configs

    @configs.setter
    def configs(self, configs: list) -> None:
        self._configs = list(configs)
        one = self._configs[0] if len(self._configs) == 1 else None
        self._module._ssm_config_override = None if one is None else (one.kwargs["BLOCK_SIZE_M"], one.num_warps)


def stochastic_rounding_unavailable(has_sr: bool, state_dtype: torch.dtype,
                                    capability: tuple[int, int] | None) -> str | None:
    """Why vLLM's stochastic rounding cannot store a state of `state_dtype` on a GPU of compute `capability`
    (None: no CUDA GPU), or None where it can. `has_sr`: whether this vLLM's selective_state_update has it. It
    is one PTX instruction, cvt.rs.f16x2.f32: fp16 states only, and sm_100 or newer."""
    if not has_sr:
        return "this vLLM's selective_state_update has no stochastic rounding (no enable_stochastic_rounding)"
    if state_dtype != torch.float16:
        return f"vLLM's stochastic rounding stores fp16 states only, not {dtype_name(state_dtype)}"
    from ssmcheck.ops.rounding.stochastic import HARDWARE_SR_CAPABILITY  # noqa: PLC0415 (imports triton)

    major, minor = HARDWARE_SR_CAPABILITY
    need = f"vLLM's stochastic rounding (PTX cvt.rs) needs an NVIDIA GPU of sm_{major}{minor}"
    if capability is None:
        return f"{need} or newer: none here"
    if capability < HARDWARE_SR_CAPABILITY:
        return f"{need} or newer; this one is sm_{capability[0]}{capability[1]}"
    return None


def _capability() -> tuple[int, int] | None:
    """The current CUDA device's compute capability, or None without one."""
    return torch.cuda.get_device_capability() if torch.cuda.is_available() else None


def call_state_update(update: Callable, state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                      state_batch_indices=None, pad_slot_id=NULL_BLOCK_ID, out=None, **extra):
    """One decode step through vLLM's `selective_state_update`: state (batch, nheads, headdim,
    dstate) updated in place, y returned in `out` (a new NaN-filled tensor like x when None).

    vLLM requires D and dt_bias; a missing one is zeros of shape (nheads, headdim) with stride 0,
    which adds nothing (but x·0 for an infinite x is NaN where "no D" would leave none). With
    `state_batch_indices`, state is a pool and row i updates slot state_batch_indices[i]; a row whose
    index is `pad_slot_id` (vLLM's null_block_id, 0 by default: slot 0 of the pool is the null block
    that pad rows point at) reads and writes no state. `extra`: further keywords of vLLM's.
    """
    nheads, headdim = state.shape[1], state.shape[2]
    zeros = torch.zeros((), dtype=torch.float32, device=x.device).expand(nheads, headdim)
    out = torch.full_like(x, math.nan) if out is None else out  # NaN-filled: what vLLM leaves unwritten shows
    # By keyword: the CPU implementation vLLM swaps in without CUDA orders them (D, z, dt_bias).
    update(state, x, dt, A, B, C, D=zeros if D is None else D, dt_bias=zeros if dt_bias is None else dt_bias,
           z=z, dt_softplus=dt_softplus, state_batch_indices=state_batch_indices, null_block_id=pad_slot_id, out=out,
           **extra)
    return out
