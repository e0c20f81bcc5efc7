"""The float64 references agree with each other and with plain loops; the baseline's error is the dtype's."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ssmcheck.ops.chunk_scan import naive
from ssmcheck.ops.chunk_scan.baseline import scan_baseline
from ssmcheck.ops.chunk_scan.naive import RecurrentStream, scan_chunked, scan_recurrent

UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def make_case(seed, batch=1, seqlen=12, nheads=2, headdim=3, dstate=4, ngroups=1, *, D="head", z=True,
              dt_bias=True, dt_softplus=True, init=False, nstates=None, dtype=torch.float64):
    """Normal-regime inputs (DESIGN §4) from a recorded seed: positional args and keywords for the scans.

    dt ends in about [1e-3, 0.1] after dt_bias (and softplus when asked).
    """
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    A = -torch.exp(torch.empty(nheads, dtype=torch.float64).uniform_(0.0, math.log(16), generator=g))
    dt_target = torch.exp(torch.empty(nheads, dtype=torch.float64).uniform_(math.log(1e-3), math.log(0.1), generator=g))
    dt_raw = 0.5 * randn(batch, seqlen, nheads) if dt_softplus else 1e-3 * randn(batch, seqlen, nheads).abs()
    args = dict(
        x=randn(batch, seqlen, nheads, headdim).to(dtype),
        dt=dt_raw.to(dtype),
        A=A,
        B=randn(batch, seqlen, ngroups, dstate).to(dtype),
        C=randn(batch, seqlen, ngroups, dstate).to(dtype),
    )
    kw = dict(dt_softplus=dt_softplus)
    if dt_bias:
        kw["dt_bias"] = dt_target + torch.log(-torch.expm1(-dt_target)) if dt_softplus else dt_target
    if D == "head":
        kw["D"] = randn(nheads)
    elif D == "channel":
        kw["D"] = randn(nheads, headdim)
    if z:
        kw["z"] = randn(batch, seqlen, nheads, headdim).to(dtype)
    if init:
        kw["initial_states"] = randn(nstates or batch, nheads, headdim, dstate)
    return args, kw


def hand_loop(x, dt, A, B, C, D, z, dt_bias, init, dt_limit):
    """Batch 1, plain Python floats: the recurrence of DESIGN §2 written out by hand."""
    _, L, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    y = [[[0.0] * P for _ in range(H)] for _ in range(L)]
    final = []
    for h in range(H):
        g = h // (H // G)
        state = [[float(init[0, h, p, n]) for n in range(N)] for p in range(P)]
        for t in range(L):
            v = float(dt[0, t, h]) + float(dt_bias[h])
            d = math.log1p(math.exp(v)) if v < 30 else v
            d = min(max(d, dt_limit[0]), dt_limit[1])
            a = math.exp(d * float(A[h]))
            for p in range(P):
                xv = float(x[0, t, h, p])
                acc = 0.0
                for n in range(N):
                    state[p][n] = a * state[p][n] + d * xv * float(B[0, t, g, n])
                    acc += float(C[0, t, g, n]) * state[p][n]
                out = acc + float(D[h, p]) * xv
                zv = float(z[0, t, h, p])
                y[t][h][p] = out * zv / (1.0 + math.exp(-zv))
        final.append(state)
    return torch.tensor([y], dtype=torch.float64), torch.tensor([final], dtype=torch.float64)


def test_recurrent_matches_hand_written_loop():
    args, kw = make_case(11, seqlen=9, nheads=4, headdim=2, dstate=3, ngroups=2, D="channel", init=True)
    dt_limit = (0.002, 0.05)
    out = scan_recurrent(**args, **kw, dt_limit=dt_limit)
    y, final = hand_loop(**args, D=kw["D"], z=kw["z"], dt_bias=kw["dt_bias"], init=kw["initial_states"],
                         dt_limit=dt_limit)
    assert out.y.dtype == torch.float64 and out.varlen_states is None
    assert rel(out.y, y) < 1e-14
    assert rel(out.final_states, final) < 1e-14


def test_varlen_restarts_each_sequence_from_its_initial_state():
    """A varlen row equals each sequence scanned on its own (batch mode) with its initial state."""
    cu = [0, 1, 6, 6, 13, 20]
    args, kw = make_case(12, seqlen=cu[-1], init=True, nstates=len(cu) - 1)
    out = scan_recurrent(**args, **kw, cu_seqlens=torch.tensor(cu))
    for s, (b, e) in enumerate(zip(cu, cu[1:])):
        piece = {k: (v[:, b:e] if k != "A" else v) for k, v in args.items()}
        own = {**kw, "z": kw["z"][:, b:e], "initial_states": kw["initial_states"][s : s + 1]}
        alone = scan_recurrent(**piece, **own)
        assert torch.equal(out.y[:, b:e], alone.y)
        assert torch.equal(out.varlen_states[s], alone.final_states[0])
    assert torch.equal(out.final_states[0], out.varlen_states[-1])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), cuts=st.lists(st.integers(0, 90), max_size=4), seqlen=st.integers(1, 90),
       extreme=st.booleans())
def test_recurrence_in_groups_matches_the_hand_written_loop(seed, cuts, seqlen, extreme):
    """The token groups of the recurrent reference (naive._recur) against the recurrence written out token by
    token, over sequences of any length (so groups whole and partial, starts anywhere in a group); `extreme`
    makes some tokens' decay underflow to exactly 0."""
    cu = [0, *sorted(c for c in cuts if c < seqlen), seqlen]
    args, kw = make_case(seed, seqlen=seqlen, nheads=2, headdim=2, dstate=3, D="channel", init=True,
                         nstates=len(cu) - 1)
    if extreme:
        args["dt"][:, ::5] = 1e4
    dt_limit = (0.0, math.inf)
    out = scan_recurrent(**args, **kw, cu_seqlens=torch.tensor(cu))
    for s, (b, e) in enumerate(zip(cu, cu[1:])):
        if e == b:
            continue
        piece = {k: (v[:, b:e] if k != "A" else v) for k, v in args.items()}
        y, final = hand_loop(**piece, D=kw["D"], z=kw["z"][:, b:e], dt_bias=kw["dt_bias"],
                             init=kw["initial_states"][s : s + 1], dt_limit=dt_limit)
        assert rel(out.y[:, b:e], y) < 1e-13
        assert rel(out.varlen_states[s], final[0]) < 1e-13


