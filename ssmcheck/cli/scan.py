"""`ssmcheck scan`: chunk-scan sweeps with verdicts.

Parses options into plain settings, hands cases to the runner, renders the
results; knows no numerics. Usage errors are one line on stderr and exit 2.
"""

from __future__ import annotations

import typer

from ssmcheck import api
from ssmcheck.cli import common as cli_common
from ssmcheck.cli import session
from ssmcheck.cli.common import EXIT_CODES, regime_lines, usage_error
from ssmcheck.core import models
from ssmcheck.core.tolerance import DEFAULT_FLOOR, DEFAULT_TOL_FACTOR
from ssmcheck.scan.regimes import REGIMES  # torch only, no triton: --help stays light

SCAN_HELP = "\n\n".join([
    "Run the chunk-scan kernel over a sweep and judge every case against a float64 reference.",
    "A case passes when its error (norm-wise, relative, for y and for the final states) is at most "
    "--tol-factor x the error of the same math in plain PyTorch in the kernel's dtype (the baseline) "
    "+ --floor; with --rtol, when it is at most rtol. NaN/Inf where the reference is finite is 'nonfinite'; "
    "a kernel that raises gives 'error'; impossible combinations are 'skipped' with the reason. A y or final "
    "states stored in fp16/bf16 whose mean rounding error (along the values, or toward +inf) lies a quarter "
    "ulp from the baseline's fails 'stored with a bias', however small its norm-wise error.",
    "The kernel gets copies of its inputs between NaN fences and NaN where it allocates uninitialised memory: "
    "a load past an input is 'nonfinite' (named: 'it reads outside its input x'), a store past one 'error'.",
    "Sweep axes take comma-separated lists; their cartesian product is the set of cases. With no options "
    "the 'default' preset (configs/default.toml) runs; an option given replaces the preset's axis.",
    "Regimes:\n\n" + "\n\n".join(regime_lines({n: r.explanation for n, r in REGIMES.items()})),
    "Exit codes: " + EXIT_CODES,
])

SCREEN_WIDTH = 180

AXIS = "Sweep axis (comma-separated):"


