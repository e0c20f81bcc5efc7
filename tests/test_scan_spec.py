"""Scan settings and cases: presets, overrides, command-line precedence, models, seeds, skip reasons."""

import pytest

from ssmcheck.core import models
from ssmcheck.core.presets import load_preset
from ssmcheck.core.sweep import SweepError
from ssmcheck.core.tolerance import DEFAULT_FLOOR, DEFAULT_TOL_FACTOR
from ssmcheck.scan.regimes import REGIMES
from ssmcheck.scan.spec import build_cases, resolve

TINY = {"regime": ["normal"], "dtype": ["fp32"], "chunk_size": [16], "seqlen": [20], "batch": [1], "nheads": [2],
        "headdim": [4], "dstate": [4], "ngroups": [1]}


def _cases(cli=None, preset=None, kernel="torch"):
    return build_cases(resolve(cli or {}, TINY if preset is None else preset, "test"), kernel)


@pytest.mark.parametrize("name", ["smoke", "default", "thorough"])
def test_shipped_presets_cover_every_regime_and_dtype_without_skips(name):
    settings = resolve({}, load_preset(name, "scan"), name)
    cases = build_cases(settings, "builtin")
    # smoke leaves out the padded regimes: most kernels take no pad tokens, and a smoke run of theirs would skip them;
    # conv-output-varlen, whose layout conv-output runs there in batch mode; continuation, whose inputs long's are; and
    # the packed extreme regimes, whose values decay-extreme and dt-extreme run there in batch mode.
    left_out = {"padded", "padded-initial-state", "conv-output-varlen", "continuation", "decay-extreme-packed",
                "dt-extreme-packed"}
    assert {c.regime for c in cases} == set(REGIMES) - (left_out if name == "smoke" else set())
    assert not [c for c in cases if c.skip_reason]
    assert (settings.reference, settings.tolerance.tol_factor, settings.tolerance.floor) == (
        "fp64", DEFAULT_TOL_FACTOR, DEFAULT_FLOOR)
    if name != "smoke":
        assert {c.dtype for c in cases} == {"fp32", "bf16", "fp16"}


