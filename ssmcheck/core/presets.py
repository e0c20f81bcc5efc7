"""Presets: `configs/NAME.toml` or any TOML file, one table per command (`[scan]`, `[drift]`).

Each key is an axis or setting with the same name as the CLI option (dashes as
underscores). A sub-table named after a device (`[drift.cuda]`, `[drift.cpu]`)
overrides keys on that device only: the interpreter is orders of magnitude
slower than a GPU, and a preset sized for one would be trivial or endless on
the other.

`--preset` takes a bare name (a preset of configs/) or a path: anything with a
path separator or ending in `.toml` is a path, relative to the current directory.
"""

from __future__ import annotations

import os
import tomllib
from importlib import resources
from pathlib import Path

from ssmcheck.core.sweep import SweepError

DEVICES = ("cpu", "cuda")  # the device sub-tables a command table may have


def _configs_dir():
    """configs/ of a source checkout, else the copy installed as package data."""
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / "configs").is_dir():
        return checkout / "configs"
    return resources.files("ssmcheck.configs")


def preset_names() -> list[str]:
    return sorted(p.name[: -len(".toml")] for p in _configs_dir().iterdir() if p.name.endswith(".toml"))


def is_path(preset: str) -> bool:
    """Whether a --preset value names a file rather than a preset of configs/."""
    separators = {"/", os.sep, os.altsep} - {None}
    return preset.endswith(".toml") or any(s in preset for s in separators)


def preset_file(name: str, option: str = "--preset"):
    """The file a --preset value names (a Path, or a package-data resource). Raises SweepError if there is none."""
    if is_path(name):
        path = Path(name).resolve()
        if not path.is_file():
            raise SweepError(f"{option} {name}: no such file {path}")
        return path
    path = _configs_dir() / f"{name}.toml"
    if not path.is_file():
        raise SweepError(f"{option}: unknown preset {name!r} (available: {', '.join(preset_names())})")
    return path


def load_preset(name: str, command: str, device: str | None = None, option: str = "--preset") -> dict:
    """The `[command]` table of configs/NAME.toml (or of the file NAME), its `[command.DEVICE]` sub-table applied.

    `option` is what messages name as the source of NAME: `--preset`, or a pyproject's `preset` key.
    Raises SweepError for an unknown name, a missing file, invalid TOML and a missing or malformed table.
    """
    path = preset_file(name, option)
    where = f"{option} {name}" if is_path(name) else f"{option} {name}: configs/{name}.toml"
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SweepError(f"{where}: not valid TOML: {exc}") from None
    if not isinstance(data.get(command), dict):
        raise SweepError(f"{where}: no [{command}] table")
    return for_device(data[command], device, f"{where}: [{command}]")


def for_device(table: dict, device: str | None, where: str) -> dict:
    """A command table without its device sub-tables, the one for `device` merged over its plain keys.

    `where` names the table in messages. Raises SweepError for a device key or `overrides` that is not a table.
    """
    for key in (*DEVICES, "overrides"):
        if key in table and not isinstance(table[key], dict):
            raise SweepError(f"{where}: {key} must be a table")
    plain = {k: v for k, v in table.items() if k not in DEVICES}
    return merge(plain, table.get(device, {}))


def merge(base: dict, top: dict) -> dict:
    """`top` over `base` key by key; `overrides` merge regime by regime.

    A regime `top` names replaces all of base's override tables for that regime;
    the other regimes keep base's.
    """
    merged = {**base, **top}
    if isinstance(base.get("overrides"), dict) and isinstance(top.get("overrides"), dict):
        merged["overrides"] = {**base["overrides"], **top["overrides"]}
    return merged
