"""Presets: `configs/NAME.toml`, one table per command (`[scan]`, `[drift]`).

Each key is an axis or setting with the same name as the CLI option (dashes as
underscores). A sub-table named after a device (`[drift.cuda]`, `[drift.cpu]`)
overrides keys on that device only: the interpreter is orders of magnitude
slower than a GPU, and a preset sized for one would be trivial or endless on
the other.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from ssmcheck.core.sweep import SweepError


def _configs_dir():
    """configs/ of a source checkout, else the copy installed as package data."""
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / "configs").is_dir():
        return checkout / "configs"
    return resources.files("ssmcheck.configs")


def preset_names() -> list[str]:
    return sorted(p.name[: -len(".toml")] for p in _configs_dir().iterdir() if p.name.endswith(".toml"))


def load_preset(name: str, command: str, device: str | None = None) -> dict:
    """The `[command]` table of configs/NAME.toml, with its `[command.DEVICE]` overrides applied."""
    path = _configs_dir() / f"{name}.toml"
    if not path.is_file():
        raise SweepError(f"--preset: unknown preset {name!r} (available: {', '.join(preset_names())})")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise SweepError(f"--preset {name}: configs/{name}.toml is not valid TOML: {exc}") from None
    if command not in data:
        raise SweepError(f"--preset {name}: configs/{name}.toml has no [{command}] table")
    table = dict(data[command])
    overrides = {d: table.pop(d) for d in ("cpu", "cuda") if d in table}
    table.update(overrides.get(device, {}))
    return table
