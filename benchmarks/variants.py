"""The Triton variants a sweep makes Triton compile, counted (and timed) without a GPU.

On a fresh GPU machine a sweep spends most of its time compiling: every launch whose specialisation is new (a
pointer's dtype, a constexpr, an integer equal to 1 or divisible by 16) is one more variant. This runs
`ssmcheck scan ARGS` (the default preset unless ARGS say otherwise) through Triton's interpreter, with the built-in
chunk scan's stages at their GPU block configurations (the interpreter's own are whole-chunk tiles; the state
update's, which `--invariance` launches, stay the interpreter's, so its counts are approximate), and records
each launch's specialisation key as Triton 3's launcher makes it (`do_not_specialize` honoured; bools and floats
not specialised; every tensor taken as 16-byte aligned, as the CUDA allocator's are). With --compile it then
compiles every distinct key for sm_90 in a second process, one after another, and times each: where a fresh
machine's compile time goes, kernel by kernel. The counts matched the H200's compile cache for the default scan
(144 variants before the thirty-fourth session's change, 81 after; benchmarks/RESULTS.md). Run from the checkout:

    PYTHONPATH=. python benchmarks/variants.py --compile -- --preset default

It prints a table and appends it, with date, versions, commit and this command, to benchmarks/RESULTS.md (or
--results PATH).
"""

from __future__ import annotations

import argparse
import collections
import importlib
import inspect
import os
import pickle
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

from record import append_section, commit, markdown_table

CAPABILITY = 90


def specialisation(fn, do_not_specialize, args: tuple, kwargs: dict) -> tuple:
    """(signature, constexprs, attrs, options) of one launch of `fn` (the kernel's Python function), as Triton's
    launcher specialises it; dtypes as their names (`bf16`), so that the key pickles."""
    import torch  # noqa: PLC0415

    names = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
             torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8", torch.int8: "i8", torch.bool: "i1"}
    params = inspect.signature(fn).parameters
    options = {k: v for k, v in kwargs.items() if k not in params}
    bound = inspect.signature(fn).bind(*args, **{k: v for k, v in kwargs.items() if k in params}).arguments
    signature, constexprs, attrs = {}, {}, {}
    for i, (name, param) in enumerate(params.items()):
        if name not in bound:
            continue
        value = bound[name]
        if "constexpr" in str(param.annotation) or value is None:
            signature[name], constexprs[name] = "constexpr", getattr(value, "name", value)
        elif isinstance(value, torch.Tensor):
            signature[name], attrs[(i,)] = "*" + names[value.dtype], [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[name] = "u1"
        elif isinstance(value, int) and name not in do_not_specialize and value == 1:
            signature[name], constexprs[name] = "constexpr", 1
        elif isinstance(value, int):
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            if name not in do_not_specialize and value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32"
    return signature, constexprs, attrs, options


def _at_gpu_tiles(default_config):
    """A stage's `default_config(..., interpret)` that always answers as on a GPU."""
    def gpu(*args, **kwargs):
        bound = inspect.signature(default_config).bind(*args, **kwargs)
        bound.arguments["interpret"] = False
        return default_config(*bound.args, **bound.kwargs)
    return gpu


def record(scan_args: list[str]) -> list:
    """The distinct specialisations of the scan's launches: (module, kernel name, launches, specialisation)."""
    os.environ["TRITON_INTERPRET"] = "1"
    import triton.runtime.interpreter as interpreter  # noqa: PLC0415

    from ssmcheck.ops.chunk_scan import chunk_cb, chunk_output, chunk_state  # noqa: PLC0415

    for module in (chunk_output, chunk_state, chunk_cb):
        module.default_config = _at_gpu_tiles(module.default_config)

    seen: dict = {}
    launches = collections.Counter()
    run = interpreter.InterpretedFunction.run

    def recording(self, *args, grid, warmup, **kwargs):
        key = (self.fn.__module__, self.fn.__name__)
        spec = specialisation(self.fn, set(self.kwargs.get("do_not_specialize") or ()), args, kwargs)
        seen.setdefault((*key, repr(spec)), (*key, spec))
        launches[key] += 1
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    interpreter.InterpretedFunction.run = recording
    from ssmcheck.cli import app  # noqa: PLC0415

    try:
        app(["scan", "--quiet", "--device", "cpu", *scan_args], standalone_mode=False)
    finally:
        interpreter.InterpretedFunction.run = run
    return [(module, name, launches[(module, name)], spec) for module, name, spec in seen.values()]


def compile_specialisation(kernel, spec: tuple, capability: int = CAPABILITY):
    """`kernel` (a triton.jit function, in compiled mode) compiled for sm_`capability` at `spec` (specialisation's
    result)."""
    import triton  # noqa: PLC0415
    import triton.language as tl  # noqa: PLC0415
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.compiler import ASTSource  # noqa: PLC0415

    signature, constexprs, attrs, options = spec
    dtypes = {"bf16": tl.bfloat16, "fp16": tl.float16, "fp32": tl.float32, "fp64": tl.float64}
    constexprs = {k: dtypes.get(v, v) if isinstance(v, str) else v for k, v in constexprs.items()}
    return triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs),
                          target=GPUTarget("cuda", capability, 32), options=options)


