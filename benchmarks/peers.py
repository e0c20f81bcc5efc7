"""The peers' kernels for the benchmarks, run in the same process as ssmcheck's on the same inputs.

Each peer is a closure over prepared inputs: what a serving engine prepares once per batch (vLLM's chunk
metadata, its flat token layout) is prepared here, outside the timed call. A peer that cannot be imported
is left out, with the reason, so a benchmark still runs where only some are installed (build them with
../shared/tools/make-peers, carry `.peers` to the GPU machine and run with
`PYTHONPATH=.:.peers/v033:.peers/mamba`, or `.peers/v031` for vLLM 0.31).
"""

from __future__ import annotations

from collections.abc import Callable


def _available(what: str, missing: dict):
    """(name, its ssmcheck.peers module, its `what`: "state_update" or "chunk_scan") for each peer that imports;
    each other peer's reason goes into `missing`."""
    from ssmcheck.core.callables import KernelSpecError  # noqa: PLC0415
    from ssmcheck.peers import mamba_ssm, vllm  # noqa: PLC0415

    for name, module in (("vLLM", vllm), ("mamba_ssm", mamba_ssm)):
        try:
            yield name, module, getattr(module, what)()
        except KernelSpecError as exc:
            missing[name] = str(exc)


def where(fn: Callable) -> str:
    """Where a peer's function was imported from (which vLLM or mamba_ssm a figure belongs to)."""
    import inspect  # noqa: PLC0415

    return inspect.getsourcefile(fn) or "?"


def state_updates(args: dict) -> tuple[dict[str, Callable], dict[str, str]]:
    """({peer: step(state) -> out}, {peer: why it is left out}) for one decode step on the selective_state_update
    keyword `args` (x, dt, A, B, C, D, z, dt_bias, dt_softplus). Each step updates `state` in place."""
    import torch  # noqa: PLC0415

    from ssmcheck.core.autotune import ORIGIN  # noqa: PLC0415

    steps, missing = {}, {}
    for name, _, fn in _available("state_update", missing):
        if name == "vLLM":
            raw = getattr(fn, ORIGIN)  # vLLM's own function, not our adapter around it
            out = torch.full_like(args["x"], float("nan"))  # poisoned: an unwritten element shows

            def step(state, raw=raw, out=out):
                raw(state, **args, out=out)
                return out
        else:
            raw = fn

            def step(state, raw=raw):
                return raw(state, **args)
        step.origin = where(raw)
        steps[name] = step
    return steps, missing


def chunk_scans(args: dict, chunk_size: int) -> tuple[dict[str, Callable], dict[str, str]]:
    """({peer: run() -> y}, {peer: why it is left out}) for one prefill of the batch-mode chunk-scan keyword
    `args` (x, dt, A, B, C, D, dt_bias; dt_softplus on)."""
    from ssmcheck.core.autotune import ORIGIN  # noqa: PLC0415

    runs, missing = {}, {}
    for name, module, fn in _available("chunk_scan", missing):
        if name == "vLLM":
            varlen = getattr(fn, ORIGIN)
            positional, keywords = module.varlen_arguments(**args, chunk_size=chunk_size, dt_softplus=True)

            def run(varlen=varlen, positional=positional, keywords=keywords):
                varlen(*positional, **keywords)
                return keywords["out"]
            run.origin = where(varlen)
        else:
            combined = fn

            def run(combined=combined):
                return combined(**args, chunk_size=chunk_size, dt_softplus=True)
            run.origin = where(combined)
        runs[name] = run
    return runs, missing
