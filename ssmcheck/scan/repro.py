"""Reproducers (`scan --repro DIR`): a failing case, shrunk, as a standalone script a kernel author can run.

For each case that ends `fail`, `nonfinite` or `error`:

1. shrink it: a greedy loop over its parameters (batch, seqlen by whole chunks, nheads, ngroups, headdim,
   dstate), each tried at smaller values, smallest first, keeping a value when the case, run again as
   the sweep ran it, keeps its status; at most SHRINK_RUNS runs;
2. write DIR/CASE_ID/: `inputs.pt` (torch.save: the kernel call's arguments, the float64 reference's
   y, states and C·h, the tolerance limits of the shrunk case, the rule for the rounding bias of y and the
   final states with the baseline's means, the token layout, the autotune configs the case pinned, which of the
   calls for y alone and with both return flags the case made, the seed check's expected count of differing
   states under stochastic rounding, the serving-shaped checks that failed) and
   `repro.py` (scan/repro_script.py: it re-runs the calls and prints the verdict, importing the kernel but not
   ssmcheck; it names the failed serving-shaped checks, whose calls it does not make).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ssmcheck.core.formats import DTYPES
from ssmcheck.core.output_bias import BIAS_FLOOR_ULP, BIAS_Z_LIMIT
from ssmcheck.core.status import Status
from ssmcheck.core.tolerance import tolerance_limit
from ssmcheck.scan import draws, spec
from ssmcheck.scan.adapter import BUILTIN, MAMBA_SSM, VLLM, ScanAdapter
from ssmcheck.scan.inputs import REFUSED_INT64
from ssmcheck.scan.padding import padded
from ssmcheck.scan.regimes import REGIMES
from ssmcheck.scan.results import ScanResult
from ssmcheck.scan.spec import ScanCase

REPRODUCED = (Status.FAIL, Status.NONFINITE, Status.ERROR)
# Runs of the case while shrinking, at most: each is a whole case (kernel, references, baseline).
SHRINK_RUNS = 24
SCRIPT = Path(__file__).with_name("repro_script.py")
# The importable callables behind the named kernels (vLLM's is called as its model code calls it: scan_call).
_CALLABLES = {
    BUILTIN: "ssmcheck.ops.chunk_scan.chunk:chunk_scan_combined",
    MAMBA_SSM: "mamba_ssm.ops.triton.ssd_combined:mamba_chunk_scan_combined",
    VLLM: "vllm.model_executor.layers.mamba.ops.ssd_combined:mamba_chunk_scan_combined_varlen",
}


def _smaller(case: ScanCase) -> list[tuple[str, list[int]]]:
    """Each parameter with the smaller values to try, smallest first."""
    whole, rest = divmod(case.seqlen, case.chunk_size)
    # Whole chunks fewer, keeping the partial last chunk (where mask bugs live); or half the tokens.
    seqlens = sorted({rest + case.chunk_size * k for k in (0, 1, whole // 2) if rest + case.chunk_size * k > 0}
                     | {case.seqlen // 2})
    return [
        ("batch", sorted({1, case.batch // 2})),
        ("seqlen", seqlens),
        ("ngroups", [1]),
        ("nheads", [n for n in _halves(case.nheads) if n % case.ngroups == 0]),
        ("headdim", _halves(case.headdim)),
        ("dstate", _halves(case.dstate)),
    ]


def _halves(n: int) -> list[int]:
    return sorted({max(1, n // 4), max(1, n // 2)})


def shrink(case: ScanCase, status: Status, run: Callable[[ScanCase], ScanResult]) -> tuple[ScanCase, ScanResult]:
    """The smallest case found that keeps `status`, and its result (from `run`, which runs a case)."""
    best, result, runs = case, None, 0
    for name, values in _smaller(case):
        for value in values:
            if value >= getattr(best, name) or value < 1 or runs >= SHRINK_RUNS:
                continue
            params = {**best.params(), name: value}
            if name in ("nheads", "headdim", "dstate", "ngroups"):
                params["model"] = None  # the widths are no longer the model's
            candidate = spec.case_from_params(params, best.kernel)
            if candidate.skip_reason is not None:
                continue
            runs += 1
            outcome = run(candidate)
            if outcome.status is status:
                best, result = candidate, outcome
                break
    return best, result if result is not None else run(best)


@dataclass(frozen=True)
class Reproducer:
    """What repro.py needs of a case, as its inputs.pt holds it."""

    kernel: str  # MODULE:FUNCTION or an absolute path/to/file.py:FUNCTION
    y_from_out: bool  # the kernel writes y into its `out` argument and returns the states (vLLM)
    args: list
    kwargs: dict


def _reproducer(adapter: ScanAdapter, inputs, case: ScanCase) -> Reproducer:
    args, kwargs = adapter.arguments(inputs, case)
    if adapter.name == VLLM:
        from ssmcheck.peers import vllm  # noqa: PLC0415

        args, kwargs = vllm.varlen_arguments(*args, **kwargs)
        return Reproducer(_CALLABLES[VLLM], True, list(args), kwargs)
    name = adapter.name
    where, _, function = name.rpartition(":")
    if where.endswith(".py"):
        name = f"{Path(where).resolve()}:{function}"
    return Reproducer(_CALLABLES.get(name, name), False, list(args), kwargs)


def write(folder: Path, runner, case: ScanCase, result: ScanResult) -> Path:
    """Shrink `case` (run by `runner`, a scan.run.ScanRunner, without stages or reproducers) and write its
    reproducer into folder/CASE_ID; returns that folder."""
    from ssmcheck.scan import run  # noqa: PLC0415 (run imports this module)

    quiet = runner.without_extras()
    small, outcome = shrink(case, result.status, lambda c: quiet(c, lambda: None))
    adapter = runner.adapter()
    inputs = REGIMES[small.regime].generate(small.shape(), DTYPES[small.dtype], small.seed,
                                            state_dtype=DTYPES[small.state_dtype]).to(runner.device)
    if REFUSED_INT64 in outcome.inputs_note:  # the case ran on int32 indices: the script passes them so too
        inputs = inputs.narrowed(REFUSED_INT64)
    inputs = adapter.cached_inputs(inputs, small)
    y, states, y_ssm = run.reference(inputs, runner.reference)
    reproducer = _reproducer(adapter, inputs, small)
    sent = padded(inputs) if inputs.pad_after is not None else None  # the call's row, with its pad tokens
    tokens = inputs.token_map()
    base = outcome.baseline
    data = {
        "id": small.id, "params": small.params(), "kernel": reproducer.kernel, "y_from_out": reproducer.y_from_out,
        "y_shape": list((sent.inputs if sent else inputs).x.shape), "chunk_size": small.chunk_size,
        "repeat": runner.repeat, "live": sent.live.cpu() if sent else None,
        "args": [_cpu(a) for a in reproducer.args], "kwargs": {k: _cpu(v) for k, v in reproducer.kwargs.items()},
        "reference": {"y": _cpu(y), "states": _cpu(states),
                      "y_ssm": _cpu(y_ssm) if inputs.D is not None or inputs.z is not None else None},
        "limits": {"y": _limit(runner, base.y.rel if base else None),
                   "states": _limit(runner, base.states.rel if base else None),
                   "group": _limit(runner, outcome.worst_group.baseline_rel if outcome.worst_group else None),
                   "ssm": _limit(runner, base.ssm.rel if base is not None and base.ssm is not None else None)},
        "bias": _bias(base),
        # The calls besides the timed one and the SSM part's that the case made (scan.run), to be made again. vLLM's
        # function takes no return flags: every call of it is the timed one.
        "calls": {"y_alone": not reproducer.y_from_out and run.judges_y_alone(small.dtype, inputs),
                  "both_flags": not reproducer.y_from_out and run.judges_both_flags(small, inputs)},
        # A kernel with the state options (which the seed check needs) stores the case's state dtype.
        "seed_check": (_seed_check(small, states) if run.judges_seed(small, adapter, DTYPES[small.state_dtype])
                       else None),
        # The serving-shaped checks (--invariance) that failed: the script makes none of their calls, and says so.
        "unmade": [check.name for check in outcome.invariance or () if check.status not in (Status.PASS, Status.SKIPPED)],
        "sequence": tokens.sequence.cpu(), "position": tokens.position.cpu(),
        "expected": {"status": outcome.status.value, "message": outcome.message},
        "pins": [{"module": t.module, "name": t.name, "index": i, "config": _config_text(t, i)}
                 for t, i in runner.pins(small).items()],
    }
    where = folder / case.id
    where.mkdir(parents=True, exist_ok=True)
    torch.save(data, where / "inputs.pt")
    shutil.copyfile(SCRIPT, where / "repro.py")
    return where


def _limit(runner, baseline_error: float | None) -> float:
    """The tolerance limit of a judged figure (infinite when the case had none: nothing to exceed)."""
    if baseline_error is None:
        return float("inf")
    tolerance = runner.tolerance
    return tolerance_limit(baseline_error, tolerance.tol_factor, tolerance.floor, tolerance.rtol)


def _bias(baseline) -> dict | None:
    """What the script judges the rounding bias of y and of the final states by (core.output_bias): the baseline's
    mean of each, along the values and toward +inf (None for one stored in fp32), the floor and the z limit; None
    where neither is narrow."""
    if baseline is None or (baseline.y_bias is None and baseline.states_bias is None):
        return None
    outputs = (("y", baseline.y_bias), ("final states", baseline.states_bias))
    means = {name: None if bias is None else bias.mean for name, bias in outputs}
    ups = {name: None if bias is None else bias.mean_up for name, bias in outputs}
    return {"baseline_mean": means, "baseline_mean_up": ups, "floor": BIAS_FLOOR_ULP, "z_limit": BIAS_Z_LIMIT}


def _seed_check(case: ScanCase, reference_states: torch.Tensor) -> dict:
    """What the script's seed check needs (scan.draws): how many stored elements two independent draws store
    differently, on average, the false-alarm chance below which equal bits fail, and the bit of the seed its third
    call flips."""
    return {"expected": draws.expected_differences(reference_states, DTYPES[case.state_dtype]),
            "false_alarm": draws.FALSE_ALARM, "flipped_bit": draws.FLIPPED_SEED_BIT}


def _config_text(tuned, index: int) -> str:
    from ssmcheck.core import autotune  # noqa: PLC0415 (reaches triton)

    return autotune.described_text(autotune.describe(tuned.configs[index]))


def _cpu(value):
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value
