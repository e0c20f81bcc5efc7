"""Planted chunk-scan kernels that break on serving-shaped inputs, with the state-spaces/mamba signature.

Each computes the right math (the same-precision baseline) and breaks only where the inputs' layout or
the output's range demands care. Used as `--kernel tests/layout_kernels.py:NAME`.

- `wrapped_token_offsets`: reads its inputs through offsets computed from their strides, with the token
  term `token * token_stride` held in a WRAP_BITS-bit signed integer: a model of a Triton kernel that
  computes `offs_t * stride_t` in 32 bits (state-spaces/mamba #1015, #1038; vLLM #20938). The Triton
  interpreter never overflows at CPU sizes, so the register is narrowed instead: with WRAP_BITS = 14,
  offsets pass 2**13 = 8192 where a tiny case's fused in_proj rows (82 elements per token at 2 heads
  x 16, dstate 8, 1 group) reach token 100, as Mamba2-2.7B's (10576 per token) pass 2**31 at token
  203,053. Below the limit it reads every element where a correct kernel does; past it the offset
  wraps two's-complement-wise to a negative one, and the element read is the one that far before the
  view's start (another row, another column block). An offset before the first element of the
  kernel's storage reads the element at that offset taken modulo the storage's size: under ssmcheck
  the storage is a copy with a NaN fence either side (core.fences), so that read returns NaN, as it
  would return whatever memory lies before a buffer in a serving engine. Contiguous inputs of the same
  case keep their offsets under the limit (32 elements per token) and read right.
- `unsaturated_fp16_output`: computes y in fp32 and narrows it with a plain cast, as `acc.to(fp16)`
  does: a finite y past 65504 is stored as inf.
- `initial_states_read_as_contiguous`: reads initial_states through contiguous strides for their shape
  (their .stride() never passed to the kernel): one layer's slice of a state cache is read at another
  layer's states.
- `batch_mode_d_per_head`: its batch-mode launcher (written apart from the varlen one) passes D's channel
  stride as 0, so a per-channel D gives every channel its head's first value.
- `z_read_with_x_strides`, `channels_read_as_contiguous`, `rows_seqlen_tokens_apart`: one stride taken from
  another input or derived from the shape instead of passed; right wherever the inputs share one layout
  (every regime but `conv-output`, whose x, B and C come channel-major out of the causal conv).
"""

import torch

from ssmcheck.ops.chunk_scan.baseline import scan_baseline

WRAP_BITS = 14


def _mamba_result(y, out, return_final_states, return_varlen_states):
    extra = ([out.final_states] if return_final_states else []) + ([out.varlen_states] if return_varlen_states else [])
    return (y, *extra) if extra else y


def _wrap(offsets: torch.Tensor) -> torch.Tensor:
    """`offsets` held in a WRAP_BITS-bit two's-complement integer."""
    half = 2 ** (WRAP_BITS - 1)
    return (offsets + half) % (2 * half) - half


def _read(t: torch.Tensor | None, strides=None, wrap_tokens: bool = True) -> torch.Tensor | None:
    """`t` (batch, seqlen, ...) as a kernel reads it from its storage through `strides` (its own by default),
    the token term wrapped where `wrap_tokens`. An offset outside the storage reads it modulo its size."""
    if t is None:
        return None
    buffer = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage())
    offsets = torch.full(t.shape, t.storage_offset(), dtype=torch.int64, device=t.device)
    for dim, (size, stride) in enumerate(zip(t.shape, t.stride() if strides is None else strides)):
        index = torch.arange(size, device=t.device) * stride
        if dim == 1 and wrap_tokens:  # the token dimension
            index = _wrap(index)
        offsets = offsets + index.view([size if d == dim else 1 for d in range(t.dim())])
    return buffer[offsets % buffer.numel()]


