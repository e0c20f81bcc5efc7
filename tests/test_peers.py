"""The peers as named kernels (`--kernel mamba_ssm`, `--kernel vllm`), on the CPU with fake packages.

tests/fake_peers holds `vllm` and `mamba_ssm` packages with the real module paths and signatures
(vLLM 0.33, mamba_ssm 2.3.2), computed with ssmcheck's torch baseline so they are correct; the fake
vLLM also checks that its chunk metadata is what vLLM's builder makes. The real packages run on the
GPU (`.peers/`, built by make-peers); here they are kept off sys.path.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import slot_kernels
import torch
from cli_invoke import assert_usage_error, case_inputs, invoke

import ssmcheck
from ssmcheck import api
from ssmcheck.core.callables import KernelSpecError
from ssmcheck.drift import adapter as drift_adapter
from ssmcheck.drift import far_slots
from ssmcheck.drift import run as drift_run
from ssmcheck.drift import table as drift_table
from ssmcheck.peers import vllm as vllm_peer
from ssmcheck.scan import adapter as scan_adapter
from ssmcheck.scan import run as scan_run
from ssmcheck.scan.regimes import REGIMES
from ssmcheck.scan.spec import build_cases
from ssmcheck.scan.spec import resolve as scan_settings

FAKE_PEERS = Path(__file__).with_name("fake_peers")
PEERS = ("vllm", "mamba_ssm")
SMALL = {"dtype": "bf16", "chunk_size": "16", "seqlen": "40", "batch": "3", "nheads": "2", "headdim": "4",
         "dstate": "8", "ngroups": "1"}


def _forget_peers(monkeypatch) -> None:
    """No peer module imported, no real peer on sys.path, no adapter resolved before."""
    for name in [m for m in sys.modules if m.partition(".")[0] in PEERS]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if ".peers" not in p and "fake_peers" not in p])
    monkeypatch.setattr(scan_run, "_ADAPTERS", {})
    monkeypatch.setattr(drift_run, "_ADAPTERS", {})


@pytest.fixture
def fakes(monkeypatch):
    """The fake peers importable; yields a function returning a fake module (its CALLS emptied)."""
    _forget_peers(monkeypatch)
    monkeypatch.syspath_prepend(str(FAKE_PEERS))

    def fake(module: str):
        mod = importlib.import_module(module)
        mod.CALLS.clear()
        return mod

    yield fake
    for name in [m for m in sys.modules if m.partition(".")[0] in PEERS]:
        del sys.modules[name]  # imported from fake_peers during the test


class _Absent(importlib.abc.MetaPathFinder):
    """Makes the peers unimportable, whatever this machine has installed."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in PEERS:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


@pytest.fixture
def no_peers(monkeypatch):
    _forget_peers(monkeypatch)
    monkeypatch.setattr(sys, "meta_path", [_Absent(), *sys.meta_path])


VARLEN_SCAN = "vllm.model_executor.layers.mamba.ops.ssd_combined"
VLLM_SSU = "vllm.model_executor.layers.mamba.ops.mamba_ssm"
MAMBA_SCAN = "mamba_ssm.ops.triton.ssd_combined"
MAMBA_SSU = "mamba_ssm.ops.triton.selective_state_update"


def _case(**options):
    return build_cases(scan_settings({**SMALL, **options}, {}, "test"), "vllm")[0]


def _inputs(case):
    return REGIMES[case.regime].generate(case.shape(), torch.bfloat16, case.seed)


def _ints(t: torch.Tensor) -> list[int]:
    assert t.dtype == torch.int32
    return t.tolist()


# ---------------------------------------------------------------------------- vLLM's chunk metadata


def _metadata(cu, chunk_size):
    meta = vllm_peer.chunk_metadata(torch.tensor(cu, dtype=torch.int32), chunk_size)
    return _ints(meta.cu_chunk_seqlens), _ints(meta.last_chunk_indices), _ints(meta.seq_idx)


def test_chunk_metadata_of_a_lone_sequence():
    assert _metadata([0, 40], 16) == ([0, 16, 32, 40], [2], [0, 0, 0])
    assert _metadata([0, 32], 16) == ([0, 16, 32], [1], [0, 0])
    assert _metadata([0, 1], 16) == ([0, 1], [0], [0])


def test_chunk_metadata_starts_a_chunk_at_every_sequence_boundary_mid_chunk():
    # Sequences [0, 1), [1, 21), [21, 40): each cut from its own first token, so the packed
    # layout's chunk boundary at 16 and 32 is not one of vLLM's.
    assert _metadata([0, 1, 21, 40], 16) == ([0, 1, 17, 21, 37, 40], [0, 2, 4], [0, 1, 1, 2, 2])
    assert _metadata([0, 16, 48], 16) == ([0, 16, 32, 48], [0, 2], [0, 1, 1])  # on the chunk grid
    assert _metadata([0, 5, 6, 7], 4) == ([0, 4, 5, 6, 7], [1, 2, 3], [0, 0, 1, 2])  # length-1 sequences


def test_chunk_metadata_of_batch_rows_is_one_sequence_per_row(fakes):
    fake = fakes(VARLEN_SCAN)
    x = torch.randn(2, 40, 2, 4)
    B = torch.randn(2, 40, 1, 8)
    y, states = vllm_peer.chunk_scan()(x, torch.rand(2, 40, 2), -torch.ones(2), B, B.clone(), 16,
                                       return_final_states=True)
    call = fake.CALLS[-1]
    assert _ints(call["cu_seqlens"]) == [0, 40, 80]
    assert _ints(call["cu_chunk_seqlens"]) == [0, 16, 32, 40, 56, 72, 80]
    assert _ints(call["seq_idx"]) == [0, 0, 0, 1, 1, 1] and _ints(call["last_chunk_indices"]) == [2, 5]
    assert call["x_shape"] == (80, 2, 4) and y.shape == x.shape and states.shape == (2, 2, 4, 8)


