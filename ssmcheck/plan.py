"""Planning a sweep: the options of a command resolved into a Plan (settings, cases, a picklable runner).

The Python API (ssmcheck.api) and the CLI both start here; a bad option raises UsageError, one
line naming it.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ssmcheck.core import autotune, config, runtime
from ssmcheck.core import ranks as launch
from ssmcheck.core.callables import KernelSpecError, kernel_name
from ssmcheck.core.formats import DTYPES
from ssmcheck.core.shard import parse_shard
from ssmcheck.core.sweep import SweepError, parse_number
from ssmcheck.core.workers import worker_devices

# The default case timeout of isolated runs: long enough for the slowest preset case on a CPU.
DEFAULT_CASE_TIMEOUT = 1800.0


class UsageError(ValueError):
    """A bad option or value; the message is one line that names it."""


@dataclass
class Plan:
    """A command's sweep, resolved and ready to run: plain settings, the cases, and their runner."""

    command: str  # "scan" or "drift"
    env: runtime.Environment
    kernel: str  # the kernel's name, as the report shows it
    settings: object  # scan.spec.ScanSettings or drift.spec.DriftSettings
    cases: list
    runner: Callable  # (case, advance) -> result; picklable for isolation
    report_settings: dict  # recorded in the report
    files: list[str]  # the configuration files read
    case_json: Callable  # result -> the case's JSON dict
    progress_units: Callable  # case -> units of progress it counts (drift: decode steps)
    shard: dict | None = None  # with --shard K/N: the report's `shard` field (core.shard)
    memory: str | None = None  # scan: the header's line on the largest case's GPU memory (scan.memory)


def plan_scan(kernel: str | Callable | None = None, preset: str | None = None, *, device: str | None = None,
              case: str | None = None, from_report: str | Path | None = None, shard: str | None = None,
              **options) -> Plan:
    """Resolve a `scan` sweep (with `shard` "K/N", its K-th of N slices). Raises UsageError."""
    env = _configure(device)
    from ssmcheck.scan import adapter, spec  # noqa: PLC0415 (after configure: reaches triton)
    from ssmcheck.scan.json import case_json  # noqa: PLC0415
    from ssmcheck.scan.run import ScanRunner  # noqa: PLC0415

    settings, cases, kernel, preset_name, files, _ = _sweep("scan", spec, kernel, preset, env, case, from_report,
                                                            options)
    kernel = kernel or adapter.BUILTIN
    name = _name(kernel)
    runner = ScanRunner(kernel, settings.tolerance, settings.reference, env.device,
                        env.interpreter, state_dtype_given="state_dtype" in settings.spec.cli_axes,
                        allow_tf32=settings.allow_tf32, warmup=env.device == "cuda", repeat=settings.repeat,
                        allow_nondeterministic=settings.allow_nondeterministic, stages=settings.stages,
                        repro=settings.repro, **_invariance(settings, options, kernel))
    under_test = _adapter(runner)
    _serving(runner)
    _check_chunk_sizes(settings, under_test)
    if settings.stages and under_test.stages is None:
        raise UsageError(f"--stages: kernel {name!r} offers no SSD stages (builtin, mamba_ssm and vllm do; a "
                         f"MODULE:FUNCTION kernel offers them as its {adapter.STAGES_ATTRIBUTE!r} attribute)")
    cases, autotuned = _configs(settings, runner, cases(name))
    tol = settings.tolerance
    return _fits(settings.repeat, settings.invariance, env.device, _sharded(shard, Plan(
        "scan", env, name, settings, cases, runner, {
            "preset": preset_name, "config_files": files, "reference": settings.reference,
            "tol_factor": tol.tol_factor, "floor": tol.floor, "rtol": tol.rtol, "seed": settings.seed,
            "fail_on": list(settings.fail_on), "allow_tf32": settings.allow_tf32, "repeat": settings.repeat,
            "allow_nondeterministic": settings.allow_nondeterministic, "configs": settings.configs,
            "stages": settings.stages, "repro": settings.repro,
            "invariance": settings.invariance, "batch_invariance": settings.batch_invariance,
            "decode_kernel": _name(runner.decode_kernel) if runner.invariance else None,
            "autotuned": autotuned,
        }, files, case_json, lambda c: 1,
    )))


