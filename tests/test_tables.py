"""The scan and drift tables fit the console: least important columns dropped, kept cells never cut.

Results are hand-made dataclasses (no kernel runs), rendered as a terminal of a given width would.
"""

import io

import pytest
from rich.console import Console

from ssmcheck.core.status import Status
from ssmcheck.drift import table as drift_table
from ssmcheck.drift.results import Checkpoint, DriftResult, DriftRun, DriftVerdict, StoreErrors
from ssmcheck.drift.spec import DriftCase
from ssmcheck.scan import table as scan_table
from ssmcheck.scan.results import Comparison, ErrorStats, NonfiniteToken, ScanResult
from ssmcheck.scan.spec import ScanCase

NAN = float("nan")
SCAN_PARAMS = ("regime", "dtype", "chunk", "seqlen", "batch", "HxPxN/G", "state")
DRIFT_PARAMS = ("regime", "state", "rounding", "batch", "HxPxN/G", "steps")


def scan_case(regime="normal", dtype="fp16", chunk_size=64, state_dtype="fp32", rounding="nearest"):
    return ScanCase(kernel="builtin", regime=regime, dtype=dtype, chunk_size=chunk_size, seqlen=300, batch=2,
                    nheads=4, headdim=32, dstate=16, ngroups=1, state_dtype=state_dtype, rounding=rounding,
                    model=None, seed=0)


def comparison(y: float, states: float) -> Comparison:
    return Comparison(ErrorStats(y, y, (0, 0, 0, 0)), ErrorStats(states, states, (0, 0, 0, 0)))


def scan_results() -> list[ScanResult]:
    baseline = comparison(1.0e-3, 1.0e-3)
    nan_at = NonfiniteToken("y", sequence=1, token=98, chunk=1, head=2, channel=5, state_index=None, count=64,
                            tokens=4, chunks=1, inputs_finite=True)
    return [
        ScanResult(scan_case(), Status.PASS, seconds=0.41, kernel=comparison(1.2e-3, 1.1e-3), baseline=baseline,
                   per_chunk=[1e-4, 2e-4, 4e-4, 8e-4, 1.6e-3], growth=16.0),
        ScanResult(scan_case(dtype="bf16", state_dtype="fp16", rounding="stochastic"), Status.FAIL,
                   "y error 2.07e-03 is 2.07 x baseline, above 2 x baseline + 1e-05", seconds=1.23,
                   kernel=comparison(2.07e-3, 1.5e-3), baseline=baseline, per_chunk=[1e-3] * 40, growth=1.0),
        ScanResult(scan_case(regime="ragged", chunk_size=128), Status.NONFINITE,
                   "y is non-finite at sequence 1 token 98 (chunk 1) head 2 channel 5", seconds=0.9,
                   kernel=comparison(NAN, 1.0e-3), baseline=baseline, first_nonfinite=nan_at, per_chunk=[1e-4, NAN]),
        ScanResult(scan_case(chunk_size=256), Status.ERROR, "RuntimeError: out of resource: shared memory",
                   seconds=0.05),
        ScanResult(scan_case(chunk_size=8), Status.SKIPPED, "chunk size 8 is below the kernel's 16"),
    ]


def drift_case(rounding="nearest", state_dtype="fp16", regime="stagnation"):
    return DriftCase(kernel="builtin", state_dtype=state_dtype, rounding=rounding, regime=regime, steps=4096,
                     batch=1, nheads=8, headdim=64, dstate=128, ngroups=1, model=None, seed=0,
                     trials=1 if rounding == "nearest" else 8)


def drift_run(scale: float) -> DriftRun:
    checkpoints = [Checkpoint(step, scale * step, scale * step, 0.0, 0.0) for step in (16, 256, 4096)]
    baseline = [Checkpoint(step, 1e-4 * step, 1e-4 * step, 0.0, 0.0) for step in (16, 256, 4096)]
    return DriftRun(checkpoints, baseline, StoreErrors(0, None, None), None, trials=1)


