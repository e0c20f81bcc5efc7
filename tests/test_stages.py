"""Stage localisation (`scan --stages`, issue #11): the first wrong SSD stage, and where, named for kernels
with one broken stage each; the built-in kernel's stages all within tolerance; the per-stage judgement."""

from __future__ import annotations

import math

import pytest
import torch
from broken_stage_kernels import FIRST_WRONG
from cli_invoke import assert_usage_error, invoke

import ssmcheck
from ssmcheck.core.tolerance import Tolerance
from ssmcheck.scan import stages
from ssmcheck.scan.inputs import ScanInputs

SMALL = ["--seqlen", "72", "--chunk-size", "16", "--batch", "2", "--nheads", "2", "--headdim", "8", "--dstate", "8",
         "--ngroups", "1"]


@pytest.mark.parametrize("name", sorted(FIRST_WRONG))
def test_names_the_broken_stage(name, tmp_path):
    stage, label, chunk, status = FIRST_WRONG[name]
    result, report = invoke("scan", "--kernel", f"tests/broken_stage_kernels.py:{name}", "--regime", "normal",
                            "--dtype", "bf16", *SMALL, "--quiet", json_path=tmp_path / "r.json")
    assert result.exit_code in (1, 3), result.output
    case = report["cases"][0]
    unit = "group" if stage == "cb" else "head"
    assert f"first wrong stage: {label}, sequence 0 chunk {chunk} {unit} 0 (" in case["message"]
    found = case["stages"]
    assert found["first_wrong"] == {"stage": stage, "label": label, "status": status, "sequence": 0, "chunk": chunk,
                                    "head": 0}
    order = list(stages.STAGES)
    for before in order[: order.index(stage)]:  # the stages before the broken one are right
        assert found["figures"][before]["status"] == "ok", (before, found["figures"][before])
    broken = found["figures"][stage]
    if status == "out of tolerance":
        assert broken["group_rel"] > broken["group_limit"]