def _fits(repeat: int, invariance: bool, device: str, plan: Plan) -> Plan:
    """The plan with its memory line, or UsageError where its largest case cannot fit in the device's free
    memory (scan.memory), before anything runs."""
    from ssmcheck.scan import memory  # noqa: PLC0415

    need, free = memory.largest(plan.cases, repeat, invariance), memory.free_bytes(device)
    reason = memory.refusal(need, free)
    if reason:
        raise UsageError(reason)
    return replace(plan, memory=None if need is None else need.line(free))


def plan_drift(kernel: str | Callable | None = None, preset: str | None = None, *, device: str | None = None,
               case: str | None = None, from_report: str | Path | None = None, philox_rounds: int | None = None,
               rounding_impl: str | None = None, shard: str | None = None, **options) -> Plan:
    """Resolve a `drift` sweep (with `shard` "K/N", its K-th of N slices). Raises UsageError.

    `philox_rounds` and `rounding_impl` default to DEFAULT_PHILOX_ROUNDS (7) and "software", or with
    `from_report` to the report's, so that a case run again rounds as it did."""
    env = _configure(device)
    from ssmcheck.drift import adapter, spec  # noqa: PLC0415 (after configure: reaches triton)
    from ssmcheck.drift.json import case_json  # noqa: PLC0415
    from ssmcheck.drift.run import DriftRunner  # noqa: PLC0415
    from ssmcheck.ops.rounding.stochastic import DEFAULT_PHILOX_ROUNDS, ROUNDING_IMPLS  # noqa: PLC0415

    settings, cases, kernel, preset_name, files, recorded = _sweep("drift", spec, kernel, preset, env, case,
                                                                   from_report, options)
    kernel = kernel or adapter.BUILTIN
    name = _name(kernel)
    philox_rounds = recorded.get("philox_rounds", DEFAULT_PHILOX_ROUNDS) if philox_rounds is None else philox_rounds
    rounding_impl = recorded.get("rounding_impl", "software") if rounding_impl is None else rounding_impl
    if isinstance(philox_rounds, bool) or not isinstance(philox_rounds, int) or philox_rounds < 1:
        raise UsageError(f"--philox-rounds: invalid value {philox_rounds} (expected an integer >= 1)")
    if rounding_impl not in ROUNDING_IMPLS:
        raise UsageError(f"--rounding-impl: invalid value {rounding_impl!r} (choose from {', '.join(ROUNDING_IMPLS)})")
    if rounding_impl == "hardware":
        if name != adapter.BUILTIN:
            raise UsageError("--rounding-impl hardware: applies to --kernel builtin only")
        reason = adapter.hardware_sr_unavailable(env.interpreter)
        if reason is not None and "stochastic" in settings.axes["rounding"]:
            raise UsageError(f"--rounding-impl hardware: {reason}")
    runner = DriftRunner(kernel, settings.tolerance, env.device, env.interpreter, philox_rounds,
                         rounding_impl, repeat=settings.repeat, allow_nondeterministic=settings.allow_nondeterministic,
                         prefill_kernel=partner(kernel) if settings.from_prefill else None)
    under_test = _adapter(runner)
    runner.prefill()
    if not under_test.takes_rounding and "rounding" not in settings.spec.cli_axes:
        # A kernel without a rounding keyword stores its state one way only, which only the user can
        # declare (--rounding); a preset's list of modes declares nothing about this kernel, nor do the modes of
        # its regimes' sub-sweeps (a stochastic-only one runs to nearest, or repeats a case and is dropped).
        settings.axes["rounding"] = ["nearest"]
        for tables in settings.spec.overrides.values():
            for override in tables:
                if "rounding" in override:
                    override["rounding"] = ["nearest"]
    cases, autotuned = _configs(settings, runner, [_kernel_skip(case, under_test) for case in cases(name)])
    tol = settings.tolerance
    return _sharded(shard, Plan(
        "drift", env, name, settings, cases, runner, {
            "preset": preset_name, "config_files": files, "steps": settings.steps, "trials": settings.trials,
            "seed": settings.seed, "tol_factor": tol.tol_factor, "floor": tol.floor, "rtol": tol.rtol,
            "fail_on": list(settings.fail_on), "philox_rounds": philox_rounds, "rounding_impl": rounding_impl,
            "rounding": "implemented by the kernel" if under_test.takes_rounding else "declared",
            "configs": settings.configs, "repeat": settings.repeat,
            "allow_nondeterministic": settings.allow_nondeterministic,
            "autotuned": autotuned,
            "from_prefill": settings.from_prefill,
            "prefill_kernel": None if runner.prefill_kernel is None else _name(runner.prefill_kernel),
        }, files, case_json, lambda c: 0 if c.skip_reason is not None else c.steps * c.trials,
    ))


