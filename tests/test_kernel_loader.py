"""--kernel MODULE:FUNCTION and path/to/file.py:FUNCTION, and which of our keywords a callable takes."""

import functools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ssmcheck.core.callables import KernelSpecError, keywords, load_callable
from ssmcheck.drift import adapter as drift_adapter
from ssmcheck.scan import adapter as scan_adapter


def test_module_function():
    assert load_callable("math:sqrt")(4.0) == 2.0


def test_module_in_the_current_directory_with_the_installed_script(tmp_path):
    """The installed `ssmcheck` script has its own folder as sys.path[0], not the current directory (as
    `python -m` has): a script file outside the user's folder stands in for it."""
    user, bin_dir = tmp_path / "user", tmp_path / "bin"
    user.mkdir()
    bin_dir.mkdir()
    (user / "mykernels.py").write_text(textwrap.dedent("""
        from ssmcheck.scan.adapter import torch_kernel

        def fn(*args, **kwargs):
            return torch_kernel(*args, **kwargs)
    """))
    (bin_dir / "ssmcheck").write_text("from ssmcheck.console import main\nmain()\n")  # as pip writes it
    argv = ["scan", "--kernel", "mykernels:fn", "--preset", "smoke", "--regime", "normal", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, str(bin_dir / "ssmcheck"), *argv], cwd=user, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_importing_a_module_leaves_sys_path_as_it_was(tmp_path, monkeypatch):
    (tmp_path / "mykernels_path_check.py").write_text("def fn():\n    return 7\n")
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    assert load_callable("mykernels_path_check:fn")() == 7
    assert sys.path == before


def test_file_function(tmp_path):
    f = tmp_path / "my_kernel.py"
    f.write_text("def scan(*a, **k):\n    return 42\n")
    assert load_callable(f"{f}:scan")() == 42


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nocolon", "expected MODULE:FUNCTION"),
        ("no_such_module_xyz:f", "cannot import no_such_module_xyz"),
        ("math:no_such_fn", "has no callable 'no_such_fn'"),
        ("missing_file.py:f", "no such file"),
    ],
)
def test_bad_specs_name_the_problem(spec, message):
    with pytest.raises(KernelSpecError, match=message):
        load_callable(spec)


def test_file_that_raises_on_import(tmp_path):
    f = tmp_path / "broken.py"
    f.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(KernelSpecError, match="RuntimeError: boom"):
        load_callable(f"{f}:fn")


def test_a_bare_assert_on_import_names_its_line(tmp_path):
    f = tmp_path / "asserts.py"
    f.write_text("import sys\nassert sys.maxsize < 0\n")
    with pytest.raises(KernelSpecError, match=r"raised AssertionError at .*asserts.py:2: assert sys.maxsize < 0"):
        load_callable(f"{f}:fn")


def _explicit(state, x, *, rounding="nearest", seed=0):
    return state


def _catch_all(state, x, **kwargs):
    return state


@functools.wraps(_explicit)
def _wrapped(*args, **kwargs):
    return _explicit(*args, **kwargs)


class _NoSignature:
    __signature__ = "not a Signature"  # inspect.signature raises TypeError, as for some C extensions

    def __call__(self, state, x, rounding="nearest"):
        return state


def test_keywords_are_the_names_a_signature_gives():
    assert keywords(_explicit) == {"state", "x", "rounding", "seed"}
    assert keywords(_wrapped) == {"state", "x", "rounding", "seed"}  # functools.wraps exposes the original
    assert keywords(_catch_all) == {"state", "x"}  # **kwargs names nothing
    assert keywords(_NoSignature()) == frozenset()


def test_scan_and_drift_decide_alike(tmp_path):
    f = tmp_path / "kernels_for_keywords.py"
    f.write_text(
        "def scan_named(x, dt, A, B, C, chunk_size, *, state_dtype=None, rounding='nearest', seed=0):\n    return x\n"
        "def scan_catch_all(x, dt, A, B, C, chunk_size, **kwargs):\n    return x\n"
        "def step_named(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, *, rounding='nearest',"
        " seed=0):\n    return x\n"
        "def step_catch_all(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, **kwargs):\n"
        "    return x\n"
    )
    assert scan_adapter.resolve(f"{f}:scan_named", interpreter=True).takes_state_options
    assert not scan_adapter.resolve(f"{f}:scan_catch_all", interpreter=True).takes_state_options
    named = drift_adapter.resolve(f"{f}:step_named", 10, "software", interpreter=True)
    assert named.takes_rounding and named.takes_seed
    catch_all = drift_adapter.resolve(f"{f}:step_catch_all", 10, "software", interpreter=True)
    assert not catch_all.takes_rounding and not catch_all.takes_seed
