"""`ssmcheck drift`: decode-loop drift of a state-update kernel, per storage dtype and rounding mode.

Parses options into plain settings (drift.spec), runs the decode loops case by
case (drift.run) and renders the table, the rounding comparisons and the
plot; knows no numerics. Usage errors are one line on stderr and exit 2 (cli.common).
"""

from __future__ import annotations

from pathlib import Path

import typer

from ssmcheck import api
from ssmcheck.cli import common as cli_common
from ssmcheck.cli import session
from ssmcheck.cli.common import EXIT_CODES, usage_error
from ssmcheck.core import models
from ssmcheck.core.tolerance import DEFAULT_FLOOR, DEFAULT_TOL_FACTOR
from ssmcheck.drift.regimes import DRIFT_REGIMES, LONG_STEPS_FACTOR  # torch only, no triton
from ssmcheck.drift.stats import BIAS_FLOOR_ULP, BIAS_Z_LIMIT

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
    "(stored minus the exact update of the previous stored state, in ulps, along the exact value's sign, and "
    f"also signed toward +inf) is statistically nonzero (|z| > {BIAS_Z_LIMIT:g}) and above {BIAS_FLOOR_ULP:.2g} ulp; "
    "in either mode, when a store lies farther from that exact update than its rounding takes a value (half an "
    "ulp to nearest, one stochastically) plus what float32 arithmetic explains ('misrounded'), or when stores "
    "flush subnormals to zero. NaN/Inf in the state or output is 'nonfinite' "
    "(with the first step, batch, head, channel and state index); a kernel that raises gives 'error'. The "
    "state and, at the first step and the checkpoints, the inputs lie between NaN fences: a load past one is "
    "'nonfinite' (named: 'it reads outside its input C'), a store past one 'error'. An fp16/bf16 output "
    "whose mean rounding error (along the values, or toward +inf) is a quarter ulp off fails 'stored with a "
    "bias'. A stochastic-rounding case also calls the step on twin elements (the same state and inputs) and "
    "with other seeds: bits shared along an axis, by elements a fixed distance apart, by two seeds, or by "
    "seeds that differ only in bit 30 or bit 0 fail ('random bits').",
    "Kernels without a `rounding` keyword are judged against what --rounding declares; torch's generator is "
    "seeded at every trial, so kernels drawing random bits from it are reproducible.",
    "With no options the 'default' preset (configs/default.toml) runs; an option given replaces the preset's "
    "value.",
    "On a GPU the steps of builtin, torch, mamba_ssm and vllm run as CUDA graph replays where a replay "
    "reproduces the eager step bit for bit, the device read at the checkpoints only; MODULE:FUNCTION kernels "
    "and --repeat run eagerly. JSON decode_loop says which, and why not.",
    "Regimes:\n\n" + "\n\n".join(f"{name}: {text}" for name, text in DRIFT_REGIMES.items()),
    "Exit codes: " + EXIT_CODES,
])