def drift_results() -> list[DriftResult]:
    return [
        DriftResult(drift_case(), DriftVerdict(Status.FAIL, "drift 2.07 x baseline at step 4096", ratio=2.07,
                                               growth_exponent=1.0, bias_z=0.3, crossing_step=4096,
                                               crossing_observed=True), 12.5, drift_run(2.07e-4)),
        DriftResult(drift_case("stochastic"), DriftVerdict(Status.PASS, "", ratio=0.12, growth_exponent=0.5,
                                                           bias_z=-1.2, crossing_step=None), 30.1, drift_run(1.2e-5)),
        DriftResult(drift_case(regime="decay", state_dtype="bf16"), DriftVerdict(Status.ERROR, "ValueError: boom"),
                    0.2, None),
        DriftResult(drift_case(state_dtype="fp32", rounding="stochastic"),
                    DriftVerdict(Status.SKIPPED, "stochastic rounding needs a narrower state"), 0.0, None),
    ]


def rendered(module, results, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    module.render(console, results)
    return console.export_text()


def table_text(module, results, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(module.results_table(console, results))
    return console.export_text()


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line[1:-1].replace("┃", "│").split("│")]


def header(text: str) -> list[str]:
    return cells(text.splitlines()[1])


def rows(text: str) -> list[dict[str, str]]:
    """The table's rows as {header: cell}, a cell folded over several lines joined back."""
    names, out = header(text), []
    for line in text.splitlines()[3:-1]:
        if not line.startswith("│"):
            break  # the notes under the table
        values = cells(line)
        if values[names.index("status")]:
            out.append(dict(zip(names, values)))
        else:  # a continuation line: only the folded cell has text
            out[-1] = {name: out[-1][name] + value for name, value in zip(names, values)}
    return out


# What every row must show whole, whatever the width: (id, status, ratio) per case.
SCAN_ROWS = [(r.case.id, r.status.value, ratio) for r, ratio in zip(scan_results(), ["1.20", "2.07", "nan", "", ""])]
DRIFT_ROWS = [(r.case.id, r.status.value, ratio) for r, ratio in zip(drift_results(), ["2.07", "0.12", "-", "-"])]
BOTH = pytest.mark.parametrize("module, results, expected", [(scan_table, scan_results, SCAN_ROWS),
                                                             (drift_table, drift_results, DRIFT_ROWS)],
                               ids=["scan", "drift"])


@BOTH
@pytest.mark.parametrize("width", [80, 60, 40])
def test_every_row_shows_its_whole_status_id_and_ratio(module, results, expected, width):
    text = table_text(module, results(), width)
    assert "…" not in text
    assert max(map(len, text.splitlines())) <= width
    assert [(row["id"], row["status"], row["ratio"]) for row in rows(text)] == expected


@BOTH
def test_at_80_columns_each_id_stays_on_one_line_to_copy(module, results, expected):
    lines = table_text(module, results(), 80).splitlines()
    for case_id, status, _ in expected:
        assert any(case_id in line and f" {status} " in line for line in lines)


@BOTH
def test_wide_consoles_show_the_parameter_columns_instead_of_the_id(module, results, expected):
    text = table_text(module, results(), 200)
    params = {scan_table: SCAN_PARAMS, drift_table: DRIFT_PARAMS}[module]
    assert "id" not in header(text) and set(params) <= set(header(text))
    assert header(text)[-1] == "time" and "…" not in text
    assert [(row["status"], row["ratio"]) for row in rows(text)] == [e[1:] for e in expected]


# The layouts in the order they are given up, each the column headers left to right.
SCAN_LAYOUTS = [
    ["regime", "dtype", "chunk", "seqlen", "batch", "HxPxN/G", "state", "status", "y err", "state err", "ratio",
     "first non-finite", "drift per chunk", "time"],
    ["id", "status", "y err", "state err", "ratio", "first non-finite", "drift per chunk", "time"],
    ["id", "status", "y err", "state err", "ratio", "first non-finite", "time"],
    ["id", "status", "y err", "state err", "ratio", "first non-finite"],
    ["id", "status", "y err", "state err", "ratio"],
    ["id", "status", "y err", "ratio"],
    ["id", "status", "ratio"],
]
DRIFT_LAYOUTS = [
    ["regime", "state", "rounding", "batch", "HxPxN/G", "steps", "status", "drift", "baseline", "ratio", "α",
     "bias z", "crosses tol", "drift curve", "time"],
    ["id", "status", "drift", "baseline", "ratio", "α", "bias z", "crosses tol", "drift curve", "time"],
    ["id", "status", "drift", "baseline", "ratio", "α", "bias z", "crosses tol", "time"],
    ["id", "status", "drift", "baseline", "ratio", "α", "bias z", "crosses tol"],
    ["id", "status", "drift", "baseline", "ratio", "α", "bias z"],
    ["id", "status", "drift", "baseline", "ratio", "bias z"],
    ["id", "status", "drift", "baseline", "ratio"],
    ["id", "status", "drift", "ratio"],
    ["id", "status", "ratio"],
]


@pytest.mark.parametrize("module, results, layouts", [(scan_table, scan_results, SCAN_LAYOUTS),
                                                      (drift_table, drift_results, DRIFT_LAYOUTS)],
                         ids=["scan", "drift"])
def test_narrower_consoles_drop_the_least_important_columns_first(module, results, layouts):
    seen = [layouts.index(header(table_text(module, results(), width))) for width in range(220, 39, -3)]
    assert seen == sorted(seen)  # never a richer layout on a narrower console
    assert set(seen) == set(range(len(layouts)))  # each is taken over 4+ widths (a column and its border)


def test_a_failing_case_note_is_one_whole_line_however_narrow_the_console():
    cases = scan_results()
    lines = rendered(scan_table, cases, 60).splitlines()
    for result in cases[1:4]:
        assert f"{result.status.value}: {result.case.id}: {result.message}" in lines
    assert "skipped (1): chunk size 8 is below the kernel's 16" in lines


def test_drift_notes_and_rounding_comparisons_are_one_line_each():
    lines = rendered(drift_table, drift_results(), 60).splitlines()
    assert "fail: stagnation-fp16-nearest-b1-h8x64n128g1: drift 2.07 x baseline at step 4096" in lines
    assert any(line.startswith("stagnation-fp16-b1-h8x64n128g1: stochastic rounding: 17.2× less drift")
               for line in lines)


def test_a_finished_case_is_one_log_line():
    lines = [scan_table.case_line(r) for r in scan_results()]
    assert lines == [
        "pass normal-fp16-c64-L300-b2-h4x32n16g1 ratio 1.20 0.41s",
        "fail normal-bf16-c64-L300-b2-h4x32n16g1-state-fp16-stochastic ratio 2.07 1.23s: "
        "y error 2.07e-03 is 2.07 x baseline, above 2 x baseline + 1e-05",
        "nonfinite ragged-fp16-c128-L300-b2-h4x32n16g1 ratio nan 0.90s: "
        "y is non-finite at sequence 1 token 98 (chunk 1) head 2 channel 5",
        "error normal-fp16-c256-L300-b2-h4x32n16g1 0.05s: RuntimeError: out of resource: shared memory",
        "skipped normal-fp16-c8-L300-b2-h4x32n16g1: chunk size 8 is below the kernel's 16",
    ]
    assert [drift_table.case_line(r) for r in drift_results()][:3] == [
        "fail stagnation-fp16-nearest-b1-h8x64n128g1 ratio 2.07 12.5s: drift 2.07 x baseline at step 4096",
        "pass stagnation-fp16-stochastic-b1-h8x64n128g1 ratio 0.12 30.1s",
        "error decay-bf16-nearest-b1-h8x64n128g1 0.2s: ValueError: boom",
    ]


def test_a_multi_line_message_keeps_its_first_and_last_line():
    from ssmcheck.core.render import headline

    compile_error = ("CompilationError: at 91:4:\n\n    seq_idx = tl.load(seq_idx_ptr)\n"
                     "    if HAS_INITSTATES and (seq_idx != seq_idx_prev):\n    ^\n"
                     "AssertionError('Mismatched type for prev_states_ptr')\n")
    assert headline(compile_error) == ("CompilationError: at 91:4: ... "
                                       "AssertionError('Mismatched type for prev_states_ptr')")
    assert headline("y error 0.1 > limit 0.01") == "y error 0.1 > limit 0.01"
    assert headline(None) == headline("  \n ") == ""
    long = headline("x" * 400)
    assert len(long) == 300 and long.endswith("...")
