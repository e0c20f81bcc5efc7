"""--kernel MODULE:FUNCTION and path/to/file.py:FUNCTION."""

import pytest

from ssmcheck.kernels import KernelSpecError, load_callable


def test_module_function():
    assert load_callable("math:sqrt")(4.0) == 2.0


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
