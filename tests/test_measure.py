"""Measurements: norm-wise errors with the worst element, first non-finite in token order, per-chunk drift."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from whole_tensors import first_nonfinite_y, group_sums

from ssmcheck.core.tensors import finite
from ssmcheck.scan import measure
from ssmcheck.scan.inputs import ScanInputs, ScanShape, TokenMap
from ssmcheck.scan.regimes import REGIMES


def _inputs(batch, seqlen, nheads=2, headdim=3, dstate=4, cu_seqlens=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    return ScanInputs(
        x=torch.randn(batch, seqlen, nheads, headdim, generator=g),
        dt=torch.rand(batch, seqlen, nheads, generator=g),
        A=-torch.rand(nheads, generator=g),
        B=torch.randn(batch, seqlen, 1, dstate, generator=g),
        C=torch.randn(batch, seqlen, 1, dstate, generator=g),
        cu_seqlens=cu_seqlens,
    )


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(1, 40), st.integers(0, 2**31 - 1))
def test_error_stats_match_numpy_and_locate_the_worst_element(batch, seqlen, seed):
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(batch, seqlen, 2, 3, generator=g, dtype=torch.float64)
    out = (ref + 1e-3 * torch.randn(ref.shape, generator=g, dtype=torch.float64)).float()
    stats = measure.error_stats(out, ref)
    diff = out.double().numpy() - ref.numpy()
    assert stats.rel == pytest.approx(np.linalg.norm(diff) / np.linalg.norm(ref.numpy()), rel=1e-12)
    assert stats.max_abs == pytest.approx(np.abs(diff).max(), rel=1e-12)
    assert abs(diff[stats.worst]) == pytest.approx(np.abs(diff).max(), rel=1e-12)


def test_error_stats_report_nan_as_the_worst_element():
    ref = torch.ones(2, 5, 1, 1, dtype=torch.float64)
    out = ref.float().clone()
    out[1, 3, 0, 0] = float("nan")
    stats = measure.error_stats(out, ref)
    assert math.isnan(stats.rel) and math.isnan(stats.max_abs)
    assert stats.worst == (1, 3, 0, 0)


def test_error_stats_of_an_exact_zero_reference():
    zero = torch.zeros(3, dtype=torch.float64)
    assert measure.error_stats(zero.float(), zero).rel == 0.0
    assert measure.error_stats(torch.ones(3), zero).rel == math.inf


def test_first_nonfinite_in_batch_mode_is_earliest_token_over_rows():
    inputs = _inputs(batch=3, seqlen=20)
    ref = torch.ones(3, 20, 2, 3, dtype=torch.float64)
    y = ref.float().clone()
    y[2, 9:, 1, 2] = float("inf")  # row 2 from token 9
    y[0, 13, 0, 1] = float("nan")  # row 0 at token 13: later in token order
    loc = first_nonfinite_y(y, ref, inputs.token_map(), 4, inputs)
    assert (loc.output, loc.sequence, loc.token, loc.chunk, loc.head, loc.channel) == ("y", 2, 9, 2, 1, 2)
    assert (loc.count, loc.tokens, loc.inputs_finite) == (11 + 1, 11 + 1, True)
    assert loc.chunks == 3 + 1  # chunks 2..4 of row 2, chunk 3 of row 0


def test_first_nonfinite_in_varlen_uses_each_sequences_own_chunking():
    cu = torch.tensor([0, 5, 23, 30], dtype=torch.int32)
    inputs = _inputs(batch=1, seqlen=30, cu_seqlens=cu)
    ref = torch.ones(1, 30, 2, 3, dtype=torch.float64)
    y = ref.float().clone()
    y[0, 14:23, 0, :] = float("nan")  # sequence 1, tokens 9..17 of it
    inputs.x[0, 14, 0, 1] = float("inf")  # the input there was already infinite
    loc = first_nonfinite_y(y, ref, inputs.token_map(), 8, inputs)
    assert (loc.sequence, loc.token, loc.chunk, loc.head, loc.channel) == (1, 9, 1, 0, 0)
    assert (loc.count, loc.tokens, loc.chunks) == (27, 9, 2)
    assert loc.inputs_finite is False


def test_nonfinite_where_the_reference_is_nonfinite_is_not_counted():
    inputs = _inputs(batch=1, seqlen=4)
    ref = torch.ones(1, 4, 2, 3, dtype=torch.float64)
    ref[0, 1] = float("nan")
    y = ref.float().clone()
    assert first_nonfinite_y(y, ref, inputs.token_map(), 2, inputs) is None


def test_first_nonfinite_state_in_index_order():
    inputs = _inputs(batch=2, seqlen=6)
    ref = torch.ones(2, 2, 3, 4, dtype=torch.float64)
    states = ref.float().clone()
    states[1, 1, 2, 3] = float("nan")
    states[1, 0, 2, 1] = float("inf")
    loc = measure.locate_nonfinite_states(states, ref, inputs)
    assert (loc.output, loc.sequence, loc.head, loc.channel, loc.state_index, loc.count) == (
        "final_states", 1, 0, 2, 1, 2)
    assert loc.token is None and loc.inputs_finite is True


def test_per_chunk_error_by_sequence_chunking_and_growth():
    cu = torch.tensor([0, 3, 11], dtype=torch.int32)  # sequences of 3 and 8 tokens, chunks of 4
    inputs = _inputs(batch=1, seqlen=11, cu_seqlens=cu)
    ref = torch.ones(1, 11, 2, 3, dtype=torch.float64)
    y = ref.clone()
    y[0, 3:7] += 0.5  # sequence 1, chunk 0 (with sequence 0's chunk 0, which is exact)
    per_chunk = group_sums(y, ref, inputs.token_map(), 4).per_chunk()
    assert per_chunk == pytest.approx([0.5 * math.sqrt(4 / 7), 0.0])
    assert measure.growth([1e-3, 2e-3, 4e-3]) == pytest.approx(4.0)
    assert measure.growth([1e-3, float("nan"), 1e-3]) == pytest.approx(1.0)
    assert measure.growth([1e-3]) is None


def test_regime_inputs_know_where_they_are_finite():
    shape = ScanShape(batch=3, seqlen=10, nheads=2, headdim=4, dstate=4, ngroups=1, chunk_size=4)
    inputs = REGIMES["initial-state"].generate(shape, torch.float32, seed=1)
    assert inputs.finite_for_sequence(1, 0)
    inputs.initial_states[1, 0, 0, 0] = float("nan")
    assert not inputs.finite_for_sequence(1, 0) and inputs.finite_for_sequence(1, 1)


@pytest.mark.parametrize("rounding, draws", [("stochastic", 4), ("nearest", 1)])
def test_a_stochastic_cases_worst_group_is_judged_against_several_baseline_draws(rounding, draws):
    """One group's error under stochastic rounding is a random draw: the baseline's worst group is the
    largest over STOCHASTIC_DRAWS seeds (each group's maximum), under round to nearest its one run."""
    from ssmcheck.core.tolerance import Tolerance
    from ssmcheck.scan import run
    from ssmcheck.scan.adapter import resolve
    from ssmcheck.scan.spec import ScanCase

    assert run.STOCHASTIC_DRAWS == 4
    case = ScanCase(kernel="torch", regime="initial-state", dtype="fp32", chunk_size=16, seqlen=64, batch=3,
                    nheads=4, headdim=8, dstate=16, ngroups=2, state_dtype="bf16", rounding=rounding,
                    model=None, seed=1234)
    result = run.run_case(case, resolve("torch", interpreter=True), Tolerance(), "fp64", "cpu")
    inputs = REGIMES["initial-state"].generate(case.shape(), torch.float32, case.seed, state_dtype=torch.bfloat16)
    ref = run.reference(inputs, "fp64")
    tokens = inputs.token_map()
    draws_y = [run.baseline(inputs, ScanCase(**{**case.__dict__, "seed": case.seed + k}), torch.bfloat16)[0]
               for k in range(draws)]
    per_draw = [group_sums(y, ref[0], tokens, 16).group_errors().max().item() for y in draws_y]
    assert result.worst_group.baseline_rel == pytest.approx(max(per_draw), rel=1e-12)
    if draws > 1:
        assert len(set(per_draw)) == draws  # the draws differ: the seed reaches the rounding


@pytest.mark.gpu
def test_the_group_figures_are_the_same_bits_on_every_run_on_a_gpu():
    # index_add_ on a GPU adds with atomics in a varying order: a serial and a --workers run of one
    # sweep reported per-chunk drifts one bit apart before the sums moved to a fixed order.
    g = torch.Generator().manual_seed(11)
    ref = torch.randn(1, 65536, 8, 16, generator=g, dtype=torch.float64).cuda()
    y = (ref + 1e-3 * torch.randn(ref.shape, generator=g, dtype=torch.float64).cuda()).float()
    cpu = _inputs(1, 65536).token_map()
    tokens = TokenMap(cpu.sequence.cuda(), cpu.position.cuda(), cpu.order.cuda())
    sums = [group_sums(y, ref, tokens, 64) for _ in range(8)]
    runs = [(s.per_chunk(), s.per_chunk_head(), s.group_errors().tolist()) for s in sums]
    assert all(run == runs[0] for run in runs)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32,
                                                             torch.float64]))
def test_finite_is_isfinite_for_every_bit_pattern(seed, dtype):
    # Random bit patterns cover every class: zeros, subnormals, normals up to the largest, inf and NaNs.
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    info = torch.iinfo(ints)
    patterns = torch.randint(info.min, info.max, (4096,), dtype=ints, generator=torch.Generator().manual_seed(seed))
    values = torch.cat([patterns.view(dtype), torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan]).to(dtype),
                        torch.tensor([torch.finfo(dtype).max, -torch.finfo(dtype).max]).to(dtype)])
    assert torch.equal(finite(values), torch.isfinite(values))