@pytest.mark.parametrize(("cu", "why"), [([0, 4, 4, 9], "sequence 1 is empty"), ([1, 9], "must start at 0"),
                                         ([0], "at least one sequence")])
def test_chunk_metadata_refuses_what_vllm_cannot_take(cu, why):
    with pytest.raises(ValueError, match=why):
        vllm_peer.chunk_metadata(cu, 16)


# ---------------------------------------------------------------------------- the vLLM chunk-scan wrapper


def test_the_vllm_wrapper_returns_what_our_signature_promises(fakes):
    fakes(VARLEN_SCAN)
    inputs = _inputs(_case(regime="ragged"))  # 3 packed sequences, boundaries mid-chunk
    fn = vllm_peer.chunk_scan()
    args = (inputs.x, inputs.dt, inputs.A, inputs.B, inputs.C, 16)
    kwargs = inputs.kwargs()
    y = fn(*args, **kwargs)
    assert isinstance(y, torch.Tensor) and y.shape == inputs.x.shape and y.dtype == torch.bfloat16
    y2, varlen = fn(*args, **kwargs, return_varlen_states=True)
    y3, final, varlen3 = fn(*args, **kwargs, return_final_states=True, return_varlen_states=True)
    assert varlen.shape == (3, 2, 4, 8) and varlen.dtype == torch.bfloat16  # C's dtype: state_dtype None
    assert final.shape == (1, 2, 4, 8) and torch.equal(final[0], varlen3[-1])  # the row's last sequence
    assert torch.equal(y, y2) and torch.equal(y2, y3) and torch.equal(varlen, varlen3)
    _, fp32 = fn(*args, **kwargs, return_varlen_states=True, state_dtype=torch.float32)
    assert fp32.dtype == torch.float32


def test_vllm_needs_cu_seqlens_for_packed_sequences(fakes):
    fakes(VARLEN_SCAN)
    inputs = _inputs(_case(regime="ragged"))
    with pytest.raises(ValueError, match="seq_idx without cu_seqlens"):
        vllm_peer.chunk_scan()(inputs.x, inputs.dt, inputs.A, inputs.B, inputs.C, 16, seq_idx=inputs.seq_idx)


# ---------------------------------------------------------------------------- the scan adapter


def test_vllm_adapter_capabilities(fakes):
    adapter = scan_adapter.resolve("vllm", interpreter=True)
    assert adapter.name == "vllm" and adapter.takes_state_dtype and not adapter.takes_state_options
    assert adapter.default_state_dtype == scan_adapter.INPUTS
    assert adapter.skip_reason(_case(state_dtype="fp16")) is None
    assert "vllm takes a state_dtype keyword but no rounding/seed" in adapter.skip_reason(
        _case(state_dtype="fp16", rounding="stochastic"))
    assert "power-of-two chunk sizes, not 48" in adapter.skip_reason(_case(chunk_size="48"))
    mamba = scan_adapter.resolve("mamba_ssm", interpreter=True)
    assert mamba.name == "mamba_ssm" and not mamba.takes_state_dtype and mamba.chunk_sizes is None
    assert "takes no state_dtype/rounding/seed keywords" in mamba.skip_reason(_case(state_dtype="fp16"))


@pytest.mark.parametrize(("state_dtype", "given", "passed", "stored"), [
    ("fp32", False, None, torch.bfloat16),  # no --state-dtype: as vLLM's model code runs it, states in C's dtype
    ("fp16", False, torch.float16, torch.float16),  # a case asking for a format gets it
    ("bf16", False, torch.bfloat16, torch.bfloat16),
    ("fp32", True, torch.float32, torch.float32),  # --state-dtype fp32 on the command line
])
def test_vllm_is_told_the_state_dtype_a_case_asks_for(fakes, state_dtype, given, passed, stored):
    fake = fakes(VARLEN_SCAN)
    case = _case(regime="initial-state", state_dtype=state_dtype)
    inputs = _inputs(case)
    adapter = scan_adapter.resolve("vllm", interpreter=True, state_dtype_given=given)
    y, states = adapter.call(inputs, case)
    (call,) = fake.CALLS
    assert call["state_dtype"] == passed and states.dtype == stored and y.dtype == torch.bfloat16
    # One per sequence, in the storage dtype (as vLLM's state cache holds them); the case's own
    # initial states are values that dtype holds exactly, so the references start from the same states.
    assert call["initial_states"].dtype == stored and call["initial_states"].shape[0] == 3
    cached = adapter.cached_inputs(inputs, case).initial_states
    assert cached.dtype == inputs.initial_states.dtype and torch.equal(cached.to(stored).to(cached.dtype), cached)
    assert torch.equal(call["initial_states"], inputs.initial_states.to(stored))
    assert stored == torch.float32 or not torch.equal(cached, inputs.initial_states)  # fresh draws need rounding
    assert states.shape == (3, 2, 4, 8)


def test_states_not_in_cs_dtype_are_caught_when_vllm_was_told_nothing(fakes, monkeypatch):
    fake = fakes(VARLEN_SCAN)
    real = fake.mamba_chunk_scan_combined_varlen
    monkeypatch.setattr(fake, "mamba_chunk_scan_combined_varlen", lambda *a, **k: real(*a, **k).float())
    case = _case()
    with pytest.raises(scan_adapter.KernelOutputError, match="states has dtype fp32, expected bf16 .C's dtype"):
        scan_adapter.resolve("vllm", interpreter=True).call(_inputs(case), case)


