"""Shared test set-up.

The device is chosen before any kernel module imports triton: compiled on a
CUDA GPU, Triton's interpreter otherwise. Tests marked `gpu` run only with CUDA, tests marked `cpu`
only without it.
"""

import pytest

from ssmcheck.core import runtime

ENV = runtime.configure()


def pytest_report_header(config):
    e = ENV
    return f"ssmcheck: device={e.device} interpreter={e.interpreter} torch={e.torch} triton={e.triton} gpu={e.gpu}"


def pytest_collection_modifyitems(config, items):
    # A process runs Triton one way (runtime.configure): `gpu` tests need it compiled on CUDA, `cpu` tests
    # configure the CPU device, which needs it interpreted.
    skips = {"gpu": pytest.mark.skip(reason="needs a CUDA GPU")} if ENV.device != "cuda" else {
        "cpu": pytest.mark.skip(reason="configures the CPU device: Triton runs compiled in this process")}
    for item in items:
        for marker, skip in skips.items():
            if marker in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def device() -> str:
    return ENV.device
