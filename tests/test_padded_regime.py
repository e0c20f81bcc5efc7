"""The `padded` scan regime: pad tokens (seq_idx -1) between packed sequences, which must change no state;
on the CPU through the Triton interpreter."""

from __future__ import annotations

import torch

import ssmcheck
from ssmcheck.ops.chunk_scan.chunk import chunk_scan_combined
from ssmcheck.scan.inputs import ScanShape
from ssmcheck.scan.padding import PAD, padded
from ssmcheck.scan.regimes import REGIMES

KERNELS = "tests/slot_kernels.py"
SMALL = dict(regime=["padded"], dtype=["fp32"], chunk_size=[16], seqlen=[40], batch=[3], nheads=[2],
             headdim=[8], dstate=[16], ngroups=[1])


def _case(kernel: str, **options) -> dict:
    (case,) = ssmcheck.scan(kernel=kernel, **{**SMALL, **options}).to_json()["cases"]
    return case


def test_the_regime_puts_pad_tokens_after_every_sequence():
    inputs = REGIMES["padded"].generate(ScanShape(3, 40, 2, 8, 16, 1, 16), torch.float32, 11)
    call = padded(inputs)
    pads = inputs.pad_after.tolist()
    assert len(pads) == 3 and all(1 <= p <= 16 for p in pads)
    assert call.inputs.x.shape[1] == 120 + sum(pads) and int((call.seq_idx == PAD).sum()) == sum(pads)
    assert torch.equal(call.inputs.x[:, call.live], inputs.x)  # the case's tokens, in order
    pad_x = call.inputs.x[0, call.seq_idx[0] == PAD]
    assert torch.isfinite(pad_x).all() and bool((pad_x != 0).any())  # pads that would change a state
    cu = call.inputs.cu_seqlens.tolist()
    assert all(call.seq_idx[0, b - 1] == PAD for b in cu[1:])  # each sequence's bounds hold its pads


def test_builtin_pads_change_no_state_and_get_zero_out(device):
    inputs = REGIMES["padded"].generate(ScanShape(3, 40, 2, 8, 16, 1, 16), torch.float32, 3).to(device)
    call = padded(inputs)
    row = call.inputs
    args = (row.x, row.dt, row.A, row.B, row.C, 16)
    y, states = chunk_scan_combined(*args, **{**row.kwargs(), "seq_idx": call.seq_idx, "return_varlen_states": True})
    want_y, want_states = chunk_scan_combined(inputs.x, inputs.dt, inputs.A, inputs.B, inputs.C, 16,
                                              **{**inputs.kwargs(), "return_varlen_states": True})
    # Chunks follow sequences and pads lie in none: the same arithmetic as without the pads, bit for bit.
    assert torch.equal(call.case_y(y), want_y) and torch.equal(states, want_states)
    assert torch.equal(y[0, call.seq_idx[0] == PAD], torch.zeros_like(y[0, call.seq_idx[0] == PAD]))


def test_builtin_and_a_declared_kernel_pass():
    assert _case("builtin")["status"] == "pass"
    assert _case(f"{KERNELS}:pad_tokens_correct", dtype=["bf16"])["status"] == "pass"


def test_pads_leaking_into_the_state_are_caught():
    case = _case(f"{KERNELS}:pads_continue_the_sequence")
    assert case["status"] == "fail", case["message"]
    assert "state" in case["message"]
    assert case["error"]["state_max_rel"] > 1e-2


def test_the_planted_kernel_is_right_without_pads():
    assert _case(f"{KERNELS}:pads_continue_the_sequence", regime=["ragged"])["status"] == "pass"


def test_padded_initial_state_gives_each_padded_sequence_its_initial_state():
    inputs = REGIMES["padded-initial-state"].generate(ScanShape(3, 40, 2, 8, 16, 1, 16), torch.float32, 12)
    assert inputs.pad_after is not None and inputs.initial_states.shape == (3, 2, 8, 16)
    assert bool((inputs.initial_states != 0).all()) and REGIMES["padded-initial-state"].pad_tokens
    assert _case("builtin", regime=["padded-initial-state"])["status"] == "pass"


def test_a_pad_path_that_drops_initial_states_fails_padded_initial_state_only():
    kernel = f"{KERNELS}:pads_drop_initial_states"
    for regime in ("padded", "initial-state"):
        assert _case(kernel, regime=[regime])["status"] == "pass", regime
    case = _case(kernel, regime=["padded-initial-state"])
    assert case["status"] == "fail" and "state" in case["message"], case["message"]


def test_a_kernel_that_does_not_declare_pad_tokens_is_skipped_with_the_reason():
    case = _case("torch")
    assert case["status"] == "skipped" and "takes no pad tokens" in case["message"]

    def undeclared(*args, **kwargs):  # the built-in kernel, without its declaration
        return chunk_scan_combined(*args, **kwargs)

    case = _case(undeclared)
    assert case["status"] == "skipped" and "attribute pad_tokens" in case["message"]


def test_a_padded_failure_reproduces_with_its_pad_tokens(tmp_path):
    from test_repro import _run_script  # noqa: PLC0415

    (case,) = ssmcheck.scan(kernel=f"{KERNELS}:pads_continue_the_sequence", repro=str(tmp_path / "r"),
                            **SMALL).to_json()["cases"]
    assert case["status"] == "fail" and case["repro"]
    data = torch.load(f"{case['repro']}/inputs.pt", weights_only=True)
    assert data["live"] is not None and bool((data["kwargs"]["seq_idx"] == PAD).any())
    run = _run_script(case["repro"], tmp_path)
    assert run.returncode == 1 and run.stdout.splitlines()[-1].startswith("fail: states error"), run.stdout