def _kernel_skip(case, under_test):
    """The drift case, skipped where the kernel says it cannot run it here (DriftAdapter.skip_reason)."""
    if case.skip_reason is not None:
        return case
    reason = under_test.skip_reason(DTYPES[case.state_dtype], case.rounding, case.regime)
    return case if reason is None else replace(case, skip_reason=reason)


def _configs(settings, runner, cases: list) -> tuple[list, list[str]]:
    """The cases, each once per autotune config with --configs all (core.autotune.every_config), and the
    kernel's autotuned functions as the report names them (core.autotune.Tuned.label)."""
    tuned = runner.autotuned()
    if settings.configs == "all":
        cases = autotune.every_config(cases, tuned)
    return cases, [t.label() for t in tuned]


def _sharded(text: str | None, plan: Plan) -> Plan:
    """The plan's K-th of N slices of its cases (`--shard K/N`, core.shard), recorded for the report."""
    if text is None:
        return plan
    try:
        chosen = parse_shard("--shard", text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return replace(plan, cases=chosen.take(plan.cases), shard=chosen.record([c.id for c in plan.cases]))


# The named kernels: each has a chunk scan and a state update under the same name.
NAMED_KERNELS = ("builtin", "torch", "mamba_ssm", "vllm")


def partner(kernel: str | Callable) -> str:
    """The kernel of the other kind that serves beside `kernel` (a chunk scan's state update, or the
    reverse): a named kernel's own, else the built-in one."""
    return kernel if isinstance(kernel, str) and kernel in NAMED_KERNELS else "builtin"


def _invariance(settings, options: dict, kernel: str | Callable) -> dict:
    """The runner's invariance fields; options that only shape the checks need them switched on."""
    if not settings.invariance:
        for key in ("batch_invariance", "decode_kernel"):
            if options.get(key) is not None:
                raise UsageError(f"--{key.replace('_', '-')} {options[key]}: needs --invariance")
        return {}
    exact = settings.batch_invariance == "exact"
    if kernel == "torch" and options.get("batch_invariance") is None:
        # The same-precision baseline run as the kernel sums a packed batch's matmuls in other shapes than a
        # sequence alone (fp32 last bits): it declares tolerance, unless --batch-invariance says otherwise.
        exact = False
    return {"invariance": True, "batch_exact": exact, "decode_kernel": settings.decode_kernel or partner(kernel)}


def _serving(runner) -> None:
    """Resolve the decode kernel of the invariance checks now: one that names nothing is a usage error."""
    try:
        runner.serving()
    except KernelSpecError as exc:
        # The loader names the option it serves as --kernel.
        raise UsageError(str(exc).replace("--kernel", "--decode-kernel", 1)) from None


def _name(kernel: str | Callable) -> str:
    """The kernel as reports name it: the --kernel value, or MODULE:QUALNAME for a callable."""
    return kernel if isinstance(kernel, str) else kernel_name(kernel)


def _configure(device: str | None) -> runtime.Environment:
    ranks = launch.from_environment()
    if ranks is not None and device != "cpu":  # under torchrun: each rank on its own GPU
        launch.use_local_gpu(ranks)
    try:
        return runtime.configure(device)
    except runtime.DeviceError as exc:
        raise UsageError(f"--device: {exc}") from None


def _adapter(runner):
    try:
        return runner.adapter()  # imports a kernel file once: the runner keeps it
    except KernelSpecError as exc:
        raise UsageError(str(exc)) from None


def _sweep(command: str, spec, kernel, preset, env, case_id, from_report, options: dict):
    """(settings, cases(kernel name) -> list, kernel, preset label, files read, the report's recorded
    settings ({} without `from_report`)) from the options over the preset and pyproject, or over the
    report of `from_report`."""
    known = set(spec.TABLE.axes) | set(spec.TABLE.settings)
    unknown = sorted(set(options) - known)
    if unknown:
        raise UsageError(f"unknown option {unknown[0]!r} for {command} (choose from {', '.join(sorted(known))})")
    if from_report is not None and case_id is None:
        raise UsageError("--from: needs --case ID (the case to run again)")
    try:
        if from_report is not None:
            params, recorded = _load_case(Path(from_report), command, case_id)
            table = {k: v for k, v in recorded.items() if k in spec.TABLE.settings and v is not None}
            settings = spec.resolve(options, table, str(from_report))
            return (settings, lambda name: [spec.case_from_params(params, name)], kernel or params.get("kernel"),
                    str(from_report), [str(from_report)], recorded)
        conf = config.load_settings(preset, command, env.device)
        settings = spec.resolve(options, conf.table, conf.label)
    except SweepError as exc:
        raise UsageError(str(exc)) from None

    def cases(name: str) -> list:
        built = spec.build_cases(settings, name)
        return built if case_id is None else _pick_case(built, case_id)

    return settings, cases, kernel, conf.preset, conf.files, {}


def _load_case(report_path: Path, command: str, case_id: str) -> tuple[dict, dict]:
    """(the case's params, the run's settings) of case `case_id` in an earlier JSON report."""
    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"--from: cannot read {str(report_path)!r}: {exc}") from None
    if not isinstance(report, dict) or report.get("tool") != "ssmcheck" or report.get("command") != command:
        raise UsageError(f"--from: {str(report_path)!r} is not an ssmcheck {command} report")
    for case in report.get("cases", []):
        if case.get("id") == case_id:
            return case["params"], report.get("settings", {})
    raise UsageError(f"--case: no case {case_id!r} in {str(report_path)!r}")