def _calls_of_each_case(calls: list[dict], cases: list[dict]) -> list[tuple[dict, dict]]:
    """The kernel's two calls of each case in order (as it is, and without D and z), past the warm-up
    call that a GPU run makes before a shape's first case (its report holds warmup_seconds), the call for y
    alone that some cases make after them (scan.run.judges_y_alone) and the call with both return flags after that
    (scan.run.judges_both_flags)."""
    calls, pairs = list(calls), []
    for case in cases:
        if case["warmup_seconds"] is not None:
            calls.pop(0)
        pairs.append((calls.pop(0), calls.pop(0)))
        if _judges_y_alone(case["params"]):
            calls.pop(0)
        if scan_run.judges_both_flags(SimpleNamespace(**case["params"]), case_inputs(case["params"])):
            calls.pop(0)
    assert not calls, f"{len(calls)} calls past the cases'"
    return pairs


def _judges_y_alone(p: dict) -> bool:
    """Whether the case of report params `p` calls the kernel for y alone too (its inputs generated again)."""
    return scan_run.judges_y_alone(p["dtype"], case_inputs(p))


def test_scan_kernel_vllm_runs_every_smoke_case_as_vllm_runs_it(fakes):
    fake = fakes(VARLEN_SCAN)
    report = api.scan(kernel="vllm", preset="smoke")
    assert len(report.cases) == 13 and report.summary["error"] == report.summary["skipped"] == 0
    # The baseline stores its states as vLLM returned them (bf16 here): a correct kernel passes.
    assert {c.status for c in report.cases} == {"pass"}
    assert {c.data["state_storage"] for c in report.cases} == {"bf16"}
    assert all(c.error["y_max_rel"] < 0.05 for c in report.cases)
    # Each case calls the kernel twice: as it is, and without D and z (the SSM part C·h alone).
    calls = [call for call, ssm_part in _calls_of_each_case(fake.CALLS, report.data["cases"])]
    assert all(ssm_part["D"] is None for _, ssm_part in _calls_of_each_case(fake.CALLS, report.data["cases"]))
    assert all(call["state_dtype"] is None and call["states"].dtype == torch.bfloat16 for call in fake.CALLS)
    ragged = next(call for call, case in zip(calls, report.cases) if case.params["regime"] == "ragged")
    cu = _ints(ragged["cu_seqlens"])
    assert len(cu) == 3 and any(b % 16 for b in cu[1:-1])  # a boundary mid-chunk
    assert _ints(ragged["cu_chunk_seqlens"]) == _metadata(cu, 16)[0]


def test_an_element_of_out_vllm_leaves_unwritten_is_nan(fakes, monkeypatch):
    """vLLM writes y into the `out` it is given: the wrapper gives it NaN-filled, so a kernel that leaves the
    last token unwritten is non-finite there, not whatever the allocator's memory held."""
    fake = fakes(VARLEN_SCAN)
    real = fake.mamba_chunk_scan_combined_varlen

    def skips_the_last_token(*args, out, **kwargs):
        written = torch.zeros_like(out)
        states = real(*args, out=written, **kwargs)
        out[:-1] = written[:-1]
        return states

    monkeypatch.setattr(fake, "mamba_chunk_scan_combined_varlen", skips_the_last_token)
    report = api.scan(kernel="vllm", regime="normal,ragged", **SMALL)
    assert report.cases and {c.status for c in report.cases} == {"nonfinite"}
    for case in report.cases:
        # The last sequence's last token (ragged's last sequence is one token long), every head and channel.
        where = case.data["first_nonfinite"]
        last = case.params["seqlen"] - 1 if case.params["regime"] == "normal" else 0
        assert (where["sequence"], where["token"], where["tokens"], where["count"]) == (2, last, 1, 2 * 4), where


@pytest.mark.parametrize("state_dtype", [None, "fp16"])
def test_vllm_continues_from_initial_states_as_its_cache_holds_them(fakes, state_dtype):
    """vLLM takes initial states only in the dtype it stores states in: each case hands it states of
    that dtype, and the references start from the same values, so a correct kernel passes."""
    fake = fakes(VARLEN_SCAN)
    options = {} if state_dtype is None else {"state_dtype": state_dtype}
    report = api.scan(kernel="vllm", preset="smoke", regime="initial-state,long", **options)
    assert report.cases and {c.status for c in report.cases} == {"pass"}
    stored = torch.bfloat16 if state_dtype is None else torch.float16
    given = [call["initial_states"] for call in fake.CALLS if call["initial_states"] is not None]
    assert given and all(t.dtype == stored for t in given)
    # The fake is the baseline's math: started from the very states the baseline starts from, it
    # errs exactly as much (were they rounded for the kernel alone, its error would differ).
    assert all(c.error["y_max_rel"] == c.error["baseline_y_max_rel"] for c in report.cases)


