"""The case table's columns for each command: a header, whether it sorts as numbers, and the cell of a case."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ssmcheck.core.report import figure, worst_ratio
from ssmcheck.html.data import severity
from ssmcheck.html.page import Cell

ROUNDING_TAGS = {"nearest": "RN", "stochastic": "SR"}


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[dict], Cell]
    numeric: bool = False


def _figure(value, fmt: str = ".2e", suffix: str = "") -> Cell:
    """A number of the report; NaN sorts as the largest (the worst), a missing one last either way."""
    x = figure(value)
    if x is None:
        return Cell("", "", kind="number")
    if math.isnan(x):
        return Cell("nan", "Infinity", kind="number")
    key = repr(x) if math.isfinite(x) else ("Infinity" if x > 0 else "-Infinity")
    return Cell(f"{x:{fmt}}{suffix}", key, kind="number")


def _status(case: dict) -> Cell:
    return Cell(case["status"], str(severity(case["status"])), kind="status")


def _case_id(mapped: set[str]) -> Callable[[dict], Cell]:
    return lambda case: Cell(case["id"], href=f"#map-{case['id']}" if case["id"] in mapped else None, kind="id")


def _param(name: str, numeric: bool = False) -> Column:
    if numeric:
        return Column(name.replace("_", " "), lambda c: _figure(c["params"].get(name), "g"), numeric=True)
    return Column(name.replace("_", " "), lambda c: Cell(str(c["params"].get(name) or "")))


def _widths(case: dict) -> Cell:
    p = case["params"]
    return Cell(p.get("model") or f"{p['nheads']}x{p['headdim']}x{p['dstate']}/{p['ngroups']}")


def _state(case: dict) -> Cell:
    p = case["params"]
    return Cell(f"{p['state_dtype']} {ROUNDING_TAGS.get(p['rounding'], p['rounding'])}")


def _first_nonfinite(case: dict) -> Cell:
    f = case.get("first_nonfinite")
    if not f:
        return Cell("")
    if f["output"] == "y":
        return Cell(f"s{f['sequence']} t{f['token']} c{f['chunk']} h{f['head']} p{f['channel']}")
    return Cell(f"state s{f['sequence']} h{f['head']} p{f['channel']} n{f['state_index']}")


def _scan_ratio(case: dict) -> Cell:
    """The largest judged ratio, as the terminal table shows it (NaN is the worst)."""
    return _figure(worst_ratio(case), ".2f")


def _seconds(case: dict) -> Cell:
    return Cell("", "", kind="number") if case["status"] == "skipped" else _figure(case["seconds"], ".2f", "s")


def _message(case: dict) -> Cell:
    return Cell(case["message"], kind="message")


def _last(key: str) -> Callable[[dict], Cell]:
    return lambda case: _figure(case["checkpoints"][-1][key] if case["checkpoints"] else None)


def scan_columns(mapped: set[str]) -> list[Column]:
    """`mapped`: the ids of the cases that have an error map (their id links to it)."""
    return [
        Column("status", _status, numeric=True),
        Column("case", _case_id(mapped)),
        _param("regime"), _param("dtype"), _param("chunk_size", numeric=True), _param("seqlen", numeric=True),
        _param("batch", numeric=True),
        Column("HxPxN/G", _widths), Column("state", _state),
        Column("y err", lambda c: _figure(c["error"]["y_max_rel"]), numeric=True),
        Column("state err", lambda c: _figure(c["error"]["state_max_rel"]), numeric=True),
        Column("ratio", _scan_ratio, numeric=True),
        Column("first non-finite", _first_nonfinite),
        Column("growth", lambda c: _figure(c["drift"]["growth"], ".2g", "x"), numeric=True),
        Column("time", _seconds, numeric=True),
        Column("message", _message),
    ]


def drift_columns() -> list[Column]:
    return [
        Column("status", _status, numeric=True),
        Column("case", lambda c: Cell(c["id"], kind="id")),
        _param("regime"), _param("state_dtype"), _param("rounding"), _param("steps", numeric=True),
        _param("trials", numeric=True),
        Column("state err", _last("state_rel"), numeric=True),
        Column("out err", _last("out_rel"), numeric=True),
        Column("ratio", lambda c: _figure(c["ratio"], ".2f"), numeric=True),
        Column("growth α", lambda c: _figure(c["growth_exponent"], ".2f"), numeric=True),
        Column("bias z", lambda c: _figure(c["bias_z"], ".2f"), numeric=True),
        Column("time", _seconds, numeric=True),
        Column("message", _message),
    ]
