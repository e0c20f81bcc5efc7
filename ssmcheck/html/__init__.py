"""`ssmcheck report REPORT.json --html OUT.html`: one self-contained HTML page from a JSON report.

`data` reads the report back (figures written as strings, cases grouped for the figures),
`figures` draws with matplotlib (the `plot` extra) into PNG bytes, `page` is the HTML, CSS
and sorting script, and `build` puts them together. Nothing here imports torch or triton:
a report is rendered from its JSON alone, on any machine.
"""

from ssmcheck.html.build import build_html, write_html
from ssmcheck.html.data import NotAReport, check_report
from ssmcheck.html.figures import PlotUnavailable, require_matplotlib

__all__ = ["NotAReport", "PlotUnavailable", "build_html", "check_report", "require_matplotlib", "write_html"]