def test_the_recurrent_reference_streams_bit_for_bit(monkeypatch):
    """Segments cut on a grid of 16 tokens from each sequence start (the chunk grid of scan.segments at chunk
    sizes 16 and up) give the whole call's states and C·h, bit for bit (y's gate may round differently where
    the CPU's vector loop leaves a segment's last elements to its scalar one), with blocks of at most 40
    tokens cutting the segments further."""
    cu = [0, 37, 38, 150, 200]
    args, kw = make_case(21, seqlen=cu[-1], init=True, nstates=len(cu) - 1)
    monkeypatch.setattr(naive, "_RECURRENT_BLOCK_ELEMENTS", 40 * 2 * 3 * 4)  # 40 tokens of the state's elements
    kw["cu_seqlens"] = torch.tensor(cu)
    whole = scan_recurrent(**args, **kw)
    stream = RecurrentStream(*args.values(), **kw)
    cuts = [0, 32, 37, 38, 54, 150, 166, 200]
    parts = [stream.segment(f0, f1) for f0, f1 in zip(cuts, cuts[1:])]
    assert torch.equal(torch.cat([y_ssm for _, y_ssm in parts]), whole.y_ssm.flatten(0, 1))
    assert rel(torch.cat([y for y, _ in parts]), whole.y.flatten(0, 1)) < 1e-15
    assert torch.equal(stream.states()[1], whole.varlen_states)


