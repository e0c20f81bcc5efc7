"""core.poison: NaN in what a kernel under test allocates uninitialised, so that an element it never writes shows."""

from pathlib import Path

import pytest
import torch
import torch.utils.deterministic

from ssmcheck import api
from ssmcheck.core.poison import uninitialised_as_nan
from ssmcheck.core.status import Status

HERE = Path(__file__).parent
BROKEN_SCAN = HERE / "broken_scan_kernels.py"
BROKEN_UPDATE = HERE / "broken_state_update_kernels.py"


def _settings():
    return (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.utils.deterministic.fill_uninitialized_memory)


@pytest.fixture
def callers_settings():
    before = _settings()
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    torch.utils.deterministic.fill_uninitialized_memory = before[2]


@pytest.mark.parametrize("dtype, filled", [(torch.float32, "nan"), (torch.bfloat16, "nan"), (torch.float16, "nan"),
                                           (torch.int32, 2**31 - 1), (torch.int64, 2**63 - 1)])
def test_uninitialised_allocations_inside_are_filled(dtype, filled):
    torch.full((257,), 3, dtype=dtype)  # freed memory holding 3s, for the allocations below to reuse
    with uninitialised_as_nan():
        made = [torch.empty(257, dtype=dtype), torch.empty_like(torch.ones(257, dtype=dtype)),
                torch.empty_strided((16, 16), (1, 16), dtype=dtype), torch.ones(3, dtype=dtype).resize_(257)[3:]]
    for t in made:
        assert (t.isnan().all() if filled == "nan" else (t == filled).all()), t


@pytest.mark.parametrize("enabled, warn_only, fill", [(False, False, True), (True, False, False), (True, True, True),
                                                      (False, False, False)])
def test_the_callers_settings_are_restored_even_when_the_call_raises(enabled, warn_only, fill, callers_settings):
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    torch.utils.deterministic.fill_uninitialized_memory = fill
    with pytest.raises(RuntimeError, match="kernel failed"), uninitialised_as_nan():
        # warn_only inside: a torch operation without a deterministic implementation must still run
        assert _settings() == (True, True, True)
        raise RuntimeError("kernel failed")
    assert _settings() == (enabled, warn_only, fill)


def test_a_scan_kernel_that_leaves_its_last_token_unwritten_is_nonfinite_there():
    report = api.scan(kernel=f"{BROKEN_SCAN}:unwritten_last_token", regime="normal", dtype="bf16", chunk_size="64",
                      seqlen="200", batch="2", nheads="2", headdim="16", dstate="16", ngroups="1")
    assert [c.status for c in report.cases] == ["nonfinite"], [c.message for c in report.cases]
    where = report.cases[0].data["first_nonfinite"]
    assert (where["token"], where["tokens"]) == (199, 2), where  # the last token of each of the 2 rows


def test_a_state_update_that_leaves_its_last_channel_unwritten_is_nonfinite_there():
    report = api.drift(kernel=f"{BROKEN_UPDATE}:unwritten_last_channel", regime="normal", state_dtype="fp16",
                       nheads="2", headdim="16", dstate="16", steps=32, trials=2)
    [case] = report.cases
    assert case.status == Status.NONFINITE.value, case.message
    where = case.data["first_nonfinite"]
    assert (where["output"], where["step"], where["channel"]) == ("out", 1, 15), where
