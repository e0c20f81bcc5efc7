"""Input regimes of the chunk scan (DESIGN §4): each turns (shape, dtype, seed) into kernel inputs.

Every regime is built so that a correct kernel accumulating in fp32 stays within
2x the same-precision baseline: the extremes they reach are ones where fp32
arithmetic is exact or irrelevant, so a verdict never hinges on a summation order.
In particular the log-decays of decay-extreme and dt-extreme are integers
(multiples of a power of two) so every partial sum of their cumulative sums is
exact in fp32, whatever order a kernel adds them in: a decay is then either
exactly 1 (only zero-dt tokens in between) or negligibly small, and never a
moderate decay computed as the difference of two huge, rounded cumsums
(dt-extreme's heads of a raw dt under softplus's threshold have moderate
decays and small cumulative sums instead, as normal's).

Inputs are drawn on the CPU from a generator seeded with the case's seed, so a
case is the same on every device; `ScanInputs.to` moves them.

The regimes long sequences run (normal, long) draw their token-wise inputs (x, B, C, z,
raw dt) in blocks of GENERATION_BLOCK tokens, block k from a generator seeded by (case
seed, k), and cast each block into the case's dtype as it is drawn: a token's inputs
depend on the seed, the widths and its position (a longer sequence begins with a shorter
one's), never on how a run is cut into segments, and no float32 copy of a whole long
input is made. Their per-head parameters
(A, dt_bias, D, initial states) come from the case seed's own generator. The other
regimes draw whole tensors from that one generator.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from ssmcheck.core.sweep import case_seed
from ssmcheck.ops.naive import NO_DT_LIMIT, process_dt
from ssmcheck.scan.inputs import ScanInputs, ScanShape

GENERATION_BLOCK = 4096  # tokens per block of token-wise inputs (normal, long)


@dataclass(frozen=True)
class Regime:
    name: str
    explanation: str  # one line, for --help and `ssmcheck regimes`
    generate: Callable[..., ScanInputs]  # (shape, dtype, seed, state_dtype=torch.float32) -> ScanInputs
    min_chunks: int = 1  # chunks (full or partial) a row must span, else the case is skipped
    pad_tokens: bool = False  # the kernel gets pad tokens (seq_idx -1) between the sequences (scan.padding)

    def skip_reason(self, shape: ScanShape) -> str | None:
        if -(-shape.seqlen // shape.chunk_size) < self.min_chunks:
            bound = (self.min_chunks - 1) * shape.chunk_size
            return (
                f"regime {self.name} needs at least {self.min_chunks} chunks per row "
                f"(seqlen > {self.min_chunks - 1} x chunk_size = {bound})"
            )
        return None


# ---------------------------------------------------------------------------- building blocks


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _uniform(g: torch.Generator, shape, lo: float, hi: float) -> torch.Tensor:
    return torch.rand(shape, generator=g) * (hi - lo) + lo


def _normal(g: torch.Generator, shape) -> torch.Tensor:
    return torch.randn(shape, generator=g)


def _integers(g: torch.Generator, shape, lo: int, hi: int) -> torch.Tensor:
    """Integers in [lo, hi] as float32 (exact in fp16 and bf16 for |v| <= 256)."""
    return torch.randint(lo, hi + 1, shape if isinstance(shape, tuple) else (shape,), generator=g).float()


def _trained_A(g: torch.Generator, nheads: int) -> torch.Tensor:
    """A = -exp(U(log 1, log 16)): the Mamba2 initialisation range."""
    return -torch.exp(_uniform(g, nheads, 0.0, math.log(16.0)))


def _inverse_softplus(v: torch.Tensor) -> torch.Tensor:
    return v + torch.log(-torch.expm1(-v))


def _trained_dt_bias(g: torch.Generator, nheads: int) -> torch.Tensor:
    """dt_bias so that softplus(raw + bias) lies around [1e-3, 0.1] (log-uniform per head) for raw dt
    of 0.5 N(0, 1)."""
    return _inverse_softplus(torch.exp(_uniform(g, nheads, math.log(1e-3), math.log(0.1))))


def _trained_dt(g: torch.Generator, rows: int, seqlen: int, nheads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(raw dt, dt_bias), as _trained_dt_bias describes them."""
    dt_bias = _trained_dt_bias(g, nheads)
    return 0.5 * _normal(g, (rows, seqlen, nheads)), dt_bias


def _unit_inputs(g: torch.Generator, shape: ScanShape, rows: int, seqlen: int) -> dict[str, torch.Tensor]:
    """x, B, C, z at unit scale, in float32 (cast to the case's dtype by `_finish`)."""
    return dict(
        x=_normal(g, (rows, seqlen, shape.nheads, shape.headdim)),
        B=_normal(g, (rows, seqlen, shape.ngroups, shape.dstate)),
        C=_normal(g, (rows, seqlen, shape.ngroups, shape.dstate)),
        z=_normal(g, (rows, seqlen, shape.nheads, shape.headdim)),
    )


