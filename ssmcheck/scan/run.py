"""Running one scan case: inputs, kernel (through its adapter), float64 reference and same-precision
baseline, measurements; the verdict is scan.verdict's.

`ScanRunner` is the same as a picklable value, so a worker process (core.isolation) can
rebuild the kernel's adapter and run cases itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ssmcheck.core import autotune, outside
from ssmcheck.core.callables import KernelSpecError
from ssmcheck.core.capture import Transcript
from ssmcheck.core.formats import DTYPES, dtype_name, saturate
from ssmcheck.core.guard import KernelExit, describe
from ssmcheck.core.precompile import COMPILE_THREADS, Launches, compile_only
from ssmcheck.core.status import Status
from ssmcheck.core.tensors import same_bits
from ssmcheck.core.tolerance import Tolerance, tolerance_limit, within_tolerance
from ssmcheck.scan import draws, invariance, measure, precision, repro, segments, stages, streamed
from ssmcheck.scan.adapter import KernelOutputError, ScanAdapter, resolve
from ssmcheck.scan.inputs import REFUSED_INT64, ScanInputs
from ssmcheck.scan.regimes import REGIMES
from ssmcheck.scan.results import SSM_PART_CALL, Comparison, ErrorMap, ScanResult, StageReport
from ssmcheck.scan.spec import ScanCase
from ssmcheck.scan.verdict import judge

# Beyond this many tokens per row the float64 reference uses the chunked form
# (tested against the sequential one to ~1e-12) instead of a Python loop over time.
SEQUENTIAL_REFERENCE_MAX_TOKENS = 8192
REFERENCE_CHUNK = 128
# Baseline draws behind the worst-group figure of a stochastically rounded case (_baseline_streams).
STOCHASTIC_DRAWS = 4


def reference_stream(inputs: ScanInputs, kind: str):
    """The sequential recurrence in float64 ("fp64") or float32 ("fp32"), or for long rows in float64 its
    chunked form, as a stream of segments (ops/chunk_scan/naive.py); y and C·h saturated to x's dtype,
    whose range the kernel returns them in (core.formats.saturate)."""
    from ssmcheck.ops.chunk_scan import naive  # noqa: PLC0415

    args = (inputs.x, inputs.dt, inputs.A, inputs.B, inputs.C)
    if reference_chunk(inputs, kind) is not None:
        stream = naive.SSDStream(*args, REFERENCE_CHUNK, **inputs.kwargs(), arith=naive.chunked_arithmetic())
    else:
        dtype = torch.float64 if kind == "fp64" else torch.float32
        stream = naive.RecurrentStream(*args, **inputs.kwargs(), dtype=dtype)
    return streamed.Saturated(stream, inputs.x.dtype)


def reference_chunk(inputs: ScanInputs, kind: str) -> int | None:
    """The chunk size of the float64 reference's chunked form for these inputs, or None (sequential)."""
    return REFERENCE_CHUNK if kind == "fp64" and inputs.x.shape[1] > SEQUENTIAL_REFERENCE_MAX_TOKENS else None


def reference(inputs: ScanInputs, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, states, the SSM part C·h of y) of `reference_stream`, whole."""
    stream = reference_stream(inputs, kind)
    y, y_ssm = _whole(stream, inputs)
    return y, streamed.states(stream, inputs), y_ssm


def _whole(stream, inputs: ScanInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, y_ssm) of a stream run as one segment, shaped like x."""
    rows, seqlen = inputs.x.shape[:2]
    return tuple(streamed.like_x(t, inputs) for t in stream.segment(0, rows * seqlen))


def baseline_stream(inputs: ScanInputs, case: ScanCase, storage: torch.dtype, allow_tf32: bool = False, **changed):
    """The same math in the kernel's dtype, its states stored in `storage` (the case's rounding), as a
    stream of segments; with `allow_tf32`, fp32 matmul operands rounded to TF32; `changed`: scan_baseline
    keywords that differ (a seed, a reduced precision)."""
    from ssmcheck.ops.chunk_scan.baseline import baseline_stream as stream  # noqa: PLC0415

    options = dict(state_dtype=storage, rounding=case.rounding, seed=case.seed)
    return stream(inputs.x, inputs.dt, inputs.A, inputs.B, inputs.C, case.chunk_size, **inputs.kwargs(),
                  **options | precision.judged_baseline_options(inputs, allow_tf32) | changed)