def compile_all(path: str) -> None:
    """Compile every specialisation pickled at `path` for sm_CAPABILITY, in this (compiled-mode) process, and
    pickle {kernel name: [seconds, ...]} back over it."""
    seconds = collections.defaultdict(list)
    with open(path, "rb") as f:
        variants = pickle.load(f)
    for module, name, _, spec in variants:
        start = time.perf_counter()
        compile_specialisation(getattr(importlib.import_module(module), name), spec)
        seconds[name].append(time.perf_counter() - start)
    with open(path, "wb") as f:
        pickle.dump(dict(seconds), f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile", action="store_true", help=f"also compile each variant for sm_{CAPABILITY}, timed")
    parser.add_argument("--results", default="benchmarks/RESULTS.md", help="markdown file to append to")
    parser.add_argument("--commit", help="commit being measured (where the checkout has no .git)")
    parser.add_argument("--compile-keys", help=argparse.SUPPRESS)  # the second process's file of keys
    parser.add_argument("scan_args", nargs="*", help="options for `ssmcheck scan` (after --)")
    opts = parser.parse_args()
    if opts.compile_keys:
        compile_all(opts.compile_keys)
        return

    variants = record(opts.scan_args)
    seconds: dict = {}
    if opts.compile:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "variants.pkl")
            with open(path, "wb") as f:
                pickle.dump(variants, f)
            env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
            env["TRITON_CACHE_DIR"] = os.path.join(tmp, "cache")  # empty: every variant compiles
            subprocess.run([sys.executable, __file__, "--compile-keys", path], env=env, check=True)
            with open(path, "rb") as f:
                seconds = pickle.load(f)

    counts = collections.Counter(name for _, name, _, _ in variants)
    calls = {name: n for _, name, n, _ in variants}
    rows = [[name, str(counts[name]), str(calls[name])]
            + ([f"{sum(seconds[name]):.1f}"] if seconds else []) for name in sorted(counts, key=counts.get, reverse=True)]
    rows.append(["all", str(sum(counts.values())), str(sum(calls.values()))]
                + ([f"{sum(map(sum, seconds.values())):.1f}"] if seconds else []))
    head = ["kernel", "variants", "launches"] + ([f"compile s (sm_{CAPABILITY}, one after another)"] if seconds else [])
    text = markdown_table(head, rows)
    print(text)
    import torch  # noqa: PLC0415
    import triton  # noqa: PLC0415

    compiled = f"; compiled here for sm_{CAPABILITY}" if opts.compile else ""
    env = SimpleNamespace(gpu=None, device=f"none (the interpreter{compiled})", torch=torch.__version__,
                          triton=triton.__version__)
    append_section(opts.results, "Triton variants of a scan (offline)", env, commit(opts.commit),
                   [f"`ssmcheck scan --quiet --device cpu {' '.join(opts.scan_args)}` through the interpreter, the chunk scan's "
                    "stages at their GPU tiles; specialisation keys as Triton 3's launcher makes them"], text)


if __name__ == "__main__":
    main()
