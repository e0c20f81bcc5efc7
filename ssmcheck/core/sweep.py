"""Sweep mechanics shared by the commands: parsing option values, the cartesian product, seeds.

A sweep is a dict of axes (name -> list of values), each named like its CLI
option (dashes as underscores). Values come from the command line as
comma-separated text or from a preset as TOML lists; both parse the same way.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from pathlib import Path

from ssmcheck.core.status import FAIL_ON


class SweepError(ValueError):
    """A bad sweep option or preset; the message names it."""


def option_name(key: str) -> str:
    """The CLI option of a preset key: chunk_size -> --chunk-size."""
    return "--" + key.replace("_", "-")


def parse_list(option: str, text: str, convert=str, allowed=None) -> list:
    """Parse a comma-separated option value, e.g. --chunk-size 64,128. An empty item (`40,,`) is refused."""
    items = [t.strip() for t in str(text).split(",")]
    if items == [""]:
        raise SweepError(f"{option}: empty value")
    if "" in items:
        raise SweepError(f"{option}: an empty item was given in {str(text)!r}")
    values = []
    for item in items:
        try:
            value = convert(item)
        except ValueError:
            raise SweepError(f"{option}: invalid value {item!r}") from None
        if allowed is not None and value not in allowed:
            raise SweepError(f"{option}: invalid value {item!r} (choose from {', '.join(map(str, allowed))})")
        values.append(value)
    return list(dict.fromkeys(values))  # de-duplicate, keep order


def parse_axis(label: str, value, convert=str, allowed=None) -> list:
    """Parse an axis given as a TOML list (a preset) or as comma-separated text (the command line)."""
    text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
    return parse_list(label, text, convert, allowed)


def parse_fail_on(label: str, value) -> tuple[str, ...]:
    """Parse --fail-on (or a preset's fail_on): which of nonfinite, tolerance, error gate the exit code."""
    return tuple(parse_axis(label, value, allowed=tuple(FAIL_ON)))


def parse_number(label: str, value, *, strict: bool = True) -> float:
    """A finite number > 0 (>= 0 when not `strict`), from the command line or a preset.

    Infinity is refused too: a tolerance of inf would pass every case without saying so.
    """
    expected = f"expected a finite number {'>' if strict else '>='} 0"
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SweepError(f"{label}: invalid value {value!r} ({expected})") from None
    if isinstance(value, bool) or not 0 <= number < float("inf") or (strict and number == 0):
        raise SweepError(f"{label}: invalid value {value!r} ({expected})")
    return number


def parse_choice(choices: tuple[str, ...]):
    """A setting's parser accepting one of `choices`."""
    def parse(label: str, value) -> str:
        if value not in choices:
            raise SweepError(f"{label}: invalid value {value!r} (choose from {', '.join(choices)})")
        return value

    return parse


def parse_count(label: str, value, minimum: int) -> int:
    """An integer >= minimum, from the command line or a preset (a TOML 2.0 or true is refused)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SweepError(f"{label}: invalid value {value!r} (expected an integer >= {minimum})")
    return value


def parse_flag(label: str, value) -> bool:
    """A yes/no setting: true or false in a preset (the command line's flags give booleans)."""
    if not isinstance(value, bool):
        raise SweepError(f"{label}: invalid value {value!r} (expected true or false)")
    return value


def parse_folder(label: str, value) -> str | None:
    """A folder to write into (None: none): an existing writable folder, or a path whose nearest existing
    ancestor is a writable folder (it is created when first written to)."""
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise SweepError(f"{label}: invalid value {value!r} (expected a folder)")
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise SweepError(f"{label}: {str(path)!r} is a file, not a folder")
    existing = next(p for p in (path, *path.absolute().parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise SweepError(f"{label}: cannot write into {str(existing)!r}")
    return str(path)


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(text)
    return value


def product(axes: dict[str, list]) -> list[dict]:
    """The cartesian product of the axes, in axis order, as a list of dicts."""
    names = list(axes)
    return [dict(zip(names, combo)) for combo in itertools.product(*(axes[n] for n in names))]


def case_seed(seed: int, params: dict) -> int:
    """A deterministic 31-bit seed from the base seed and a case's parameters.

    Stable across processes and Python versions (no `hash()` randomisation).
    """
    key = json.dumps({"seed": seed, **params}, sort_keys=True, default=str)
    return _seed_of(key)


def step_seeds(seed: int, first: int, count: int) -> list[int]:
    """case_seed(seed, {"step": n}) for n = first .. first + count - 1: the same keys, written without json (1 us a
    seed, where case_seed takes 3.4 us on a 2-core CPU; a drift on a GPU asks for one a decode step, 712k in its
    default preset)."""
    return [_seed_of(f'{{"seed": {int(seed)}, "step": {int(n)}}}') for n in range(first, first + count)]


def _seed_of(key: str) -> int:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little") & 0x7FFFFFFF