def baseline(inputs: ScanInputs, case: ScanCase, storage: torch.dtype,
             allow_tf32: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, states, the SSM part C·h of y) of `baseline_stream`, whole. C·h comes out in x's dtype, as a
    kernel called without D and z returns it (it is bitwise that output)."""
    stream = baseline_stream(inputs, case, storage, allow_tf32)
    y, y_ssm = _whole(stream, inputs)
    return y, streamed.states(stream, inputs), saturate(y_ssm, inputs.x.dtype).to(inputs.x.dtype)


def _baseline_output(inputs: ScanInputs, case: ScanCase, storage: torch.dtype, allow_tf32: bool,
                     record_stages: bool = False):
    from ssmcheck.ops.chunk_scan.baseline import scan_baseline  # noqa: PLC0415

    return scan_baseline(
        inputs.x, inputs.dt, inputs.A, inputs.B, inputs.C, case.chunk_size, **inputs.kwargs(),
        state_dtype=storage, rounding=case.rounding, seed=case.seed,
        **precision.judged_baseline_options(inputs, allow_tf32), record_stages=record_stages,
    )


def localise_stages(kernel: ScanAdapter, inputs: ScanInputs, case: ScanCase, storage: torch.dtype,
                    allow_tf32: bool, tolerance: Tolerance, transcript=None) -> StageReport:
    """The kernel's SSD stages against the float64 chunked reference's at the case's chunk size, judged
    against the baseline's (scan.stages). Advisory: a failure to compare is the report's note, never
    the case's verdict."""
    from ssmcheck.ops.chunk_scan import naive  # noqa: PLC0415

    try:
        found = kernel.call_stages(inputs, case, transcript)
    except Exception as exc:  # noqa: BLE001 (a kernel's failure is the report's)
        return StageReport(note=f"the kernel's stages raised {describe(exc)}")
    try:
        ref = naive.scan_chunked(inputs.x, inputs.dt, inputs.A, inputs.B, inputs.C, case.chunk_size,
                                 **inputs.kwargs(), record_stages=True)
        # The baseline stores the states it passes as the kernel stores its own: mamba_ssm keeps them in C's
        # dtype between chunks while its final states come back in fp32.
        passed = found["passed_states"].dtype
        base = _baseline_output(inputs, case, passed if passed in DTYPES.values() else storage, allow_tf32,
                                record_stages=True)
        truth = {**ref.stages, "y": saturate(ref.y, inputs.x.dtype)}
        return stages.localise(found, truth, {**base.stages, "y": base.y}, inputs, case.chunk_size, tolerance)
    except Exception as exc:  # noqa: BLE001
        return StageReport(note=f"comparing the stages raised {describe(exc)}")


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_case(case: ScanCase, kernel: ScanAdapter, tolerance: Tolerance, reference_kind: str,
             device: str, allow_tf32: bool = False, warmup: bool = False, repeat: int = 1,
             allow_nondeterministic: bool = False, compare_stages: bool = False,
             serving: invariance.Options | None = None) -> ScanResult:
    """Measure and judge one case. The kernel's stages are compared with the reference's (scan.stages)
    with `compare_stages`, and for every case that fails or is non-finite where the kernel offers them.
    With `warmup`, the first call of the kernel for each shape (where a GPU compiles and autotunes) is
    made once before the timed one and timed apart: the case's `seconds` then leave it out, and
    `warmup_seconds` hold it. With `repeat` K > 1 the kernel runs K
    times on identical inputs and the runs are compared bit for bit (a race shows as a difference). With
    `serving`, the invariance checks (scan.invariance) run too and are folded into the verdict."""
    reason = case.skip_reason or kernel.skip_reason(case)
    if reason:
        return ScanResult(case, Status.SKIPPED, reason)
    start = time.perf_counter()
    result = _run(case, kernel, tolerance, reference_kind, device, allow_tf32, warmup, repeat,
                  allow_nondeterministic, compare_stages, serving)
    result.seconds = time.perf_counter() - start - (result.warmup_seconds or 0.0)
    return result


def _case_inputs(kernel: ScanAdapter, case: ScanCase, device: str) -> ScanInputs:
    """The case's inputs, drawn from its seed, on `device`, as the kernel takes them (its cached_inputs)."""
    inputs = REGIMES[case.regime].generate(case.shape(), DTYPES[case.dtype], case.seed,
                                           state_dtype=DTYPES[case.state_dtype])
    return kernel.cached_inputs(inputs.to(device), case)


