"""`drift --from-prefill N`: the decode starts from the states a chunk-scan prefill of N tokens returns, as a
served model's cache does, instead of the regime's drawn initial state.

The prefill continues the regime: it starts from the regime's initial state and runs N tokens drawn from the
regime's own step distribution (a generator of their own, so the decode stream is unchanged), through the
chunk-scan kernel that serves beside the decode kernel (plan.partner). A scan kernel that can store the
case's state dtype is told to (with its rounding); one that cannot returns fp32 states, which are stored
rounded to nearest, as a cache write would. The reference and the baseline then start from those stored
states, so the drift measures the decode alone, from where a real prefill leaves it.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ssmcheck.core import sweep
from ssmcheck.core.capture import Transcript
from ssmcheck.core.guard import describe
from ssmcheck.drift.adapter import KernelRaised
from ssmcheck.drift.regimes import DecodeProblem
from ssmcheck.drift.spec import DriftCase
from ssmcheck.scan.adapter import ScanAdapter
from ssmcheck.scan.inputs import ScanInputs
from ssmcheck.scan.spec import ScanCase

# The prefill's chunk size: Mamba2's smaller served one, which every kernel here takes.
PREFILL_CHUNK = 64


def prefilled(problem: DecodeProblem, case: DriftCase, scan: ScanAdapter, transcript: Transcript) -> DecodeProblem:
    """`problem` starting from the states of a prefill of case.from_prefill tokens. Raises KernelRaised when the
    prefill raises or returns non-finite states (a decode from them would judge nothing)."""
    inputs = _prefill_inputs(problem, case)
    scan_case = _scan_case(case, scan)
    try:
        states = scan.call(scan.cached_inputs(inputs, scan_case), scan_case, transcript)[1]
    except Exception as exc:  # noqa: BLE001 (the prefill kernel's failure is the case's error)
        raise KernelRaised(f"the prefill of {case.from_prefill} tokens raised {describe(exc)}") from exc
    if not bool(torch.isfinite(states).all()):
        raise KernelRaised(f"the prefill of {case.from_prefill} tokens returned non-finite states")
    return replace(problem, initial_state=states.to(case.dtype).contiguous())


def _prefill_inputs(problem: DecodeProblem, case: DriftCase) -> ScanInputs:
    """N tokens of the regime's stream as a chunk-scan batch (one row per decode batch row), per-head
    parameters taken back from the decode's expanded views."""
    generator = torch.Generator().manual_seed(sweep.case_seed(case.seed, {"prefill": case.from_prefill}))
    steps = problem.draw_steps(generator, case.from_prefill)

    def tokens(name: str) -> torch.Tensor:  # (batch, tokens, ...), the tokens drawn as steps
        return getattr(steps, name).transpose(0, 1).contiguous().to(problem.device)

    return ScanInputs(
        x=tokens("x"), dt=tokens("dt")[..., 0].contiguous(), A=problem.A[:, 0, 0].contiguous(), B=tokens("B"),
        C=tokens("C"), D=problem.D[:, 0].contiguous(), dt_bias=problem.dt_bias[:, 0].contiguous(),
        initial_states=problem.initial_state.float(), dt_softplus=problem.dt_softplus,
        note=f"prefill of {case.from_prefill} tokens",
    )


def _scan_case(case: DriftCase, scan: ScanAdapter) -> ScanCase:
    """The scan case of the prefill: the decode's storage where the scan kernel can store it, else fp32."""
    told = ScanCase(scan.name, "normal", "fp32", PREFILL_CHUNK, case.from_prefill, case.batch, case.nheads,
                    case.headdim, case.dstate, case.ngroups, case.state_dtype, case.rounding, case.model, case.seed)
    return told if scan.skip_reason(told) is None else replace(told, state_dtype="fp32", rounding="nearest")
