"""Device selection: decided once, before triton is imported, and reported."""

import os
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl

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


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "y", "On", "0", "false", "off", "no", ""])
def test_triton_INTERPRET_is_read_as_triton_reads_it(value, monkeypatch):
    # configure's choice of device and the kernels' interpret=None must agree with Triton's own reading.
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert runtime.interpreting() == triton.knobs.runtime.interpret


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


_TILE_TYPES = """
from ssmcheck.core import runtime
runtime.configure('cpu')
import triton.language as tl
block_init, tensor_init = tl.block_type.__init__.original, tl.tensor.__init__.original

def plain(value):  # attributes made comparable: Triton tuples and constexprs by their values
    if isinstance(value, tl.core.tuple):
        return ('tuple', [plain(v) for v in value.values])
    if isinstance(value, tl.constexpr):
        return ('constexpr', value.value)
    return value

def attributes(obj, skip=()):
    return {k: plain(v) for k, v in vars(obj).items() if k not in skip}

elements = [tl.float32, tl.bfloat16, tl.int1, tl.uint32, tl.pointer_type(tl.float16)]
shapes = [[1], [16], [4, 8], [2, 1, 64], [tl.constexpr(8), 2], tl.block_type(tl.int8, [32, 2]).shape]
checked = 0
for element in elements:
    for shape in shapes * 2:  # twice: the second construction comes from the memo
        want = object.__new__(tl.block_type)
        block_init(want, element, shape)
        got = tl.block_type(element, shape)
        assert attributes(got) == attributes(want), (attributes(got), attributes(want))
        for ty in (got, element):
            want_t = object.__new__(tl.tensor)
            tensor_init(want_t, 'h', ty)
            got_t = tl.tensor('h', ty)
            assert attributes(got_t) == attributes(want_t), (attributes(got_t), attributes(want_t))
            checked += 1
shared = tl.block_type(tl.float32, [4, 8]).shape is tl.block_type(tl.float32, [4, 8]).shape
errors = []
for bad in ([3], [], [16, tl.constexpr(5)]):
    try:
        tl.block_type(tl.float32, bad)
    except (TypeError, ValueError) as e:
        errors.append(type(e).__name__)
print(checked, shared, *errors)
"""


def test_the_interpreter_memoises_tile_types_and_builds_them_as_before():
    # Each tile op built a block type and a tensor, formatting names and Triton tuples: a third of a CPU scan.
    r = _fresh(_TILE_TYPES)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["120", "True", "ValueError", "TypeError", "ValueError"]


_LISTED_SHAPES = """
import os
os.environ['TRITON_INTERPRET'] = '1'
import triton.language as tl
def listed_init(self, handle, type):  # as an older Triton might: the shape a list, which its holder may change
    self.handle, self.type, self.dtype = handle, type, type.scalar
    self.shape = [tl.constexpr(s) for s in type.shape]
tl.tensor.__init__ = listed_init
from ssmcheck.core import runtime
runtime.configure('cpu')
ty = tl.block_type(tl.float32, [4, 8])
a, b = tl.tensor('a', ty), tl.tensor('b', ty)
print(tl.tensor.__init__.original is listed_init, a.shape is b.shape, [s.value for s in b.shape])
"""


def test_the_tile_type_memo_shares_no_list():
    r = _fresh(_LISTED_SHAPES)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "False", "[4,", "8]"]


