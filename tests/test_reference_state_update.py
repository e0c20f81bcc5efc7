"""The reference decode step: repeated steps equal the sequential scan; per-channel parameters by hand."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ssmcheck.ops.chunk_scan.naive import scan_recurrent
from ssmcheck.ops.state_update.naive import state_update_step


def randn(g, *shape):
    return torch.randn(*shape, generator=g, dtype=torch.float64)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 3),
    nheads_groups=st.sampled_from([(1, 1), (2, 1), (2, 2), (4, 2), (4, 1)]),
    headdim=st.integers(1, 4),
    dstate=st.integers(1, 4),
    steps=st.integers(1, 8),
    dt_softplus=st.booleans(),
    with_d_z_bias=st.booleans(),
)
def test_steps_equal_the_recurrent_scan(seed, batch, nheads_groups, headdim, dstate, steps, dt_softplus,
                                        with_d_z_bias):
    """Per-head parameters tied across channels as stride-0 views, the way mamba's decode path passes them."""
    nheads, ngroups = nheads_groups
    g = torch.Generator().manual_seed(seed)
    A = -torch.exp(randn(g, nheads))
    dt = randn(g, batch, steps, nheads) if dt_softplus else 0.1 * randn(g, batch, steps, nheads).abs()
    x, z = randn(g, batch, steps, nheads, headdim), randn(g, batch, steps, nheads, headdim)
    B, C = randn(g, batch, steps, ngroups, dstate), randn(g, batch, steps, ngroups, dstate)
    D, dt_bias = randn(g, nheads), 0.1 * randn(g, nheads).abs()
    init = randn(g, batch, nheads, headdim, dstate)
    opts = dict(D=D, z=z, dt_bias=dt_bias) if with_d_z_bias else {}
    ref = scan_recurrent(x, dt, A, B, C, **opts, initial_states=init, dt_softplus=dt_softplus)

    A_tied = A[:, None, None].expand(nheads, headdim, dstate)
    state = init.clone()
    for t in range(steps):
        tied = {}
        if with_d_z_bias:
            tied = dict(D=D[:, None].expand(nheads, headdim), z=z[:, t],
                        dt_bias=dt_bias[:, None].expand(nheads, headdim))
        before = state.clone()
        new_state, out = state_update_step(
            state, x[:, t], dt[:, t, :, None].expand(batch, nheads, headdim), A_tied, B[:, t], C[:, t],
            **tied, dt_softplus=dt_softplus,
        )
        assert torch.equal(state, before)  # pure
        assert out.shape == (batch, nheads, headdim)
        assert torch.allclose(out, ref.y[:, t], rtol=1e-13, atol=1e-13)
        state = new_state
    assert torch.allclose(state, ref.final_states, rtol=1e-13, atol=1e-13)


def test_per_channel_parameters_by_hand():
    """A, dt, D and dt_bias that differ per channel, checked with plain Python floats."""
    g = torch.Generator().manual_seed(21)
    batch, nheads, ngroups, headdim, dstate = 2, 4, 2, 3, 2
    state = randn(g, batch, nheads, headdim, dstate)
    x, z, dt = randn(g, batch, nheads, headdim), randn(g, batch, nheads, headdim), randn(g, batch, nheads, headdim)
    A = -torch.exp(randn(g, nheads, headdim, dstate))
    B, C = randn(g, batch, ngroups, dstate), randn(g, batch, ngroups, dstate)
    D, dt_bias = randn(g, nheads, headdim), randn(g, nheads, headdim)
    new_state, out = state_update_step(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=True)
    for b in range(batch):
        for h in range(nheads):
            grp = h // (nheads // ngroups)
            for p in range(headdim):
                d = math.log1p(math.exp(float(dt[b, h, p] + dt_bias[h, p])))
                acc = 0.0
                for n in range(dstate):
                    s = math.exp(d * float(A[h, p, n])) * float(state[b, h, p, n]) \
                        + d * float(x[b, h, p]) * float(B[b, grp, n])
                    assert math.isclose(float(new_state[b, h, p, n]), s, rel_tol=1e-14, abs_tol=1e-14)
                    acc += float(C[b, grp, n]) * s
                zv = float(z[b, h, p])
                expect = (acc + float(D[h, p]) * float(x[b, h, p])) * zv / (1 + math.exp(-zv))
                assert math.isclose(float(out[b, h, p]), expect, rel_tol=1e-13, abs_tol=1e-13)


def test_computes_in_the_inputs_dtype():
    g = torch.Generator().manual_seed(22)
    state = randn(g, 1, 2, 2, 2).float()
    args = [randn(g, 1, 2, 2).float(), randn(g, 1, 2, 2).abs().float(), -torch.ones(2, 2, 2),
            randn(g, 1, 1, 2).float(), randn(g, 1, 1, 2).float()]
    new_state, out = state_update_step(state, *args)
    assert new_state.dtype == torch.float32 and out.dtype == torch.float32
