"""ssmcheck as a pytest plugin (registered through the `pytest11` entry point): each case of a sweep is a test item.

From the command line, a sweep is collected beside whatever else pytest collects:

    pytest --ssmcheck-scan KERNEL [--ssmcheck-preset NAME] [--ssmcheck-device cpu|cuda]
    pytest --ssmcheck-drift KERNEL ...

KERNEL is what `ssmcheck scan --kernel` takes (`builtin`, `torch`, `MODULE:FUNCTION`,
`path/to/file.py:FUNCTION`); the preset defaults to `smoke`; a project's `[tool.ssmcheck]` table
applies as it does to the CLI. The items' nodeids are `ssmcheck-scan::<case id>` and
`ssmcheck-drift::<case id>` (e.g. `ssmcheck-scan::ragged-bf16-c16-L40-b2-h2x8n8g1`); select them
with `-k` (`-k ragged`; `-k ssmcheck-scan` for the sweep alone in a project that has tests), not by
nodeid on the command line (pytest reads a nodeid's first part as a path).

In a test module, `pytestmark = pytest.mark.ssmcheck(kernel=..., preset=..., command="scan"|"drift",
**options)` (kernel as `ssmcheck.api.scan` takes it, a callable too; options as its keywords, e.g.
`regime=["normal"]`) adds the sweep's cases under the module, as
`path/to/test_mod.py::ssmcheck-scan::<case id>`, after the module's own tests, which still run
(`-k "not ssmcheck-scan"` leaves the sweep out). Without `preset=` the marker's sweep uses
`--ssmcheck-preset`; it runs on `--ssmcheck-device` unless it names a `device=`. One marker per
command and module; a bad marker is a one-line collection error of its sweep.

An item runs its case when pytest runs it: `pass` passes; `fail`, `nonfinite` and `error` fail
with the verdict's message (a non-finite one names the first NaN's sequence, token, chunk, head
and channel); `skipped` skips with the reason; a failing status that the sweep's `fail_on` does
not gate is xfailed. The case's JSON dict is the item's `ssmcheck` user property, so `--junitxml`
carries its figures. Cases are independent, so `-x`, `--junitxml` and pytest-xdist's `-n` work:
every xdist worker plans the same sweep from the same options, and a plan lists its cases in a
fixed order, so all workers collect the same items in the same order.

On a GPU, once a sweep's first item is set up, helper processes compile the Triton kernels of its selected
items ahead while the items run (`ssmcheck.api.start_compiling_ahead`, the README's "Compiling ahead"), except
under xdist (whose workers share the items) or with `--ssmcheck-no-compile-ahead`.

Importing this module does not import triton, which the runtime must first switch to the interpreter
or compiled mode (core.runtime): ssmcheck's API is imported where a sweep is planned or run.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable

import pytest

COMMANDS = ("scan", "drift")
MARKER = "ssmcheck"
DEFAULT_PRESET = "smoke"

# The command-line sweeps, planned at configure time so that a bad option is a usage error.
_PLANS = pytest.StashKey[dict]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ssmcheck", "ssmcheck: one test item per case of a Mamba2 kernel sweep")
    group.addoption("--ssmcheck-scan", metavar="KERNEL",
                    help="collect the chunk-scan sweep of KERNEL (builtin, torch, MODULE:FUNCTION or FILE.py:FUNCTION)")
    group.addoption("--ssmcheck-drift", metavar="KERNEL",
                    help="collect the decode-drift sweep of the state-update KERNEL")
    group.addoption("--ssmcheck-preset", metavar="NAME", default=DEFAULT_PRESET,
                    help=f"the preset of the sweeps: a name of configs/ or a TOML path (default: {DEFAULT_PRESET})")
    group.addoption("--ssmcheck-device", metavar="DEVICE",
                    help="cpu (Triton interpreter) or cuda (default: cuda when available)")
    group.addoption("--ssmcheck-no-compile-ahead", action="store_true",
                    help="on a GPU, do not compile a sweep's Triton kernels ahead of its first item (ssmcheck scan's "
                         "--no-compile-ahead)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}(kernel, preset=None, command='scan', **options): add the module's ssmcheck sweep, "
                   "one test item per case",
    )
    config.stash[_PLANS] = {
        command: _command_line_plan(config, command, kernel)
        for command in COMMANDS if (kernel := config.getoption(f"ssmcheck_{command}")) is not None
    }


def pytest_report_header(config: pytest.Config) -> list[str]:
    plans = config.stash[_PLANS]
    if not plans:
        return []
    from ssmcheck.core.report import environment_line  # noqa: PLC0415 (imports torch)

    return [
        f"{environment_line(command, plan.env)} | kernel {plan.kernel} | preset {plan.report_settings['preset']} | "
        f"{len(plan.cases)} cases"
        for command, plan in plans.items()
    ]


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """Add the command-line sweeps under the session, and a marked module's sweeps under the module."""
    report = yield
    if report.passed:
        if isinstance(collector, pytest.Session):
            report.result.extend(_command_line_sweeps(collector))
        elif isinstance(collector, pytest.Module):
            report.result.extend(_module_sweeps(collector))
    return report