def _pick_case(cases: list, case_id: str) -> list:
    chosen = [c for c in cases if c.id == case_id]
    if not chosen:
        close = difflib.get_close_matches(case_id, [c.id for c in cases], n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else f" ({len(cases)} cases in this sweep)"
        raise UsageError(f"--case: no case {case_id!r} in this sweep{hint}")
    return chosen


def _check_chunk_sizes(settings, under_test) -> None:
    """A chunk size the kernel cannot take is a usage error, named where it came from."""
    allowed = under_test.chunk_sizes
    if allowed is None:
        return
    sources = [("--chunk-size" if "chunk_size" in settings.spec.cli_axes else "chunk_size", settings.axes["chunk_size"])]
    sources += [(f"overrides.{regime}.chunk_size", o["chunk_size"])
                for regime, tables in settings.overrides.items() for o in tables if "chunk_size" in o]
    for label, sizes in sources:
        bad = [c for c in sizes if c is not None and c not in allowed]
        if bad:
            raise UsageError(f"{label}: invalid value {bad[0]} ({under_test.chunk_size_rule})")


def check_case_timeout(isolate: bool, seconds: float | None) -> float | None:
    """The case timeout: only with isolation, where it defaults to DEFAULT_CASE_TIMEOUT."""
    if seconds is None:
        return DEFAULT_CASE_TIMEOUT if isolate else None
    if not isolate:
        raise UsageError("--case-timeout: needs --isolate (a case can only be stopped in a worker process)")
    try:
        return parse_number("--case-timeout", seconds)
    except SweepError as exc:
        raise UsageError(str(exc)) from None


def check_workers(workers: str | int | None, device: str) -> list[str | None] | None:
    """The worker processes of `--workers` (core.workers: each one's GPU, None on the CPU); None without it."""
    if workers is None:
        return None
    try:
        return worker_devices("--workers", workers, device)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
