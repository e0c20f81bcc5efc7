"""What the worker-pool tests (tests/test_workers.py) run in their workers: importable, so picklable."""

import os

from ssmcheck.scan.adapter import torch_kernel


class WhereRunner:
    """A runner for core.isolation whose result says where its case ran: (case, worker pid, the
    worker's CUDA_VISIBLE_DEVICES)."""

    device = "cpu"

    def __call__(self, case: str, advance):
        return case, os.getpid(), os.environ.get("CUDA_VISIBLE_DEVICES")

    def failed(self, case: str, message: str, seconds: float):
        return case, None, message


def scan_naming_its_gpu(x, *args, **kwargs):
    """A correct chunk scan that prints the GPU it runs on (CUDA_VISIBLE_DEVICES and the device's UUID),
    which the case's JSON `stdout` keeps."""
    import torch  # noqa: PLC0415

    print(f"visible={os.environ.get('CUDA_VISIBLE_DEVICES')} gpu={torch.cuda.get_device_properties(x.device).uuid}")
    return torch_kernel(x, *args, **kwargs)


class AheadRunner(WhereRunner):
    """A WhereRunner that compiles ahead: its results also hold the cases and threads its worker was given to
    compile ahead (runner.precompile), None where it was given none."""

    given = None

    def precompile(self, cases: list, threads: int):
        from ssmcheck.core.precompile import Launches  # noqa: PLC0415

        AheadRunner.given = (list(cases), threads)
        return Launches(supported=True, count=10 * len(cases), compilations=[0.5] * len(cases))

    def __call__(self, case: str, advance):
        return (*super().__call__(case, advance), AheadRunner.given)


class SpreadingRunner(WhereRunner):
    """A runner whose compiling ahead spreads the cases after the first at once (as a cold cache does): its
    record's `launches` count the cases each process compiled, and the process keeps what it kept in `kept` and
    the threads it was given in `threads`."""

    kept = threads = None

    def precompile(self, cases: list, threads: int | None = None, spread=None):
        from ssmcheck.core.precompile import Launches  # noqa: PLC0415

        kept = list(cases) if spread is None else [cases[0], *spread(list(cases[1:]))]
        SpreadingRunner.kept, SpreadingRunner.threads = kept, threads
        return Launches(supported=True, count=len(kept), compilations=[0.5] * len(kept))