def _run(case, kernel, tolerance, reference_kind, device, allow_tf32, warmup, repeat,
         allow_nondeterministic, compare_stages, serving) -> ScanResult:
    try:
        inputs = _case_inputs(kernel, case, device)
        cuts = segments.case_cuts(inputs, case.chunk_size, reference_chunk(inputs, reference_kind))
    except Exception as exc:  # noqa: BLE001 (a bug on our side is still one case's outcome)
        return ScanResult(case, Status.ERROR, f"setting up the case raised {describe(exc)}")

    torch.manual_seed(case.seed)  # for kernels that draw random bits from torch's generator
    _sync(device)
    transcript = Transcript()
    warmup_seconds, picks, first_call = _warm_up(kernel, inputs, case, transcript, device) if warmup else (None, {},
                                                                                                          None)
    start = time.perf_counter()
    try:
        # With --repeat, the same inputs again: a race shows as runs that differ.
        out, *again = _calls(kernel, inputs, case, transcript, device, repeat)
    except Exception as exc:  # noqa: BLE001 (any failure of the kernel is this case's verdict)
        if not (inputs.wide_indices and _refused(exc)):
            return _kernel_failed(case, exc, inputs, transcript)
        # A kernel may take int32 indices alone, as engines pass them: one that refuses int64 is judged on int32 (a
        # program outside its memory or a wrong output is no refusal: it was judged above).
        inputs = inputs.narrowed(f"{REFUSED_INT64} ({describe(exc)}), so int32")
        start = time.perf_counter()
        try:
            out, *again = _calls(kernel, inputs, case, transcript, device, repeat)
        except Exception as exc:  # noqa: BLE001
            return _kernel_failed(case, exc, inputs, transcript)
    kernel_seconds = time.perf_counter() - start
    storage = kernel.judged_storage(case, out[1].dtype)
    ssm_kernel = y_alone = None
    if inputs.D is not None or inputs.z is not None:
        # The SSM part alone: the same call without D and z, and without the return flags (kernel.call_y),
        # judged against C·h of the references.
        try:
            ssm_kernel = kernel.call_y(replace(inputs, D=None, z=None), case, transcript)
            _sync(device)
        except Exception as exc:  # noqa: BLE001
            return _kernel_failed(case, exc, inputs, transcript, f" ({SSM_PART_CALL})")
    if judges_y_alone(case.dtype, inputs):
        # And y alone with D and z, the call a training forward makes, judged beside the case's own (_judge_beside).
        try:
            y_alone = kernel.call_y(inputs, case, transcript)
            _sync(device)
        except Exception as exc:  # noqa: BLE001
            return _kernel_failed(case, exc, inputs, transcript, f" ({Y_ALONE_CALL[0]})")
    both = None
    if judges_both_flags(case, inputs):
        # And the call with both flags, as Mamba2's inference prefill makes it on packed sequences (_judge_both).
        try:
            both = kernel.call_both(inputs, case, transcript)
            _sync(device)
        except Exception as exc:  # noqa: BLE001
            return _kernel_failed(case, exc, inputs, transcript, f" ({BOTH_FLAGS_CALL[0]})")
    ref_stream = reference_stream(inputs, reference_kind)
    if serving is not None:  # the serving-shaped checks compare whole outputs: keep the reference whole
        ref_stream = streamed.Recorded(ref_stream)
    try:  # after the call: the states the kernel returned may say how it stores them
        figures = streamed.compare(inputs, case.chunk_size, cuts, ref_stream, out[0], ssm_kernel,
                                   _baseline_streams(inputs, case, storage, allow_tf32))
    except Exception as exc:  # noqa: BLE001 (a bug on our side is still one case's outcome)
        return ScanResult(case, Status.ERROR, f"computing the references raised {describe(exc)}")

    tokens = inputs.token_map()
    ssm = figures.kernel_ssm is not None
    result = ScanResult(
        case, Status.PASS, kernel_seconds=kernel_seconds, warmup_seconds=warmup_seconds,
        autotune_picks=picks or None, inputs_note=inputs.note,
        stdout=transcript.text,
        state_storage=dtype_name(storage),
        kernel=Comparison(figures.kernel_y, measure.error_stats(out[1], figures.reference_states),
                          figures.kernel_ssm if ssm else None, figures.kernel_y_bias,
                          measure.stored_bias(out[1], figures.reference_states)),
        baseline=Comparison(figures.baseline_y, measure.error_stats(figures.baseline_states, figures.reference_states),
                            figures.baseline_ssm if ssm else None, figures.baseline_y_bias,
                            measure.stored_bias(figures.baseline_states, figures.reference_states)),
        worst_group=measure.worst_group(
            figures.kernel_groups.group_errors(),
            # Each group's largest error over the baseline's draws (_baseline_streams).
            torch.stack([groups.group_errors() for groups in figures.baseline_groups]).amax(0),
            figures.kernel_groups.shape(),
        ),
        first_nonfinite_state=measure.locate_nonfinite_states(out[1], figures.reference_states, inputs),
        per_chunk=figures.kernel_groups.per_chunk(),
    )
    ssm_nonfinite = figures.first_nonfinite_ssm and figures.first_nonfinite_ssm.locate(tokens, inputs, "ssm_y")
    result.first_nonfinite = (figures.first_nonfinite.locate(tokens, inputs) or result.first_nonfinite_state
                              or ssm_nonfinite)
    result.growth = measure.growth(result.per_chunk)
    result.repeat = measure.repeat_spread(out, again, tokens) if again else None
    verdict = judge(result.kernel, result.baseline, result.first_nonfinite, tolerance, result.worst_group,
                    result.repeat, allow_nondeterministic, case.rounding)
    result.status, result.message, result.limits = verdict.status, verdict.message, verdict.limits
    racy = result.repeat is not None and not result.repeat.identical and not allow_nondeterministic
    if result.status is Status.FAIL and not racy:
        result.message += _first_group_over(result, figures.kernel_groups, tolerance)
    if result.status is Status.FAIL and not racy:  # a race is no question of precision
        moved = measure.states_of_other_sequences(out[1], figures.reference_states)
        if moved:
            shown = ", ".join(f"{i} is sequence {j}'s" for i, j in moved[:4]) + (", ..." if len(moved) > 4 else "")
            result.message += f"; states returned for other sequences: the state of sequence {shown}"
        if verdict.over_limit:  # errors of a reduced precision's size; a biased store alone is no such question
            result.precision, note = _classify(inputs, case, storage, cuts, reference_kind, result, out, allow_tf32)
            result.message += f"; {note}"
    if judges_seed(case, kernel, storage) and result.status in (Status.PASS, Status.FAIL):
        _check_seed(result, kernel, inputs, case, transcript, device, out[1], figures.reference_states, storage)
    if y_alone is not None and result.status in (Status.PASS, Status.FAIL) and result.limits:
        _judge_beside(result, Y_ALONE_CALL, (y_alone,), out)
    if both is not None and result.status in (Status.PASS, Status.FAIL) and result.limits:
        _judge_both(result, both, out, inputs)
    if first_call is not None and result.status in (Status.PASS, Status.FAIL) and result.limits:
        _judge_beside(result, FIRST_CALL, first_call, out)
    if result.status is Status.NONFINITE:
        # The call that came back non-finite: the case's, else the one without D and z.
        if not outside.finite(out):
            result.reads_outside = _reads_outside(kernel, inputs, case, transcript, device)
        elif not outside.finite([ssm_kernel]):
            result.reads_outside = _reads_outside(kernel, replace(inputs, D=None, z=None), case, transcript, device)
        if result.reads_outside is not None:
            result.message += f"; {outside.describe(result.reads_outside)}"
    if result.status in (Status.FAIL, Status.NONFINITE):
        if picks:  # a config-dependent failure passes under another pick: where it flips between runs, which ran
            result.message += f"; the autotuner's picks: {autotune.picks_text(picks)}"
        result.error_map = ErrorMap(case.chunk_size, int(tokens.position.max()) + 1,
                                    figures.kernel_groups.per_chunk_head())
    failed = result.status in (Status.FAIL, Status.NONFINITE)
    if kernel.stages is not None and (compare_stages or failed):
        if len(cuts) > 1:  # the stages of every chunk at once: not bounded by a segment
            result.stages = StageReport(note=f"stages not compared: the case is longer than one segment "
                                             f"({cuts[0][1]} tokens)")
        else:
            result.stages = localise_stages(kernel, inputs, case, storage, allow_tf32, tolerance, transcript)
            result.stdout = transcript.text
        if failed:
            result.message += f"; {stages.describe(result.stages)}"
    if serving is not None:
        checks = _serving_calls(serving, kernel, case, storage, allow_tf32, tolerance, transcript, device)
        result.invariance = invariance.run_checks(checks, inputs, case.chunk_size, case.seed, out,
                                                  ref_stream.whole(inputs), result.baseline)
        invariance.combine(result)
        result.stdout = transcript.text
    return result


