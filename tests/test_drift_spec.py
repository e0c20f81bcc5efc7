"""`ssmcheck drift` settings and cases: presets under command-line options, the sweep, seeds, skips."""

import pytest

from ssmcheck.core import models
from ssmcheck.core.presets import load_preset
from ssmcheck.core.sweep import SweepError
from ssmcheck.drift.regimes import DRIFT_REGIMES, LONG_STEPS_FACTOR
from ssmcheck.drift.spec import build_cases, resolve


def test_default_preset_covers_both_roundings_fp16_bf16_and_every_regime():
    settings = resolve({}, load_preset("default", "drift"), "default")
    cases = build_cases(settings, "builtin")
    # and `untied` into an fp32 state too, to nearest (what a half-precision state's own rounding hides);
    # `bf16-inputs` into fp32 to nearest and into fp16 both ways; `fp16-inputs`, `optional-none`, `gate-without-d` and
    # `dt-bias-none` and `small-dt` into fp32 to nearest; `subnormal` into fp16 both ways; `dt-extreme` into fp32 to
    # nearest too
    only_fp32 = ("fp16-inputs", "optional-none", "gate-without-d", "dt-bias-none", "small-dt")
    assert {(c.state_dtype, c.rounding, c.regime) for c in cases} == {
        (d, r, g) for d in ("fp16", "bf16") for r in ("nearest", "stochastic") for g in DRIFT_REGIMES
        if g not in ("bf16-inputs", "subnormal", *only_fp32)
    } | {("fp32", "nearest", "untied"), ("fp32", "nearest", "bf16-inputs"), ("fp16", "nearest", "bf16-inputs"),
         ("fp16", "stochastic", "bf16-inputs"), ("fp16", "nearest", "subnormal"), ("fp16", "stochastic", "subnormal"),
         ("fp32", "nearest", "dt-extreme")} | {("fp32", "nearest", g) for g in only_fp32}
    assert all(c.skip_reason is None for c in cases)
    assert {c.steps for c in cases if c.regime == "long"} == {settings.steps * LONG_STEPS_FACTOR}


@pytest.mark.parametrize("name", ["smoke", "default", "thorough"])
def test_every_preset_resolves(name):
    settings = resolve({}, load_preset(name, "drift"), name)
    assert build_cases(settings, "torch")


def test_command_line_replaces_the_preset():
    preset = {"state_dtype": ["fp16"], "steps": 7, "trials": 3, "regime": ["normal"]}
    settings = resolve({"state_dtype": "bf16,fp32", "steps": 5}, preset, "p")
    assert settings.axes["state_dtype"] == ["bf16", "fp32"] and settings.steps == 5
    assert settings.trials == 3 and settings.axes["regime"] == ["normal"]


def test_an_array_of_overrides_is_a_union_of_sub_sweeps_without_repeats():
    preset = {"regime": ["normal", "long"], "state_dtype": ["fp16"], "rounding": ["nearest"],
              "overrides": {"normal": [{}, {"headdim": [24], "dstate": [40]}, {"headdim": [16]}]}}
    cases = build_cases(resolve({}, preset, "p"), "builtin")
    assert [(c.regime, c.headdim, c.dstate) for c in cases] == [("normal", 16, 128), ("normal", 24, 40),
                                                                 ("long", 16, 128)]
    # an explicit shape drops the extra sub-sweeps
    cases = build_cases(resolve({"nheads": "2"}, preset, "p"), "builtin")
    assert [(c.regime, c.headdim) for c in cases] == [("normal", 16), ("long", 16)]
    # a state dtype or a rounding picks values in every sub-sweep, which all still run (repeats dropped)
    for option in ({"state_dtype": "bf16"}, {"rounding": "stochastic"}):
        cases = build_cases(resolve(option, preset, "p"), "builtin")
        assert [(c.regime, c.headdim, c.dstate) for c in cases] == [("normal", 16, 128), ("normal", 24, 40),
                                                                     ("long", 16, 128)]
    # --regime only picks regimes, sub-sweeps and all
    cases = build_cases(resolve({"regime": "long,normal"}, preset, "p"), "builtin")
    assert [(c.regime, c.headdim, c.dstate) for c in cases] == [("long", 16, 128), ("normal", 16, 128),
                                                                 ("normal", 24, 40)]