class SweepCollector(pytest.Collector):
    """One sweep: plans it when collected (a bad option is this collector's error) and yields an item per case."""

    def __init__(self, *, make_plan: Callable, **kwargs):
        super().__init__(**kwargs)
        self.make_plan = make_plan

    def collect(self):
        from ssmcheck.api import UsageError  # noqa: PLC0415

        try:
            plan = self.make_plan()
        except UsageError as exc:
            raise self.CollectError(str(exc)) from None
        self.plan = plan
        for case in plan.cases:
            yield CaseItem.from_parent(self, name=case.id, plan=plan, case=case)

    def setup(self) -> None:
        """Before the sweep's first item runs: start compiling ahead what the sweep's items that run (after -k)
        will launch (api.start_compiling_ahead: a GPU's Triton kernels, in helper processes while the items run),
        unless --ssmcheck-no-compile-ahead, or pytest-xdist shares the items among its workers (each would
        compile them all)."""
        self.helpers = None
        if self.config.getoption("ssmcheck_no_compile_ahead") or hasattr(self.config, "workerinput"):
            return
        from ssmcheck import api  # noqa: PLC0415

        try:
            self.helpers = api.start_compiling_ahead(
                self.plan, [item.case for item in self.session.items if item.parent is self])
        except Exception:  # noqa: BLE001, S110 (each item compiles at its first launch, as without it)
            pass

    def teardown(self) -> None:
        """After the sweep's last item: end the helpers that compiled ahead."""
        if getattr(self, "helpers", None) is not None:
            self.helpers.end()


class CaseItem(pytest.Item):
    """One case of a sweep, named by its case id; it runs the case when pytest runs the item."""

    def __init__(self, *, plan, case, **kwargs):
        super().__init__(**kwargs)
        self.plan = plan
        self.case = case

    def runtest(self) -> None:
        from ssmcheck.core.report import json_safe  # noqa: PLC0415
        from ssmcheck.core.status import FAIL_ON  # noqa: PLC0415

        case = self.plan.case_json(self.plan.runner(self.case, lambda: None))
        self.user_properties.append(("ssmcheck", json.dumps(json_safe(case))))
        status, message = case["status"], case["message"]
        if status == "pass":
            return
        if status == "skipped":
            pytest.skip(message)
        if status not in {FAIL_ON[category].value for category in self.plan.settings.fail_on}:
            pytest.xfail(f"{status} (not gated by fail_on): {message}")
        pytest.fail(f"{status}: {message}", pytrace=False)

    def reportinfo(self):
        return self.path, None, f"ssmcheck {self.plan.command} {self.name}"


def _command_line_sweeps(session: pytest.Session) -> list[SweepCollector]:
    return [
        # An explicit nodeid: the session's is "", which would make the default "::ssmcheck-scan".
        SweepCollector.from_parent(session, name=f"ssmcheck-{command}", nodeid=f"ssmcheck-{command}",
                                   make_plan=lambda plan=plan: plan)
        for command, plan in session.config.stash[_PLANS].items()
    ]


def _module_sweeps(module: pytest.Module) -> list[SweepCollector]:
    sweeps, seen = [], set()
    for mark in module.own_markers:
        if mark.name != MARKER:
            continue
        command = mark.kwargs.get("command", "scan")
        if command in seen:
            make_plan = functools.partial(_duplicate_marker, command)
        else:
            make_plan = functools.partial(_marker_plan, module.config, mark)
        seen.add(command)
        sweeps.append(SweepCollector.from_parent(module, name=f"ssmcheck-{command}", make_plan=make_plan))
    return sweeps


def _planner(command: str) -> Callable:
    from ssmcheck import api  # noqa: PLC0415 (imports torch)

    return {"scan": api.plan_scan, "drift": api.plan_drift}[command]


def _command_line_plan(config: pytest.Config, command: str, kernel: str):
    from ssmcheck.api import UsageError  # noqa: PLC0415

    try:
        return _planner(command)(kernel, config.getoption("ssmcheck_preset"),
                                 device=config.getoption("ssmcheck_device"))
    except UsageError as exc:
        raise pytest.UsageError(_pytest_option_message(str(exc), command)) from None


def _pytest_option_message(message: str, command: str) -> str:
    """The API's one-line message, naming this plugin's option instead of the CLI's."""
    ours = {"--kernel": f"--ssmcheck-{command}", "--preset": "--ssmcheck-preset", "--device": "--ssmcheck-device"}
    for cli_option, option in ours.items():
        if message.startswith(cli_option):
            return option + message[len(cli_option):]
    return f"--ssmcheck-{command}: {message}"


def _marker_plan(config: pytest.Config, mark: pytest.Mark):
    from ssmcheck.api import UsageError  # noqa: PLC0415

    options = {"preset": config.getoption("ssmcheck_preset"), "device": config.getoption("ssmcheck_device"),
               **mark.kwargs}
    command = options.pop("command", "scan")
    kernel = options.pop("kernel", None)
    if mark.args or kernel is None:
        raise UsageError(f"@pytest.mark.{MARKER}: takes keywords only, and kernel= is required")
    if command not in COMMANDS:
        raise UsageError(f"@pytest.mark.{MARKER}: command: invalid value {command!r} (choose from {', '.join(COMMANDS)})")
    try:
        return _planner(command)(kernel, **options)
    except UsageError as exc:
        raise UsageError(f"@pytest.mark.{MARKER}: {exc}") from None


def _duplicate_marker(command: str):
    from ssmcheck.api import UsageError  # noqa: PLC0415

    raise UsageError(f"@pytest.mark.{MARKER}: a second command={command!r} marker on one module (one per command)")