def _serving_calls(options: invariance.Options, kernel: ScanAdapter, case: ScanCase, storage: torch.dtype,
                   allow_tf32: bool, tolerance: Tolerance, transcript, device: str) -> invariance.Serving:
    """The calls the invariance checks make, bound to this case."""
    from ssmcheck.drift.adapter import torch_state_update  # noqa: PLC0415 (plain PyTorch: the decode baseline)

    decode = options.decode
    return invariance.Serving(
        scan=lambda inputs: _calls(kernel, inputs, case, transcript, device, 1)[0],
        baseline=lambda inputs: baseline(inputs, case, storage, allow_tf32)[:2],
        decode=None if decode is None else lambda state, arguments, seed: decode.update(
            state, arguments, case.rounding, seed, "prefill→decode", transcript),
        baseline_decode=lambda state, arguments, seed: torch_state_update(
            state, **arguments, rounding=case.rounding, seed=seed),
        tolerance=tolerance, batch_exact=options.batch_exact, decode_skip=options.decode_skip,
        write_cache=(lambda inputs, cache, slots: kernel.write_cache(inputs, case, cache, slots, transcript))
        if kernel.writes_cache else None,
    )


def _baseline_streams(inputs: ScanInputs, case: ScanCase, storage: torch.dtype, allow_tf32: bool) -> list:
    """The case's baseline stream, and for the worst-group rule its other draws.

    With stochastic rounding into a narrower storage, one group's error is a draw of a few rounding
    errors: the kernel's worst group and the baseline's are two samples of a maximum, and a correct
    kernel's came out 2.2x the baseline's in one thorough case on the H200. There the baseline is run
    with STOCHASTIC_DRAWS seeds and each group keeps its largest error: the worst a correct
    implementation showed in that many draws. Deterministic rounding needs one draw."""
    draws = 1 if case.rounding != "stochastic" or storage == torch.float32 else STOCHASTIC_DRAWS
    return [baseline_stream(inputs, case, storage, allow_tf32, seed=case.seed + draw) for draw in range(draws)]


# Per process: the (kernel, shape) pairs already called once, so compiled and autotuned, with what their autotuners
# picked then (core.autotune.recorded_picks; empty where none tuned).
_WARM: dict[tuple, dict] = {}


def _warm_up(kernel: ScanAdapter, inputs: ScanInputs, case: ScanCase, transcript,
             device: str) -> tuple[float | None, dict, tuple | None]:
    """Call the kernel once, untimed as the case, if this kernel has not yet run this shape: the seconds
    it took (compilation and autotuning on a GPU), or None when it was warm already; what the kernel's
    autotuners picked for this shape at that call; and what that call returned, (y, states), for
    _judge_beside (None when warm, or where it raised). A failure here is left to the timed call, which meets
    it again and reports it."""
    key = _shape_key(kernel, inputs, case)
    if key in _WARM:
        return None, _WARM[key], None
    start = time.perf_counter()
    first_call = None
    with autotune.recorded_picks(autotune.find(kernel.fn)) as picks:
        try:
            first_call = _calls(kernel, inputs, case, transcript, device, 1)[0]
        except Exception:  # noqa: BLE001, S110 (the timed call reports it)
            pass
    seconds = time.perf_counter() - start
    _WARM[key] = picks
    return seconds, picks, first_call