@triton.jit
def _convert(src_ptr, dst_ptr, n, TO: tl.constexpr, CUT: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(src_ptr + i, mask=i < n)
    if CUT:
        v = v.to(TO, fp_downcast_rounding="rtz")
    else:
        v = v.to(TO)
    tl.store(dst_ptr + i, v, mask=i < n)


@triton.jit
def _dot(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    m, n, k = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(a_ptr + m[:, None] * K + k[None, :])
    b = tl.load(b_ptr + k[:, None] * N + n[None, :])
    tl.store(c_ptr + m[:, None] * N + n[None, :], tl.dot(a, b, tl.zeros((M, N), tl.float32)))


def test_bf16_to_fp32_in_kernels_is_exact_for_every_pattern(device):
    # The interpreter's generic conversion turned bf16 subnormals into other values (0x0001 into 0); the GPU
    # widens by a shift. Every one of the 65536 bf16 patterns, NaN payloads and subnormals included.
    patterns = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).to(device)
    out = torch.full((65536,), float("nan"), device=device)
    _convert[(16,)](patterns.view(torch.bfloat16), out, 65536, TO=tl.float32, CUT=False, BLOCK=4096)
    assert torch.equal(out.view(torch.int32), patterns.to(torch.int32) << 16)  # the pattern in the upper half


def _fp32_patterns(device) -> torch.Tensor:
    """fp32 values that test a conversion to bf16: random patterns (subnormals, NaN payloads, huge values),
    exact ties to even and odd neighbours, the overflow boundary, infinities, zeros."""
    g = torch.Generator().manual_seed(5)
    random = torch.randint(-2**31, 2**31, (20000,), generator=g, dtype=torch.int64).to(torch.int32)
    upper = torch.randint(-2**15, 2**15, (2000,), generator=g, dtype=torch.int64).to(torch.int32) << 16
    special = torch.tensor([0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x7F800000, 0x7F800001, 0x7FFFFFFF, 0x00000001,
                            0x00008000, 0x00018000, 0x007FFFFF, 0x80000000, 0x3F808000, 0x3F818000],
                           dtype=torch.int64).to(torch.int32)
    bits = torch.cat([random, upper | 0x8000, upper | 0x7FFF, upper | 0x8001, special, special | -2**31])
    return bits.view(torch.float32).to(device)


def _same_values(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bitwise equal, but any NaN for NaN (payloads differ between converters)."""
    nan = want.isnan()
    return torch.equal(got.isnan(), nan) and torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))


def test_fp32_to_bf16_in_kernels_rounds_to_nearest_even_as_the_gpu(device):
    # The interpreter truncated (and garbled fp32 subnormals); cvt.rn.bf16.f32 rounds to nearest even, as
    # torch does.
    x = _fp32_patterns(device)
    out = torch.empty(x.shape, dtype=torch.bfloat16, device=device)
    _convert[(triton.cdiv(x.numel(), 4096),)](x, out, x.numel(), TO=tl.bfloat16, CUT=False, BLOCK=4096)
    assert _same_values(out, x.to(torch.bfloat16))


def test_fp32_to_bf16_toward_zero_in_kernels_cuts_the_pattern(device):
    x = _fp32_patterns(device)
    out = torch.empty(x.shape, dtype=torch.bfloat16, device=device)
    _convert[(triton.cdiv(x.numel(), 4096),)](x, out, x.numel(), TO=tl.bfloat16, CUT=True, BLOCK=4096)
    cut = (x.view(torch.int32) >> 16).to(torch.int16).view(torch.bfloat16)
    assert _same_values(out, torch.where(x.isnan(), x.to(torch.bfloat16), cut))


def test_a_bf16_dot_in_kernels_multiplies_the_values(device):
    # The interpreter multiplied bf16 operands as their uint16 patterns.
    g = torch.Generator().manual_seed(6)
    a = torch.randn(16, 32, generator=g).to(torch.bfloat16).to(device)
    b = torch.randn(32, 16, generator=g).to(torch.bfloat16).to(device)
    c = torch.full((16, 16), float("nan"), device=device)
    _dot[(1,)](a, b, c, M=16, N=16, K=32)
    # Products of bf16 values are exact in fp32; fp32 sums of K terms in any order stay within K * 2**-24 of
    # the sum of the magnitudes (Higham's bound), where integer-pattern products land far outside.
    error = (c.double() - a.double() @ b.double()).abs()
    assert (error <= 32 * 2.0**-24 * (a.double().abs() @ b.double().abs())).all(), error.max()


@triton.jit
def _flagged(x_ptr, y_ptr, flag, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + i)
    if flag:
        v = v * 2.0
    tl.store(y_ptr + i, v)


@pytest.mark.parametrize("flag", [False, True])
def test_a_bool_kernel_argument_is_a_run_time_flag(device, flag):
    # The built-in kernels pass has_d / has_z so; Triton 3.6's interpreter refused every such launch.
    x = torch.randn(16, generator=torch.Generator().manual_seed(3)).to(device)
    y = torch.full_like(x, float("nan"))
    _flagged[(1,)](x, y, flag, BLOCK=16)
    assert torch.equal(y, x * 2.0 if flag else x)


@triton.jit
def _loaded_bound_and_inverted_mask(n_ptr, x_ptr, y_ptr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    n = tl.load(n_ptr)  # a scalar from memory as a loop bound
    acc = tl.zeros((BLOCK,), tl.float32)
    for t in range(0, n, BLOCK):
        acc += tl.load(x_ptr + t + i, mask=t + i < n, other=0.0)
    bits = acc.to(tl.uint32, bitcast=True) & ~tl.full((BLOCK,), 0xFFFF, tl.uint32)  # `~` of an unsigned tile
    tl.store(y_ptr + i, bits.to(tl.float32, bitcast=True))


def test_a_loaded_scalar_bounds_a_loop_and_unsigned_masks_invert(device):
    # Triton 3.6's interpreter under NumPy 2 refused both (core.runtime: _scalars_as_indices,
    # _all_ones_of_unsigned_types).
    x = torch.randn(37, generator=torch.Generator().manual_seed(5)).to(device)
    n = torch.tensor([37], dtype=torch.int32, device=device)
    y = torch.full((8,), float("nan"), device=device)
    _loaded_bound_and_inverted_mask[(1,)](n, x, y, BLOCK=8)
    sums = torch.zeros(8, device=device)
    for t in range(0, 37, 8):  # the kernel's order of additions
        chunk = x[t:t + 8]
        sums[:len(chunk)] += chunk
    want = (sums.view(torch.int32) & ~0xFFFF).view(torch.float32)
    assert torch.equal(y, want)