def test_varlen_without_initial_states_starts_from_zero_and_trailing_empty_sequence():
    cu = [0, 4, 10, 10]
    args, kw = make_case(13, seqlen=10)
    out = scan_recurrent(**args, **kw, cu_seqlens=torch.tensor(cu))
    alone = scan_recurrent(**{k: (v[:, 4:] if k != "A" else v) for k, v in args.items()}, **{**kw, "z": kw["z"][:, 4:]})
    assert torch.equal(out.y[:, 4:], alone.y)
    assert torch.equal(out.varlen_states[2], torch.zeros_like(out.varlen_states[2]))  # empty: its initial state
    assert torch.equal(out.final_states[0], out.varlen_states[1])  # the state after the last token
    chunked = scan_chunked(**args, chunk_size=4, **kw, cu_seqlens=torch.tensor(cu))
    assert rel(chunked.final_states, out.final_states) < 1e-12


def test_float32_reference_is_float32_and_close():
    args, kw = make_case(14, batch=2, seqlen=40, init=True)
    ref = scan_recurrent(**args, **kw)
    out32 = scan_recurrent(**args, **kw, dtype=torch.float32)
    assert out32.y.dtype == torch.float32 and out32.final_states.dtype == torch.float32
    assert rel(out32.y, ref.y) < 1e-5


def test_invalid_varlen_arguments_raise():
    args, kw = make_case(15, batch=2, seqlen=8)
    with pytest.raises(ValueError, match="batch 1"):
        scan_recurrent(**args, **kw, cu_seqlens=torch.tensor([0, 8]))
    with pytest.raises(ValueError, match="one row per batch row"):
        scan_recurrent(**args, **kw, initial_states=torch.zeros(1, 2, 3, 4, dtype=torch.float64))
    args, kw = make_case(15, seqlen=8)
    with pytest.raises(ValueError, match="cu_seqlens"):
        scan_chunked(**args, chunk_size=4, **kw, cu_seqlens=torch.tensor([0, 3, 7]))
    with pytest.raises(ValueError, match="one row per sequence"):
        scan_baseline(**args, chunk_size=4, **kw, cu_seqlens=torch.tensor([0, 3, 8]),
                      initial_states=torch.zeros(3, 2, 3, 4))


@st.composite
def scan_cases(draw):
    nheads = draw(st.sampled_from([1, 2, 4]))
    shape = dict(
        seqlen=draw(st.integers(1, 70)),
        nheads=nheads,
        headdim=draw(st.integers(1, 5)),
        dstate=draw(st.integers(1, 5)),
        ngroups=draw(st.sampled_from([g for g in (1, 2, 4) if nheads % g == 0])),
    )
    varlen = draw(st.booleans())
    cu = None
    if varlen:
        # Cut points anywhere, so boundaries fall mid-chunk and sequences of length 1 (or 0) occur.
        cuts = draw(st.lists(st.integers(0, shape["seqlen"]), max_size=6))
        cu = [0, *sorted(cuts), shape["seqlen"]]
    opts = dict(
        D=draw(st.sampled_from([None, "head", "channel"])),
        z=draw(st.booleans()),
        dt_bias=draw(st.booleans()),
        init=draw(st.booleans()),
        nstates=len(cu) - 1 if cu else None,
        batch=1 if varlen else draw(st.integers(1, 3)),
        dt_softplus=draw(st.booleans()),
    )
    extra = dict(dt_limit=draw(st.sampled_from([(0.0, math.inf), (0.01, 0.3)])))
    if cu is not None:
        extra["cu_seqlens"] = torch.tensor(cu)
    chunk = draw(st.sampled_from([1, 2, 4, 8, 16, 32, 64]))
    return draw(st.integers(0, 2**31 - 1)), shape, opts, extra, chunk


@settings(max_examples=60, deadline=None)
@given(scan_cases())
def test_chunked_matches_recurrent(case):
    seed, shape, opts, extra, chunk = case
    args, kw = make_case(seed, **shape, **opts)
    kw.update(extra)
    ref = scan_recurrent(**args, **kw)
    out = scan_chunked(**args, chunk_size=chunk, **kw)
    assert rel(out.y, ref.y) < 1e-12
    assert rel(out.final_states, ref.final_states) < 1e-12
    if "cu_seqlens" in kw:
        assert out.varlen_states.shape == ref.varlen_states.shape
        # Empty sequences without initial states have a zero state: compare norm-wise over all.
        assert (out.varlen_states - ref.varlen_states).norm() <= 1e-12 * ref.varlen_states.norm()
    else:
        assert out.varlen_states is None and ref.varlen_states is None