def _first_group_over(result: ScanResult, groups, tolerance: Tolerance) -> str:
    """The clause naming the earliest chunk whose group is over the worst-group limit, where the worst group
    failed later than that chunk; "" otherwise."""
    worst = result.worst_group
    limit = tolerance_limit(worst.baseline_rel, tolerance.tol_factor, tolerance.floor, tolerance.rtol)
    if within_tolerance(worst.rel, worst.baseline_rel, tolerance.tol_factor, tolerance.floor, tolerance.rtol):
        return ""
    first = measure.first_group_over(groups.group_errors(), limit, groups.shape())
    if first is None or first[1] >= worst.chunk:
        return ""
    sequence, chunk, head, error = first
    return (f"; the earliest y group over the group limit {limit:.3g}: sequence {sequence} chunk {chunk} head {head} "
            f"(error {error:.3g})")


def judges_seed(case: ScanCase, kernel: ScanAdapter, storage: torch.dtype) -> bool:
    """Whether a case also makes the seed check (_check_seed): stochastically rounded, by a kernel told its storage
    through the state options, into a narrower dtype than fp32."""
    return case.rounding == "stochastic" and kernel.takes_state_options and storage != torch.float32


def _check_seed(result: ScanResult, kernel: ScanAdapter, inputs: ScanInputs, case: ScanCase, transcript,
                device: str, states: torch.Tensor, reference_states: torch.Tensor, storage: torch.dtype) -> None:
    """Fold scan.draws' seed check into a stochastically rounded case: the kernel called again with each of
    draws.OTHER_SEEDS; the first whose states are the first call's bits fails the case."""
    for seeds, depends, other in draws.OTHER_SEEDS:
        try:
            again = _calls(kernel, inputs, replace(case, seed=other(case.seed)), transcript, device, 1)[0][1]
        except Exception as exc:  # noqa: BLE001 (any failure of the kernel is this case's verdict)
            failed = _kernel_failed(case, exc, inputs, transcript, " (the call with another seed)")
            result.status, result.message = failed.status, failed.message
            return
        clause = draws.seed_ignored(states, again, reference_states, storage, seeds, depends)
        if clause is not None:
            _found(result, Status.FAIL, clause)
            return


def _found(result: ScanResult, status: Status, clause: str) -> None:
    """A check that runs after the verdict (on a passing or failing case) found `clause`: the case takes `status`
    and the clause joins its message."""
    result.status = status
    result.message = "; ".join(filter(None, [result.message, clause]))


# The calls judged beside the case's own, as messages name them, and what makes such a call wrong alone.
FIRST_CALL = ("the first call of this shape (compiling and autotuning; untimed)",
              "a first call wrong alone, as an autotuner that benchmarks its configs into the outputs without resetting "
              "them")
Y_ALONE_CALL = ("the call without the return flags (as a training forward, or a prefill that keeps no state, makes "
                "it)", "a path taken without the return flags that computes y otherwise")


BOTH_FLAGS_CALL = ("the call with both return flags (as Mamba2's inference prefill makes it on packed sequences)",
                   "a path taken with both flags that computes y or the states otherwise")


def judges_both_flags(case: ScanCase, inputs: ScanInputs) -> bool:
    """Whether a case also judges the call with both return flags, which Mamba2's own inference prefill makes on
    packed sequences (final_states then holds the row's final state: its last sequence's): in rows of several
    sequences without pad tokens (whose row would end in a pad, of no sequence), in bf16, the dtype serving engines
    run, with the states stored as by default (fp32, to nearest: the other storages take the same call) and chunks of
    64 tokens or more (vLLM and mamba_ssm serve at 256). Each such call costs a kernel call: in all 21 bf16 packed
    cases of the default preset the calls took 9.7 s of a 2-core CPU's 67 s (2026-12-06), 5.4 s in these 14."""
    return (inputs.varlen and inputs.pad_after is None and inputs.nsequences > 1 and case.dtype == "bf16"
            and (case.state_dtype, case.rounding) == ("fp32", "nearest") and case.chunk_size >= 64)


def _judge_both(result: ScanResult, both: tuple, timed: tuple, inputs: ScanInputs) -> None:
    """Fold the call with both return flags into a judged case: its y and varlen states beside the timed call's
    (_judge_beside), and its final states beside its own last sequence's varlen state, which they are (off by
    more than the states' limit plus the timed call's states error fails: a final state that carries an earlier
    sequence's state, or misses the last one's tokens). A last sequence of no tokens is left out: the row's final
    state is then the one before it."""
    y, final, states = both
    _judge_beside(result, BOTH_FLAGS_CALL, (y, states), timed)
    bounds = inputs.cu_seqlens
    if result.status not in (Status.PASS, Status.FAIL) or int(bounds[-1]) == int(bounds[-2]):
        return
    last = states[-1:]
    if same_bits(final, last):
        return
    off, = measure.relative_errors([(final, last)])
    _found_off(result, BOTH_FLAGS_CALL[0], "final states", final, last, off, result.kernel.states.rel,
               result.limits[1], "its last sequence's varlen state", "the final state of a packed row is its last "
               "sequence's")


