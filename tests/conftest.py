"""Shared test set-up.

The device is chosen before any kernel module imports triton: compiled on a
CUDA GPU, Triton's interpreter otherwise. Tests marked `gpu` run only with CUDA.
"""

import pytest
import torch

from ssmcheck.core import runtime

ENV = runtime.configure()


def pytest_report_header(config):
    e = ENV
    return f"ssmcheck: device={e.device} interpreter={e.interpreter} torch={e.torch} triton={e.triton} gpu={e.gpu}"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device() -> str:
    return ENV.device