def test_builtin_stages_within_tolerance(tmp_path):
    """Every stage of the built-in kernel passes, in batches, varlen batches with mid-chunk boundaries,
    with initial states and with extreme decays, in bf16 and fp32."""
    result, report = invoke("scan", "--stages", "--regime", "normal,ragged,initial-state,decay-extreme",
                            "--dtype", "bf16,fp32", *SMALL, "--quiet", json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    ran = [c for c in report["cases"] if c["status"] != "skipped"]
    assert len(ran) == 8
    for case in ran:
        assert case["stages"]["note"] == "" and case["stages"]["first_wrong"] is None, case["stages"]
        assert set(case["stages"]["figures"]) == set(stages.STAGES)
        for figure in case["stages"]["figures"].values():
            assert figure["rel"] <= figure["limit"] and figure["worst_group_rel"] <= figure["group_limit"]


def test_stages_not_asked_for_passing_cases(tmp_path):
    result, report = invoke("scan", "--regime", "normal", "--dtype", "fp32", *SMALL, "--quiet",
                            json_path=tmp_path / "r.json")
    assert result.exit_code == 0 and report["cases"][0]["stages"] is None


def test_stages_need_a_kernel_that_offers_them():
    result, _ = invoke("scan", "--stages", "--kernel", "tests/broken_scan_kernels.py:slightly_inaccurate",
                       "--regime", "normal", *SMALL)
    assert_usage_error(result, "--stages")


def test_failing_kernel_without_stages_is_judged_as_before(tmp_path):
    result, report = invoke("scan", "--kernel", "tests/broken_scan_kernels.py:slightly_inaccurate", "--regime",
                            "normal", "--dtype", "bf16", *SMALL, "--quiet", json_path=tmp_path / "r.json")
    case = report["cases"][0]
    assert result.exit_code == 1 and case["stages"] is None and "stage" not in case["message"]


def _layout(cu: list[int], chunk_size: int):
    total = cu[-1]
    inputs = ScanInputs(x=torch.zeros(1, total, 2, 1), dt=torch.zeros(1, total, 2), A=torch.zeros(2),
                        B=torch.zeros(1, total, 1, 1), C=torch.zeros(1, total, 1, 1),
                        cu_seqlens=torch.tensor(cu, dtype=torch.int32))
    return stages.chunks(inputs, chunk_size)


def test_chunks_follow_sequences():
    assert _layout([0, 5, 21, 22], 8) == [(0, 0, 0, 5), (1, 0, 5, 8), (1, 1, 13, 8), (2, 0, 21, 1)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_judge_stage_finds_the_first_group_out_of_tolerance(seed):
    """A stage whose error is the baseline's everywhere but in one (chunk, head) group is out of tolerance
    there, and only there; the same error scaled into tolerance passes."""
    gen = torch.Generator().manual_seed(seed)
    layout = _layout([0, 20, 45], 8)  # 3 + 4 chunks
    reference = torch.randn(len(layout), 2, 4, 4, generator=gen, dtype=torch.float64)
    noise = 1e-3 * torch.randn(reference.shape, generator=gen, dtype=torch.float64)
    baseline = reference + noise
    chunk, head = int(torch.randint(len(layout), (1,), generator=gen)), int(torch.randint(2, (1,), generator=gen))
    kernel = reference + noise
    kernel[chunk, head] += 50 * noise[chunk, head]
    tolerance = Tolerance(tol_factor=2.0, floor=0.0)
    figure = stages.judge_stage("chunk_states", kernel, reference, baseline, layout, 8, tolerance)
    assert figure.status == "out of tolerance"
    assert (figure.sequence, figure.chunk, figure.head) == (*layout[chunk][:2], head)
    assert figure.group_rel > figure.group_limit
    assert stages.judge_stage("chunk_states", baseline.clone(), reference, baseline, layout, 8, tolerance).status == "ok"


def test_judge_stage_nonfinite_and_unread_entries():
    """NaN where the output stage reads is non-finite; NaN past a chunk's end or above C·Bᵀ's diagonal is not read."""
    gen = torch.Generator().manual_seed(3)
    layout = _layout([0, 5, 21], 8)
    reference = torch.randn(len(layout), 1, 8, 8, generator=gen, dtype=torch.float64)
    kernel = reference.clone()
    kernel[0, 0, :, 5:] = math.nan  # past chunk 0's 5 tokens
    kernel[1, 0, 2, 3:] = math.inf  # above the diagonal
    tolerance = Tolerance()
    assert stages.judge_stage("cb", kernel, reference, reference, layout, 8, tolerance).status == "ok"
    kernel[2, 0, 6, 1] = math.nan
    figure = stages.judge_stage("cb", kernel, reference, reference, layout, 8, tolerance)
    assert (figure.status, figure.sequence, figure.chunk) == ("nonfinite", 1, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("peer", ["mamba_ssm", "vllm"])
def test_real_peer_stages_within_tolerance(peer):
    """The installed peers' stage functions (PYTHONPATH=.:.peers/v033:.peers/mamba), composed as their combined
    functions compose them: every stage within tolerance where they pass, but for the cumulative decay of their
    own softplus (README: log(exp(dt) + 1) on Triton 3, ~eps/dt relative per token, seen alone in a length-1
    ragged sequence's chunk) with every later stage within tolerance; mamba_ssm's varlen chunks straddle
    sequences, so there its stages are not compared, and the note says why; its varlen initial-state cases
    are errors (its assert takes one initial state per batch row), judged before any stage."""
    pytest.importorskip({"mamba_ssm": "mamba_ssm.ops.triton.ssd_combined",
                         "vllm": "vllm.model_executor.layers.mamba.ops.ssd_combined"}[peer])
    report = ssmcheck.scan(kernel=peer, stages=True, regime=["normal", "ragged", "initial-state"],
                           dtype=["bf16", "fp16"], seqlen=[300], chunk_size=[64], batch=[2], nheads=[4], headdim=[32],
                           dstate=[32], ngroups=[2])
    ran = [c for c in report.cases if c.status != "skipped"]
    assert ran
    for case in ran:
        found = case.data["stages"]
        # Every message names what tells one run from another: the autotuner's picks (a peer's config is chosen by
        # timing, so it may differ between runs) and the case's verdict (this test failed once in a full GPU run
        # and passed alone, 2026-12-04).
        why = (case.id, case.status, case.message, case.data.get("autotune_picks"))
        if peer == "mamba_ssm" and case.params["regime"] == "initial-state":
            assert case.status == "error" and "AssertionError" in case.data["message"] and found is None, why
            continue
        assert found is not None, why  # a case that raised has no stages: its message says what it raised
        if peer == "mamba_ssm" and case.params["regime"] == "ragged":
            assert "straddle" in found["note"], (*why, found)
            continue
        assert found["note"] == "", (*why, found["note"])
        if case.status == "pass" and found["first_wrong"] is not None:
            assert found["first_wrong"]["stage"] == "cumsum", (*why, found["first_wrong"])
            cumsum = found["figures"]["cumsum"]
            assert cumsum["rel"] <= cumsum["limit"] and cumsum["worst_group_rel"] < 1e-3, (*why, cumsum)
            assert all(f["status"] == "ok" for name, f in found["figures"].items() if name != "cumsum"), (
                *why, found["figures"])
