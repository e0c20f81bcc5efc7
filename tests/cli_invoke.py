"""Running `ssmcheck COMMAND ARGS` in-process on the real app, as a user would."""

import json
from pathlib import Path
from types import SimpleNamespace

from typer.testing import CliRunner

from ssmcheck.cli import app


def invoke(*argv, json_path=None, **runner_options):
    """Run the app (with --json when given); return (result, report or None). Never a traceback."""
    argv = [*map(str, argv)] + (["--json", str(json_path)] if json_path else [])
    # A log's width comes from COLUMNS: fix it, so that what a test sees does not depend on the shell
    # (or on pytest-xdist's workers) it runs in.
    runner_options["env"] = {"COLUMNS": "200", **runner_options.get("env", {})}
    result = CliRunner().invoke(app, argv, **runner_options)
    assert "Traceback" not in result.output, result.output
    report = json.loads(Path(json_path).read_text()) if json_path and Path(json_path).exists() else None
    return result, report


def assert_usage_error(result, named: str) -> None:
    """Exit code 2 and one line on stderr, `Error: ...`, naming the bad option; nothing on stdout."""
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and lines[0].startswith("Error:"), result.stderr


def planted_bug_cases(report: dict, reached) -> list[dict]:
    """The cases that ran and that `reached(params)` names, after asserting that every other case that ran
    passed: a planted bug must show in the cases built to reach it and nowhere else."""
    ran = [c for c in report["cases"] if c["status"] != "skipped"]
    chosen = [c for c in ran if reached(c["params"])]
    elsewhere = [c["id"] for c in ran if c not in chosen and c["status"] != "pass"]
    assert not elsewhere, elsewhere
    return chosen


def case_inputs(p: dict):
    """The scan inputs of the case a report's params `p` name, generated again from its regime, shape and seed."""
    from ssmcheck.core.formats import DTYPES  # noqa: PLC0415
    from ssmcheck.scan.inputs import ScanShape  # noqa: PLC0415
    from ssmcheck.scan.regimes import REGIMES  # noqa: PLC0415

    shape = ScanShape(p["batch"], p["seqlen"], p["nheads"], p["headdim"], p["dstate"], p["ngroups"], p["chunk_size"])
    return REGIMES[p["regime"]].generate(shape, DTYPES[p["dtype"]], p["seed"])


def case_decoding(run, kernel: str, through_slots: bool, **options) -> dict:
    """`run(kernel, seed=s, **options)` (a drift case's JSON) for the first base seed s whose case, of one trial
    (round to nearest), decodes through slot indices or not, as asked: drift.lockstep.slotted_from's coin, for a
    kernel whose pad slot id is -1 (tests/slot_kernels.py's). The coin comes from the case, not from its run,
    which an error may have cut short."""
    from ssmcheck.drift.lockstep import slotted_from  # noqa: PLC0415

    for seed in range(16):
        case = run(kernel, seed=seed, **options)
        planned = SimpleNamespace(seed=case["params"]["seed"], id=case["id"])
        if (slotted_from(planned, SimpleNamespace(pad_slot_id=-1), 0, case["params"]["batch"]) is not None) \
                == through_slots:
            if case["slotted_trials"] is not None:  # the run, where it ran, agrees
                assert bool(case["slotted_trials"]) == through_slots, case
            return case
    raise AssertionError("no base seed of 16 gave the coin asked for")
