"""[tool.ssmcheck] in pyproject.toml, --preset as a path, and the precedence preset < pyproject < command line."""

from pathlib import Path

import pytest

from ssmcheck.core import config, presets
from ssmcheck.core.sweep import SweepError
from ssmcheck.scan import spec as scan_spec

PRESET = """
[scan]
regime = ["normal", "long"]
dtype = ["bf16"]
seqlen = [40]
batch = [2]

[scan.overrides.long]
seqlen = [130]

[scan.overrides.normal]
chunk_size = [16, 32]

[scan.cuda]
seqlen = [4096]

[drift]
steps = 16
"""


@pytest.fixture
def configs(tmp_path, monkeypatch):
    """A configs/ folder holding the preset `p`, in place of the shipped one."""
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "p.toml").write_text(PRESET)
    monkeypatch.setattr(presets, "_configs_dir", lambda: folder)
    return folder


def _project(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "pyproject.toml"
    path.write_text(text)
    return path


# discovery


def test_the_first_pyproject_upward_with_the_table_wins(tmp_path):
    outer = _project(tmp_path / "a", "[tool.ssmcheck.scan]\nseqlen = [1]\n")
    _project(tmp_path / "a" / "b", "[project]\nname = 'x'\n\n[tool.ruff]\nline-length = 90\n")  # skipped
    start = tmp_path / "a" / "b" / "c"
    start.mkdir()
    found = config.find_pyproject(start)
    assert found.path == outer and found.table == {"scan": {"seqlen": [1]}}

    inner = _project(tmp_path / "a" / "b", "[tool.ssmcheck.drift]\nsteps = 8\n")
    assert config.find_pyproject(start).path == inner


def test_discovery_starts_in_the_current_directory(tmp_path, monkeypatch):
    path = _project(tmp_path / "proj", "[tool.ssmcheck.scan]\n")
    (tmp_path / "proj" / "src").mkdir()
    monkeypatch.chdir(tmp_path / "proj" / "src")
    assert config.find_pyproject().path == path


def test_no_pyproject_with_the_table_means_the_preset_alone(tmp_path, configs):
    _project(tmp_path / "proj", "[project]\nname = 'x'\n")
    loaded = config.load_settings("p", "scan", None, tmp_path / "proj")
    assert loaded.table == presets.load_preset("p", "scan")
    assert loaded.files == [str(configs / "p.toml")] and loaded.label == "p"


def test_a_pyproject_that_is_not_valid_toml_is_named(tmp_path):
    path = _project(tmp_path / "proj", "[tool.ssmcheck.scan\n")
    with pytest.raises(SweepError, match=f"^{path}: not valid TOML"):
        config.find_pyproject(tmp_path / "proj")


@pytest.mark.parametrize("text", [
    "[tool.ssmcheck.scna]\nseqlen = [1]\n", "[tool.ssmcheck]\nseqlen = [1]\n", "[tool]\nssmcheck = 3\n",
    "[tool.ssmcheck.scan]\npreset = 3\n",
])
def test_a_malformed_tool_table_is_named(tmp_path, text):
    path = _project(tmp_path / "proj", text)
    with pytest.raises(SweepError, match=f"^{path}: \\[tool.ssmcheck"):
        config.find_pyproject(tmp_path / "proj")


# precedence


def test_preset_then_pyproject_then_command_line(tmp_path, configs):
    pyproject = _project(tmp_path / "proj", "[tool.ssmcheck.scan]\nseqlen = [64]\nbatch = [1]\n")
    loaded = config.load_settings("p", "scan", "cpu", tmp_path / "proj")
    assert loaded.files == [str(configs / "p.toml"), str(pyproject)]
    settings = scan_spec.resolve({"batch": "3"}, loaded.table, loaded.label)
    assert settings.axes["dtype"] == ["bf16"]  # the preset's
    assert settings.axes["seqlen"] == [64]  # the pyproject's over the preset's
    assert settings.axes["batch"] == [3]  # the command line's over both
    assert settings.overrides["long"] == [{"seqlen": [130]}]  # the preset's, untouched


def test_overrides_merge_regime_by_regime(tmp_path, configs):
    _project(tmp_path / "proj", "[tool.ssmcheck.scan.overrides.long]\nbatch = [1]\n")
    table = config.load_settings("p", "scan", None, tmp_path / "proj").table
    assert table["overrides"] == {"long": {"batch": [1]}, "normal": {"chunk_size": [16, 32]}}


def test_device_sub_tables_apply_after_the_plain_keys(tmp_path, configs):
    _project(tmp_path / "proj", "[tool.ssmcheck.scan]\nbatch = [1]\n\n[tool.ssmcheck.scan.cuda]\nbatch = [8]\n")
    on = {device: config.load_settings("p", "scan", device, tmp_path / "proj").table for device in ("cpu", "cuda")}
    assert (on["cpu"]["seqlen"], on["cpu"]["batch"]) == ([40], [1])
    assert (on["cuda"]["seqlen"], on["cuda"]["batch"]) == ([4096], [8])  # the preset's and the pyproject's cuda
    assert "cuda" not in on["cuda"] and "cpu" not in on["cpu"]

    _project(tmp_path / "plain", "[tool.ssmcheck.scan]\nseqlen = [64]\n")
    assert config.load_settings("p", "scan", "cuda", tmp_path / "plain").table["seqlen"] == [64]


def test_the_pyproject_chooses_the_preset_when_the_command_line_does_not(tmp_path, configs):
    _project(tmp_path / "proj", "[tool.ssmcheck.scan]\npreset = 'p'\n")
    loaded = config.load_settings(None, "scan", None, tmp_path / "proj")
    assert loaded.preset == "p" and loaded.table == presets.load_preset("p", "scan") and loaded.label == "p"
    (configs / "q.toml").write_text("[scan]\nseqlen = [7]\n")
    assert config.load_settings("q", "scan", None, tmp_path / "proj").table == {"seqlen": [7]}  # --preset wins


def test_a_preset_path_in_the_pyproject_is_relative_to_it(tmp_path, monkeypatch):
    (tmp_path / "proj" / "ci").mkdir(parents=True)
    (tmp_path / "proj" / "ci" / "gate.toml").write_text("[scan]\nseqlen = [9]\n")
    pyproject = _project(tmp_path / "proj", "[tool.ssmcheck.scan]\npreset = 'ci/gate.toml'\nbatch = [1]\n")
    monkeypatch.chdir(tmp_path)
    loaded = config.load_settings(None, "scan", None, tmp_path / "proj")
    assert loaded.table == {"seqlen": [9], "batch": [1]}
    assert loaded.files == [str(tmp_path / "proj" / "ci" / "gate.toml"), str(pyproject)]

    _project(tmp_path / "bad", "[tool.ssmcheck.scan]\npreset = 'nope.toml'\n")
    with pytest.raises(SweepError, match=r"pyproject.toml \[tool.ssmcheck.scan\] preset .*nope.toml: no such file"):
        config.load_settings(None, "scan", None, tmp_path / "bad")


def test_no_preset_anywhere_is_the_default(tmp_path):
    loaded = config.load_settings(None, "drift", None, tmp_path)
    assert loaded.preset == "default" and loaded.table == presets.load_preset("default", "drift")
    assert loaded.files[0].endswith("default.toml")


def test_an_unknown_key_from_the_pyproject_is_reported_naming_it(tmp_path, configs):
    pyproject = _project(tmp_path / "proj", "[tool.ssmcheck.scan]\ncolour = 'red'\n")
    loaded = config.load_settings("p", "scan", None, tmp_path / "proj")
    with pytest.raises(SweepError, match=f"^--preset p \\+ {pyproject} \\[tool.ssmcheck.scan\\]: unknown key 'colour'"):
        scan_spec.resolve({}, loaded.table, loaded.label)


# --preset as a path


@pytest.mark.parametrize("value, path", [
    ("smoke", False), ("ci.toml", True), ("ci/gate", True), ("./gate", True), ("/abs/gate.toml", True),
])
def test_a_path_has_a_separator_or_ends_in_toml(value, path):
    assert presets.is_path(value) is path


def test_preset_as_a_path_relative_to_the_current_directory(tmp_path, monkeypatch):
    (tmp_path / "gate.toml").write_text("[scan]\nseqlen = [5]\n\n[scan.cuda]\nseqlen = [500]\n")
    monkeypatch.chdir(tmp_path)
    assert presets.load_preset("gate.toml", "scan", "cpu") == {"seqlen": [5]}
    assert presets.load_preset(str(tmp_path / "gate.toml"), "scan", "cuda") == {"seqlen": [500]}
    loaded = config.load_settings("./gate.toml", "scan", None, tmp_path)
    assert loaded.files == [str(tmp_path / "gate.toml")] and loaded.label == "./gate.toml"


@pytest.mark.parametrize("text, message", [
    (None, "no such file"), ("[scan\n", "not valid TOML"), ("[drift]\nsteps = 3\n", r"no \[scan\] table"),
    ("[scan]\ncuda = 3\n", "cuda must be a table"),
])
def test_a_bad_preset_file_is_one_line_naming_preset_and_file(tmp_path, text, message):
    path = tmp_path / "gate.toml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SweepError, match=f"^--preset {path}: .*{message}") as caught:
        presets.load_preset(str(path), "scan")
    assert "\n" not in str(caught.value)


def test_a_bad_shipped_preset_names_its_file(configs):
    (configs / "broken.toml").write_text("[scan\n")
    with pytest.raises(SweepError, match=r"^--preset broken: configs/broken.toml: not valid TOML"):
        presets.load_preset("broken", "scan")