def test_scan_kernel_vllm_with_state_dtype_passes_it_and_skips_stochastic(fakes, tmp_path):
    fake = fakes(VARLEN_SCAN)
    result, report = invoke("scan", "--kernel", "vllm", "--preset", "smoke", "--regime", "normal,ragged",
                            "--state-dtype", "fp16", "--rounding", "nearest,stochastic", json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    statuses = {c["id"]: (c["status"], c["message"]) for c in report["cases"]}
    assert [s for s, _ in statuses.values()].count("pass") == 2
    skipped = [m for s, m in statuses.values() if s == "skipped"]
    assert len(skipped) == 2 and all("cannot store fp16 states with stochastic rounding" in m for m in skipped)
    passed = [c for c in report["cases"] if c["status"] == "pass"]
    assert len(_calls_of_each_case(fake.CALLS, passed)) == 2  # each case, and its SSM part, told fp16:
    assert [call["state_dtype"] for call in fake.CALLS] == [torch.float16] * len(fake.CALLS)


def test_scan_kernel_mamba_ssm_passes_every_smoke_case(fakes, tmp_path):
    fake = fakes(MAMBA_SCAN)
    result, report = invoke("scan", "--kernel", "mamba_ssm", "--preset", "smoke", json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert report["summary"]["pass"] == 13 and all(c["params"]["kernel"] == "mamba_ssm" for c in report["cases"])
    each_case = _calls_of_each_case(fake.CALLS, report["cases"])
    # ragged, aligned, initial-state and aligned-initial-state; their SSM-part calls ask for y alone, with seq_idx
    varlen = [call for call, _ in each_case if call["return_varlen_states"]]
    assert len(varlen) == 4 and all(call["seq_idx"].shape == (1, 80) for call in varlen)
    assert all(call["return_final_states"] for call, _ in each_case if not call["return_varlen_states"])
    assert not any(ssm["return_final_states"] or ssm["return_varlen_states"] for _, ssm in each_case)
    assert all(ssm["seq_idx"] is not None for (call, ssm) in each_case if call["return_varlen_states"])


def test_a_chunk_size_vllm_cannot_take_is_a_usage_error(fakes):
    result, _ = invoke("scan", "--kernel", "vllm", "--preset", "smoke", "--chunk-size", "48")
    assert_usage_error(result, "--chunk-size")
    assert "power-of-two" in result.stderr


# ---------------------------------------------------------------------------- drift


def test_drift_kernel_vllm_runs_round_to_nearest_and_skips_its_stochastic_rounding_without_sm_100(fakes, tmp_path):
    fake = fakes(VLLM_SSU)
    result, report = invoke("drift", "--kernel", "vllm", "--preset", "smoke", json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert report["settings"]["rounding"] == "implemented by the kernel"
    assert {(c["params"]["rounding"], c["status"]) for c in report["cases"]} == {("nearest", "pass"),
                                                                                 ("stochastic", "skipped")}
    assert report["summary"]["pass"] == report["summary"]["skipped"] == 2
    # On this machine: no GPU of sm_100 (its PTX cvt.rs), so vLLM's stochastic rounding is never asked for.
    assert all("vLLM's stochastic rounding (PTX cvt.rs) needs an NVIDIA GPU of sm_100 or newer" in c["message"]
               for c in report["cases"] if c["status"] == "skipped")
    assert not any(call["enable_stochastic_rounding"] for call in fake.CALLS)
    assert fake.CALLS and all(call["state_dtype"] == torch.float16 and call["z"] is None for call in fake.CALLS)
    # The padded-slot check: pad rows on vLLM's null block, slot 0, which no live row takes.
    for case in (c for c in report["cases"] if c["status"] != "skipped"):
        slots = case["slots"]
        assert slots["pad_slot_id"] == 0 and 0 not in [s for r, s in enumerate(slots["slots"])
                                                       if r not in slots["pad_rows"]]
        assert slots["pad_out"]["outputs"] == "written" and slots["untouched"]["status"] == "pass"
    assert any(call["null_block_id"] == 0 and call["state_batch_indices"] is not None for call in fake.CALLS)


def test_an_element_of_out_the_vllm_state_update_leaves_unwritten_is_nan(fakes, monkeypatch):
    """Without an `out` of the caller's, the vLLM wrapper gives vLLM a NaN-filled one: a step that leaves the last
    channel unwritten is non-finite there from the first step, not whatever the allocator's memory held."""
    fake = fakes(VLLM_SSU)
    real = fake.selective_state_update

    def skips_the_last_channel(state, x, *args, out, **kwargs):
        written = torch.zeros_like(out)
        real(state, x, *args, out=written, **kwargs)
        out[..., :-1] = written[..., :-1]

    monkeypatch.setattr(fake, "selective_state_update", skips_the_last_channel)
    report = api.drift(kernel="vllm", preset="smoke", rounding=["nearest"])
    assert report.cases and {c.status for c in report.cases} == {"nonfinite"}
    for case in report.cases:
        where = case.data["first_nonfinite"]
        assert (where["output"], where["step"], where["channel"]) == ("out", 1, case.params["headdim"] - 1), where


def test_drift_kernel_vllm_stochastic_rounding_is_asked_for_where_it_can_run(fakes, tmp_path, monkeypatch):
    # As on a GPU of sm_100: the fp16 cases run with vLLM's enable_stochastic_rounding, judged as stochastic
    # rounding (the fake rounds with torch's SR), and the bf16 ones are skipped: cvt.rs.f16x2 makes fp16 only.
    fake = fakes(VLLM_SSU)
    monkeypatch.setattr(vllm_peer, "_capability", lambda: (10, 0))
    result, report = invoke("drift", "--kernel", "vllm", "--preset", "smoke", "--state-dtype", "fp16,bf16",
                            "--rounding", "stochastic", json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    by_dtype = {}
    for case in report["cases"]:
        by_dtype.setdefault(case["params"]["state_dtype"], set()).add((case["status"], case["message"]))
    assert {status for status, _ in by_dtype["fp16"]} == {"pass"}
    assert by_dtype["bf16"] == {("skipped", "vLLM's stochastic rounding stores fp16 states only, not bf16")}
    assert fake.CALLS and all(call["enable_stochastic_rounding"] for call in fake.CALLS)


def test_drift_kernel_vllm_configs_all_pins_each_launch_config_of_its_tables(fakes, tmp_path, monkeypatch):
    # vLLM picks the state update's (BLOCK_SIZE_M, num_warps) by batch x heads; --configs all pins each through its
    # own override hook, so a bug of one config shows at any batch: here the fake writes NaN under (32, 8).
    fake = fakes(VLLM_SSU)
    real = fake.selective_state_update

    def nan_under_32_by_8(state, x, *args, out, **kwargs):
        real(state, x, *args, out=out, **kwargs)
        if fake._ssm_config_override == (32, 8):
            out[..., 0] = float("nan")

    monkeypatch.setattr(fake, "selective_state_update", nan_under_32_by_8)
    result, report = invoke("drift", "--kernel", "vllm", "--preset", "smoke", "--regime", "normal", "--rounding",
                            "nearest", "--configs", "all", json_path=tmp_path / "r.json")
    assert result.exit_code == 3, result.output
    cases = report["cases"]
    assert len(cases) == len(vllm_peer.SSU_BLOCK_SIZE_M) * len(vllm_peer.SSU_NUM_WARPS)
    pinned = {(c["params"]["config"]["kwargs"]["BLOCK_SIZE_M"], c["params"]["config"]["num_warps"]): c["status"]
              for c in cases}
    assert pinned == {(m, w): "nonfinite" if (m, w) == (32, 8) else "pass"
                      for m in vllm_peer.SSU_BLOCK_SIZE_M for w in vllm_peer.SSU_NUM_WARPS}
    assert "_selective_scan_update_kernel config 15 (BLOCK_SIZE_M=32, num_stages=3, num_warps=8): nonfinite in 1/1" \
        in result.output
    assert fake._ssm_config_override is None  # restored: vLLM picks again
    (table,) = report["settings"]["autotuned"]
    assert table == (f"{VLLM_SSU}._selective_scan_update_kernel (16 configs, picked by vLLM's tables by batch x "
                     "heads, not an autotuner)")
    assert {call["config"] for call in fake.CALLS} == set(pinned)


def _draft_variant(fake, monkeypatch, variant):
    """The fake vLLM with its speculative path replaced by `variant(real, **keywords)`."""
    real = fake.selective_state_update

    @functools.wraps(real)  # its signature: the wrapper sees vLLM's speculative keywords
    def update(*args, num_accepted_tokens=None, **kwargs):
        if num_accepted_tokens is None:
            return real(*args, **kwargs)
        return variant(real, *args, num_accepted_tokens=num_accepted_tokens, **kwargs)

    monkeypatch.setattr(fake, "selective_state_update", update)


def _starts_from_the_first_source(real, *args, state_batch_indices, num_accepted_tokens, **kwargs):
    # Planted: num_accepted_tokens read as 1, so every row starts from the slot of its first draft token.
    return real(*args, state_batch_indices=state_batch_indices, num_accepted_tokens=torch.ones_like(
        num_accepted_tokens), **kwargs)


def _stores_the_last_token_only(real, state, *args, dst_state_batch_indices, **kwargs):
    # Planted: every token's state goes to the null block but the last one's.
    only_last = torch.zeros_like(dst_state_batch_indices)
    only_last[:, -1] = dst_state_batch_indices[:, -1]
    return real(state, *args, dst_state_batch_indices=only_last, **kwargs)


def _writes_back_the_source(real, state, *args, state_batch_indices, dst_state_batch_indices, num_accepted_tokens,
                            **kwargs):
    # Planted: right, and then the last token's state is also stored over the row's source slot.
    real(state, *args, state_batch_indices=state_batch_indices, dst_state_batch_indices=dst_state_batch_indices,
         num_accepted_tokens=num_accepted_tokens, **kwargs)
    rows = torch.arange(len(num_accepted_tokens))
    sources = state_batch_indices[rows, (num_accepted_tokens - 1).long()].long()
    state[sources] = state[dst_state_batch_indices[:, -1].long()]


def _stores_the_tokens_not_kept(real, state, *args, dst_state_batch_indices, **kwargs):
    # Planted: right, but a token whose destination is the null block has its state stored there anyway (here
    # the state of the token before it, whose destination is kept).
    result = real(state, *args, dst_state_batch_indices=dst_state_batch_indices, **kwargs)
    for b, t in (dst_state_batch_indices == 0).nonzero().tolist():
        state[0] = state[dst_state_batch_indices[b, t - 1].long()]
    return result


def _rows_at_a_fixed_stride(real, *args, cu_seqlens, **kwargs):
    # Planted: row b's tokens taken from b * 3 on (the most draft tokens a row has), not from cu_seqlens[b].
    fixed = (torch.arange(len(cu_seqlens), device=cu_seqlens.device) * 3).clamp(max=int(cu_seqlens[-1]))
    return real(*args, cu_seqlens=fixed.to(cu_seqlens.dtype), **kwargs)


def _every_token_gets_the_first_tokens_out(real, state, x, *args, out, cu_seqlens, **kwargs):
    # Planted: the states are right, but each row's out holds its first token's for every token.
    real(state, x, *args, out=out, cu_seqlens=cu_seqlens, **kwargs)
    for start, end in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()):
        out[start:end] = out[start]


def test_drift_kernel_vllm_verifies_draft_tokens_as_speculative_decoding_does(fakes, tmp_path):
    fake = fakes(VLLM_SSU)
    result, report = invoke("drift", "--kernel", "vllm", "--preset", "smoke", "--rounding", "nearest",
                            "--batch", "3", json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    for case in report["cases"]:
        spec = case["slots"]["speculative"]
        assert case["slots"]["drafts"]["status"] == case["slots"]["kept"]["status"] == "pass"
        assert spec["tokens"] == 3 and spec["accepted"] == [3, 2, 1] and spec["lengths"] == [2, 3, 2]
        # Columns past a row's tokens, and the last row's last token (not kept), have the null block, 0, for
        # destination; no source or kept token has it.
        assert spec["not_kept"] == [2, 1] and [row.count(0) for row in spec["destinations"]] == [1, 0, 2]
        slots = [s for row in spec["sources"] + spec["destinations"] for s in row if s != 0]
        assert len(set(slots)) == len(slots) == 9 + 2 + 3 + 1
        assert 0 not in [s for row in spec["sources"] for s in row]
        assert case["slots"]["drafts"]["tokens"] == 7
    verified = [call for call in fake.CALLS if call["num_accepted_tokens"] is not None]
    assert len(verified) == len(report["cases"])


# 2 x 8 x 16 = 256 elements a slot: at a wrap of 2**14 elements (drift.far_slots.FAR_ELEMENTS lowered to it) the
# far-drafts check's slots lie from 64 on, and a destination offset formed modulo 2**14 lands on slots 0..15.
SMALL_SLOTS = ("--regime", "normal", "--state-dtype", "fp16", "--rounding", "nearest", "--batch", "3", "--nheads", "2",
               "--headdim", "8", "--dstate", "16", "--steps", "2")


def _destinations_wrapping(real, state, *args, dst_state_batch_indices, **kwargs):
    # Planted: a destination's offset, slot x slot stride, wraps at 2**14 elements, as one formed in 32-bit integers
    # wraps at 2**32: a far token's state lands on the slot its wrapped offset names (its sources are read right).
    wrapped = slot_kernels.wrapped_slots(dst_state_batch_indices, state)
    return real(state, *args, dst_state_batch_indices=wrapped.to(dst_state_batch_indices.dtype), **kwargs)


@pytest.mark.parametrize("wraps", [False, True])
def test_draft_slots_past_2_32_elements_fail_where_a_destination_offset_wraps(fakes, tmp_path, monkeypatch, wraps):
    """The far-drafts check (drift.far_slots.run_draft_check), at a wrap of 2**14 elements on the CPU: the
    speculative call's source and destination slots past it, every other slot FILL; a kernel whose destination
    offsets wrap writes a near slot, which only this check's pool reaches."""
    monkeypatch.setattr(far_slots, "FAR_ELEMENTS", slot_kernels.WRAP_ELEMENTS)
    fake = fakes(VLLM_SSU)
    if wraps:
        _draft_variant(fake, monkeypatch, _destinations_wrapping)
    result, report = invoke("drift", "--kernel", "vllm", "--preset", "smoke", *SMALL_SLOTS,
                            json_path=tmp_path / "r.json")
    (case,) = report["cases"]
    checks = case["slots"]
    far = checks["far_drafts"]
    assert far["pool_slots"] == 64 + 13 and far["slot_elements"] == 256
    # The pad id, vLLM's null block 0, stays below the far slots; every other slot lies past 2**14 elements.
    assert all(s == 0 or s >= 64 for row in far["sources"] + far["destinations"] for s in row)
    assert [row.count(0) for row in far["destinations"]] == [1, 1]
    assert checks["drafts"]["status"] == checks["kept"]["status"] == checks["far_slot"]["status"] == "pass"
    if not wraps:
        assert result.exit_code == 0 and far["status"] == "pass" and far["written"] == [], result.output
        assert far["worst"]["state_rel"] < 1e-2 and far["tokens"] == 5
        return
    assert result.exit_code == 1 and case["status"] == far["status"] == "fail", result.output
    first = far["written"][0]
    (b, t, slot), = [(b, t, s) for b, row in enumerate(far["destinations"]) for t, s in enumerate(row)
                     if s != 0 and s * 256 % 2**14 // 256 == first]
    assert (f"draft tokens' slots past 2**32 elements: the step wrote slot {first} (no row's) and "
            f"{len(far['written']) - 1} more: row {b} token {t}'s destination slot {slot} lies {slot * 256:,} "
            f"elements in, {slot * 256 % 2**14:,} modulo 16,384 (its offset formed in 32-bit integers)") in case["message"]
    # In the table's slots column: the far twin of drafts as `F`, beside far_slot's `f`.
    results = ssmcheck.drift(kernel="vllm", preset="smoke", regime=["normal"], state_dtype=["fp16"],
                             rounding=["nearest"], batch=[3], nheads=[2], headdim=[8], dstate=[16], steps=2).results
    assert drift_table._slots(results[0]).split()[-2:] == ["k✓", "F✗"]


def test_a_vllm_without_speculative_decoding_gets_no_draft_check(fakes, tmp_path, monkeypatch):
    fake = fakes(VLLM_SSU)
    real = fake.selective_state_update

    def older(state, x, dt, A, B, C, D, dt_bias, z=None, dt_softplus=False, state_batch_indices=None,
              null_block_id=0, out=None):
        return real(state, x, dt, A, B, C, D, dt_bias, z=z, dt_softplus=dt_softplus,
                    state_batch_indices=state_batch_indices, null_block_id=null_block_id, out=out)

    monkeypatch.setattr(fake, "selective_state_update", older)
    result, report = invoke("drift", "--kernel", "vllm", "--preset", "smoke", "--rounding", "nearest",
                            json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert all(c["slots"]["live"]["status"] == "pass" and "drafts" not in c["slots"] for c in report["cases"])


def test_scan_kernel_vllm_writes_its_final_states_into_a_cache_as_vllm_0_33_does(fakes, tmp_path):
    fake = fakes(VARLEN_SCAN)
    result, report = invoke("scan", "--kernel", "vllm", "--preset", "smoke", "--invariance", "--regime",
                            "normal,ragged,initial-state", json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    for case in report["cases"]:
        write = case["invariance"]["cache_write"]
        assert write["status"] == "pass" and write["differs"] == write["changed"] == write["unwritten"] == []
        assert 0 not in write["slots"] and write["cache_slots"] - 1 not in write["slots"]
    written = [call for call in fake.CALLS if call["final_state_indices"] is not None]
    assert len(written) == len(report["cases"]) and "c✓" in result.stdout


def test_a_vllm_without_the_fused_cache_write_gets_no_cache_check(fakes, tmp_path, monkeypatch):
    fake = fakes(VARLEN_SCAN)
    real = fake.mamba_chunk_scan_combined_varlen

    def older(x, dt, A, B, C, chunk_size, cu_seqlens, cu_chunk_seqlens, last_chunk_indices, seq_idx, out, D=None,
              z=None, dt_bias=None, initial_states=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
              return_intermediate_states=False, state_dtype=None):  # vLLM 0.31's signature
        return real(x, dt, A, B, C, chunk_size, cu_seqlens, cu_chunk_seqlens, last_chunk_indices, seq_idx, out, D=D,
                    z=z, dt_bias=dt_bias, initial_states=initial_states, dt_softplus=dt_softplus, dt_limit=dt_limit,
                    return_intermediate_states=return_intermediate_states, state_dtype=state_dtype)

    monkeypatch.setattr(fake, "mamba_chunk_scan_combined_varlen", older)
    assert not scan_adapter.resolve("vllm", interpreter=True).writes_cache
    result, report = invoke("scan", "--kernel", "vllm", "--preset", "smoke", "--invariance", "--regime", "ragged",
                            json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    write = report["cases"][0]["invariance"]["cache_write"]
    assert write["status"] == "skipped" and "writes no state cache" in write["message"]


@pytest.mark.parametrize(("variant", "check", "status", "words"), [
    (_starts_from_the_first_source, "drafts", "fail", "draft tokens: row "),
    (_stores_the_last_token_only, "drafts", "nonfinite", "non-finite (NaN where it was not written)"),
    (_writes_back_the_source, "kept", "fail", "slots kept: the call wrote slot "),
    (_stores_the_tokens_not_kept, "kept", "fail",
     "slots kept: the call wrote slot 0 (the pad id: row 2 token 1's destination)"),
    (_rows_at_a_fixed_stride, "drafts", "fail", "draft tokens: row "),
    (_every_token_gets_the_first_tokens_out, "drafts", "fail", "farther from C·(its stored state) than"),
])
def test_the_speculative_check_catches_a_planted_bug(fakes, tmp_path, monkeypatch, variant, check, status, words):
    fake = fakes(VLLM_SSU)
    _draft_variant(fake, monkeypatch, variant)
    _, report = invoke("drift", "--kernel", "vllm", "--preset", "smoke", "--rounding", "nearest", "--batch", "3",
                       "--regime", "normal", json_path=tmp_path / "r.json")
    (case,) = report["cases"]
    assert case["slots"]["speculative"]["accepted"] == [3, 2, 1]
    assert case["status"] == status and case["slots"][check]["status"] == status
    assert words in case["message"], case["message"]
    others = {name: c["status"] for name, c in case["slots"].items() if isinstance(c, dict) and "status" in c}
    assert {name for name, s in others.items() if s != "pass"} == {check}


def _drafts_rounded_to_nearest(real, *args, enable_stochastic_rounding=False, **kwargs):
    # Planted: the speculative path stores every token's state rounded to nearest, whatever it is asked.
    return real(*args, enable_stochastic_rounding=False, **kwargs)


@pytest.mark.parametrize("planted", [False, True])
def test_the_speculative_check_tells_a_draft_path_rounding_to_nearest(fakes, tmp_path, monkeypatch, planted):
    """Stochastically, the first draft tokens' stores are exact steps from the sources, rounded: their squared errors
    against stochastic rounding's spread (stats.nearest_z) tell a draft path that rounds to nearest, whose errors
    lie within the tolerance; the fake's stochastic draft path passes."""
    fake = fakes(VLLM_SSU)
    monkeypatch.setattr(vllm_peer, "_capability", lambda: (10, 0))  # as on a GPU of sm_100, whose SR vLLM's is
    if planted:
        _draft_variant(fake, monkeypatch, _drafts_rounded_to_nearest)
    _, report = invoke("drift", "--kernel", "vllm", "--preset", "smoke", "--rounding", "stochastic",
                       "--state-dtype", "fp16", "--batch", "3", "--regime", "normal", json_path=tmp_path / "r.json")
    (case,) = report["cases"]
    drafts = case["slots"]["drafts"]
    if not planted:
        assert drafts["status"] == "pass" and abs(drafts["nearest_z"]) < 4, drafts
        return
    assert drafts["status"] == "fail" and drafts["nearest_z"] < -10, drafts
    assert "the first tokens' stores rounded to nearest" in drafts["message"], drafts["message"]
    assert drafts["worst"]["state_rel"] <= 2 * drafts["worst"]["baseline_state_rel"] + 1e-5  # within the tolerance


def _pool_taken_as_contiguous(real, state, *args, **kwargs):
    # Planted: the draft path addresses slot s at s times a state's size, as if the pool were contiguous.
    contiguous = torch.empty(state.shape).stride()
    return real(state.as_strided(state.shape, contiguous, state.storage_offset()), *args, **kwargs)


def test_the_speculative_check_runs_on_a_paged_pool(fakes, tmp_path, monkeypatch):
    fake = fakes(VLLM_SSU)
    _draft_variant(fake, monkeypatch, _pool_taken_as_contiguous)
    _, report = invoke("drift", "--kernel", "vllm", "--preset", "smoke", "--rounding", "nearest", "--batch", "3",
                       "--regime", "normal", json_path=tmp_path / "r.json")
    (case,) = report["cases"]
    kept = case["slots"]["kept"]
    assert case["status"] != "pass" and kept["status"] == "fail" and kept["past_state"], case["message"]
    assert "the pages after the states of slots " in kept["message"], kept["message"]
    assert case["slots"]["drafts"]["status"] != "pass"
    assert case["slots"]["live"]["status"] == "pass"  # the one-token path is vLLM's own


@pytest.mark.parametrize(("has_sr", "dtype", "capability", "reason"), [
    (True, torch.float16, (10, 0), None),
    (True, torch.float16, (12, 0), None),
    (True, torch.float16, (9, 0), "needs an NVIDIA GPU of sm_100 or newer; this one is sm_90"),
    (True, torch.float16, None, "needs an NVIDIA GPU of sm_100 or newer: none here"),
    (True, torch.bfloat16, (10, 0), "fp16 states only, not bf16"),
    (False, torch.float16, (10, 0), "has no stochastic rounding (no enable_stochastic_rounding)"),
])
def test_where_vllm_stochastic_rounding_cannot_run(has_sr, dtype, capability, reason):
    said = vllm_peer.stochastic_rounding_unavailable(has_sr, dtype, capability)
    assert said is None if reason is None else reason in said


def test_drift_kernel_mamba_ssm_runs(fakes, tmp_path):
    fake = fakes(MAMBA_SSU)
    result, report = invoke("drift", "--kernel", "mamba_ssm", "--preset", "smoke", json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert report["summary"]["pass"] == 2 and fake.CALLS
    assert all(c["slots"]["pad_slot_id"] == -1 and c["slots"]["pad_out"]["outputs"] == "zeros" for c in report["cases"])
    adapter = drift_adapter.resolve("mamba_ssm", 10, "software", True)
    assert adapter.name == "mamba_ssm" and not adapter.takes_rounding and not adapter.takes_seed


def test_vllm_state_update_gets_zeros_for_a_missing_d_or_dt_bias(fakes):
    fake = fakes(VLLM_SSU)
    state = torch.randn(2, 3, 4, 8).half()
    x, dt = torch.randn(2, 3, 4), torch.rand(3, 1).expand(2, 3, 4)
    A = -torch.rand(3, 1, 1).expand(3, 4, 8)
    B, C = torch.randn(2, 1, 8), torch.randn(2, 1, 8)
    expected_state = state.clone()
    expected = drift_adapter.torch_state_update(expected_state, x, dt, A, B, C)
    out = vllm_peer.state_update()(state, x, dt, A, B, C)
    assert torch.equal(out, expected) and torch.equal(state, expected_state)
    (call,) = fake.CALLS
    assert call["D"].shape == call["dt_bias"].shape == (3, 4) and call["D"].stride() == (0, 0)
    assert not call["D"].any() and not call["dt_bias"].any()


# ---------------------------------------------------------------------------- not importable


@pytest.mark.parametrize(("command", "kernel", "missing"), [
    ("scan", "vllm", "vllm"), ("scan", "mamba_ssm", "mamba_ssm"),
    ("drift", "vllm", "vllm"), ("drift", "mamba_ssm", "mamba_ssm"),
])
def test_a_peer_that_is_not_importable_is_a_usage_error(no_peers, command, kernel, missing):
    result, _ = invoke(command, "--kernel", kernel, "--preset", "smoke")
    assert_usage_error(result, f"--kernel {kernel}")
    assert "cannot import" in result.stderr and f"No module named '{missing}" in result.stderr


def test_the_api_raises_usage_error_for_a_missing_peer(no_peers):
    with pytest.raises(ssmcheck.UsageError, match="--kernel vllm: cannot import vLLM's Mamba2 ops"):
        ssmcheck.scan(kernel="vllm", preset="smoke")
    with pytest.raises(KernelSpecError, match="^--kernel mamba_ssm: cannot import mamba_ssm's Triton ops: No module"):
        scan_adapter.resolve("mamba_ssm", interpreter=True)



def test_the_vllm_wrappers_name_vllms_kernels_for_the_autotuner_search(fakes):
    """--configs searches from the kernel a wrapper names (core.autotune.ORIGIN): vLLM's, not ssmcheck.peers."""
    from ssmcheck.core import autotune

    for factory, module, name in ((vllm_peer.chunk_scan, VARLEN_SCAN, "mamba_chunk_scan_combined_varlen"),
                                  (vllm_peer.state_update, VLLM_SSU, "selective_state_update")):
        origin = getattr(factory(), autotune.ORIGIN)
        assert origin is getattr(fakes(module), name)


def test_padded_regime_skips_vllm_and_runs_mamba_ssm(fakes):
    fakes(VARLEN_SCAN)
    case = _case(regime="padded")
    reason = scan_adapter.resolve("vllm", True).skip_reason(case)
    assert reason is not None and "takes no pad tokens" in reason and "cu_seqlens" in reason
    fakes(MAMBA_SCAN)
    assert scan_adapter.resolve("mamba_ssm", True).skip_reason(case) is None


def test_the_vllm_wrapper_forgets_the_configs_vllms_launcher_kept(fakes, monkeypatch):
    """vLLM 0.33's launcher keeps the autotuner's choice per key and launches it directly afterwards: a config
    pinned later would never run. Each call through the wrapper starts with that store empty."""
    import types  # noqa: PLC0415

    fakes(VARLEN_SCAN)
    launcher = types.ModuleType("vllm.model_executor.layers.mamba.ops.triton_helpers")
    launcher._autotuned_configs = {("_chunk_scan_fwd_kernel", 64): "a config kept by an earlier call"}
    monkeypatch.setitem(sys.modules, launcher.__name__, launcher)
    x = torch.randn(1, 40, 2, 4)
    B = torch.randn(1, 40, 1, 8)
    vllm_peer.chunk_scan()(x, torch.rand(1, 40, 2), -torch.ones(2), B, B.clone(), 16)
    assert launcher._autotuned_configs == {}
