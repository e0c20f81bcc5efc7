"""`ssmcheck scan --invariance` as users run it: the built-in kernels pass the serving-shaped checks, and each
check catches the planted bug of its class (tests/serving_kernels.py); plus the cutting of inputs it rests on."""

from pathlib import Path

import pytest
import torch
from cli_invoke import assert_usage_error, invoke
from hypothesis import given, settings
from hypothesis import strategies as st

from ssmcheck.core.tolerance import Tolerance
from ssmcheck.scan import invariance
from ssmcheck.scan.inputs import ScanShape
from ssmcheck.scan.regimes import REGIMES
from ssmcheck.scan.sequences import Piece, packed, scattered, split_points, unpacked, whole_sequences

SERVING = str(Path(__file__).with_name("serving_kernels.py"))
SMOKE = ["--preset", "smoke", "--invariance"]


def scan(*args, json_path=None):
    return invoke("scan", *args, json_path=json_path)


def checks(report) -> list[dict]:
    return [case["invariance"] for case in report["cases"]]


def test_the_builtin_kernels_pass_every_check_of_the_smoke_preset(tmp_path):
    result, report = scan(*SMOKE, json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert report["summary"]["pass"] == 13 and report["settings"]["decode_kernel"] == "builtin"
    ran = {name: 0 for name in ("batch", "split", "prefill_decode", "cache_write")}
    for case in checks(report):
        for name, check in case.items():
            assert check["status"] in ("pass", "skipped"), check
            ran[name] += check["status"] == "pass"
    # The built-in scan is bitwise batch-invariant: each sequence alone gives the packed run's bits.
    assert all(c["batch"]["identical"] for c in checks(report) if c["batch"]["status"] == "pass")
    # batch 1 (long) has nothing to pack; long's decode steps get dt processed, its dt_limit applied (the state
    # update takes none). The built-in scan returns its final states: it writes no cache.
    assert ran == {"batch": 12, "split": 13, "prefill_decode": 13, "cache_write": 0}, ran
    assert "b✓ s✓ p✓ c–" in result.stdout


def test_the_baseline_run_as_the_kernel_declares_batch_invariance_within_tolerance(tmp_path):
    """`--kernel torch` sums a packed batch in other shapes than a sequence alone (fp32 last bits differ): its
    batch check is judged by the tolerance rule unless `--batch-invariance exact` is asked for."""
    args = ("--kernel", "torch", "--invariance", "--regime", "ragged", "--dtype", "fp32", "--batch", "3")
    result, report = scan(*args, json_path=tmp_path / "t.json")
    assert result.exit_code == 0, result.output
    [batch] = [c["batch"] for c in checks(report)]
    assert batch["status"] == "pass" and batch["mode"] == "tolerance" and not batch["identical"]
    exact, report = scan(*args, "--batch-invariance", "exact", json_path=tmp_path / "e.json")
    assert exact.exit_code == 1 and report["cases"][0]["message"].startswith("batch invariance: sequence")
    # the differences are within the rule: the message says which declaration judges by it
    assert report["cases"][0]["message"].endswith("; within the tolerance rule, which --batch-invariance tolerance "
                                                  "judges by, for a kernel whose results depend on the packing by "
                                                  "design"), report["cases"][0]["message"]


@pytest.mark.parametrize("regime", ["ragged", "initial-state"])
def test_stochastic_state_storage_keeps_the_builtin_scan_batch_invariant(tmp_path, regime):
    # Philox counters are sequence-relative: a sequence rounds its stored states the same alone or packed
    # (found on the H200: global chunk indices made every packed sequence but the first draw other bits).
    result, report = scan(*SMOKE, "--regime", regime, "--dtype", "fp32", "--batch", "4", "--state-dtype", "fp16",
                          "--rounding", "stochastic", json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    [case] = report["cases"]
    assert case["state_storage"].startswith("fp16") and "stochastic" in str(case["params"]["rounding"])
    batch = case["invariance"]["batch"]
    assert batch["status"] == "pass" and batch["identical"] and batch["sequences"] == 4


def test_batch_invariance_catches_outputs_that_depend_on_batch_mates(tmp_path):
    result, report = scan(*SMOKE, "--kernel", f"{SERVING}:batch_dependent", "--regime", "normal,ragged",
                          "--dtype", "fp32", json_path=tmp_path / "r.json")
    assert result.exit_code == 1, result.output
    for case in report["cases"]:
        assert case["status"] == "fail" and case["message"].startswith("batch invariance: sequence 0 run alone")
        assert case["error"]["worst_ratio"] < 2  # the plain check passes it: its errors are the baseline's size
        batch = case["invariance"]["batch"]
        assert batch["status"] == "fail" and not batch["identical"] and batch["worst"]["max_abs"] > 0
        assert case["invariance"]["split"]["status"] == case["invariance"]["prefill_decode"]["status"] == "pass"


def test_declared_batch_variance_is_judged_by_the_tolerance_rule(tmp_path):
    result, report = scan(*SMOKE, "--kernel", f"{SERVING}:batch_dependent", "--regime", "normal", "--dtype", "fp32",
                          "--batch-invariance", "tolerance", json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    batch = report["cases"][0]["invariance"]["batch"]
    assert batch["mode"] == "tolerance" and not batch["identical"] and 0 < batch["worst"]["y_rel"] < 1e-5


def test_split_invariance_catches_a_continuation_that_ignores_its_state_mid_chunk(tmp_path):
    result, report = scan(*SMOKE, "--kernel", f"{SERVING}:ignores_midchunk_initial_state", "--regime", "ragged",
                          "--batch", "4", json_path=tmp_path / "r.json")
    assert result.exit_code == 1, result.output
    case = report["cases"][0]
    split = case["invariance"]["split"]
    assert case["error"]["worst_ratio"] < 2 and split["status"] == "fail"
    assert case["message"].startswith("split invariance (cut at tokens")
    assert split["y_rel"] > 2 * split["baseline_y_rel"] and split["state_rel"] > 2 * split["baseline_state_rel"]
    assert any(p % 16 for p in split["points"])  # cut mid-chunk


def test_a_check_whose_kernel_raises_is_an_error_named_first_with_the_raising_line(tmp_path):
    result, report = scan(*SMOKE, "--kernel", f"{SERVING}:one_initial_state_per_row", "--regime", "ragged",
                          "--batch", "4", json_path=tmp_path / "r.json")
    assert result.exit_code == 4, result.output
    [case] = report["cases"]
    split = case["invariance"]["split"]
    assert case["status"] == split["status"] == "error" and case["invariance"]["batch"]["status"] == "pass"
    # A bare assert has no message: the check names where it was raised, as the case's own errors do.
    assert "raised AssertionError at serving_kernels.py:" in split["message"]
    assert "assert initial_states is None" in split["message"]
    assert case["message"].startswith("split invariance: the kernel (second part")


def test_prefill_decode_catches_a_decode_that_disagrees_with_the_prefill(tmp_path):
    result, report = scan(*SMOKE, "--decode-kernel", f"{SERVING}:decode_ignores_z", "--regime", "normal",
                          json_path=tmp_path / "r.json")
    assert result.exit_code == 1, result.output
    case = report["cases"][0]
    decode = case["invariance"]["prefill_decode"]
    assert decode["status"] == "fail" and case["message"].startswith("prefill→decode: hand-off step y error")
    assert decode["handoff_y_rel"] > 100 * decode["baseline_handoff_y_rel"] and decode["decode_steps"] == 4
    assert report["settings"]["decode_kernel"].endswith("decode_ignores_z")
    assert "p✗" in result.stdout


def test_a_correct_cache_write_passes_and_a_kernel_without_one_skips_the_check(tmp_path):
    result, report = scan(*SMOKE, "--kernel", f"{SERVING}:cache_write_correct", "--regime", "normal,ragged",
                          "--dtype", "fp32", json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    for case in report["cases"]:
        write = case["invariance"]["cache_write"]
        assert write["status"] == "pass" and write["mode"] == "exact" and write["y_identical"]
        assert len(write["slots"]) == (2 if case["params"]["regime"] == "ragged" else case["params"]["batch"])
        assert write["cache_slots"] == len(write["slots"]) + 3 and {0, write["cache_slots"] - 1}.isdisjoint(
            write["slots"])
    _, report = scan(*SMOKE, "--regime", "normal", "--dtype", "fp32", json_path=tmp_path / "b.json")
    write = report["cases"][0]["invariance"]["cache_write"]
    assert write["status"] == "skipped" and "takes no final_states_out" in write["message"]


@pytest.mark.parametrize(("kernel", "words"), [
    ("cache_write_at_sequence_index", "wrote slot 0 (no sequence's)"),
    ("cache_write_all_heads_but_the_last", "left unwritten in 64 of 128 elements"),
    ("cache_write_through_bf16", "differs from the state the kernel returns without the cache"),
    ("cache_write_as_if_contiguous", "(the pool's slot stride is 160 elements, a state 128: a kernel that takes "
                                     "one for the other writes there)"),
])
def test_the_cache_write_check_catches_a_planted_bug(tmp_path, kernel, words):
    result, report = scan(*SMOKE, "--kernel", f"{SERVING}:{kernel}", "--regime", "ragged", "--dtype", "fp32",
                          json_path=tmp_path / "r.json")
    assert result.exit_code == 1, result.output
    [case] = report["cases"]
    checks = case["invariance"]
    assert case["status"] == "fail" and case["error"]["worst_ratio"] < 2  # the plain check passes it
    assert checks["cache_write"]["status"] == "fail" and case["message"].startswith("cache write (slots ")
    assert words in case["message"], case["message"]
    assert {name for name, c in checks.items() if c["status"] != "pass"} == {"cache_write"}
    assert "c✗" in result.stdout


def test_invariance_is_off_unless_asked(tmp_path):
    result, report = scan("--preset", "smoke", "--regime", "normal", "--kernel", "torch", json_path=tmp_path / "r.json")
    assert result.exit_code == 0 and report["cases"][0]["invariance"] is None
    assert "invariance" not in result.stdout and report["settings"]["decode_kernel"] is None


def test_the_thorough_preset_runs_the_checks():
    from ssmcheck.core.presets import load_preset

    assert load_preset("thorough", "scan")["invariance"] is True


@pytest.mark.parametrize("args, named", [
    (["--invariance=yes"], "--invariance"),
    (["--invariance", "--batch-invariance", "fuzzy"], "fuzzy"),
    (["--batch-invariance", "tolerance"], "--batch-invariance tolerance"),
    (["--decode-kernel", "builtin"], "--decode-kernel builtin"),
    (["--invariance", "--decode-kernel", "nowhere.py:step"], "--decode-kernel 'nowhere.py:step'"),
])
def test_usage_errors(args, named):
    assert_usage_error(scan("--preset", "smoke", *args)[0], named)


def test_a_preset_value_that_is_no_flag_is_a_usage_error(tmp_path):
    preset = tmp_path / "p.toml"
    preset.write_text('[scan]\ninvariance = "yes"\n')
    assert_usage_error(scan("--preset", str(preset))[0], "invariance: invalid value 'yes'")


def test_help_documents_the_options():
    text = scan("--help")[0].stdout
    for option in ("--invariance", "--batch-invariance", "--decode-kernel"):
        assert option in text


# ---------------------------------------------------------------------------- cutting the inputs


def _inputs(regime: str, batch: int, seqlen: int, chunk: int, seed: int):
    return REGIMES[regime].generate(ScanShape(batch, seqlen, 2, 4, 4, 1, chunk), torch.float32, seed)


@settings(max_examples=25, deadline=None)
@given(regime=st.sampled_from(["normal", "ragged", "initial-state"]), batch=st.integers(1, 5),
       seqlen=st.integers(2, 40), chunk=st.sampled_from([4, 16]), seed=st.integers(0, 2**31 - 1))
def test_pieces_pack_and_scatter_back_to_the_case(regime, batch, seqlen, chunk, seed):
    inputs = _inputs(regime, batch, seqlen, chunk, seed)
    points = split_points(inputs, chunk, torch.Generator().manual_seed(seed))
    wholes = whole_sequences(inputs)
    assert sum(p.length for p in wholes) == inputs.x.shape[0] * inputs.x.shape[1]
    for piece, cut in zip(wholes, points):
        assert 0 <= cut < piece.length and (cut > 0) == (piece.length > 1)
        assert cut == 0 or cut % chunk  # mid-chunk: a sequence of two tokens or more has such a point
    firsts = [Piece(p.sequence, p.row, p.start, p.start + c) if c else p for p, c in zip(wholes, points)]
    seconds = [Piece(p.sequence, p.row, p.start + c, p.stop) for p, c in zip(wholes, points) if c]
    pieces_y = []
    for group in (firsts, seconds):
        if group:
            piece_inputs = packed(inputs, group, None)
            assert piece_inputs.nsequences == len(group)
            # packed in the case's own index dtype: ragged's int64, else int32
            assert not piece_inputs.varlen or piece_inputs.seq_idx.dtype == (
                torch.int64 if regime == "ragged" else torch.int32)
            pieces_y += list(zip(group, unpacked(piece_inputs, piece_inputs.x, group)))
    assert torch.equal(scattered(inputs, pieces_y), inputs.x)


# ---------------------------------------------------------------------------- the cache-write verdicts


def _cache_check(writer, sequences: int, dtype: torch.dtype, seed: int):
    """The cache_write check of a case with `sequences` random final states in `dtype`, whose kernel writes the
    cache with `writer(cache, slots, states)` and returns the case's own y."""
    g = torch.Generator().manual_seed(seed)
    states = torch.randn(sequences, 2, 3, 4, generator=g).to(dtype)
    y = torch.randn(1, 7, 2, 3, generator=g)

    def write_cache(inputs, cache, slots):
        writer(cache, slots.long(), states)
        return y.clone()

    serving = invariance.Serving(scan=None, baseline=None, decode=None, baseline_decode=None,
                                 tolerance=Tolerance(), batch_exact=True, write_cache=write_cache)
    return invariance._cache_write(serving, None, 16, seed, (y, states), (y.double(), states.double()), None)


@settings(max_examples=30, deadline=None)
@given(sequences=st.integers(1, 12), dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
       seed=st.integers(0, 2**31 - 1))
def test_the_cache_write_verdicts_on_drawn_caches(sequences, dtype, seed):
    def right(cache, slots, states):
        cache[slots] = states

    check = _cache_check(right, sequences, dtype, seed)
    slots = check.figures["slots"]
    assert check.status.value == "pass", check.message
    assert sorted(slots) == sorted(set(slots)) and 0 < min(slots) and max(slots) < check.figures["cache_slots"] - 1

    def rotated(cache, slots, states):  # each state into the next sequence's slot
        cache[slots.roll(1)] = states

    def spilled(cache, slots, states):  # right, and one element more, in the page after the cache (the guard's)
        cache[slots] = states
        torch.as_strided(cache, (1,), (1,), cache.storage_offset() + cache.shape[0] * cache.stride(0)).fill_(0)

    def past_the_state(cache, slots, states):  # right, and one element more, after the last slot's state
        cache[slots] = states
        torch.as_strided(cache, (1,), (1,), cache.storage_offset() + (cache.shape[0] - 1) * cache.stride(0)
                         + cache[0].numel()).fill_(0)

    if sequences > 1:
        check = _cache_check(rotated, sequences, dtype, seed)
        assert check.status.value == "fail" and "differs from the state the kernel returns" in check.message
    check = _cache_check(spilled, sequences, dtype, seed)
    assert check.status.value == "fail" and check.figures["changed"] == [check.figures["cache_slots"]]
    assert f"wrote slot {check.figures['cache_slots']} (outside the cache)" in check.message
    check = _cache_check(past_the_state, sequences, dtype, seed)
    last = check.figures["cache_slots"] - 1
    assert check.status.value == "fail" and check.figures["changed"] == [] and check.figures["past_state"] == [last]
    assert f"wrote the page after slot {last}'s state (the pool's slot stride is " in check.message, check.message


@pytest.mark.gpu
def test_the_builtin_kernels_pass_every_check_on_the_gpu_at_model_widths(tmp_path):
    result, report = scan("--invariance", "--model", "mamba2-2.7b,codestral-mamba-7b", "--dtype", "fp32,bf16,fp16",
                          "--regime", "normal,ragged,initial-state,decay-extreme,large-magnitude", "--seqlen", "300,1000",
                          "--batch", "3", "--device", "cuda", json_path=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert all(c["batch"]["status"] == c["split"]["status"] == c["prefill_decode"]["status"] == "pass"
               for c in checks(report))
