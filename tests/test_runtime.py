"""Device selection: decided once, before triton is imported, and reported."""

import os
import subprocess
import sys

import pytest
import torch

from ssmcheck.core import runtime


def _fresh(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_cpu_sets_interpreter_before_triton_import():
    r = _fresh(
        "import sys, os\n"
        "from ssmcheck.core import runtime\n"
        "assert 'triton' not in sys.modules\n"
        "e = runtime.configure('cpu')\n"
        "assert os.environ['TRITON_INTERPRET'] == '1'\n"
        "assert e.device == 'cpu' and e.interpreter\n"
        "print(e.triton)\n"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()


def test_importing_the_package_does_not_import_triton():
    r = _fresh("import sys, ssmcheck, ssmcheck.cli, ssmcheck.core.status, ssmcheck.core.sweep, ssmcheck.core.report; print('triton' in sys.modules)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_unknown_device_is_rejected():
    with pytest.raises(runtime.DeviceError, match="unknown device 'tpu'"):
        runtime.configure("tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_cuda_without_gpu_is_rejected():
    with pytest.raises(runtime.DeviceError, match="no CUDA GPU"):
        runtime.configure("cuda")


def test_cannot_switch_mode_after_triton_import():
    # conftest configured the session already, so triton is imported in one mode.
    other = "cuda" if runtime.environment().interpreter else "cpu"
    if other == "cuda" and not torch.cuda.is_available():
        pytest.skip("no GPU to switch to")
    with pytest.raises(runtime.DeviceError, match="already imported"):
        runtime.configure(other)


def test_environment_is_reported():
    env = runtime.environment().as_dict()
    assert set(env) >= {"device", "torch", "triton", "interpreter"}
    assert env["torch"] == torch.__version__



def test_the_interpreter_skips_its_int32_overflow_checks():
    # They assert only under TRITON_DEBUG, yet each int32 op is redone in int64: a fifth of a CPU scan.
    r = _fresh(
        "from ssmcheck.core import runtime\n"
        "runtime.configure('cpu')\n"
        "from triton.runtime import interpreter\n"
        "options = getattr(interpreter.interpreter_builder, 'options', None)\n"
        "print(getattr(options, 'sanitize_overflow', 'absent'))\n"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() in ("False", "absent")


_NESTED_LAUNCH = """
import torch
from ssmcheck.core import runtime
runtime.configure('cpu')
import triton, triton.language as tl
from triton.runtime import interpreter
calls = []
once = interpreter._patch_lang
original = next(c.cell_contents for c in once.__closure__ if getattr(c.cell_contents, '__name__', '') == '_patch_lang')
def counted(fn):
    calls.append(fn.__name__)
    return original(fn)
for cell in once.__closure__:
    if cell.cell_contents is original:
        cell.cell_contents = counted

@triton.jit
def twice(v):
    return v * 2

@triton.jit
def plus_one_twice(v):
    return twice(v) + 1

@triton.jit
def kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, plus_one_twice(tl.load(x_ptr + i)))

load = tl.load
x = torch.arange(32, dtype=torch.float32) + 0.5
y = torch.full_like(x, float('nan'))
kernel[(4,)](x, y, BLOCK=8)
kernel[(4,)](x, y, BLOCK=8)
print(calls, torch.equal(y, 2 * x + 1), tl.load is load)
"""


def test_the_interpreter_patches_the_language_once_per_launch_and_restores_it():
    # Nested @triton.jit helpers re-patched triton.language on every call: a third of a CPU scan's kernel time.
    r = _fresh(_NESTED_LAUNCH)
    assert r.returncode == 0, r.stderr
    # Two launches of 4 programs, 2 nested calls each: patched once per launch, not 2 + 16 times.
    assert r.stdout.split() == ["['kernel',", "'kernel']", "True", "True"]


_DTYPE_LOOKUP = """
from ssmcheck.core import runtime
runtime.configure('cpu')
import triton.language as tl
from triton.runtime import interpreter
memoised = interpreter._get_np_dtype
original = memoised.lookup
scalars = [t for t in vars(tl).values() if isinstance(t, tl.dtype) and not isinstance(t, tl.block_type)]
types = scalars + [tl.pointer_type(t) for t in scalars] + [tl.block_type(t, [4, 8]) for t in scalars]
types += [tl.block_type(tl.pointer_type(tl.float32), [16])]
checked = 0
for t in types * 2:  # twice: the second answer comes from the memo
    try:
        want = original(t)
    except KeyError:
        continue
    assert memoised(t) == want, (t, memoised(t), want)
    checked += 1
print(getattr(memoised, 'memoised', False), checked, memoised(tl.block_type(tl.bfloat16, [2])))
"""


def test_the_interpreter_dtype_lookup_is_memoised_and_answers_as_before():
    # The interpreter built a dict of numpy dtypes on every tile op: about 5% of a CPU scan.
    r = _fresh(_DTYPE_LOOKUP)
    assert r.returncode == 0, r.stderr
    memoised, checked, bf16 = r.stdout.split()
    assert memoised == "True" and int(checked) >= 60 and bf16 == "uint16"


def test_bf16_to_fp32_in_kernels_is_exact_for_every_pattern(device):
    # The interpreter's generic conversion turned bf16 subnormals into other values (0x0001 into 0); the GPU
    # widens by a shift. Every one of the 65536 bf16 patterns, NaN payloads and subnormals included.
    import triton
    import triton.language as tl

    @triton.jit
    def widen(src_ptr, dst_ptr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst_ptr + i, tl.load(src_ptr + i).to(tl.float32))

    patterns = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).to(device)
    out = torch.full((65536,), float("nan"), device=device)
    widen[(65536 // 4096,)](patterns.view(torch.bfloat16), out, BLOCK=4096)
    want = patterns.to(torch.int32) << 16  # the pattern in the upper half, exactly
    assert torch.equal(out.view(torch.int32), want)
