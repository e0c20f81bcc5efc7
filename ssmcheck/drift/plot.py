"""`ssmcheck drift --plot FILE.png`: state drift against decode step, log-log.

One panel per configuration (regime, state dtype, shape), one line per rounding
mode (solid: the kernel; dashed: its baseline). matplotlib is an optional
extra (`pip install ssmcheck[plot]`); `require_matplotlib` says so when absent.
"""

from __future__ import annotations

import math
from pathlib import Path

from ssmcheck.drift.results import DriftResult

INSTALL_HINT = "pip install ssmcheck[plot]"
_COLOURS = {"nearest": "tab:red", "stochastic": "tab:blue"}


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401, PLC0415
    except ImportError:
        raise PlotUnavailable(f"--plot needs matplotlib, an optional extra: {INSTALL_HINT}") from None


def _positive(steps, values):
    points = [(s, v) for s, v in zip(steps, values) if math.isfinite(v) and v > 0]
    return [p[0] for p in points], [p[1] for p in points]


def plot_drift(results: list[DriftResult], path: Path | str) -> int:
    """Draw the results that ran into `path`; returns the number of panels (0: nothing drawn)."""
    require_matplotlib()
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt  # noqa: PLC0415

    panels: dict[str, list[DriftResult]] = {}
    for r in results:
        if r.run is not None and r.run.checkpoints:
            panels.setdefault(r.case.configuration, []).append(r)
    if not panels:
        return 0
    columns = min(len(panels), 4)
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.5 * columns, 3.5 * rows), squeeze=False)
    for ax, (config, members) in zip(axes.flat, panels.items()):
        for r in members:
            colour = _COLOURS.get(r.case.rounding)
            steps = [c.step for c in r.run.checkpoints]
            ax.loglog(*_positive(steps, [c.state_rel for c in r.run.checkpoints]), "-o", markersize=3,
                      color=colour, label=f"{r.case.rounding} ({r.status.value})")
            base_steps = [c.step for c in r.run.baseline]
            ax.loglog(*_positive(base_steps, [c.state_rel for c in r.run.baseline]), "--", color=colour,
                      alpha=0.6, label=f"{r.case.rounding} baseline")
        ax.set_title(config, fontsize=9)
        ax.set_xlabel("decode step")
        ax.set_ylabel("state relative error")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return len(panels)