def scan(
    kernel: str = typer.Option(None, metavar="SPEC", help="builtin (default), torch (the baseline as the kernel), MODULE:FUNCTION or path/to/file.py:FUNCTION with the mamba_chunk_scan_combined signature."),
    preset: str = typer.Option(None, metavar="NAME|FILE", help="The sweep: configs/NAME.toml (smoke, default, thorough) or a TOML file. Default: [tool.ssmcheck.scan] preset in pyproject.toml, else default. pyproject.toml's [tool.ssmcheck.scan] keys apply over it, the command line over both."),
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
    allow_tf32: bool = typer.Option(None, "--allow-tf32", metavar="", help="Judge fp32 cases against a baseline whose matmul operands are truncated to TF32 (10 fraction bits, as tensor cores read fp32; the same on every device): for kernels whose fp32 tl.dot runs in TF32 by design."),
    configs: str = typer.Option(None, metavar="auto|all", help="auto (default): each autotuned function runs the autotuner's pick (in the Triton interpreter, which cannot benchmark, its first config). all: every case once per config of every autotuned function reachable from the kernel, one function at a time, the config in the case id, its params and the table."),
    repeat: int = typer.Option(None, metavar="K", help="Run each case K times on identical inputs and compare the outputs bit for bit: a difference (a race) fails the case (default 1)."),
    allow_nondeterministic: bool = typer.Option(None, "--allow-nondeterministic", metavar="", help="With --repeat: the kernel is nondeterministic by design (atomics); judge the spread between runs like an error instead."),
    stages: bool = typer.Option(None, "--stages", metavar="", help="Compare every case's SSD stages (cumulative decay, chunk states, state passing, C·Bᵀ, output) with the float64 reference's, each judged against the baseline's same stage; failing cases are always compared, where the kernel offers its stages (builtin, mamba_ssm, vllm, or a callable's ssd_stages attribute). The message names the first wrong stage and where (sequence, chunk, head)."),
    repro: str = typer.Option(None, "--repro", metavar="DIR", help="For each failing case (fail, nonfinite, error), shrink it (seqlen, batch, heads, widths, chunks) while it keeps its status, and write DIR/CASE_ID/repro.py with its inputs and float64 reference (torch.save): a script that re-runs the kernel calls the case made and prints the verdict without ssmcheck (the terminal report names it)."),
    invariance: bool = typer.Option(None, "--invariance", metavar="", help="Also run the serving-shaped checks, each a verdict of its own (JSON invariance, table column invariance): batch (each sequence run alone gives the same bits as packed with the others), split (each sequence cut at a random token, mid-chunk where it can be, the second part started from the first part's returned state, judged by the tolerance rule), prefill_decode (the last 4 tokens of each sequence decoded with the state update from the prefill's returned states, judged against the float64 recurrence over all tokens, the hand-off step on its own) and cache_write (for a kernel taking final_states_out and final_state_indices, as vLLM 0.33 does: the final states written into a NaN-filled cache at random slots must be the ones it returns, bitwise, and no other slot may change). The case's status is the most severe of its own and its checks' (nonfinite, then error, then fail); the exit code follows the statuses as always."),
    batch_invariance: str = typer.Option(None, "--batch-invariance", metavar="exact|tolerance", help="With --invariance: exact (default): a sequence alone and packed must agree bit for bit; tolerance: the kernel declares it may differ, and the difference (relative to the reference's norm) is judged by the tolerance rule."),
    decode_kernel: str = typer.Option(None, "--decode-kernel", metavar="SPEC", help="With --invariance: the state update the prefill_decode check decodes with (as drift's --kernel). Default: the kernel's own for builtin, torch, mamba_ssm and vllm, else builtin."),
    fail_on: cli_common.FailOn = None,
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
    quiet: cli_common.Quiet = False,
    device: cli_common.Device = None,
) -> None:
    options = dict(
        chunk_size=chunk_size, seqlen=seqlen, dtype=dtype, batch=batch, nheads=nheads, headdim=headdim,
        dstate=dstate, ngroups=ngroups, model=model, regime=regime, state_dtype=state_dtype, rounding=rounding,
        reference=reference, tol_factor=tol_factor, floor=floor, rtol=rtol, seed=seed, fail_on=fail_on,
        allow_tf32=allow_tf32 or None, repeat=repeat, configs=configs, allow_nondeterministic=allow_nondeterministic or None,
        stages=stages or None, repro=repro,
        invariance=invariance or None, batch_invariance=batch_invariance, decode_kernel=decode_kernel,
    )
    try:
        plan = api.plan_scan(kernel, preset, device=device, case=case_id, from_report=from_report, shard=shard,
                             **{k: v for k, v in options.items() if v is not None})
        api.check_workers(workers, plan.env.device)
        timeout = api.check_case_timeout(isolate or workers is not None, case_timeout)
    except api.UsageError as exc:
        usage_error(str(exc))
    files = session.outputs(json_path, jsonl_path, junit_path, summary_path)
    from ssmcheck.scan import table  # noqa: PLC0415 (after the plan has configured the device)

    out = cli_common.open_report(SCREEN_WIDTH, table.header(plan.env, plan.kernel, plan.settings,
                                                             plan.report_settings["autotuned"])
                                 + cli_common.files_note(plan.files) + (f"\n{plan.memory}" if plan.memory else ""), quiet)
    _, code = session.run_sweep(plan, out, files, render=table.render, case_line=table.case_line, quiet=quiet,
                                isolate=isolate, case_timeout=timeout, workers=workers,
                                compile_ahead=not no_compile_ahead)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("scan", cls=cli_common.OneLineUsageErrors, help=SCAN_HELP, no_args_is_help=False)(scan)