def test_default_preset_has_chunk_256_with_several_chunks_and_ragged_seqlens():
    cases = build_cases(resolve({}, load_preset("default", "scan"), "default"), "builtin")
    assert any(c.chunk_size == 256 and c.seqlen >= 3 * 256 for c in cases)
    assert any(c.seqlen % c.chunk_size for c in cases) and any(c.seqlen % c.chunk_size == 0 for c in cases)
    # every regime with an fp32 state (what kernels without state options run), plus rounded states
    assert {c.regime for c in cases if c.state_dtype == "fp32"} == set(REGIMES)
    assert {(c.state_dtype, c.rounding) for c in cases} >= {("fp16", "stochastic"), ("bf16", "nearest")}
    assert {c.batch for c in cases if c.regime == "ragged"} >= {1, 4}
    # widths that fill no block of 16, in every dtype, with several heads to a group
    partial = [c for c in cases if c.headdim % 16 and c.dstate % 16 and c.nheads // c.ngroups > 1]
    assert {c.dtype for c in partial} == {"fp32", "bf16", "fp16"}


def test_command_line_axes_replace_the_preset_and_its_overrides():
    preset = {**TINY, "regime": ["normal", "long"], "overrides": {"long": {"seqlen": [200], "batch": [3]}}}
    cases = _cases(preset=preset)
    assert [(c.regime, c.seqlen, c.batch) for c in cases] == [("normal", 20, 1), ("long", 200, 3)]
    cases = _cases({"seqlen": "300,40"}, preset)
    assert [(c.regime, c.seqlen, c.batch) for c in cases] == [
        ("normal", 300, 1), ("normal", 40, 1), ("long", 300, 3), ("long", 40, 3)]


def test_an_array_of_overrides_is_a_union_of_sub_sweeps_without_repeats():
    preset = {**TINY, "overrides": {"normal": [{"batch": [1, 2]}, {"batch": [2], "state_dtype": ["bf16"]}]}}
    cases = _cases(preset=preset)
    assert [(c.batch, c.state_dtype) for c in cases] == [(1, "fp32"), (2, "fp32"), (2, "bf16")]
    # an explicit shape drops the extra sub-sweeps
    assert [(c.batch, c.state_dtype) for c in _cases({"batch": "5"}, preset)] == [(5, "fp32")]
    assert [(c.batch, c.state_dtype) for c in _cases({"nheads": "2"}, preset)] == [(1, "fp32"), (2, "fp32")]
    # a dtype or a rounding picks values in every sub-sweep, which all still run
    assert [(c.batch, c.state_dtype, c.dtype) for c in _cases({"dtype": "bf16"}, preset)] == [
        (1, "fp32", "bf16"), (2, "fp32", "bf16"), (2, "bf16", "bf16")]
    assert [(c.batch, c.state_dtype, c.rounding) for c in _cases({"rounding": "stochastic"}, preset)] == [
        (1, "fp32", "stochastic"), (2, "fp32", "stochastic"), (2, "bf16", "stochastic")]
    # --regime only picks regimes: the preset split by regime runs every case of the whole
    assert [(c.batch, c.state_dtype) for c in _cases({"regime": "normal"}, preset)] == [
        (1, "fp32"), (2, "fp32"), (2, "bf16")]


@pytest.mark.parametrize("name", ["default", "thorough"])
def test_a_preset_run_regime_by_regime_runs_the_whole_preset(name):
    preset = load_preset(name, "scan")
    whole = build_cases(resolve({}, preset, name), "builtin")
    split = [c for regime in dict.fromkeys(c.regime for c in whole)
             for c in build_cases(resolve({"regime": regime}, preset, name), "builtin")]
    assert sorted(c.id for c in split) == sorted(c.id for c in whole)


def test_seeds_are_deterministic_per_case_and_independent_of_the_kernel():
    a = _cases({"seqlen": "20,21"}, kernel="torch")
    b = _cases({"seqlen": "20,21"}, kernel="builtin")
    assert [c.seed for c in a] == [c.seed for c in b]
    assert a[0].seed != a[1].seed
    assert _cases({"seed": 1})[0].seed != _cases({"seed": 2})[0].seed


def test_invalid_combinations_are_skipped_with_the_reason():
    cases = _cases({"nheads": "3,4", "ngroups": "2", "state_dtype": "fp32,bf16", "rounding": "stochastic"})
    reasons = {(c.nheads, c.state_dtype): c.skip_reason for c in cases}
    assert "not a multiple of ngroups" in reasons[(3, "bf16")]
    assert "stochastic rounding needs an fp16 or bf16 state" in reasons[(4, "fp32")]
    assert reasons[(4, "bf16")] is None
    assert _cases({"chunk_size": "48"}, kernel="torch")[0].skip_reason is None
    assert "8 chunks" in _cases({"regime": "long"})[0].skip_reason


def test_model_widths_replace_the_width_axes_and_bring_their_chunk_size():
    (case,) = _cases({"model": "Mamba2-2.7B"})
    assert (case.nheads, case.headdim, case.dstate, case.ngroups, case.chunk_size, case.model) == (
        80, 64, 128, 1, 256, "Mamba2-2.7B")
    (case,) = _cases({"model": "nemotron-h-8b", "chunk_size": "64"})
    assert (case.nheads, case.ngroups, case.chunk_size) == (128, 8, 64)
    assert "Nemotron-H-8B" in case.id and case.params()["model"] == "Nemotron-H-8B"


def test_known_models_have_consistent_widths():
    names = {m.name for m in models.MODELS.values()}
    assert {"Mamba2-130M", "Mamba2-370M", "Mamba2-780M", "Mamba2-1.3B", "Mamba2-2.7B", "Codestral-Mamba-7B",
            "Nemotron-H-8B"} <= names
    for m in models.MODELS.values():
        assert m.nheads % m.ngroups == 0 and m.chunk_size in (128, 256)
    assert models.lookup("mamba2-130m").nheads == 24
    with pytest.raises(KeyError, match="known"):
        models.lookup("gpt-2")


@pytest.mark.parametrize("cli, option", [
    ({"dtype": "fp8"}, "--dtype"), ({"chunk_size": "0"}, "--chunk-size"), ({"regime": "nope"}, "--regime"),
    ({"model": "gpt"}, "--model"), ({"reference": "fp16"}, "--reference"), ({"tol_factor": 0.0}, "--tol-factor"),
    ({"floor": -1.0}, "--floor"), ({"rtol": -1e-3}, "--rtol"), ({"fail_on": "warnings"}, "--fail-on"),
    ({"seed": -1}, "--seed"), ({"model": "mamba2-130m", "nheads": "4"}, "--nheads"),
    ({"state_dtype": "fp64"}, "--state-dtype"), ({"rounding": "up"}, "--rounding"),
])
def test_bad_values_name_the_option(cli, option):
    with pytest.raises(SweepError, match=option):
        resolve(cli, TINY, "test")


def test_bad_preset_tables_name_the_preset_and_key():
    with pytest.raises(SweepError, match="--preset test.*'colour'"):
        resolve({}, {**TINY, "colour": 1}, "test")
    with pytest.raises(SweepError, match="overrides.nope"):
        resolve({}, {**TINY, "overrides": {"nope": {}}}, "test")
    with pytest.raises(SweepError, match="--preset test: seqlen"):
        resolve({}, {**TINY, "seqlen": [0]}, "test")
