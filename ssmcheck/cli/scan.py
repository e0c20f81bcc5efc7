"""`ssmcheck scan`: chunk-scan sweeps with verdicts.

Parses options into plain settings, hands cases to the runner, renders the
results; knows no numerics. Usage errors are one line on stderr and exit 2.
"""

from __future__ import annotations

import typer

from ssmcheck.cli import common as cli_common
from ssmcheck.cli.common import EXIT_CODES, regime_lines, usage_error
from ssmcheck.core import models, presets
from ssmcheck.core.callables import KernelSpecError
from ssmcheck.core.sweep import SweepError
from ssmcheck.core.tolerance import DEFAULT_FLOOR, DEFAULT_TOL_FACTOR
from ssmcheck.scan.regimes import REGIMES  # torch only, no triton: --help stays light


SCAN_HELP = "\n\n".join([
    "Run the chunk-scan kernel over a sweep and judge every case against a float64 reference.",
    "A case passes when its error (norm-wise, relative, for y and for the final states) is at most "
    "--tol-factor x the error of the same math in plain PyTorch in the kernel's dtype (the baseline) "
    "+ --floor; with --rtol, when it is at most rtol. NaN/Inf where the reference is finite is 'nonfinite'; "
    "a kernel that raises gives 'error'; impossible combinations are 'skipped' with the reason.",
    "Sweep axes take comma-separated lists; their cartesian product is the set of cases. With no options "
    "the 'default' preset (configs/default.toml) runs; an option given replaces the preset's axis.",
    "Regimes:\n\n" + "\n\n".join(regime_lines({n: r.explanation for n, r in REGIMES.items()})),
    "Exit codes: " + EXIT_CODES,
])

SCREEN_WIDTH = 180

AXIS = "Sweep axis (comma-separated):"


def scan(
    kernel: str = typer.Option("builtin", metavar="SPEC", help="builtin, torch (the baseline as the kernel), MODULE:FUNCTION or path/to/file.py:FUNCTION with the mamba_chunk_scan_combined signature."),
    preset: str = typer.Option(None, metavar="NAME", help="Load the sweep from configs/NAME.toml (smoke, default, thorough). Default: default."),
    chunk_size: str = typer.Option(None, "--chunk-size", metavar="LIST", help=f"{AXIS} e.g. 64,128,256."),
    seqlen: str = typer.Option(None, metavar="LIST", help=f"{AXIS} tokens per row (varlen regimes: mean tokens per sequence)."),
    dtype: str = typer.Option(None, metavar="LIST", help=f"{AXIS} fp32, fp16, bf16."),
    batch: str = typer.Option(None, metavar="LIST", help=f"{AXIS} rows (varlen regimes: sequences packed in one row)."),
    nheads: str = typer.Option(None, metavar="LIST", help=f"{AXIS} SSM heads."),
    headdim: str = typer.Option(None, metavar="LIST", help=f"{AXIS} channels per head."),
    dstate: str = typer.Option(None, metavar="LIST", help=f"{AXIS} state size per channel."),
    ngroups: str = typer.Option(None, metavar="LIST", help=f"{AXIS} must divide nheads."),
    model: str = typer.Option(None, metavar="LIST", help="Real model widths instead of --nheads/--headdim/--dstate/--ngroups (and its chunk size unless --chunk-size): " + ", ".join(m.name for m in models.MODELS.values()) + "."),
    regime: str = typer.Option(None, metavar="LIST", help=f"{AXIS} " + ", ".join(REGIMES) + " (see below)."),
    state_dtype: str = typer.Option(None, "--state-dtype", metavar="LIST", help=f"{AXIS} dtype of the stored chunk and final states: fp32 (default), fp16, bf16."),
    rounding: str = typer.Option(None, metavar="LIST", help=f"{AXIS} how fp16/bf16 states are stored: nearest (default), stochastic."),
    reference: str = typer.Option(None, metavar="fp64|fp32", help="fp64 (default): float64 sequential recurrence; fp32: the same in float32, as the peers' tests use."),
    tol_factor: float = typer.Option(None, "--tol-factor", metavar="X", help=f"Allowed multiple of the baseline's error (default {DEFAULT_TOL_FACTOR:g})."),
    floor: float = typer.Option(None, metavar="X", help=f"Added to the allowed error (default {DEFAULT_FLOOR:g})."),
    rtol: float = typer.Option(None, metavar="X", help="Judge against this relative error instead of the baseline rule."),
    seed: int = typer.Option(None, metavar="N", help="Base seed (default 0); each case's seed derives from it and the case's parameters."),
    fail_on: cli_common.FailOn = None,
    json_path: cli_common.JsonPath = None,
    quiet: cli_common.Quiet = False,
    device: cli_common.Device = None,
) -> None:
    env = cli_common.configure_device(device)  # before anything imports triton
    # Imported after configure: the runner reaches the kernels, which import triton.
    from ssmcheck.scan import adapter, run, spec, table  # noqa: PLC0415
    from ssmcheck.scan.json import case_json  # noqa: PLC0415

    cli = dict(
        chunk_size=chunk_size, seqlen=seqlen, dtype=dtype, batch=batch, nheads=nheads, headdim=headdim,
        dstate=dstate, ngroups=ngroups, model=model, regime=regime, state_dtype=state_dtype, rounding=rounding,
        reference=reference, tol_factor=tol_factor, floor=floor, rtol=rtol, seed=seed, fail_on=fail_on,
    )
    preset_name = preset or "default"
    try:
        settings = spec.resolve(cli, presets.load_preset(preset_name, "scan", env.device), preset_name)
    except SweepError as exc:
        usage_error(str(exc))
    cli_common.check_output_path("--json", json_path)
    try:
        kernel_under_test = adapter.resolve(kernel, env.interpreter)
    except KernelSpecError as exc:
        usage_error(str(exc))

    cases = spec.build_cases(settings, kernel)
    out = cli_common.open_report(SCREEN_WIDTH, table.header(env, kernel, settings), quiet)

    def run_one(case, _advance):
        return run.run_case(case, kernel_under_test, settings.tolerance, settings.reference, env.device)

    results, seconds = cli_common.run_cases("scan", cases, run_one, quiet)
    if not quiet:
        table.render(out, results)
    cli_common.finish(out, "scan", env, results, case_json, settings.fail_on, seconds, json_path, {
        "preset": preset_name, "reference": settings.reference, "tol_factor": settings.tolerance.tol_factor,
        "floor": settings.tolerance.floor, "rtol": settings.tolerance.rtol, "seed": settings.seed,
        "fail_on": list(settings.fail_on),
    })


def register(app: typer.Typer) -> None:
    app.command("scan", cls=cli_common.OneLineUsageErrors, help=SCAN_HELP, no_args_is_help=False)(scan)
