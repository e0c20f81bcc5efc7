"""The JSON envelope, the sparkline and the shared header and summary lines."""

import json
import math

from ssmcheck import __version__
from ssmcheck.core import render, report, runtime
from ssmcheck.core.tolerance import Tolerance, tolerance_rule


def test_envelope_keys_and_nonfinite_values(tmp_path):
    rep = report.build_report("scan", runtime.environment(), [{"id": "c0", "value": math.nan, "v": [math.inf]}], {"pass": 1}, 0)
    path = tmp_path / "r.json"
    report.write_json(path, rep)
    data = json.loads(path.read_text())  # strict JSON: no bare NaN
    assert set(data) == {"tool", "version", "command", "environment", "cases", "summary", "exit_code", "interrupted",
                         "interrupted_by"}
    assert data["interrupted"] is False and data["interrupted_by"] is None
    assert data["tool"] == "ssmcheck" and data["command"] == "scan"
    assert data["cases"][0]["value"] == "nan" and data["cases"][0]["v"] == ["inf"]
    assert set(data["environment"]) >= {"device", "torch", "triton", "interpreter"}


def test_sparkline_spans_the_bars_and_marks_nonfinite():
    line = render.sparkline([1e-6, 1e-5, 1e-4, math.nan, 1e-3])
    assert len(line) == 5
    assert line[0] == render.SPARK_BARS[0] and line[-1] == render.SPARK_BARS[-1]
    assert line[3] == "!"
    assert render.sparkline([]) == ""
    assert set(render.sparkline([2.0, 2.0, 2.0])) == {render.SPARK_BARS[0]}


def test_header_and_summary_lines():
    env = runtime.environment()
    assert report.environment_line("drift", env).startswith(f"ssmcheck {__version__} drift | device {env.device} (")
    assert tolerance_rule(Tolerance()) == "2 x baseline + 1e-05"
    assert tolerance_rule(Tolerance(rtol=0.01)) == "rtol 0.01"
    counts = {"pass": 2, "fail": 1}
    assert report.summary_line(counts, 1.23, 1) == "3 cases: 2 pass, 1 fail in 1.2s; exit code 1"
    assert report.summary_line(counts, 1.23, 1, prefix="drift: ").startswith("drift: 3 cases:")
