"""The report's figures, drawn with matplotlib (the `plot` extra) into PNG bytes.

- `error_map`: one failing scan case's relative error of y per (chunk, head) on the token axis,
  log10 colours, non-finite cells in red, the first non-finite element starred, chunk
  boundaries drawn; above it, the case's per-chunk error on the same token axis.
- `chunk_drift`: every scan case's per-chunk error, the failing ones in colour.
- `rounding_pair`: one drift configuration's error against decode step, one panel per rounding
  mode on a shared scale (nearest beside stochastic).
"""

from __future__ import annotations

import io
import math

from ssmcheck.core.report import figure
from ssmcheck.html.data import STATUS_COLOURS, DriftConfiguration

INSTALL_HINT = 'pip install "ssmcheck[plot]"'
DPI = 100
NONFINITE_CELL = "#ff1f1f"  # outside viridis, so a NaN/Inf cell never reads as an error level
EMPTY_RANGE = (1e-16, 1.0)  # colour range of a map with no finite, positive error
# Log scales span at least this many decades: a narrower one would paint noise-level differences
# (1.8e-3 against 2.1e-3) as opposite ends of the colour map, and crowd the axis with labels.
MIN_DECADES = 2
MAX_TICKED_CHUNKS = 16  # up to this many chunks, the token axis is ticked at each chunk's start
MAX_MAP_HEIGHT = 6.0  # inches: many heads share it
CURVE_HEIGHT = 1.6  # inches: the per-chunk curve above a map
MAP_WIDTH = 7.2  # inches: two maps side by side on a wide screen


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401, PLC0415
    except ImportError:
        raise PlotUnavailable(f"ssmcheck report needs matplotlib, an optional extra: {INSTALL_HINT}") from None


def _pyplot():
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    _pyplot().close(fig)
    return buffer.getvalue()


def _mark_nonfinite(ax, xs, values) -> None:
    """Non-finite points of a log-scale curve, as red crosses along the top of the axes."""
    bad = [x for x, v in zip(xs, values) if not math.isfinite(v)]
    if bad:
        ax.plot(bad, [0.94] * len(bad), "x", color=NONFINITE_CELL, markersize=7, mew=2,
                transform=ax.get_xaxis_transform(), label="non-finite")


def _positive(xs, values):
    points = [(x, v) for x, v in zip(xs, values) if math.isfinite(v) and v > 0]
    return [p[0] for p in points], [p[1] for p in points]


def _log_range(low: float, high: float) -> tuple[float, float]:
    """[low, high] widened about its geometric middle to at least MIN_DECADES decades."""
    if high >= low * 10**MIN_DECADES:
        return low, high
    middle = math.sqrt(low * high)
    return middle / 10 ** (MIN_DECADES / 2), middle * 10 ** (MIN_DECADES / 2)


def _widen(ax) -> None:
    """Give a log y-axis at least MIN_DECADES decades (after its curves are drawn)."""
    ax.set_ylim(*_log_range(*ax.get_ylim()))


