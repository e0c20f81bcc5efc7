"""Stages 2 and 3 in one kernel (states_passed) against the two kernels it stands in for.

The chunk scan runs it in Triton's interpreter (where its stages are not kept). There both take a whole
chunk a tile and a whole head's state a program, so the one kernel must give the two kernels' bits: the
incoming state of every chunk and the state after every sequence, over layouts (sequences of any length,
chunk sizes, several groups, strided inputs), initial states, state dtypes and stochastic rounding.
Compiled (benchmarks/chunk_scan.py times it), their tiles differ, and with them the order of the sums: there
the two are held to each other within what that order can move.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ssmcheck.ops.chunk_scan import chunk
from ssmcheck.ops.chunk_scan.chunk_state import chunk_state
from ssmcheck.ops.chunk_scan.dt_cumsum import dt_cumsum
from ssmcheck.ops.chunk_scan.layout import varlen_table
from ssmcheck.ops.chunk_scan.state_passing import state_passing
from ssmcheck.ops.chunk_scan.states_passed import states_passed
from ssmcheck.ops.rounding.stochastic import triton_dtype

STATE_ROUNDINGS = [(torch.float32, "nearest"), (torch.bfloat16, "nearest"), (torch.float16, "stochastic"),
                   (torch.bfloat16, "stochastic")]


def _inputs(lengths, nheads, ngroups, headdim, dstate, chunk_size, dtype, seed, device, strided):
    """Fresh inputs (x, B through a wider buffer when `strided`), the chunk table of `lengths`, dt processed."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    ntok = sum(lengths)
    wide = 3 if strided else 1
    x = torch.randn(ntok, nheads, headdim * wide, generator=g).to(device, dtype)[..., ::wide]
    B = torch.randn(ntok, ngroups, dstate * wide, generator=g).to(device, dtype)[..., :dstate]
    dt = (torch.rand(ntok, nheads, generator=g) * 2 - 1).to(device)
    A = -torch.exp(torch.rand(nheads, generator=g) * 3).to(device)
    dt_bias = (torch.randn(nheads, generator=g) - 3).to(device)
    bounds = torch.tensor([0, *lengths]).cumsum(0).tolist()
    table = varlen_table(list(zip(bounds[:-1], bounds[1:])), chunk_size, device)
    dt_proc, dA_cs, _ = dt_cumsum(dt, A, dt_bias, True, (0.0, float("inf")), table)
    init = torch.randn(len(lengths), nheads, headdim, dstate, generator=g).to(device)
    return x, B, dt_proc, dA_cs, table, init


def _both(x, B, dt_proc, dA_cs, table, init, state_dtype, rounding, seed, interpret, passed_dtype=None):
    mm = triton_dtype(x.dtype)
    stochastic = rounding == "stochastic"
    local = chunk_state(x, B, dt_proc, dA_cs, mm, table, interpret)
    two = state_passing(local, dA_cs, init, state_dtype, stochastic, seed, table, passed_dtype=passed_dtype)
    one = states_passed(x, B, dt_proc, dA_cs, init, state_dtype, stochastic, seed, table, mm, interpret,
                        passed_dtype=passed_dtype)
    return two, one


