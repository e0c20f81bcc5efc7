"""`ssmcheck drift`: decode-loop drift of a state-update kernel, per storage dtype and rounding mode.

Parses options into plain settings, hands cases to the runner, renders the
results; knows no numerics. Usage errors are one line on stderr and exit 2.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from ssmcheck import models, runtime, sweep
from ssmcheck.cli_scan import EXIT_CODES, OneLineUsageErrors
from ssmcheck.drift_regimes import DRIFT_REGIMES, LONG_STEPS_FACTOR
from ssmcheck.drift_spec import ROUNDING_IMPLS
from ssmcheck.drift_stats import BIAS_FLOOR_ULP, BIAS_Z_LIMIT
from ssmcheck.kernels import KernelSpecError
from ssmcheck.sweep import SweepError
from ssmcheck.verdict import DEFAULT_FLOOR, DEFAULT_TOL_FACTOR, ExitCode

SCREEN_WIDTH = 200
AXIS = "Sweep axis: comma-separated list."

DRIFT_HELP = "\n\n".join([
    "Run a state-update kernel over decode loops and judge how its cached state drifts from a float64 "
    "reference, per storage dtype and rounding mode.",
    "Every case runs three recurrences over the same inputs: the kernel (updating its state in place), the "
    "float64 reference, and the baseline: the float64 recurrence with the state rounded to the storage dtype "
    "after every step in the declared mode (what the format itself explains). At log-spaced checkpoints it "
    "reports the state and output relative errors, the growth exponent (error ~ step^alpha: ~1 bias or "
    "stagnation, ~0.5 unbiased noise), and the step where the drift would cross the tolerance.",
    "A case fails when its state drift at a checkpoint exceeds --tol-factor x the baseline's "
    f"+ {DEFAULT_FLOOR:g} (or --rtol), when its output error (rms over checkpoints) does, or, with stochastic "
    "rounding, when its stores are biased: --trials seeds are run and the mean rounding error per store "
    "(stored minus the exact update of the previous stored state, in ulps, along the exact value's sign) "
    f"is statistically nonzero (|z| > {BIAS_Z_LIMIT:g}) and above {BIAS_FLOOR_ULP:.2g} ulp. NaN/Inf in the state "
    "or output is 'nonfinite' "
    "(with the first step, batch, head, channel and state index); a kernel that raises gives 'error'.",
    "Kernels without a `rounding` keyword are judged against what --rounding declares; torch's generator is "
    "seeded at every trial, so kernels drawing random bits from it are reproducible.",
    "With no options the 'default' preset (configs/default.toml) runs; an option given replaces the preset's "
    "value.",
    "Regimes:\n\n" + "\n\n".join(f"{name}: {text}" for name, text in DRIFT_REGIMES.items()),
    "Exit codes: " + EXIT_CODES,
])


def _usage_error(message: str):
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(int(ExitCode.USAGE))


def _summary_line(counts: dict[str, int], seconds: float, exit_code: int) -> str:
    parts = ", ".join(f"{n} {status}" for status, n in counts.items())
    return f"drift: {sum(counts.values())} cases: {parts} in {seconds:.1f}s; exit code {exit_code}"


def _check_output_path(option: str, path: Path | None) -> None:
    if path is not None and not path.parent.is_dir():
        _usage_error(f"{option}: no such directory {str(path.parent)!r}")


def drift(
    kernel: str = typer.Option("builtin", help="builtin (Triton), torch (plain PyTorch in fp32, storing the state with the reference rounding), MODULE:FUNCTION or path/to/file.py:FUNCTION with the selective_state_update signature."),
    preset: str = typer.Option(None, help="Load settings from configs/NAME.toml (smoke, default, thorough). Default: default."),
    state_dtype: str = typer.Option(None, "--state-dtype", metavar="LIST", help=f"{AXIS} fp16, bf16, fp32."),
    rounding: str = typer.Option(None, metavar="LIST", help=f"{AXIS} nearest, stochastic: how the state is stored (for a kernel without a rounding keyword: what it is supposed to do)."),
    regime: str = typer.Option(None, metavar="LIST", help=f"{AXIS} " + ", ".join(DRIFT_REGIMES) + " (see below)."),
    steps: int = typer.Option(None, metavar="N", help=f"Decode steps per case (the long regime runs {LONG_STEPS_FACTOR}x)."),
    trials: int = typer.Option(None, metavar="K", help="Seeds per stochastic-rounding case (the bias test pools them)."),
    batch: str = typer.Option(None, metavar="LIST", help=AXIS),
    nheads: str = typer.Option(None, metavar="LIST", help=AXIS),
    headdim: str = typer.Option(None, metavar="LIST", help=AXIS),
    dstate: str = typer.Option(None, metavar="LIST", help=AXIS),
    ngroups: str = typer.Option(None, metavar="LIST", help=f"{AXIS} must divide nheads."),
    model: str = typer.Option(None, metavar="LIST", help="Real model widths instead of --nheads/--headdim/--dstate/--ngroups: " + ", ".join(m.name for m in models.MODELS.values()) + "."),
    seed: int = typer.Option(None, help="Base seed (default 0); inputs derive from it, the regime and the shape; rounding seeds from those and the trial."),
    tol_factor: float = typer.Option(None, "--tol-factor", help=f"Allowed multiple of the baseline's drift (default {DEFAULT_TOL_FACTOR:g})."),
    rtol: float = typer.Option(None, help="Judge the drift against this relative error instead of the baseline rule."),
    fail_on: str = typer.Option(None, "--fail-on", metavar="LIST", help="Which of nonfinite,tolerance,error may make the exit code nonzero (default: all)."),
    philox_rounds: int = typer.Option(10, "--philox-rounds", metavar="N", help="Philox rounds of the built-in kernel's software stochastic rounding."),
    rounding_impl: str = typer.Option("software", "--rounding-impl", help="Built-in kernel's stochastic rounding: software (Philox, any GPU and the interpreter) or hardware (PTX cvt.rs, sm_100+ only)."),
    json_path: Path = typer.Option(None, "--json", metavar="FILE", help="Write the JSON report here."),
    plot_path: Path = typer.Option(None, "--plot", metavar="FILE.png", help="Draw drift against step, log-log, one line per rounding mode (needs matplotlib: pip install ssmcheck[plot])."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the summary line."),
    device: str = typer.Option(None, help="cpu (Triton interpreter) or cuda (compiled). Default: cuda when available."),
) -> None:
    try:
        env = runtime.configure(device)  # before anything imports triton
    except runtime.DeviceError as exc:
        _usage_error(f"--device: {exc}")
    # Imported after configure: the runner reaches the kernels, which import triton.
    from ssmcheck import drift_kernels, drift_report, drift_spec, plot  # noqa: PLC0415
    from ssmcheck.drift import run_case  # noqa: PLC0415
    from ssmcheck.report import build_report, write_json  # noqa: PLC0415
    from ssmcheck.verdict import exit_code, summarize  # noqa: PLC0415

    if plot_path is not None:
        try:
            plot.require_matplotlib()
        except plot.PlotUnavailable as exc:
            _usage_error(str(exc))
    _check_output_path("--json", json_path)
    _check_output_path("--plot", plot_path)
    cli = dict(
        state_dtype=state_dtype, rounding=rounding, regime=regime, steps=steps, trials=trials, batch=batch,
        nheads=nheads, headdim=headdim, dstate=dstate, ngroups=ngroups, model=model, seed=seed,
        tol_factor=tol_factor, rtol=rtol, fail_on=fail_on,
    )
    preset_name = preset or "default"
    try:
        settings = drift_spec.resolve(cli, sweep.load_preset(preset_name, "drift", env.device), preset_name)
    except SweepError as exc:
        _usage_error(str(exc))
    if philox_rounds < 1:
        _usage_error(f"--philox-rounds: invalid value {philox_rounds} (expected an integer >= 1)")
    if rounding_impl not in ROUNDING_IMPLS:
        _usage_error(f"--rounding-impl: invalid value {rounding_impl!r} (choose from {', '.join(ROUNDING_IMPLS)})")
    if rounding_impl == "hardware":
        if kernel != drift_kernels.BUILTIN:
            _usage_error("--rounding-impl hardware: applies to --kernel builtin only")
        from ssmcheck.ops.rounding.stochastic import hardware_sr_unavailable  # noqa: PLC0415

        reason = hardware_sr_unavailable()
        if reason is not None and "stochastic" in settings.axes["rounding"]:
            _usage_error(f"--rounding-impl hardware: {reason}")
    try:
        kernel_under_test = drift_kernels.resolve_kernel(kernel, philox_rounds, rounding_impl)
    except KernelSpecError as exc:
        _usage_error(str(exc))

    cases = drift_spec.build_cases(settings, kernel)
    out = Console(highlight=False)
    if not out.is_terminal:  # logs and pipes: wide enough for the table, never truncated
        out = Console(highlight=False, width=SCREEN_WIDTH)
    if not quiet:
        out.print(drift_report.header(env, kernel, settings), markup=False)
    start = time.perf_counter()
    results = []
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
        TimeElapsedColumn(), console=Console(stderr=True), disable=quiet, transient=True,
    ) as progress:
        total = sum(c.steps * c.trials for c in cases if c.skip_reason is None)
        task = progress.add_task("drift", total=total)
        done = 0
        for case in cases:
            progress.update(task, description=case.id)
            results.append(run_case(
                case, kernel_under_test, settings.tolerance, env.device, on_step=lambda: progress.advance(task)
            ))
            if case.skip_reason is None:
                done += case.steps * case.trials
                progress.update(task, completed=done)  # a case stopped early (non-finite, error) skips ahead
    seconds = time.perf_counter() - start

    statuses = [r.status for r in results]
    counts = summarize(statuses)
    code = exit_code(statuses, settings.fail_on)
    if not quiet:
        drift_report.render(out, results)
    if plot_path is not None and plot.plot_drift(results, plot_path) and not quiet:
        out.print(f"plot written to {plot_path}", markup=False)
    out.print(_summary_line(counts, seconds, int(code)), markup=False)
    if json_path is not None:
        report = build_report("drift", env, [drift_report.case_json(r) for r in results], counts, int(code))
        tol = settings.tolerance
        report["settings"] = {
            "preset": preset_name, "steps": settings.steps, "trials": settings.trials, "seed": settings.seed,
            "tol_factor": tol.tol_factor, "floor": tol.floor, "rtol": tol.rtol, "fail_on": list(settings.fail_on),
            "philox_rounds": philox_rounds, "rounding_impl": rounding_impl,
        }
        write_json(json_path, report)
    raise typer.Exit(int(code))


def register(app: typer.Typer) -> None:
    app.command("drift", cls=OneLineUsageErrors, help=DRIFT_HELP, no_args_is_help=False)(drift)
