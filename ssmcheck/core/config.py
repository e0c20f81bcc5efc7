"""The table a command runs with: a preset, a project's `[tool.ssmcheck]`, then the command line.

A project configures ssmcheck in its `pyproject.toml`, as it does ruff or pytest:

    [tool.ssmcheck.scan]
    preset = "smoke"          # the base preset when --preset is not given (a name or a path)
    seqlen = [64, 200]        # any key a preset's [scan] table takes, `overrides` and `cpu`/`cuda` too

    [tool.ssmcheck.drift]
    steps = 64

The file is found from the start directory (the current one) upward: the first
`pyproject.toml` that has a `[tool.ssmcheck]` table wins, and one without it is
skipped (as ruff does). Precedence, lowest first:

1. the preset: `--preset`, else the pyproject's `preset` key, else `default`; its device sub-table applied;
2. the pyproject's table, key by key (`overrides` regime by regime), then its device sub-table;
3. the command line, which `scan.spec.resolve` / `drift.spec.resolve` apply over `Configuration.table`.

Keys are validated by those resolvers, which prefix their messages with `--preset LABEL:`;
`Configuration.label` names the pyproject file whenever its table sets keys, so that a
bad key or value from it is reported naming the file.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from ssmcheck.core import presets
from ssmcheck.core.sweep import SweepError

PYPROJECT = "pyproject.toml"
COMMANDS = ("scan", "drift")


@dataclass(frozen=True)
class Pyproject:
    path: Path
    table: dict  # its [tool.ssmcheck] table, checked to hold only command tables


@dataclass(frozen=True)
class Configuration:
    table: dict  # what scan.spec.resolve / drift.spec.resolve take as the preset table
    preset: str  # the base preset as named: a preset of configs/ or a path
    label: str  # the sources, for resolve's messages: the preset, and the pyproject when it sets keys
    files: list[str]  # the files read, lowest precedence first


def find_pyproject(start: Path | None = None) -> Pyproject | None:
    """The first pyproject.toml from `start` (default: the current directory) upward with a [tool.ssmcheck] table.

    Raises SweepError, naming the file, for a pyproject.toml that is not valid TOML or
    whose [tool.ssmcheck] holds anything but [tool.ssmcheck.scan] and [tool.ssmcheck.drift].
    """
    directory = (start or Path.cwd()).resolve()
    for folder in (directory, *directory.parents):
        path = folder / PYPROJECT
        if not path.is_file():
            continue
        try:
            data = tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise SweepError(f"{path}: not valid TOML: {exc}") from None
        tool = data.get("tool")
        table = tool.get("ssmcheck") if isinstance(tool, dict) else None
        if table is not None:
            _check(path, table)
            return Pyproject(path, table)
    return None


def _check(path: Path, table) -> None:
    if not isinstance(table, dict):
        raise SweepError(f"{path}: [tool.ssmcheck] must be a table")
    for key, value in table.items():
        if key not in COMMANDS or not isinstance(value, dict):
            tables = " and ".join(f"[tool.ssmcheck.{c}]" for c in COMMANDS)
            raise SweepError(f"{path}: [tool.ssmcheck] takes only the tables {tables}, not {key!r}")
        if not isinstance(value.get("preset", ""), str):
            raise SweepError(f"{path}: [tool.ssmcheck.{key}] preset must be a string (a preset name or a path)")


def load_settings(preset: str | None, command: str, device: str | None, start: Path | None = None) -> Configuration:
    """The preset with the project's [tool.ssmcheck.COMMAND] over it, for `device` ("cpu", "cuda" or None).

    `preset` is --preset (None when not given). A path in the pyproject's `preset` key is
    relative to the pyproject's folder. Raises SweepError, naming --preset or the
    pyproject file, for an unknown preset, a missing or invalid file, or a malformed table.
    """
    pyproject = find_pyproject(start)
    section = dict(pyproject.table.get(command, {})) if pyproject else {}
    base = section.pop("preset", None)
    if preset is not None:
        name, option = preset, "--preset"
    elif base is not None:
        name = str(pyproject.path.parent / base) if presets.is_path(base) else base
        option = f"{pyproject.path} [tool.ssmcheck.{command}] preset"
    else:
        name, option = "default", "--preset"

    table = presets.load_preset(name, command, device, option)
    files = [str(presets.preset_file(name, option))]
    label = name
    if pyproject:
        files.append(str(pyproject.path))
    if section:
        where = f"{pyproject.path} [tool.ssmcheck.{command}]"
        table = presets.merge(table, presets.for_device(section, device, where))
        label = f"{name} + {where}"
    return Configuration(table=table, preset=name, label=label, files=files)