def wrapped_token_offsets(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                          seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                          return_final_states=False, return_varlen_states=False):
    """The baseline on its inputs as read through WRAP_BITS-bit token offsets (module docstring)."""
    x, dt, B, C, z = (_read(t) for t in (x, dt, B, C, z))
    out = scan_baseline(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                        cu_seqlens=cu_seqlens, dt_softplus=dt_softplus, dt_limit=dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)


def unsaturated_fp16_output(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                            seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                            return_final_states=False, return_varlen_states=False):
    """y computed in fp32 (inputs widened, so nothing saturates on the way) and cast to x's dtype plainly:
    inf where a finite y lies past the format's range. Its states are the baseline's."""
    out = scan_baseline(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                        cu_seqlens=cu_seqlens, dt_softplus=dt_softplus, dt_limit=dt_limit)
    wide = [None if t is None else t.float() for t in (x, dt, B, C, z)]
    y = scan_baseline(wide[0], wide[1], A, wide[2], wide[3], chunk_size, D=D, z=wide[4], dt_bias=dt_bias,
                      initial_states=initial_states, cu_seqlens=cu_seqlens, dt_softplus=dt_softplus,
                      dt_limit=dt_limit).y
    return _mamba_result(y.to(x.dtype), out, return_final_states, return_varlen_states)


def initial_states_read_as_contiguous(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                      initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                      dt_limit=(0.0, float("inf")), return_final_states=False,
                                      return_varlen_states=False):
    """The baseline on initial states read from their first element with contiguous strides."""
    if initial_states is not None:
        contiguous = torch.empty(initial_states.shape, device="meta").stride()
        initial_states = initial_states.as_strided(initial_states.shape, contiguous)
    return _baseline_call(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus,
                          dt_limit, return_final_states, return_varlen_states)


def batch_mode_d_per_head(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                          seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                          return_final_states=False, return_varlen_states=False):
    """The baseline with, in batch mode, a per-channel D read at channel stride 0 (each head's first value)."""
    if cu_seqlens is None and D is not None and D.dim() == 2:
        D = D[:, :1].expand_as(D)
    return _baseline_call(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus,
                          dt_limit, return_final_states, return_varlen_states)


def z_read_with_x_strides(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                          seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                          return_final_states=False, return_varlen_states=False):
    """The baseline with the gate z read through x's strides (one set of strides passed for both, as right as
    the callers whose x and z share a layout)."""
    if z is not None:
        z = _read(z, x.stride(), wrap_tokens=False)
    return _baseline_call(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus,
                          dt_limit, return_final_states, return_varlen_states)


def channels_read_as_contiguous(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                return_final_states=False, return_varlen_states=False):
    """The baseline on x, B, C and z read with a last-axis stride of 1 (their other strides their own): a kernel
    that takes the channel and state axes as contiguous."""
    x, B, C, z = (None if t is None else _read(t, (*t.stride()[:-1], 1), wrap_tokens=False) for t in (x, B, C, z))
    return _baseline_call(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus,
                          dt_limit, return_final_states, return_varlen_states)


def rows_seqlen_tokens_apart(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                             seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                             return_final_states=False, return_varlen_states=False):
    """The baseline on token-wise inputs whose rows are read seqlen token strides apart (the row stride derived,
    not passed): right for every layout whose rows follow each other, as a (batch, seqlen, width) buffer's do."""
    def rows_derived(t):
        return None if t is None else _read(t, (t.shape[1] * t.stride(1), *t.stride()[1:]), wrap_tokens=False)
    x, dt, B, C, z = (rows_derived(t) for t in (x, dt, B, C, z))
    return _baseline_call(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus,
                          dt_limit, return_final_states, return_varlen_states)


def _baseline_call(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit,
                   return_final_states, return_varlen_states):
    """The baseline's answer to a call with these arguments, as the mamba signature returns it."""
    out = scan_baseline(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                        cu_seqlens=cu_seqlens, dt_softplus=dt_softplus, dt_limit=dt_limit)
    return _mamba_result(out.y, out, return_final_states, return_varlen_states)