def judges_y_alone(dtype: str, inputs: ScanInputs) -> bool:
    """Whether a case of `dtype` on `inputs` also judges the call for y alone with D and z: where there are
    sequences or initial states, whose states the return flags ask for and the peers then handle on other paths
    (mamba_ssm's varlen states in a kernel of their own), and in batch-mode cases with both D and z and no initial
    states, Mamba2's training forward as it is (a path of its own for that call that gates before adding the skip
    term is right wherever the flags are asked for); in bf16 cases, the dtype serving engines run, since another
    path is wrong in any dtype and each such call costs a kernel call (in every case with D or z, it took the
    default scan on a 2-core CPU from 39 s to 60 s; in the sequences' and initial states' cases alone, to 46.5 s,
    2026-12-05). The training forward also in fp32 cases, the other dtype training runs: a path of its own for that
    call may differ with the inputs' dtype (TF32 products for fp32 inputs) where no other call reaches it (since the
    fifty-second session)."""
    if inputs.varlen or inputs.initial_states is not None:
        return (inputs.D is not None or inputs.z is not None) and dtype == "bf16"
    return inputs.D is not None and inputs.z is not None and dtype in ("bf16", "fp32")  # the training forward


def _judge_beside(result: ScanResult, call: tuple[str, str], outputs: tuple, timed: tuple) -> None:
    """Fold another call's outputs of the case's computation (`outputs`: y, or (y, states)) into a judged case.

    They differ from the timed call's by d (norm-wise, relative); the timed call's own error is e. Where d > limit
    + e, the other call's error is above the limit (d <= its error + e), whatever the rounding draws: the case
    fails, or is non-finite where the other call's outputs are and the timed call's are not. `call`: (the call in
    words, what makes it wrong alone).

    The first call of a shape on a GPU (warm-up: a server's first request of a shape is that call) is wrong alone
    where it autotunes by running every config on the outputs it returns, without resetting them (Triton's
    reset_to_zero), or reads what compiling left behind; the call without the return flags (y alone) where a kernel
    takes another path for it."""
    if all(same_bits(a, b) for a, b in zip(outputs, timed)):
        return
    what, why = call
    offs = measure.relative_errors(list(zip(outputs, timed)))
    checked = zip(("y", "states"), outputs, timed, offs, (result.kernel.y.rel, result.kernel.states.rel),
                  result.limits)
    for name, other, own, off, error, limit in checked:
        if _found_off(result, what, name, other, own, off, error, limit, "the timed call's", why):
            return


def _found_off(result: ScanResult, what: str, name: str, other: torch.Tensor, own: torch.Tensor, off: float,
               error: float, limit: float, against: str, why: str) -> bool:
    """Whether `other` (output `name` of the call `what`), `off` (norm-wise, relative) from `own` (`against` in
    words), is non-finite where `own` is not or past `limit` + `error` (own's error): then the case takes that
    finding (_found)."""
    if bool((~torch.isfinite(other) & torch.isfinite(own)).any()):
        _found(result, Status.NONFINITE, f"{what} returned non-finite {name}")
        return True
    if off > limit + error:
        _found(result, Status.FAIL, f"{what} returned {name} {off:.3g} off {against}, whose own error is "
                                    f"{error:.3g} (limit {limit:.3g}): {why}")
        return True
    return False


def _shape_key(kernel: ScanAdapter, inputs: ScanInputs, case: ScanCase) -> tuple:
    """What a kernel's first call compiles and autotunes for. The pinned config too (--configs all): each pin
    compiles its own variant, and the other functions' picks recorded at its first call are the ones its cases
    run with (a pinned function shows none: it runs its one config without a pick)."""
    return (kernel.name, case.dtype, case.chunk_size, tuple(inputs.x.shape), tuple(inputs.B.shape), inputs.varlen,
            case.state_dtype, case.rounding, inputs.D is None, inputs.z is None, inputs.initial_states is None,
            case.config)


def compile_ahead(kernel: ScanAdapter, cases: list[ScanCase], pins: Callable[[ScanCase], dict], device: str,
                  threads: int, serving: invariance.Options | None = None,
                  tolerance: Tolerance | None = None) -> Launches:
    """Compile, in `threads` threads at once, the Triton kernels that `cases` will launch (core.precompile): the
    kernel is called once per shape (and once more without D and z, for y alone where judges_y_alone and with both
    return flags where judges_both_flags, as the cases call it) with every launch made compile-only; with `serving`
    (and the runner's `tolerance`), the invariance checks' calls follow (_rehearse_checks). A case whose call raises here is left to run as usual,
    where its error is reported.
    The first call decides whether to go on: a kernel that launched nothing through Triton is not called again;
    nor is any once the first calls found every variant in Triton's cache (Launches.cache_warm). In a helper
    process only (core.precompile says why)."""
    seen: set[tuple] = set()
    with compile_only(threads) as launches:
        for case in cases:
            if not launches.supported or (seen and not launches.count) or launches.cache_warm():
                break
            if case.skip_reason or kernel.skip_reason(case):
                continue
            try:
                inputs = _case_inputs(kernel, case, device)
                # The regime too: it sets the call's flags (dt_softplus, dt_limit, D per channel), constexprs of
                # the kernels, where _warm_up's timing needs the shape alone.
                key = (case.regime, *_shape_key(kernel, inputs, case))
            except Exception:  # noqa: BLE001, S112 (the case meets it again and reports it)
                continue
            if key in seen:
                continue
            seen.add(key)
            try:
                with autotune.pinned(pins(case)):
                    out = kernel.call(inputs, case, Transcript())
                    if inputs.D is not None or inputs.z is not None:
                        kernel.call_y(replace(inputs, D=None, z=None), case, Transcript())
                    if judges_y_alone(case.dtype, inputs):
                        kernel.call_y(inputs, case, Transcript())
                    if judges_both_flags(case, inputs):
                        kernel.call_both(inputs, case, Transcript())
                    if serving is not None:
                        _rehearse_checks(serving, kernel, case, inputs, out, tolerance, device)
            except Exception:  # noqa: BLE001, S110 (as above)
                pass
            launches.call_done()
    return launches


