"""A scan case's inputs as plain data: the shape, the mamba_chunk_scan_combined arguments, and
where each token lies in its sequence (for locating errors)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import torch

from ssmcheck.core.tensors import moved

# The note's clause for inputs whose int64 indices the kernel refused (it raised), so that the case ran on int32
# (scan.run, ScanInputs.narrowed): a reproducer of the case calls it so too (scan.repro).
REFUSED_INT64 = "the kernel refused int64 cu_seqlens and seq_idx"


@dataclass(frozen=True)
class ScanShape:
    batch: int  # batch rows; for varlen regimes, the number of sequences packed into one row
    seqlen: int  # tokens per row; for varlen regimes, the mean sequence length
    nheads: int
    headdim: int
    dstate: int
    ngroups: int
    chunk_size: int


@dataclass(frozen=True)
class TokenMap:
    """Where each (row, token) of the kernel's input lies in its own sequence."""

    sequence: torch.Tensor  # (batch, seqlen) int64: sequence index
    position: torch.Tensor  # (batch, seqlen) int64: token index within that sequence
    order: torch.Tensor  # (batch, seqlen) int64: rank in token order (packed position, or token-major over rows)

    def segment(self, f0: int, f1: int) -> TokenMap:
        """The map of flattened tokens [f0, f1) (batch*seqlen, in row order), as (1, f1 - f0) tensors."""
        return TokenMap(*(t.flatten()[None, f0:f1] for t in (self.sequence, self.position, self.order)))


@dataclass(frozen=True)
class ScanInputs:
    """Arguments of a mamba_chunk_scan_combined call (DESIGN §2)."""

    x: torch.Tensor  # (batch, seqlen, nheads, headdim)
    dt: torch.Tensor  # (batch, seqlen, nheads)
    A: torch.Tensor  # (nheads,)
    B: torch.Tensor  # (batch, seqlen, ngroups, dstate)
    C: torch.Tensor  # (batch, seqlen, ngroups, dstate)
    D: torch.Tensor | None = None
    z: torch.Tensor | None = None
    dt_bias: torch.Tensor | None = None
    initial_states: torch.Tensor | None = None  # (batch or nseq, nheads, headdim, dstate)
    cu_seqlens: torch.Tensor | None = None  # (nseq + 1,) int32 or int64: varlen when given (batch is 1)
    dt_softplus: bool = False
    dt_limit: tuple[float, float] = (0.0, math.inf)
    note: str = ""  # what the regime built, for messages
    # (nseq,) int64: pad tokens (seq_idx -1) the kernel gets after each varlen sequence (the `padded` regime,
    # scan.padding); every other field holds the case's own tokens alone, as the references see them.
    pad_after: torch.Tensor | None = None

    @property
    def varlen(self) -> bool:
        return self.cu_seqlens is not None

    @property
    def nsequences(self) -> int:
        return len(self.cu_seqlens) - 1 if self.varlen else self.x.shape[0]

    @property
    def seq_idx(self) -> torch.Tensor | None:
        """(1, seqlen) sequence index of every token, derived from cu_seqlens, in its dtype."""
        if not self.varlen:
            return None
        return self.token_map().sequence.to(self.cu_seqlens.dtype)

    @property
    def wide_indices(self) -> bool:
        """Whether cu_seqlens and seq_idx are int64 (engines pass int32)."""
        return self.varlen and self.cu_seqlens.dtype == torch.int64

    def narrowed(self, why: str) -> ScanInputs:
        """These inputs with int32 cu_seqlens and seq_idx, `why` added to the note."""
        return replace(self, cu_seqlens=self.cu_seqlens.to(torch.int32), note=f"{self.note}; {why}")

    def to(self, device: str | torch.device) -> ScanInputs:
        """The inputs on `device`, each with its own strides: views into one buffer (the strided regime's
        fused in_proj output) stay views, with their strides and offsets, into one moved copy of it.
        Tensor.to alone would give each non-contiguous view a contiguous copy of its own, so the
        kernel would never see the layout the regime built."""
        buffers: dict[tuple, torch.Tensor] = {}
        on_device = {
            f.name: moved(getattr(self, f.name), device, buffers)
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return replace(self, **on_device)

    def kwargs(self) -> dict:
        """Keyword arguments shared by kernels and references (everything but x, dt, A, B, C)."""
        return dict(
            D=self.D, z=self.z, dt_bias=self.dt_bias, initial_states=self.initial_states,
            cu_seqlens=self.cu_seqlens, dt_softplus=self.dt_softplus, dt_limit=self.dt_limit,
        )

    def token_map(self) -> TokenMap:
        rows, seqlen = self.x.shape[:2]
        device = self.x.device
        t = torch.arange(seqlen, device=device)
        if self.varlen:
            cu = self.cu_seqlens.to(device=device, dtype=torch.int64)
            sequence = torch.searchsorted(cu[1:], t, right=True)
            position = t - cu[sequence]
            return TokenMap(sequence[None], position[None], t[None])
        b = torch.arange(rows, device=device)[:, None]
        return TokenMap(b.expand(rows, seqlen), t.expand(rows, seqlen), t * rows + b)

    def finite_at(self, row: int, token: int, head: int) -> bool:
        """Whether every input that reaches (row, token, head) is finite."""
        sequence = int(self.token_map().sequence[row, token])
        return self._finite(row, slice(token, token + 1), head, sequence)

    def finite_for_sequence(self, sequence: int, head: int) -> bool:
        """Whether every input of one sequence (for one head) is finite: what its final state depends on."""
        if self.varlen:
            lo, hi = int(self.cu_seqlens[sequence]), int(self.cu_seqlens[sequence + 1])
            return self._finite(0, slice(lo, hi), head, sequence)
        return self._finite(sequence, slice(None), head, sequence)

    def _finite(self, row: int, tokens: slice, head: int, sequence: int) -> bool:
        group = head // (self.x.shape[2] // self.B.shape[2])
        parts = [self.x[row, tokens, head], self.dt[row, tokens, head], self.A[head],
                 self.B[row, tokens, group], self.C[row, tokens, group]]
        if self.z is not None:
            parts.append(self.z[row, tokens, head])
        parts += [p[head] for p in (self.D, self.dt_bias) if p is not None]
        if self.initial_states is not None:
            parts.append(self.initial_states[sequence, head])
        return all(bool(torch.isfinite(p).all()) for p in parts)
