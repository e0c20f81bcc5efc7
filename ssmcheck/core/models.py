"""SSM widths of real Mamba2-family models, for `--model NAME`.

Each entry is one model's Mamba2 mixer as published in its configuration
(state-spaces/mamba2-* use the mamba_ssm `Mamba2` defaults: d_state 128,
headdim 64, expand 2, ngroups 1, chunk_size 256, so nheads = 2 * d_model / 64).
"""

from __future__ import annotations

from dataclasses import dataclass

WIDTHS = ("nheads", "headdim", "dstate", "ngroups")  # the widths a model sets (--model replaces these options)


@dataclass(frozen=True)
class ModelWidths:
    name: str
    nheads: int
    headdim: int
    dstate: int
    ngroups: int
    chunk_size: int  # the chunk size the model is served with
    source: str  # where the numbers come from


def _mamba2(name: str, d_model: int) -> ModelWidths:
    return ModelWidths(
        name=name,
        nheads=2 * d_model // 64,
        headdim=64,
        dstate=128,
        ngroups=1,
        chunk_size=256,
        source=f"state-spaces/{name.lower()}: d_model {d_model}, mamba_ssm Mamba2 defaults",
    )


MODELS: dict[str, ModelWidths] = {
    m.name.lower(): m
    for m in (
        _mamba2("Mamba2-130M", 768),
        _mamba2("Mamba2-370M", 1024),
        _mamba2("Mamba2-780M", 1536),
        _mamba2("Mamba2-1.3B", 2048),
        _mamba2("Mamba2-2.7B", 2560),
        ModelWidths(
            "Codestral-Mamba-7B", nheads=128, headdim=64, dstate=128, ngroups=8, chunk_size=256,
            source="mistralai/Mamba-Codestral-7B-v0.1 config.json",
        ),
        ModelWidths(
            "Nemotron-H-8B", nheads=128, headdim=64, dstate=128, ngroups=8, chunk_size=128,
            source="nvidia/Nemotron-H-8B-Base-8K config (hybrid: Mamba2 + attention layers)",
        ),
    )
}


def lookup(name: str) -> ModelWidths:
    """The widths of a model by name (case-insensitive); KeyError lists the known names."""
    try:
        return MODELS[name.strip().lower()]
    except KeyError:
        known = ", ".join(m.name for m in MODELS.values())
        raise KeyError(f"unknown model {name!r} (known: {known})") from None
