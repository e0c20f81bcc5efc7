"""Tensor operations and reads back to the host of a scan, per call site, counted on the CPU (no GPU needed).

On the H200 a warm thorough sweep is bound by launches and waits for the device, not by its arithmetic
(benchmarks/RESULTS.md, thirty-fifth session: 0.47 s of kernels in a 9.3 s shard, eight worker processes
time-slicing one GPU). Each tensor operation is a kernel launch there, and each read of a tensor's values
into Python (`tolist`, `item`, `bool`, `int`, `float`, `cpu`, `numpy`) waits for the device. This script runs
`ssmcheck scan --device cpu` (the interpreter) with every aten operation and every such read counted and
attributed to the innermost ssmcheck frame. The counts are the same on any machine; a read counted here is a
wait on a GPU only where the tensor lives on the device (the counts include reads of host-only tensors).
Operations inside a Triton launch are the interpreter's own and are not counted (on a GPU the launch is one).
Run from the checkout, e.g.

    PYTHONPATH=. python benchmarks/host_waits.py -- --preset thorough --regime normal,ragged --dtype bf16 \\
        --chunk-size 64 --ngroups 1 --seqlen 255

It prints the totals and the busiest sites and appends them, with date, versions, commit and this command,
to benchmarks/RESULTS.md (or --results PATH).
"""

from __future__ import annotations

import argparse
import collections
import sys
import traceback
from types import SimpleNamespace

from record import append_section, commit, markdown_table

# aten operations that launch nothing on a GPU: views and allocations.
NO_LAUNCH = {"view", "_unsafe_view", "as_strided", "t", "transpose", "permute", "expand", "slice", "select", "unsqueeze",
             "squeeze", "detach", "alias", "unflatten", "reshape", "empty", "empty_strided", "_reshape_alias", "unbind",
             "split", "split_with_sizes", "lift_fresh", "set_", "view_as_real", "_local_scalar_dense"}
READS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy")


def _site(stack) -> str | None:
    """The innermost ssmcheck frame as path:line:function, or None inside a Triton launch (the interpreter's)."""
    for frame in reversed(stack):
        if "triton/runtime/interpreter" in frame.filename:
            return None
        if "/ssmcheck/" in frame.filename:
            return f"{frame.filename.split('/ssmcheck/')[1]}:{frame.lineno}:{frame.name}"
    return "(outside ssmcheck)"


def count(scan_args: list[str]) -> tuple[collections.Counter, collections.Counter, str]:
    """(operations by site, reads by site, the scan's summary line)."""
    import torch  # noqa: PLC0415
    from torch.utils._python_dispatch import TorchDispatchMode  # noqa: PLC0415
    from typer.testing import CliRunner  # noqa: PLC0415

    from ssmcheck.cli import app  # noqa: PLC0415

    operations, reads = collections.Counter(), collections.Counter()

    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ not in NO_LAUNCH:
                site = _site(traceback.extract_stack()[:-1])
                if site is not None:
                    operations[site] += 1
            return func(*args, **(kwargs or {}))

    def counted(name, method):
        def read(self, *args, **kwargs):
            site = _site(traceback.extract_stack()[:-1])
            if site is not None:
                reads[f"{site} {name}"] += 1
            return method(self, *args, **kwargs)
        return read

    originals = {name: getattr(torch.Tensor, name) for name in READS}
    for name, method in originals.items():
        setattr(torch.Tensor, name, counted(name, method))
    try:
        with Counting():
            result = CliRunner().invoke(app, ["scan", "--device", "cpu", "--quiet", *scan_args])
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return operations, reads, result.output.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=15, help="sites to list of each kind")
    parser.add_argument("--results", default="benchmarks/RESULTS.md", help="markdown file to append to")
    parser.add_argument("--commit", help="commit being measured (where the checkout has no .git)")
    parser.add_argument("scan_args", nargs="*", help="options for `ssmcheck scan` (after --)")
    opts = parser.parse_args()
    operations, reads, summary = count(opts.scan_args)
    text = "\n\n".join([
        f"`{summary}`: {sum(operations.values())} operations, {sum(reads.values())} reads back",
        markdown_table(["site", "operations"], [[f"`{s}`", str(n)] for s, n in operations.most_common(opts.top)]),
        markdown_table(["site and read", "reads"], [[f"`{s}`", str(n)] for s, n in reads.most_common(opts.top)]),
    ])
    print(text)
    import torch  # noqa: PLC0415
    import triton  # noqa: PLC0415

    env = SimpleNamespace(gpu=None, device="none (the interpreter)", torch=torch.__version__, triton=triton.__version__)
    append_section(opts.results, "operations and reads back of a scan, by site (CPU count)", env, commit(opts.commit),
                   [f"`ssmcheck scan --quiet --device cpu {' '.join(opts.scan_args)}`",
                    f"python {sys.version.split()[0]}"], text)


if __name__ == "__main__":
    main()