def _rehearse_checks(options: invariance.Options, kernel: ScanAdapter, case: ScanCase, inputs: ScanInputs,
                     out, tolerance: Tolerance, device: str) -> None:
    """Run the case's invariance checks inside compile_only, so that their calls compile their own variants: a
    sequence alone, a split's second part from the first part's states (initial states: other constexprs), the
    state-update kernel's decode steps, the cache write. Nothing those calls return was computed, so the
    checks' verdicts are thrown away; the kernel's own calls stand in for the baselines (plain PyTorch, which
    would compute and compile nothing) and for the reference."""
    calls = _serving_calls(options, kernel, case, out[1].dtype, False, tolerance, Transcript(), device)
    calls = replace(calls, baseline=calls.scan, baseline_decode=calls.decode or calls.baseline_decode)
    nothing = Comparison(measure.error_stats(out[0], out[0]), measure.error_stats(out[1], out[1]))
    invariance.run_checks(calls, inputs, case.chunk_size, case.seed, out, out, nothing)


def _calls(kernel: ScanAdapter, inputs: ScanInputs, case: ScanCase, transcript, device: str, count: int,
           nan_fences=None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`count` calls of the kernel on `inputs`, each waited for (`nan_fences`: ScanAdapter.call's). Raises
    what the kernel raises."""
    outputs = []
    for _ in range(count):
        outputs.append(kernel.call(inputs, case, transcript, nan_fences))
        _sync(device)
    return outputs


def _reads_outside(kernel: ScanAdapter, inputs: ScanInputs, case: ScanCase, transcript,
                   device: str) -> list[tuple[str, ...]] | None:
    """core.outside's answer for a call that came back non-finite; None also where a rerun raised (the
    verdict stands as measured)."""
    def call(nan_fences):
        return _calls(kernel, inputs, case, transcript, device, 1, nan_fences)[0]

    try:
        return outside.reads_outside(call, kernel.fenced_storages(inputs))
    except Exception:  # noqa: BLE001 (advisory, as _classify)
        return None


def _refused(exc: Exception) -> bool:
    """Whether the kernel itself raised `exc` (refusing its arguments), not ssmcheck on what the call did: a program
    outside its memory, an exit, an output of the wrong kind or inputs the call changed."""
    return not isinstance(exc, (KernelExit, KernelOutputError))


def _kernel_failed(case: ScanCase, exc: Exception, inputs: ScanInputs, transcript, which: str = "") -> ScanResult:
    """The result of a kernel call that raised: the case's error (KernelExit's message is the whole
    description), or a skip where a pinned autotune config cannot launch (triton's OutOfResources)."""
    if case.config is not None and type(exc).__name__ == "OutOfResources":
        return ScanResult(case, Status.SKIPPED, f"the kernel rejects this config: {describe(exc)}")
    message = str(exc) if isinstance(exc, KernelExit) else describe(exc)
    return ScanResult(case, Status.ERROR, message + which, inputs_note=inputs.note, stdout=transcript.text)


def _classify(inputs, case, storage, cuts, reference_kind, result: ScanResult, out, allow_tf32: bool
              ) -> tuple[dict | None, str]:
    """Which reduced precision the kernel's errors match (TF32 matmuls, fp16/bf16 storage, fp16
    accumulation), for a failing case: (the JSON record, the message's words); the candidates' baselines
    are measured in a second pass over the segments, against the reference and against the kernel's
    outputs `out` (y, states). Advisory: a failure to classify never changes the verdict."""
    try:
        def measured(streams: dict) -> dict[str, tuple[float, ...]]:
            return streamed.relative_errors(inputs, cuts, reference_stream(inputs, reference_kind), streams, out[:2])

        candidates = precision.candidate_precisions(inputs, case, storage, measured, result.baseline.y.rel,
                                                    result.baseline.states.rel, allow_tf32=allow_tf32)
        found = precision.closest(result.kernel.y.rel, result.kernel.states.rel, candidates)
    except Exception as exc:  # noqa: BLE001
        return None, f"precision not classified ({describe(exc)})"
    return precision.as_json(found, candidates), precision.describe(found)


@dataclass(frozen=True)
class ScanRunner:
    """What running scan cases takes, as plain values: picklable, so a worker process can run them."""

    kernel: str | Callable  # the --kernel value, or a callable given to the Python API
    tolerance: Tolerance
    reference: str  # "fp64" or "fp32"
    device: str  # "cpu" or "cuda"
    interpreter: bool
    state_dtype_given: bool = False  # --state-dtype was on the command line: a declaration (ScanAdapter)
    allow_tf32: bool = False  # fp32 cases judged against the TF32 baseline
    warmup: bool = False  # time each kernel's first call per shape apart (compile, autotune): on a GPU
    repeat: int = 1  # runs per case on identical inputs, compared bit for bit
    allow_nondeterministic: bool = False  # the kernel declares itself nondeterministic: judge its spread
    stages: bool = False  # compare every case's SSD stages (failing cases' always are, where the kernel offers them)
    repro: str | None = None  # write a shrunk reproducer of each failing case into this folder (scan.repro)
    invariance: bool = False  # run the serving-shaped checks (scan.invariance)
    batch_exact: bool = True  # batch invariance bit for bit (else within the tolerance rule)
    decode_kernel: str | Callable | None = None  # the state update the prefill→decode check decodes with

    def adapter(self) -> ScanAdapter:
        """The kernel's adapter, resolved once per process. Raises core.callables.KernelSpecError."""
        if self not in _ADAPTERS:
            _ADAPTERS[self] = resolve(self.kernel, self.interpreter, self.state_dtype_given)
        return _ADAPTERS[self]

    def serving(self) -> invariance.Options | None:
        """What the invariance checks need beyond the case (None without --invariance); the decode kernel is
        resolved once per process. Raises core.callables.KernelSpecError."""
        if not self.invariance:
            return None
        if self not in _DECODERS:
            from ssmcheck.drift.adapter import resolve as resolve_decode  # noqa: PLC0415
            from ssmcheck.ops.rounding.stochastic import DEFAULT_PHILOX_ROUNDS  # noqa: PLC0415

            _DECODERS[self] = None if self.decode_kernel is None else resolve_decode(
                self.decode_kernel, DEFAULT_PHILOX_ROUNDS, "software", self.interpreter)
        decode = _DECODERS[self]
        return invariance.Options(self.batch_exact, decode, "" if decode else "no state-update kernel to decode with")

    def autotuned(self) -> list:
        """The kernel's autotuned functions (core.autotune)."""
        return autotune.find(self.adapter().fn)

    def pins(self, case: ScanCase) -> dict:
        """The configs to pin for `case` (core.autotune.pins)."""
        return autotune.pins(self.autotuned(), case.config, self.interpreter)

    def __call__(self, case: ScanCase, advance: Callable[[], None]) -> ScanResult:
        """Run one case (a scan case is one unit of progress: `advance` is not called); with `repro`, a
        failing case's reproducer is written (scan.repro)."""
        with autotune.pinned(self.pins(case)) as bypassed:
            result = self._run(case)
        if bypassed and result.status is not Status.SKIPPED:
            result.status, result.message = Status.ERROR, autotune.bypassed_message(bypassed, result.message)
        if self.repro is not None and result.status in repro.REPRODUCED:  # its runs pin their own configs
            try:
                result.repro = str(repro.write(Path(self.repro), self, case, result))
            except Exception as exc:  # noqa: BLE001 (advisory: the case's verdict stands)
                result.message += f"; no reproducer written ({describe(exc)})"
        return result

    def precompile(self, cases: list[ScanCase], threads: int) -> Launches | None:
        """On a GPU, compile the Triton kernels the cases will launch before they run, in `threads` threads at once
        (COMPILE_THREADS at most) (compile_ahead; in a helper process only), the invariance checks' calls too where
        they run; None where nothing is compiled ahead (the CPU's interpreter compiles nothing)."""
        if self.device != "cuda" or self.interpreter:
            return None
        try:
            serving = self.serving()
        except KernelSpecError:  # each case reports it
            serving = None
        return compile_ahead(self.adapter(), cases, self.pins, self.device, min(threads, COMPILE_THREADS), serving,
                             self.tolerance)

    @staticmethod
    def compile_group(case: ScanCase) -> tuple:
        """What picks most of the Triton variants a case launches: the kernel, its pinned config, the dtype and the
        chunk size (shapes, regimes and state dtypes add a few each). A compiling helper takes such a group whole,
        so that no two compile its variants (core.isolation.CompilingHelpers)."""
        return case.kernel, case.config, case.dtype, case.chunk_size

    def without_extras(self) -> ScanRunner:
        """This runner without stage comparisons and reproducers: the case's verdict alone."""
        return replace(self, stages=False, repro=None)

    def _run(self, case: ScanCase) -> ScanResult:
        return run_case(case, self.adapter(), self.tolerance, self.reference, self.device, self.allow_tf32,
                        self.warmup, self.repeat, self.allow_nondeterministic, self.stages, self.serving())

    def failed(self, case: ScanCase, message: str, seconds: float) -> ScanResult:
        """The result of a case that ended without one of its own (its worker crashed or timed out)."""
        return ScanResult(case, Status.ERROR, message, seconds=seconds)


# Per process: a worker resolves its runner's adapter (importing the kernel) at its first case.
_ADAPTERS: dict[ScanRunner, ScanAdapter] = {}
_DECODERS: dict[ScanRunner, object] = {}