@settings(max_examples=12, deadline=None)
@given(lengths=st.lists(st.integers(1, 150), min_size=1, max_size=4),
       chunk_size=st.sampled_from([16, 32, 64]),
       heads=st.sampled_from([(2, 1), (4, 2), (3, 3)]),
       headdim=st.sampled_from([8, 12, 16]),
       dstate=st.sampled_from([16, 24]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       state_rounding=st.sampled_from(STATE_ROUNDINGS),
       with_init=st.booleans(),
       strided=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_one_kernel_gives_the_two_kernels_bits(lengths, chunk_size, heads, headdim, dstate, dtype, state_rounding,
                                                with_init, strided, seed):
    nheads, ngroups = heads
    x, B, dt_proc, dA_cs, table, init = _inputs(lengths, nheads, ngroups, headdim, dstate, chunk_size, dtype, seed,
                                                "cpu", strided)
    state_dtype, rounding = state_rounding
    (states2, final2), (states1, final1) = _both(x, B, dt_proc, dA_cs, table, init if with_init else None,
                                                 state_dtype, rounding, seed, interpret=True)
    assert torch.isfinite(states1.float()).all() and torch.isfinite(final1.float()).all()
    assert torch.equal(states1, states2)
    assert torch.equal(final1, final2)


def test_fp32_states_passed_in_the_inputs_dtype_are_the_two_kernels_bits():
    # The chunk scan's own call: fp32 states, the incoming ones stored in the inputs' dtype for the output stage.
    x, B, dt_proc, dA_cs, table, init = _inputs([70, 5, 130], 4, 2, 16, 32, 64, torch.bfloat16, 7, "cpu", False)
    (states2, final2), (states1, final1) = _both(x, B, dt_proc, dA_cs, table, init, torch.float32, "nearest", 7,
                                                 interpret=True, passed_dtype=torch.bfloat16)
    assert states1.dtype == torch.bfloat16 and final1.dtype == torch.float32
    assert torch.equal(states1, states2) and torch.equal(final1, final2)


def test_the_interpreted_scan_runs_one_kernel_unless_its_stages_are_kept_or_replaced(monkeypatch):
    # Stages kept for comparison need the chunks' own states; a pipeline with stage 2 or 3 replaced (a planted bug
    # in tests/broken_stage_kernels.py) must run the replacement, not the built-in pair in one kernel.
    from dataclasses import replace

    calls = []
    monkeypatch.setattr(chunk, "states_passed", lambda *a, **k: calls.append("one") or states_passed(*a, **k))
    g = torch.Generator().manual_seed(3)
    args = dict(x=torch.randn(1, 40, 2, 8, generator=g), dt=torch.rand(1, 40, 2, generator=g) * 0.1,
                A=-torch.rand(2, generator=g) - 0.5, B=torch.randn(1, 40, 1, 16, generator=g),
                C=torch.randn(1, 40, 1, 16, generator=g), chunk_size=16, interpret=True)
    y = chunk.chunk_scan_combined(**args)
    assert calls == ["one"]
    stages = chunk.chunk_scan_stages(**args)
    assert calls == ["one"] and torch.isfinite(stages["chunk_states"]).all()
    torch.testing.assert_close(stages["y"], y, rtol=0, atol=0)
    replaced = replace(chunk.PIPELINE, chunk_state=lambda *a, **k: chunk_state(*a, **k))
    assert torch.equal(chunk.chunk_scan_combined(**args, pipeline=replaced), y)
    assert calls == ["one"]


@pytest.mark.gpu
def test_gpu_one_kernel_agrees_with_the_two(monkeypatch):
    # Mamba2-2.7B widths, the chunk scan's own call (fp32 states, the incoming ones in bf16), a long sequence and
    # short ones. The two kernels sum a chunk's products in another order (their tiles differ), so they may differ by
    # what reordering a sum of n fp32 terms can move, 2 n eps32 times the sum of the terms' magnitudes, per element:
    # that sum is the same two kernels run on |x| and |B| (their weights are positive). A bf16 incoming state may
    # round the other way, one bf16 unit more.
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x, B, dt_proc, dA_cs, table, init = _inputs([5000, 1, 300, 3000], 80, 1, 64, 128, 256, torch.bfloat16, 5,
                                                "cuda", False)
    (states2, final2), (states1, final1) = _both(x, B, dt_proc, dA_cs, table, init, torch.float32, "nearest", 5,
                                                 interpret=False, passed_dtype=torch.bfloat16)
    (sizes, final_sizes), _ = _both(x.abs(), B.abs(), dt_proc, dA_cs, table, init.abs(), torch.float32, "nearest", 5,
                                    interpret=False)
    reorder = 2 * 256 * torch.finfo(torch.float32).eps
    assert ((final1 - final2).abs() <= reorder * final_sizes).all()
    bf16_unit = torch.finfo(torch.bfloat16).eps * states2.float().abs()
    assert ((states1.float() - states2.float()).abs() <= bf16_unit + reorder * sizes).all()
    # Compiled, the chunk scan runs the two kernels (the faster there).
    monkeypatch.setattr(chunk, "states_passed", lambda *a, **k: pytest.fail("the compiled scan ran states_passed"))
    chunk.chunk_scan_combined(x[None, :300], torch.rand(1, 300, 80, device="cuda"), -torch.rand(80, device="cuda"),
                              B[None, :300], B[None, :300], 256)