def error_map(errors: list[list], chunk_size: int, tokens: int, per_chunk: list, first: tuple[int, int] | None,
              title: str) -> bytes:
    """`errors` is the JSON's [chunk][head] relative error of y; `tokens` the longest sequence's length
    (its last chunk may be partial); `first` the (token, head) of the first non-finite element of y, if any."""
    import numpy as np  # noqa: PLC0415
    from matplotlib.colors import LogNorm  # noqa: PLC0415
    from matplotlib.patches import Patch  # noqa: PLC0415

    plt = _pyplot()
    grid = np.array([[figure(e) for e in row] for row in errors], dtype=float).T  # (heads, chunks)
    nheads, nchunks = grid.shape
    finite = np.isfinite(grid)
    positive = grid[finite & (grid > 0)]
    low, high = _log_range(positive.min(), positive.max()) if positive.size else EMPTY_RANGE
    shown = np.ma.masked_invalid(np.where(finite & (grid <= 0), low, grid))  # an exact chunk at the lowest colour
    colours = plt.get_cmap("viridis").with_extremes(bad=NONFINITE_CELL)
    # chunk k spans tokens [k * chunk_size, (k + 1) * chunk_size), the last one cut at the longest sequence's end
    edges = np.minimum(np.arange(nchunks + 1) * chunk_size, tokens)

    map_height = min(MAX_MAP_HEIGHT, 1.4 + 0.25 * nheads)
    fig, (top, ax) = plt.subplots(2, 1, sharex=True, figsize=(MAP_WIDTH, CURVE_HEIGHT + map_height), layout="constrained",
                                  height_ratios=[CURVE_HEIGHT, map_height])
    centres = (edges[:-1] + edges[1:]) / 2
    curve = [figure(e) for e in per_chunk][:nchunks]
    top.semilogy(*_positive(centres, curve), "-o", markersize=3, color="#37474f", label="all heads")
    _mark_nonfinite(top, centres, curve)
    _widen(top)
    top.set_ylabel("rel. error\nper chunk", fontsize=8)
    top.grid(True, which="major", alpha=0.3)
    top.set_title(title, fontsize=10)

    mesh = ax.pcolormesh(edges, np.arange(nheads + 1) - 0.5, shown, cmap=colours, norm=LogNorm(low, high))
    for panel in (top, ax):
        for boundary in edges[1:-1]:
            panel.axvline(boundary, color="white" if panel is ax else "#b0bec5", linewidth=0.8)
    handles = [Patch(facecolor=NONFINITE_CELL, label="non-finite")]
    if first is not None:
        token, head = first
        handles += ax.plot([token + 0.5], [head], "*", markersize=16, markerfacecolor="white",
                           markeredgecolor="black", mew=1.2, label=f"first non-finite: token {token}, head {head}")
    fig.legend(handles=handles, loc="outside lower left", ncol=2, fontsize=8, frameon=False)
    ax.set_xlim(edges[0], edges[-1])
    if nchunks <= MAX_TICKED_CHUNKS:
        ax.set_xticks(edges[:-1])  # chunk starts (the end may be a partial chunk's, too close to label)
    ax.set_ylim(nheads - 0.5, -0.5)  # head 0 on top, as in a table
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel(f"token (within its sequence); chunks of {chunk_size} tokens", fontsize=9)
    ax.set_ylabel("head")
    fig.colorbar(mesh, ax=ax, label="relative error of y", pad=0.01)
    return _png(fig)


def chunk_drift(cases: list[dict]) -> bytes:
    """Every scan case that ran: its relative error of y per chunk, failing cases in their status colour."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(MAP_WIDTH + 1.5, 3.4))  # room for the legend beside it
    # passing cases first, so the failing ones are drawn on top
    for case in sorted(cases, key=lambda c: c["status"] != "pass"):
        values = [figure(e) for e in case["drift"]["per_chunk"]]
        chunks = range(len(values))
        failing = case["status"] != "pass"
        ax.semilogy(*_positive(chunks, values), "-o" if failing else "-", markersize=3, linewidth=1.4 if failing else 0.8,
                    color=STATUS_COLOURS.get(case["status"], "black"), alpha=1.0 if failing else 0.45,
                    label=case["id"] if failing else None)
        _mark_nonfinite(ax, chunks, values)
    _widen(ax)
    ax.set_xlabel("chunk (each sequence chunked on its own)")
    ax.set_ylabel("relative error of y")
    ax.set_title(f"per-chunk drift: {len(cases)} cases (passing in green)", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))  # one "non-finite" entry
    if 0 < len(unique) <= 12:
        ax.legend(unique.values(), unique.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    fig.tight_layout()
    return _png(fig)


def rounding_pair(configuration: DriftConfiguration) -> bytes:
    """Error against decode step, log-log: one panel per rounding mode, nearest left, on one y scale."""
    plt = _pyplot()
    cases = configuration.cases
    fig, axes = plt.subplots(1, len(cases), sharey=True, figsize=(4.3 * len(cases), 3.3), squeeze=False)
    for ax, case in zip(axes.flat, cases):
        colour = STATUS_COLOURS.get(case["status"], "black")
        for label, points, style in (("state", case["checkpoints"], "-o"),
                                     ("state, baseline", (case.get("baseline") or {}).get("checkpoints", []), "--"),
                                     ("output", case["checkpoints"], ":")):
            key = "out_rel" if label == "output" else "state_rel"
            steps, values = [p["step"] for p in points], [figure(p[key]) for p in points]
            ax.loglog(*_positive(steps, values), style, markersize=3, color=colour if label == "state" else "#546e7a",
                      label=label)
            if label == "state":
                _mark_nonfinite(ax, steps, values)
        first = case.get("first_nonfinite")
        if first and first.get("step") is not None:
            ax.axvline(first["step"], color=NONFINITE_CELL, linewidth=1, label=f"first non-finite: step {first['step']}")
        params = case["params"]
        ax.set_title(f"{params['rounding']} ({case['status']}, {params['trials']} trial"
                     f"{'s' if params['trials'] != 1 else ''})", fontsize=9, color=colour)
        ax.set_xlabel("decode step")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    _widen(axes.flat[0])  # the panels share their y axis
    axes.flat[0].set_ylabel("relative error")
    fig.suptitle(configuration.name, fontsize=10)
    fig.tight_layout()
    return _png(fig)
