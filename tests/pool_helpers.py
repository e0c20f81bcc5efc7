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
    """A WhereRunner that compiles ahead (runner.precompile) as a compiling helper calls it: its record's
    `launches` count ten per case it was given, after `pause` seconds."""

    pause = 0.0

    def precompile(self, cases: list, threads: int):
        import time  # noqa: PLC0415

        from ssmcheck.core.precompile import Launches  # noqa: PLC0415

        time.sleep(self.pause)
        return Launches(supported=True, count=10 * len(cases), compilations=[0.5] * len(cases))


class GroupedAheadRunner(WhereRunner):
    """Compiles ahead integer cases grouped by parity (runner.compile_group): its record's `launches` is the sum of
    the cases it was given, which tells the slices apart."""

    @staticmethod
    def compile_group(case: int) -> int:
        return case % 2

    def precompile(self, cases: list, threads: int):
        from ssmcheck.core.precompile import Launches  # noqa: PLC0415

        return Launches(supported=True, count=sum(cases), compilations=[0.5] * len(cases))


class SlowAheadRunner(AheadRunner):
    """An AheadRunner whose compiling ahead outlasts any test."""

    pause = 600.0


class ThreadsRunner(WhereRunner):
    """A WhereRunner whose result is (case, torch's CPU threads in its worker)."""

    def __call__(self, case: str, advance):
        import torch  # noqa: PLC0415

        return case, torch.get_num_threads()
