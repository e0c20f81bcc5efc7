"""Finding a kernel's autotuners across its package, and pinning one config at a time."""

import torch

from ssmcheck.core import autotune
from tests.tuned_kernels import entry


def test_autotuners_are_found_through_the_modules_a_kernel_imports():
    (tuned,) = autotune.find(entry.run)
    assert (tuned.name, tuned.module) == ("_copy_kernel", "tests.tuned_kernels.copy")
    assert [autotune.describe(c) for c in tuned.configs] == [
        {"kwargs": {"BLOCK": 16}, "num_warps": 1, "num_stages": 3},
        {"kwargs": {"BLOCK": 32}, "num_warps": 2, "num_stages": 3},
    ]
    assert autotune.described_text(autotune.describe(tuned.configs[1])) == "BLOCK=32, num_warps=2, num_stages=3"


def test_pinning_runs_one_config_and_restores_the_list(device):
    (tuned,) = autotune.find(entry.run)
    x = torch.arange(1, 41, dtype=torch.float32, device=device)
    with autotune.pinned({tuned: 0}):
        assert torch.equal(entry.run(x), x)
    with autotune.pinned({tuned: 1}):
        out = entry.run(x)
    assert torch.equal(out[:39], x[:39]) and out[39].isnan()  # the bug only BLOCK=32 has
    assert len(tuned.autotuner.configs) == 2


def test_a_wrapper_is_searched_from_the_kernel_it_names_as_its_origin():
    """The peers' adapters wrap vLLM's kernels in functions of ssmcheck.peers: the search must start from
    the wrapped kernel's module, which the wrapper names in autotune.ORIGIN."""
    import sys
    import types

    module = types.ModuleType("wrapperpkg.wrap")
    exec("def wrapper(x, _run=None):\n    return _run(x)\n", module.__dict__)  # noqa: S102 (a module with no imports)
    sys.modules["wrapperpkg.wrap"] = module
    try:
        wrapper = module.wrapper
        assert autotune.find(wrapper) == []
        setattr(wrapper, autotune.ORIGIN, entry.run)
        assert [(t.name, t.module) for t in autotune.find(wrapper)] == [("_copy_kernel", "tests.tuned_kernels.copy")]
    finally:
        del sys.modules["wrapperpkg.wrap"]