def _blocked_tokens(seed: int, shape: ScanShape, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """x, B, C, z at unit scale and raw dt of 0.5 N(0, 1) (as _trained_dt's), in `dtype`, drawn in blocks
    of GENERATION_BLOCK tokens (the module docstring says why)."""
    rows, seqlen = shape.batch, shape.seqlen
    tokens = {}
    for block, t0 in enumerate(range(0, seqlen, GENERATION_BLOCK)):
        g = _generator(case_seed(seed, {"token_block": block}))
        # A whole block is drawn even where the sequence ends in it, so its tokens are a longer case's.
        drawn = _unit_inputs(g, shape, rows, GENERATION_BLOCK)
        drawn["dt"] = 0.5 * _normal(g, (rows, GENERATION_BLOCK, shape.nheads))
        n = min(GENERATION_BLOCK, seqlen - t0)
        for name, value in drawn.items():
            if name not in tokens:
                tokens[name] = torch.empty(rows, seqlen, *value.shape[2:], dtype=dtype)
            tokens[name][:, t0 : t0 + n] = value[:, :n]
    return tokens


def _ragged_cu_seqlens(g: torch.Generator, nseq: int, total: int, chunk_size: int) -> torch.Tensor:
    """Boundaries of `nseq` sequences packed into `total` tokens, falling mid-chunk.

    One sequence: the lone sequence [0, total]. Two or more: the first sequence
    has length 1, and with three or more so does the last (or, where that boundary
    would fall on a chunk boundary, the second); the other boundaries are drawn at
    random, avoiding multiples of chunk_size where there is room.
    """
    if nseq == 1:
        return torch.tensor([0, total], dtype=torch.int32)
    fixed = [1] if nseq == 2 else [1, total - 1 if (total - 1) % chunk_size else 2]
    candidates = [c for c in range(2, total - 1) if c not in fixed]
    mid_chunk = [c for c in candidates if c % chunk_size]
    pool = mid_chunk if len(mid_chunk) >= nseq - 1 - len(fixed) else candidates
    picks = torch.randperm(len(pool), generator=g)[: nseq - 1 - len(fixed)].tolist()
    cuts = sorted(fixed + [pool[i] for i in picks])
    return torch.tensor([0, *cuts, total], dtype=torch.int32)


def _aligned_cu_seqlens(g: torch.Generator, nseq: int, total: int, chunk_size: int) -> torch.Tensor:
    """Boundaries of `nseq` sequences packed into `total` tokens, on chunk boundaries.

    Every boundary is a multiple of chunk_size, drawn at random among them, where there are enough of
    them; the rest fall mid-chunk. A sequence then starts exactly where a chunk does: its state must come
    from nothing, not from the sequence before, with no token of the chunk left to show the change.
    """
    if nseq == 1:
        return torch.tensor([0, total], dtype=torch.int32)
    multiples = list(range(chunk_size, total, chunk_size))
    aligned = [multiples[i] for i in torch.randperm(len(multiples), generator=g)[: nseq - 1].tolist()]
    others = [c for c in range(1, total) if c % chunk_size]
    extra = [others[i] for i in torch.randperm(len(others), generator=g)[: nseq - 1 - len(aligned)].tolist()]
    return torch.tensor([0, *sorted(aligned + extra), total], dtype=torch.int32)


def _finish(dtype: torch.dtype, note: str, **tensors) -> ScanInputs:
    """Cast the activations to the case's dtype; A, D, dt_bias and initial states are float32,
    cu_seqlens int32."""
    activations = {"x", "dt", "B", "C", "z"}
    cast = {}
    for name, value in tensors.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            value = (value.to(dtype) if name in activations else value.float()).contiguous()
        cast[name] = value
    return ScanInputs(note=note, **cast)


# `_gate_tails`: the fraction of a case's gate elements drawn far into silu's upper tail, and their range. Past fp16's
# exp overflow (11.09) and, above 88.7, past fp32's: silu taken as z * exp(z) / (1 + exp(z)) is inf / inf = NaN
# there, and one whose exp runs in half precision is NaN from 11.09 on, where z * sigmoid(z) is z.
# Half, not a few: a gate of 12..100 at one or two of a case's outputs weights the norm-wise error toward them (drift's
# `gate-without-d` draws its tails from these too: drift.regimes).
GATE_TAIL_FRACTION = 1 / 2
GATE_TAIL = (12.0, 100.0)
# `_c_apart`: the columns past a token's C in each row of the buffer C is a view into, NaN (and drift.lockstep's past
# a batch row's C). 16: C's stride keeps its divisibility by 16, so a case compiles the Triton variants it compiled
# with C contiguous (8 made 20-odd more).
C_ROW_PAD = 16


def _gate_tails(inputs: ScanInputs, seed: int) -> ScanInputs:
    """`inputs` with GATE_TAIL_FRACTION of the gate's elements set to GATE_TAIL values, from a generator of their own
    (the other draws are the regime's without them)."""
    g = _generator(case_seed(seed, {"gate": "tails"}))
    z = inputs.z.float()
    tail = torch.rand(z.shape, generator=g) < GATE_TAIL_FRACTION
    z = torch.where(tail, _uniform(g, z.shape, *GATE_TAIL), z)
    return replace(inputs, z=z.to(inputs.z.dtype),
                   note=f"{inputs.note}; {int(tail.sum())} gate values {GATE_TAIL[0]:g}..{GATE_TAIL[1]:g} (silu's tail)")


def _c_apart(inputs: ScanInputs) -> ScanInputs:
    """`inputs` with C a view into a buffer of its own whose token rows end in C_ROW_PAD NaN columns, where B is
    contiguous: the one layout in which C's strides differ from B's (every caller that splits B and C from one buffer
    passes them alike), so a kernel that reads C with B's strides reads other tokens' C and NaN."""
    C = inputs.C
    width = C.shape[-2] * C.shape[-1]
    buffer = torch.full((*C.shape[:-2], width + C_ROW_PAD), float("nan"), dtype=C.dtype)
    return replace(inputs, C=_placed_in_columns(buffer, {"C": C})["C"],
                   note=f"{inputs.note}; C a view into a buffer of {width + C_ROW_PAD} elements a token ({C_ROW_PAD} "
                        "NaN past C's), B contiguous")


def _lengths_note(cu: torch.Tensor) -> str:
    lengths = (cu[1:] - cu[:-1]).tolist()
    shown = ", ".join(map(str, lengths[:8])) + (", ..." if len(lengths) > 8 else "")
    return f"varlen: {len(lengths)} sequence{'s' if len(lengths) > 1 else ''} of {shown} tokens"


# ---------------------------------------------------------------------------- the regimes


def normal(shape: ScanShape, dtype: torch.dtype, seed: int, state_dtype: torch.dtype = torch.float32) -> ScanInputs:
    g = _generator(seed)
    return _finish(
        dtype, "batch rows, trained-model ranges, D per head, z gate", dt_bias=_trained_dt_bias(g, shape.nheads),
        A=_trained_A(g, shape.nheads), D=_normal(g, shape.nheads), dt_softplus=True,
        **_blocked_tokens(seed, shape, dtype),
    )


def _varlen(shape: ScanShape, dtype: torch.dtype, seed: int, with_initial_states: bool,
            boundaries=_ragged_cu_seqlens, gated: bool = False, dt_limit=NO_DT_LIMIT,
            processed_dt: bool = False, dt_centres: tuple[float, float] | None = None,
            linear_softplus: float = 0.0, bare: bool = False, head_d: bool = False) -> ScanInputs:
    """Packed sequences: with an initial state each and D per head and a gate z, or else with D per channel (per
    head where `head_d`) and no gate but where `gated` (a per-channel D under a gate: y = (C·h + D·x) * silu(z), D·x
    per channel).
    `processed_dt`: dt passed as softplus(raw + dt_bias) already, with no dt_bias and dt_softplus False (the same
    draws), as a caller that applies the softplus itself passes it. `dt_centres`: the range of the heads' dt centres
    (dt_bias drawn for them), instead of the trained range, so that a dt_limit clamps every head as `long`'s does.
    `linear_softplus`: the fraction of (token, head) whose raw dt + dt_bias is set to 21..40, where softplus is the
    identity (kernels take its linear branch past 20), drawn last. `bare`: no D and no dt_bias, the bias folded into
    the raw dt (the same softplus(dt) as with it) and the gate z kept."""
    g = _generator(seed)
    total = shape.batch * shape.seqlen
    cu = boundaries(g, shape.batch, total, shape.chunk_size)
    u = _unit_inputs(g, shape, 1, total)
    dt, dt_bias = _trained_dt(g, 1, total, shape.nheads)
    if dt_centres is not None:
        dt_bias = _inverse_softplus(torch.exp(_uniform(g, shape.nheads, *(math.log(c) for c in dt_centres))))
    if processed_dt:
        dt, dt_bias = torch.nn.functional.softplus(dt.double() + dt_bias.double()).float(), None
    elif bare:
        dt, dt_bias = dt + dt_bias, None
    extra = {}
    if with_initial_states:
        extra["initial_states"] = _normal(g, (shape.batch, shape.nheads, shape.headdim, shape.dstate))
        extra["D"] = _normal(g, shape.nheads)
    else:
        extra["D"] = _normal(g, shape.nheads if head_d else (shape.nheads, shape.headdim))
        if not gated:
            u.pop("z")
    if bare:  # D drawn all the same, so that the draws after it (A, the linear branch's) are those without `bare`
        extra.pop("D")
    note = _lengths_note(cu) + (", each with an initial state" if with_initial_states else "")
    note += ", D per channel under a gate z" if gated else ""
    note += ", D per head and no gate" if head_d else ""
    note += f", dt clamped to {dt_limit}" if dt_limit != NO_DT_LIMIT else ""
    note += ", dt processed (softplus applied, no dt_bias)" if processed_dt else ""
    note += ", a gate z, no D and no dt_bias (softplus of the raw dt)" if bare else ""
    A = _trained_A(g, shape.nheads)
    if linear_softplus:
        linear = torch.rand(dt.shape, generator=g) < linear_softplus
        dt = torch.where(linear, _uniform(g, dt.shape, 21.0, 40.0) - dt_bias, dt)
        note += f", raw dt + dt_bias 21..40 (softplus's linear branch) at {int(linear.sum())} (token, head)"
    return _finish(
        dtype, note, dt=dt, dt_bias=dt_bias, A=A, cu_seqlens=cu, dt_softplus=not processed_dt, dt_limit=dt_limit,
        **u, **extra,
    )


def ragged(shape: ScanShape, dtype: torch.dtype, seed: int, state_dtype: torch.dtype = torch.float32) -> ScanInputs:
    """Packed sequences of uneven lengths, their dt limited above only (RAGGED_DT_LIMIT: no lower end, as a
    model's time_step_limit (0, max) is), which clamps 1% to half of a case's tokens (those of its heads with the
    largest dt): a kernel that applies a dt_limit only when its lower end is above 0 fails here. And 2% of (token,
    head) take softplus's linear branch (raw dt + dt_bias 21..40), clamped to the limit's 0.02 there too: a kernel
    that clamps only what its softplus's other branch computed takes dt 21..40 at those tokens (since the fifty-first
    session). C is a view into a buffer of its own, its token stride past B's (`_c_apart`: a varlen path that reads C
    with B's strides fails here; since the sixty-fifth session). Its cu_seqlens and seq_idx are int64 (`_wide_indices`),
    every other regime's int32."""
    return _wide_indices(_c_apart(_varlen(shape, dtype, seed, with_initial_states=False, dt_limit=RAGGED_DT_LIMIT,
                                          linear_softplus=0.02)))


def _wide_indices(inputs: ScanInputs) -> ScanInputs:
    """`inputs` with cu_seqlens (and so seq_idx) int64, as torch.cumsum gives them: a kernel that reads its indices
    as int32 whatever their dtype takes every other word for a boundary here, where engines' int32 hide it. One that
    refuses int64 is run on int32 (scan.run), as engines call it."""
    return replace(inputs, cu_seqlens=inputs.cu_seqlens.to(torch.int64),
                   note=inputs.note + ", cu_seqlens and seq_idx int64")


def aligned(shape: ScanShape, dtype: torch.dtype, seed: int, state_dtype: torch.dtype = torch.float32) -> ScanInputs:
    """Packed sequences starting where chunks do, D per channel under a gate z, and dt processed already
    (softplus applied, no dt_bias): the one varlen regime with dt_softplus False, so a kernel whose varlen path
    applies the softplus (or dt_bias) whatever it is told fails here. Clamped below only, dt_limit (0.008, inf),
    with long's dt centres (every head has tokens below it): the one dt_limit without an upper end, so a kernel
    that clamps only where the upper end is finite, or only in its softplus's branch, fails here (since the
    fifty-second session)."""
    return _varlen(shape, dtype, seed, with_initial_states=False, boundaries=_aligned_cu_seqlens, gated=True,
                   processed_dt=True, dt_limit=ALIGNED_DT_LIMIT, dt_centres=LONG_DT_CENTRES)


def aligned_initial_state(shape: ScanShape, dtype: torch.dtype, seed: int,
                          state_dtype: torch.dtype = torch.float32) -> ScanInputs:
    """aligned's boundaries, each sequence from an initial state: where a sequence starts a chunk, its state is
    its initial state (a path of its own in kernels: the chunk loads it instead of starting from zero). The initial
    states are one layer's slice of a state cache, as `long`'s: the one packed regime whose initial states are not
    contiguous, so a varlen launcher that takes their strides from their shape reads another layer's states."""
    inputs = _varlen(shape, dtype, seed, with_initial_states=True, boundaries=_aligned_cu_seqlens)
    # The other layers' states from a generator of their own: the draws above are the regime's before it had them.
    states = inputs.initial_states
    cache = _normal(_generator(case_seed(seed, {"cache": CACHE_LAYERS})), (states.shape[0], CACHE_LAYERS,
                                                                          *states.shape[1:]))
    cache[:, CACHE_LAYERS - 1] = states
    return replace(inputs, initial_states=cache[:, CACHE_LAYERS - 1],
                   note=f"{inputs.note}; initial states one layer's slice of a {CACHE_LAYERS}-layer state cache")


def _padded(inputs: ScanInputs, shape: ScanShape, seed: int) -> ScanInputs:
    """Packed `inputs`, each sequence followed by 1..chunk_size pad tokens in the kernel's call (scan.padding)."""
    pads = torch.randint(1, shape.chunk_size + 1, (shape.batch,), generator=_generator(seed + 1))
    shown = ", ".join(map(str, pads.tolist()[:8])) + (", ..." if shape.batch > 8 else "")
    return replace(inputs, pad_after=pads, note=f"{inputs.note}; each followed by {shown} pad tokens (seq_idx -1)")


def padded(shape: ScanShape, dtype: torch.dtype, seed: int, state_dtype: torch.dtype = torch.float32) -> ScanInputs:
    """ragged's sequences, each followed by 1..chunk_size pad tokens in the kernel's call (scan.padding), with D per
    head and no gate z: the call vLLM's Mamba2 mixer makes (its gated norm runs after the scan), the one varlen
    regime with a per-head D and no gate (since the sixty-third session; D per channel before), so a varlen path of
    its own for that call (an epilogue without the gate reading D without its head's offset) fails here."""
    return _padded(_varlen(shape, dtype, seed, with_initial_states=False, head_d=True), shape, seed)


def padded_initial_state(shape: ScanShape, dtype: torch.dtype, seed: int,
                         state_dtype: torch.dtype = torch.float32) -> ScanInputs:
    """initial-state's sequences, each from its initial state, each followed by pad tokens: a padded batch of
    chunked-prefill continuations, where a kernel's pad-aware path (the one taken where seq_idx holds -1) must
    still start every sequence from its initial state."""
    return _padded(_varlen(shape, dtype, seed, with_initial_states=True), shape, seed)


def initial_state(shape: ScanShape, dtype: torch.dtype, seed: int, state_dtype: torch.dtype = torch.float32) -> ScanInputs:
    """Packed sequences from initial states, with long's two-sided dt_limit and dt centres (both ends clamp tokens of
    every head): the one packed regime whose dt_limit has a lower end above 0, so a varlen path that clamps above
    only, or decays an initial state by dt before its clamp, fails here. A gate z with no D, and a softplus with no
    dt_bias (its bias folded into the raw dt): the one varlen regime with either (since the fifty-ninth session; D per
    head and a dt_bias before), so a varlen path that gates only along with its skip term, or takes the softplus
    only along with a bias, fails here. Half the gate's values lie in silu's upper tail, 12..100
    (`_gate_tails`: a silu through exp(z) / (1 + exp(z)) is NaN there; since the sixty-fifth session)."""
    return _gate_tails(_varlen(shape, dtype, seed, with_initial_states=True, dt_limit=LONG_DT_LIMIT,
                               dt_centres=LONG_DT_CENTRES, bare=True), seed)


def decay_extreme(shape: ScanShape, dtype: torch.dtype, seed: int, state_dtype: torch.dtype = torch.float32) -> ScanInputs:
    """|dt*A| per token is 0 or 2**e..4*2**e with e in [8, 20]: cumsums of 1e3..1e9, all exact in fp32.

    The step's dt (0..4, integers) is passed as dt - 1 with a dt_bias of 1, no softplus and no dt_limit: exact in
    every dtype, so the zero-dt tokens' dt + dt_bias is exactly 0. The one batch-mode regime with a bias and
    neither a softplus nor a dt_limit: a kernel that adds dt_bias only where it processes dt further takes dt - 1,
    and a zero-dt token's decay exp(|A|) overflows.

    D per channel and no gate (Mamba2 with D_has_hdim, its gated RMSNorm outside the scan): the one batch-mode regime
    with both, so a batch-mode path that reads a per-channel D as per head where no z is passed fails here (since the
    fifty-second session; D per head before)."""
    g = _generator(seed)
    rows, seqlen, nheads = shape.batch, shape.seqlen, shape.nheads
    u = _unit_inputs(g, shape, rows, seqlen)
    u.pop("z")
    exponents = torch.linspace(8, 20, nheads).round() if nheads > 1 else _integers(g, 1, 8, 20)
    A = -torch.exp2(exponents[torch.randperm(nheads, generator=g)])
    dt = _integers(g, (rows, seqlen, nheads), 1, 4)
    dt[torch.rand((rows, seqlen, nheads), generator=g) < 0.25] = 0.0  # scattered zero-dt tokens
    padding = torch.randint(0, seqlen // 4 + 1, (rows,), generator=g)
    for row, n in enumerate(padding.tolist()):  # trailing padding: exact-zero dt, as padded batches have
        if n:
            dt[row, seqlen - n:] = 0.0
    return _finish(
        dtype, f"|A| = 2**e, e in 8..20; zero-dt padding of {padding.tolist()} tokens per row; dt passed as dt - 1 "
        "with a dt_bias of 1, no softplus; D per channel, no gate", dt=dt - 1.0, dt_bias=torch.ones(nheads), A=A,
        D=_normal(g, (nheads, shape.headdim)),
        dt_softplus=False, **u,
    )


def dt_extreme(shape: ScanShape, dtype: torch.dtype, seed: int, state_dtype: torch.dtype = torch.float32) -> ScanInputs:
    """Raw dt of 21..100 (softplus is the identity there; past 88.7 an exp in fp32 overflows, so a softplus without
    its linear branch is inf) or -40..-23 (dt ~ 1e-10..1e-18), integers (exact in fp16 and bf16); in every other
    head (1, 3, ...) 12..20 instead of 21..100: below the threshold, where softplus is still log1p(exp(dt)) and an
    exp taken in fp16 is inf (past 11.09), though every input is finite in fp16.

    With A in -1..-16 (powers of two) a large dt gives an exact integer log-decay,
    and a whole chunk of tiny ones sums to under half an ulp of any nonzero
    integer partial sum, so every partial sum of the cumsum rounds to the exact
    integer whatever the order of additions. The heads of 12..20 take A = -2**-5 or -2**-6 instead: softplus's
    result there is no integer, so their log-decays (0.19..0.63 a token) are moderate, as in `normal`, and their
    cumulative sums (a few units a chunk) round as little as `normal`'s; a huge cumulative sum of inexact terms
    would make a decay across tiny-dt tokens depend on the order of the additions (cumsum-cancel's subject).

    A gate z and no D: the one regime where y is C·h gated alone, so a kernel that gates only along with D·x
    (or takes D as given) fails here.
    """
    g = _generator(seed)
    rows, seqlen, nheads = shape.batch, shape.seqlen, shape.nheads
    u = _unit_inputs(g, shape, rows, seqlen)
    large = torch.rand((rows, seqlen, nheads), generator=g) < 0.5
    dt = torch.where(large, _integers(g, (rows, seqlen, nheads), 21, 100),
                     -_integers(g, (rows, seqlen, nheads), 23, 40))
    A = -torch.exp2(_integers(g, nheads, 0, 4))
    # Drawn after the rest, so that the other heads' inputs are those of the regime before it had these.
    below_threshold = torch.arange(nheads) % 2 == 1
    dt = torch.where(below_threshold & large, _integers(g, (rows, seqlen, nheads), 12, 20), dt)
    A = torch.where(below_threshold, -torch.exp2(-_integers(g, nheads, 5, 6)), A)
    return _finish(
        dtype, "raw dt = 21..100 (heads 1, 3, ...: 12..20, A = -2**-5 or -2**-6) or -40..-23 through softplus, "
        "A in -1..-16, a gate z and no D", dt=dt, A=A, dt_softplus=True, **u,
    )


def _packed(inputs: ScanInputs) -> ScanInputs:
    """`inputs`' batch rows as packed sequences of one row, each from zero (cu_seqlens at the rows' ends): the same
    values on a kernel's varlen path."""
    rows, seqlen = inputs.x.shape[:2]

    def flat(t):
        return None if t is None else t.reshape(1, rows * seqlen, *t.shape[2:])

    return replace(inputs, x=flat(inputs.x), dt=flat(inputs.dt), B=flat(inputs.B), C=flat(inputs.C), z=flat(inputs.z),
                   cu_seqlens=torch.arange(rows + 1, dtype=torch.int32) * seqlen,
                   note=f"{inputs.note}; its {rows} rows packed as sequences of one row")


def decay_extreme_packed(shape: ScanShape, dtype: torch.dtype, seed: int,
                         state_dtype: torch.dtype = torch.float32) -> ScanInputs:
    """decay-extreme's rows packed as sequences (`_packed`): its huge cumulative log-decays on the varlen path, where
    a path of its own that masks a decay after its exp (inf * 0), or takes exp(cum_i) * exp(-cum_j), is non-finite."""
    return _packed(decay_extreme(shape, dtype, seed, state_dtype))


def dt_extreme_packed(shape: ScanShape, dtype: torch.dtype, seed: int,
                      state_dtype: torch.dtype = torch.float32) -> ScanInputs:
    """dt-extreme's rows packed as sequences (`_packed`): its raw dt past softplus's threshold and past fp16's and
    fp32's exp overflow on the varlen path, where a softplus of its own without the linear branch is inf."""
    return _packed(dt_extreme(shape, dtype, seed, state_dtype))


def cumsum_cancel(shape: ScanShape, dtype: torch.dtype, seed: int, state_dtype: torch.dtype = torch.float32) -> ScanInputs:
    """Runs of zero-dt tokens between tokens whose log-decay |A|*dt is 1e5..1e7 and not dyadic.

    Within a chunk the cumulative log-decay reaches ~1e9, where an fp32 sum rounds by tens to
    hundreds, while every decay across a zero-dt run is exactly exp(0) = 1 and every decay across
    a nonzero token is exp(-1e5) = 0. A kernel that takes decays as differences of cumulative sums
    must therefore get equal sums on both sides of a zero-dt run: an order that adds the same
    terms in another association (a tree-order fp32 scan) makes the difference tens of units
    positive or negative, and exp() of it overflows or vanishes (vLLM #37501).
    """
    g = _generator(seed)
    rows, seqlen, nheads = shape.batch, shape.seqlen, shape.nheads
    u = _unit_inputs(g, shape, rows, seqlen)
    u.pop("z")
    A = -torch.exp(_uniform(g, nheads, math.log(1e4), math.log(1e5)))
    # Half the tokens carry dt in [10, 100]; the rest are zero-dt runs, as padding produces them.
    dt = torch.where(torch.rand((rows, seqlen, nheads), generator=g) < 0.5,
                     _uniform(g, (rows, seqlen, nheads), 10.0, 100.0), torch.zeros(rows, seqlen, nheads))
    # dt * x is the update's size: keep it near unit scale whatever dt is.
    u["x"] = u["x"] / torch.where(dt > 0, dt, 1.0)[..., None]
    return _finish(
        dtype, "|A|*dt of 1e5..1e7 (non-dyadic) between zero-dt runs: cumulative log-decays ~1e9 per chunk",
        dt=dt, A=A, D=_normal(g, nheads), dt_softplus=False, **u,
    )


LARGE_MAGNITUDE_DT_LIMIT = (0.0175, 0.0325)
RAGGED_DT_LIMIT = (0.0, 0.02)
ALIGNED_DT_LIMIT = (0.008, math.inf)


def large_magnitude(shape: ScanShape, dtype: torch.dtype, seed: int, state_dtype: torch.dtype = torch.float32) -> ScanInputs:
    """Positive x, B, C with slow decay, so states grow; x scaled so y and the states reach 1/64 of the format's max.
    C is a view into a buffer of its own, its token stride past B's (`_c_apart`: a batch-mode path that reads C with
    B's strides fails here; since the sixty-fifth session; large-output's scaled C is contiguous)."""
    g = _generator(seed)
    rows, seqlen, nheads = shape.batch, shape.seqlen, shape.nheads
    positive = {
        "x": _uniform(g, (rows, seqlen, nheads, shape.headdim), 0.5, 1.5),
        "B": _uniform(g, (rows, seqlen, shape.ngroups, shape.dstate), 0.5, 1.5),
        "C": _uniform(g, (rows, seqlen, shape.ngroups, shape.dstate), 0.5, 1.5),
    }
    # The step's dt is dt + dt_bias with no softplus, each about half of it (the only scan regime that passes a
    # bias without a softplus: a kernel that adds dt_bias only along with its softplus takes a dt half too small).
    # Clamped to LARGE_MAGNITUDE_DT_LIMIT: with a bias of 0.005..0.0125 the lower end clamps tokens of the head, with
    # one of 0.0075..0.025 the upper end (the only dt_limit of the scan regimes without a softplus).
    dt = _uniform(g, (rows, seqlen, nheads), 0.005, 0.025)
    dt_bias = _uniform(g, nheads, 0.005, 0.025)
    A = -torch.exp(_uniform(g, nheads, math.log(1e-3), math.log(1e-2)))
    D = _uniform(g, nheads, 0.0, 1.0)
    unit = _finish(dtype, "", dt=dt, dt_bias=dt_bias, dt_limit=LARGE_MAGNITUDE_DT_LIMIT, A=A, D=D, **positive)
    # Everything is positive and y, states are linear in x: scale x so the peak reaches the target.
    peak = _peak_magnitude(unit)
    narrowest = min(torch.finfo(dtype).max, torch.finfo(state_dtype).max)
    scale = narrowest / 64 / peak
    positive["x"] = positive["x"] * scale
    return _c_apart(_finish(
        dtype, f"x scaled by {scale:.3g}: peak |y|, |state| ~ {narrowest / 64:.3g}; dt + dt_bias, no softplus, "
        f"clamped to {LARGE_MAGNITUDE_DT_LIMIT}", dt=dt, dt_bias=dt_bias, dt_limit=LARGE_MAGNITUDE_DT_LIMIT, A=A, D=D,
        **positive,
    ))


def _peak_magnitude(inputs: ScanInputs) -> float:
    from ssmcheck.ops.chunk_scan.naive import scan_recurrent  # noqa: PLC0415 (float64 ground truth)

    ref = scan_recurrent(inputs.x, inputs.dt, inputs.A, inputs.B, inputs.C, **inputs.kwargs(), dtype=torch.float64)
    return max(float(ref.y.abs().max()), float(ref.final_states.abs().max()))


# long's dt_limit, and the range of its heads' dt centres: softplus(0.5 N(0, 1) + dt_bias) spreads a head's dt
# over about e^-1..e^1 times its centre, so in every head both limits clamp some tokens (1-20% each, for a centre
# in 0.01..0.02); a kernel that ignores the limit, or one of its ends, computes another dt there.
LONG_DT_LIMIT = (0.006, 0.03)
LONG_DT_CENTRES = (0.01, 0.02)


# The layers of the state cache `long`'s initial states are one layer's slice of.
CACHE_LAYERS = 2


def long(shape: ScanShape, dtype: torch.dtype, seed: int, state_dtype: torch.dtype = torch.float32) -> ScanInputs:
    """Batch rows continuing from initial states, read where an engine keeps them: one layer's slice of a state
    cache of CACHE_LAYERS layers (rows CACHE_LAYERS times a state apart, each state contiguous), so a kernel
    that reads initial_states with contiguous strides reads another layer's state. D per channel (Mamba2 with
    D_has_hdim), which the batch-mode path must read per channel as the varlen one does."""
    g = _generator(seed)
    centres = torch.exp(_uniform(g, shape.nheads, *(math.log(c) for c in LONG_DT_CENTRES)))
    inputs = _finish(
        dtype, f"batch rows continuing from initial states (one layer's slice of a {CACHE_LAYERS}-layer state "
               f"cache), D per channel, dt clamped to dt_limit {LONG_DT_LIMIT}",
        dt_bias=_inverse_softplus(centres), A=_trained_A(g, shape.nheads),
        D=_normal(g, (shape.nheads, shape.headdim)), dt_softplus=True, dt_limit=LONG_DT_LIMIT,
        **_blocked_tokens(seed, shape, dtype),
    )
    # Every layer's states are drawn: the other layers' are finite values a misplaced read takes.
    cache = _normal(g, (shape.batch, CACHE_LAYERS, shape.nheads, shape.headdim, shape.dstate))
    return replace(inputs, initial_states=cache[:, CACHE_LAYERS - 1])


# ---------------------------------------------------------------------------- serving layouts and ranges

# Peak |y| of large-output, in multiples of fp16's largest finite value.
OUTPUT_PAST_FP16 = 2


def in_proj_columns(shape: ScanShape) -> dict[str, int]:
    """The column blocks of one token of Mamba2's fused in_proj output, in order: z, x, B, C, dt.

    state-spaces/mamba's Mamba2 splits `zxbcdt = in_proj(u)` as [z0, x0, z, xBC, dt] (the d_mlp parts
    z0, x0 are empty in the Mamba2 models) and xBC as [x, B, C]; vLLM's MambaMixer2 splits the same
    projection the same way. Its width, 2 * nheads * headdim + 2 * ngroups * dstate + nheads, is the
    row stride every input of the strided regime carries.
    """
    d_inner = shape.nheads * shape.headdim
    groups = shape.ngroups * shape.dstate
    return {"z": d_inner, "x": d_inner, "B": groups, "C": groups, "dt": shape.nheads}


def _placed_in_columns(buffer: torch.Tensor, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each of `values` (rows, seqlen, ...) copied into the next block of `buffer`'s last axis (rows, seqlen,
    width), in order: the views, with the buffer's strides."""
    views, start = {}, 0
    for name, value in values.items():
        width = math.prod(value.shape[2:])
        view = buffer[..., start : start + width].unflatten(-1, value.shape[2:])
        view.copy_(value)
        views[name] = view
        start += width
    return views


def strided(shape: ScanShape, dtype: torch.dtype, seed: int, state_dtype: torch.dtype = torch.float32) -> ScanInputs:
    """normal's values, passed as serving engines pass them: z, x, B, C and dt are views into one
    (batch, seqlen, width) buffer laid out as Mamba2's fused in_proj output (`in_proj_columns`), so
    every token of every input is `width` elements after the previous one.

    In the models, x, B and C come out of the causal conv over the xBC columns: a conv that writes
    in place (or a fused one) leaves them in this buffer, one that does not puts them in a buffer of
    its own (`conv-output` passes them so). The in_proj buffer is the wider of the two, so its token
    offsets reach 2**31 first (README: the 2**31 offsets). dt is in the activations' dtype, as the
    projection returns it; A, D and dt_bias are parameters, contiguous.

    dt is clamped above only, dt_limit (0, max) with max the STRIDED_DT_QUANTILE of the step's dt: a model's
    time_step_limit (0, max) in batch mode, where a path that clamps only where the lower end is above 0 (taking
    (0, anything) for no limit) computes another dt for a quarter of the tokens.

    The buffer holds STRIDED_SPARE_TOKENS more tokens a row than the call's, NaN (a buffer sized for more tokens, as
    a CUDA graph's is captured for a larger batch): a row starts (seqlen + spare) tokens after the previous one, so
    a kernel that takes a row's offset as seqlen times the token stride reads the spare tokens or the previous
    row's (since the sixty-third session).
    """
    values = normal(shape, dtype, seed)
    step_dt = process_dt(values.dt, values.dt_bias, values.dt_softplus, NO_DT_LIMIT, torch.float64).flatten()
    # kthvalue, not quantile: torch.quantile refuses past 2**24 elements (--model widths at long prompts).
    upper = step_dt.kthvalue(max(1, math.ceil(STRIDED_DT_QUANTILE * step_dt.numel()))).values
    values = replace(values, dt_limit=(0.0, float(f"{float(upper):.2g}")))
    columns = in_proj_columns(shape)
    # Every column of the call's tokens is written below; the spare tokens are NaN.
    buffer = torch.full((shape.batch, shape.seqlen + STRIDED_SPARE_TOKENS, sum(columns.values())), float("nan"),
                        dtype=dtype)
    views = _placed_in_columns(buffer[:, :shape.seqlen], {name: getattr(values, name) for name in columns})
    return replace(values, **views, note=f"{values.note}; x, z, B, C, dt: views into one in_proj buffer of "
                                         f"{buffer.shape[-1]} elements per token and {buffer.shape[1]} tokens a row "
                                         f"({STRIDED_SPARE_TOKENS} spare, NaN); dt clamped to {values.dt_limit}")


# The quantile of strided's step dt that its dt_limit's upper end takes (a quarter of the tokens clamped).
STRIDED_DT_QUANTILE = 0.75
# The tokens a row of strided's buffer holds past the call's.
STRIDED_SPARE_TOKENS = 8


def conv_output(shape: ScanShape, dtype: torch.dtype, seed: int, state_dtype: torch.dtype = torch.float32) -> ScanInputs:
    """normal's values, laid out as vLLM's Mamba2 mixer hands them to its prefill scan (`_in_conv_output`)."""
    return _in_conv_output(normal(shape, dtype, seed), shape, dtype)


def conv_output_varlen(shape: ScanShape, dtype: torch.dtype, seed: int,
                       state_dtype: torch.dtype = torch.float32) -> ScanInputs:
    """Packed sequences, each from an initial state (a prefill that continues cached prefixes), D per head and a
    gate z, no dt_limit, laid out as conv-output's: the call vLLM's mixer makes, whose prefill scan is
    always varlen. A varlen path that takes an input's strides from its shape (z or x assumed contiguous) reads
    other columns here, where conv-output's batch-mode call runs another path."""
    return _in_conv_output(_varlen(shape, dtype, seed, with_initial_states=True), shape, dtype)


def _in_conv_output(values: ScanInputs, shape: ScanShape, dtype: torch.dtype) -> ScanInputs:
    """`values` laid out as vLLM's Mamba2 mixer hands them to its prefill scan: z and dt are views into the fused
    in_proj output (`in_proj_columns`), x, B and C views into the causal conv's output, which is channel-major:
    (rows, d_inner + 2 * ngroups * dstate, tokens), each channel's tokens contiguous.

    (The mixer transposes its xBC view of the in_proj output for the conv, and the conv's output is
    `torch.empty_like` of that view, which is not dense, so it comes out contiguous in the transposed shape;
    transposed back, x's token stride is 1. vLLM's and mamba_ssm's chunk scans take x with either of its
    last two axes contiguous.) So x and z have different strides, x's token stride is 1 and its channel stride
    the number of tokens, and a row of x, B and C is not seqlen times their token stride on: a kernel that reads
    one input with another's strides, takes a channel stride of 1, or derives a row's offset from seqlen fails
    here, where every other regime's inputs share their layouts. The in_proj buffer's x, B and C columns hold
    the values before the conv: here x, B and C negated, finite values a kernel reading them instead meets.
    """
    columns = in_proj_columns(shape)
    conv_names = ("x", "B", "C")
    rows, tokens = values.x.shape[:2]
    # (rows, conv channels, tokens) contiguous, seen as (rows, tokens, conv channels): token stride 1.
    conv = torch.empty((rows, sum(columns[n] for n in conv_names), tokens), dtype=dtype)
    views = _placed_in_columns(conv.transpose(1, 2), {name: getattr(values, name) for name in conv_names})
    in_proj = torch.empty((rows, tokens, sum(columns.values())), dtype=dtype)
    before_conv = {name: -getattr(values, name) if name in conv_names else getattr(values, name) for name in columns}
    views |= {name: view for name, view in _placed_in_columns(in_proj, before_conv).items() if name not in conv_names}
    return replace(values, **views, note=f"{values.note}; z, dt: views into an in_proj buffer of "
                                         f"{in_proj.shape[-1]} elements per token; x, B, C: views into a "
                                         f"channel-major conv output of {conv.shape[1]} channels (token stride 1)")


def large_output(shape: ScanShape, dtype: torch.dtype, seed: int, state_dtype: torch.dtype = torch.float32) -> ScanInputs:
    """large-magnitude's inputs at fp16's scale (y and states at 1/64 of 65504, whatever the dtypes) with C
    scaled up, so that |y| peaks at OUTPUT_PAST_FP16 times fp16's largest value while the states, which do
    not depend on C, stay where they were.

    In fp16 the float64 y lies past the format's range from some token on, while every input, the fp32
    states and the fp32 sums are finite: the judged reference is y saturated to ±65504 (the closest value
    fp16 has: core.formats.saturate), so a kernel that stores inf there is non-finite at that token, and
    one that saturates passes. In bf16 and fp32 the same y is inside the range and nothing may saturate.
    """
    from ssmcheck.ops.chunk_scan.naive import scan_recurrent  # noqa: PLC0415 (float64 ground truth)

    inputs = large_magnitude(shape, dtype, seed, state_dtype=torch.float16)
    ref = scan_recurrent(inputs.x, inputs.dt, inputs.A, inputs.B, inputs.C, **inputs.kwargs(), dtype=torch.float64)
    # y = C·h + D·x with everything positive: C·h, the larger part, scales with C.
    target = OUTPUT_PAST_FP16 * torch.finfo(torch.float16).max
    scale = target / float(ref.y_ssm.abs().max())
    return replace(inputs, C=(inputs.C.double() * scale).to(dtype),
                   note=f"{inputs.note}; C scaled by {scale:.3g}: peak |y| ~ {target:.3g}, past fp16's 65504")


REGIMES: dict[str, Regime] = {
    r.name: r
    for r in (
        Regime("normal", "trained-model ranges: A = -exp(U(log 1, log 16)), dt in [1e-3, 0.1] via dt_bias "
               "and softplus, unit-scale x/B/C, D and z", normal),
        Regime("ragged", "varlen: batch sequences packed in one row, boundaries mid-chunk, length-1 "
               "sequences (batch 1: a lone sequence); dt limited above only, dt_limit (0, 0.02), also where 2% of "
               "raw dt + dt_bias lie past softplus's threshold of 20; C's token stride past B's (C a view); cu_seqlens and "
               "seq_idx int64 (int32 for a kernel that refuses them)", ragged),
        Regime("aligned", "varlen: ragged's packing with every sequence boundary on a chunk boundary, so a "
               "sequence starts where a chunk does (batch 1: a lone sequence); D per channel under a gate z; dt "
               "passed processed (softplus applied, no dt_bias, dt_softplus False), clamped below only, dt_limit "
               "(0.008, inf)", aligned),
        Regime("padded", "ragged's packed sequences with pad tokens (seq_idx -1) after each, as a serving "
               "engine's packed batch has them: they must change no state (kernels that take them)", padded,
               pad_tokens=True),
        Regime("padded-initial-state", "padded's pad tokens after initial-state's sequences, each from its initial "
               "state: chunked-prefill continuations in a padded batch (kernels that take pad tokens)",
               padded_initial_state, pad_tokens=True),
        Regime("initial-state", "varlen with a nonzero initial state per sequence, starting mid-chunk "
               "(batch 1: a lone sequence); dt_limit (0.006, 0.03), both ends clamping tokens of every head; a gate "
               "z without D, half of it 12..100 (silu's tail), a softplus without dt_bias", initial_state),
        Regime("aligned-initial-state", "aligned's packing (every sequence starts a chunk) with a nonzero initial "
               "state per sequence, read from one layer's slice of a state cache (not contiguous)",
               aligned_initial_state),
        Regime("decay-extreme", "|A|*dt of 2**8..2**22 per token, within-chunk cumulative log-decay reaching "
               "1e4..1e9, exact-zero dt padding; dt passed as dt - 1 with a dt_bias of 1, no softplus, no dt_limit; D per "
               "channel, no gate", decay_extreme),
        Regime("dt-extreme", "raw dt of 21..100, past softplus's linear threshold (20) and fp32's exp overflow "
               "(88.7), in every other head 12..20, under the threshold but past fp16's exp overflow (11.09), or "
               "-40..-23, very negative (dt ~ 1e-10..1e-18); a gate z and no D", dt_extreme),
        Regime("decay-extreme-packed", "decay-extreme's rows packed as sequences of one row (cu_seqlens): its "
               "cumulative log-decays of 1e4..1e9 on a kernel's varlen path", decay_extreme_packed),
        Regime("dt-extreme-packed", "dt-extreme's rows packed as sequences of one row (cu_seqlens): its raw dt "
               "past softplus's threshold and exp's overflow on a kernel's varlen path", dt_extreme_packed),
        Regime("cumsum-cancel", "|A|*dt of 1e5..1e7 (non-dyadic) between runs of zero-dt tokens: "
               "cumulative log-decays near 1e9, where fp32 rounds by tens, yet every decay across a "
               "zero-dt run is exactly 1", cumsum_cancel),
        Regime("large-magnitude", "positive x/B/C, slow decay and growing states, scaled so y and "
               "the states reach 1/64 of the format's largest value; dt + dt_bias with no softplus, with dt_limit; "
               "C's token stride past B's (C a view)", large_magnitude),
        Regime("long", "at least 8 chunks of state passing, continuing from initial states read from one layer's "
               "slice of a state cache (rows not contiguous), D per channel, with a dt_limit both of whose ends "
               "clamp tokens of every head", long, min_chunks=8),
        Regime("continuation", "long's batch rows from initial states at any length, down to under one chunk (a "
               "chunked prefill's next few tokens a row): a batch-mode path for short rows that never loads the "
               "initial states fails here", long),
        Regime("strided", "normal's values as serving passes them: x, z, B, C, dt are strided views into one "
               "fused in_proj buffer ([z | x | B | C | dt] per token, --model widths); dt_limit (0, max) clamping a "
               "quarter of the tokens", strided),
        Regime("conv-output", "normal's values as vLLM's mixer passes them: z, dt views into the in_proj buffer, "
               "x, B, C views into the causal conv's channel-major output (token stride 1, channel stride seqlen)",
               conv_output),
        Regime("conv-output-varlen", "packed sequences from initial states laid out as conv-output's (vLLM's prefill "
               "call, always varlen): z, dt views into the in_proj buffer, x, B, C into the channel-major conv output",
               conv_output_varlen),
        Regime("large-output", "large-magnitude's growing states with C scaled so |y| peaks at 2x fp16's largest "
               "value: fp16 y is judged saturated to 65504, and inf there is non-finite", large_output),
    )
}