def drift(
    kernel: str = typer.Option(None, metavar="SPEC", help="builtin (Triton; default), torch (plain PyTorch in fp32, storing the state with the reference rounding), MODULE:FUNCTION or path/to/file.py:FUNCTION with the selective_state_update signature."),
    preset: str = typer.Option(None, metavar="NAME|FILE", help="The settings: configs/NAME.toml (smoke, default, thorough) or a TOML file. Default: [tool.ssmcheck.drift] preset in pyproject.toml, else default. pyproject.toml's [tool.ssmcheck.drift] keys apply over it, the command line over both."),
    state_dtype: str = typer.Option(None, "--state-dtype", metavar="LIST", help=f"{AXIS} fp16, bf16, fp32."),
    rounding: str = typer.Option(None, metavar="LIST", help=f"{AXIS} nearest, stochastic: how the state is stored. A kernel without a rounding keyword is run only in the modes given here (what it is declared to do), else as nearest: a preset's list declares nothing."),
    regime: str = typer.Option(None, metavar="LIST", help=f"{AXIS} " + ", ".join(DRIFT_REGIMES) + " (see below)."),
    steps: int = typer.Option(None, metavar="N", help=f"Decode steps per case (the long regime runs {LONG_STEPS_FACTOR}x). Default from the preset: 32 on the CPU, 8192 on a GPU."),
    trials: int = typer.Option(None, metavar="K", help="Seeds per stochastic-rounding case (the bias test pools them; nearest runs once). Default from the preset: 2."),
    batch: str = typer.Option(None, metavar="LIST", help=AXIS),
    nheads: str = typer.Option(None, metavar="LIST", help=f"{AXIS} SSM heads."),
    headdim: str = typer.Option(None, metavar="LIST", help=f"{AXIS} channels per head."),
    dstate: str = typer.Option(None, metavar="LIST", help=f"{AXIS} state size per channel."),
    ngroups: str = typer.Option(None, metavar="LIST", help=f"{AXIS} must divide nheads."),
    model: str = typer.Option(None, metavar="LIST", help="Real model widths instead of --nheads/--headdim/--dstate/--ngroups: " + ", ".join(m.name for m in models.MODELS.values()) + "."),
    seed: int = typer.Option(None, metavar="N", help="Base seed (default 0); inputs derive from it, the regime and the shape; rounding seeds from those and the trial."),
    tol_factor: float = typer.Option(None, "--tol-factor", metavar="X", help=f"Allowed multiple of the baseline's drift (default {DEFAULT_TOL_FACTOR:g})."),
    rtol: float = typer.Option(None, metavar="X", help="Judge the drift against this relative error instead of the baseline rule."),
    from_prefill: int = typer.Option(None, "--from-prefill", metavar="N", help="Start each decode from the states a chunk-scan prefill of N tokens returns (from the regime's initial state, over N tokens of the regime's own inputs, chunk size 64), as a served model's cache does; the prefill runs on the kernel's own chunk scan for builtin, torch, mamba_ssm and vllm, else on the built-in one. Default 0: the regime's drawn initial state."),
    fail_on: cli_common.FailOn = None,
    configs: str = typer.Option(None, metavar="auto|all", help="auto (default): each autotuned function of the kernel runs the autotuner's pick (in the Triton interpreter, which cannot benchmark, its first config). all: every case once per config of every autotuned function reachable from the kernel, one function at a time, the config in the case id, its params and the table. vLLM's state update, which picks its launch config from tables by batch x heads, offers 16 configs the same way."),
    repeat: int = typer.Option(None, metavar="K", help="Run every decode step K times from the same state with the same inputs and seed, and compare the runs bit for bit: a difference (a race) fails the case (default 1)."),
    allow_nondeterministic: bool = typer.Option(None, "--allow-nondeterministic", metavar="", help="With --repeat: the kernel is nondeterministic by design (atomics); runs that differ do not fail the case, and the JSON records by how much."),
    philox_rounds: int = typer.Option(None, "--philox-rounds", metavar="N", help="Philox rounds of the built-in kernel's software stochastic rounding (default 7; with --from, the report's)."),
    rounding_impl: str = typer.Option(None, "--rounding-impl", metavar="IMPL", help="Built-in kernel's stochastic rounding: software (Philox, any GPU and the interpreter) or hardware (PTX cvt.rs, sm_100+ only). Default software; with --from, the report's."),
    case_id: cli_common.CaseId = None,
    from_report: cli_common.FromReport = None,
    isolate: cli_common.Isolate = False,
    case_timeout: cli_common.CaseTimeout = None,
    shard: cli_common.Shard = None,
    workers: cli_common.Workers = None,
    no_compile_ahead: cli_common.NoCompileAhead = False,
    json_path: cli_common.JsonPath = None,
    jsonl_path: cli_common.JsonlPath = None,
    junit_path: cli_common.JunitPath = None,
    summary_path: cli_common.SummaryPath = None,
    plot_path: Path = typer.Option(None, "--plot", metavar="FILE.png", help="Draw drift against step, log-log, one line per rounding mode (needs matplotlib: pip install ssmcheck[plot])."),
    quiet: cli_common.Quiet = False,
    device: cli_common.Device = None,
) -> None:
    options = dict(
        state_dtype=state_dtype, rounding=rounding, regime=regime, steps=steps, trials=trials, batch=batch,
        nheads=nheads, headdim=headdim, dstate=dstate, ngroups=ngroups, model=model, seed=seed,
        tol_factor=tol_factor, rtol=rtol, fail_on=fail_on, configs=configs, repeat=repeat,
        allow_nondeterministic=allow_nondeterministic or None, from_prefill=from_prefill,
    )
    try:
        plan = api.plan_drift(kernel, preset, device=device, case=case_id, from_report=from_report, shard=shard,
                              philox_rounds=philox_rounds, rounding_impl=rounding_impl,
                              **{k: v for k, v in options.items() if v is not None})
        api.check_workers(workers, plan.env.device)
        timeout = api.check_case_timeout(isolate or workers is not None, case_timeout)
    except api.UsageError as exc:
        usage_error(str(exc))
    from ssmcheck.drift import plot, table  # noqa: PLC0415 (after the plan has configured the device)

    if plot_path is not None:
        try:
            plot.require_matplotlib()
        except plot.PlotUnavailable as exc:
            usage_error(str(exc))
    files = session.outputs(json_path, jsonl_path, junit_path, summary_path)
    session.check_writable("--plot", plot_path)
    out = cli_common.open_report(SCREEN_WIDTH, table.header(plan.env, plan.kernel, plan.settings,
                                                              plan.report_settings["autotuned"])
                                 + cli_common.files_note(plan.files), quiet)
    implements_rounding = plan.runner.adapter().takes_rounding

    def render(console, results):
        table.render(console, results, compare_rounding=implements_rounding)

    report, code = session.run_sweep(plan, out, files, render=render, case_line=table.case_line, quiet=quiet,
                                     isolate=isolate, case_timeout=timeout, workers=workers, unit="steps", prefix="drift: ",
                                     compile_ahead=not no_compile_ahead)
    if plot_path is not None and not cli_common.follower_rank() and plot.plot_drift(report.results, plot_path) \
            and not quiet:
        out.print(f"plot written to {plot_path}", markup=False)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("drift", cls=cli_common.OneLineUsageErrors, help=DRIFT_HELP, no_args_is_help=False)(drift)