def test_a_prefill_skips_the_untied_regime():
    # The chunk scan ties A and dt per head: it cannot produce the state an untied decode starts from.
    cases = build_cases(resolve({"regime": "normal,untied", "from_prefill": 64}, {}, "p"), "builtin")
    assert {c.regime for c in cases if c.skip_reason is None} == {"normal"}
    assert all("untied regime has one per channel" in c.skip_reason for c in cases if c.regime == "untied")


def test_unknown_preset_key_names_it():
    with pytest.raises(SweepError, match="--preset p: unknown key 'chunk_size'"):
        resolve({}, {"chunk_size": [64]}, "p")


def test_cases_list_the_rounding_modes_of_a_configuration_side_by_side_with_shared_inputs():
    settings = resolve({"regime": "normal,stagnation", "state_dtype": "fp16", "nheads": "2,4"}, {}, "p")
    cases = build_cases(settings, "torch")
    assert [c.rounding for c in cases] == ["nearest", "stochastic"] * 4
    for nearest, stochastic in zip(cases[::2], cases[1::2]):
        assert nearest.configuration == stochastic.configuration
        assert nearest.seed == stochastic.seed  # same inputs, so the modes compare like for like
        assert nearest.trials == 1 and stochastic.trials == settings.trials
    assert len({c.seed for c in cases}) == 4
    other_kernel = build_cases(settings, "builtin")
    assert [c.seed for c in other_kernel] == [c.seed for c in cases]


def test_model_sets_the_widths():
    settings = resolve({"model": "mamba2-2.7b,codestral-mamba-7b", "rounding": "nearest", "regime": "normal",
                        "state_dtype": "fp16"}, {}, "p")
    cases = build_cases(settings, "torch")
    for case, name in zip(cases, ("mamba2-2.7b", "codestral-mamba-7b")):
        widths = models.MODELS[name]
        assert (case.nheads, case.headdim, case.dstate, case.ngroups) == (
            widths.nheads, widths.headdim, widths.dstate, widths.ngroups)
        assert case.model == widths.name and case.params()["model"] == widths.name


def test_impossible_combinations_are_skipped_with_the_reason():
    settings = resolve({"state_dtype": "fp32", "nheads": "3", "ngroups": "2"}, {}, "p")
    reasons = {c.skip_reason for c in build_cases(settings, "torch")}
    assert reasons == {"nheads 3 is not a multiple of ngroups 2"}
    settings = resolve({"state_dtype": "fp32", "rounding": "stochastic"}, {}, "p")
    assert all("fp32 state" in c.skip_reason for c in build_cases(settings, "torch"))


def test_the_gpu_default_adds_a_serving_batch_and_one_row_and_keeps_the_normal_sub_sweeps():
    # [drift.cuda.overrides.normal] replaces the plain tables on a GPU: it repeats them, and adds 256 rows and one.
    cpu, cuda = (load_preset("default", "drift", device)["overrides"]["normal"] for device in ("cpu", "cuda"))
    assert cuda[:-2] == cpu
    assert cuda[-2] == {"batch": [256], "nheads": [1], "state_dtype": ["fp16"], "rounding": ["nearest"]}
    assert cuda[-1] == {"batch": [1], "state_dtype": ["fp16"], "rounding": ["nearest"]}
    cases = build_cases(resolve({}, load_preset("default", "drift", "cuda"), "default"), "builtin")
    assert [c.id for c in cases if c.batch == 256] == ["normal-fp16-nearest-b256-h1x64n128g1"]
    # every other GPU case has 2 rows or more: a path for a single row is reached by this one alone
    assert [c.id for c in cases if c.batch == 1] == ["normal-fp16-nearest-b1-h8x64n128g1"]