def test_chunked_is_accurate_where_cumulative_decays_are_huge():
    """Decay-extreme: log-decays summing to ~1e6 per chunk, plus exact-zero dt padding."""
    args, kw = make_case(16, seqlen=50, nheads=2, dt_bias=False, dt_softplus=False)
    dt = torch.full_like(args["dt"], 0.05)
    dt[:, ::7] = 1e5
    dt[:, 3::11] = 0.0
    args["dt"] = dt
    ref = scan_recurrent(**args, **kw)
    out = scan_chunked(**args, chunk_size=32, **kw)
    assert rel(out.y, ref.y) < 1e-12


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("state_dtype", ["float32", "same"])
def test_baseline_error_is_a_fraction_of_the_unit_roundoff(dtype, state_dtype):
    sd = torch.float32 if state_dtype == "float32" else dtype
    args, kw = make_case(17, batch=2, seqlen=150, nheads=4, headdim=16, dstate=16, ngroups=2, init=True,
                         dtype=dtype)
    ref = scan_recurrent(**args, **kw)
    out = scan_baseline(**args, chunk_size=32, **kw, state_dtype=sd)
    assert out.y.dtype == dtype and out.final_states.dtype == sd
    u = UNIT_ROUNDOFF[dtype]
    # Measured ~0.45u for y: rounding the output alone costs ~0.3u, so well above 0.1u.
    assert 0.1 * u < rel(out.y, ref.y) < 2 * u
    assert rel(out.final_states, ref.final_states) < 2 * u


def test_baseline_float32_is_close_to_reference():
    args, kw = make_case(18, batch=2, seqlen=150, nheads=4, headdim=16, dstate=16, ngroups=2, init=True,
                         dtype=torch.float32)
    ref = scan_recurrent(**args, **kw)
    out = scan_baseline(**args, chunk_size=32, **kw)
    assert out.y.dtype == torch.float32 and out.final_states.dtype == torch.float32
    assert rel(out.y, ref.y) < 1e-6
    assert rel(out.final_states, ref.final_states) < 1e-6


def test_baseline_varlen_and_stochastic_state_rounding():
    cu = torch.tensor([0, 3, 40, 41, 90])
    args, kw = make_case(19, seqlen=90, nheads=2, headdim=8, dstate=8, init=True, nstates=4, dtype=torch.float16)
    kw["cu_seqlens"] = cu
    ref = scan_recurrent(**args, **kw)
    runs = [scan_baseline(**args, chunk_size=16, **kw, state_dtype=torch.float16, rounding="stochastic", seed=s)
            for s in (1, 1, 2)]
    assert torch.equal(runs[0].varlen_states, runs[1].varlen_states)  # the seed decides
    assert not torch.equal(runs[0].varlen_states, runs[2].varlen_states)
    u = UNIT_ROUNDOFF[torch.float16]
    for run in runs:
        assert run.varlen_states.dtype == torch.float16
        assert rel(run.y, ref.y) < 2 * u
        assert rel(run.varlen_states, ref.varlen_states) < 2 * u
        assert torch.equal(run.final_states[0], run.varlen_states[-1])


def test_baseline_stays_finite_with_extreme_decay_and_ragged_length():
    """Rounded cumsum differences may come out positive: they are clamped and masked before exp."""
    args, kw = make_case(20, seqlen=45, nheads=2, dt_bias=False, dt_softplus=False, dtype=torch.bfloat16)
    dt = torch.full(args["dt"].shape, 3e4)
    dt[:, 5::9] = 0.0
    args["dt"] = dt.to(torch.bfloat16)
    out = scan_baseline(**args, chunk_size=16, **kw)
    ref = scan_recurrent(**args, **kw)
    assert torch.isfinite(out.y).all() and torch.isfinite(out.final_states).all()
    assert rel(out.y, ref.y) < 2 * UNIT_ROUNDOFF[torch.bfloat16]
