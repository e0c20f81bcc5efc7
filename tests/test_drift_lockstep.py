"""The decode loop of drift.lockstep on the CPU: windows of step inputs, and the checkpoint-only read-back
that a CUDA graph run uses (here with a stand-in graph that replays the step eagerly)."""

import importlib.util
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ssmcheck.core import runtime, sweep
from ssmcheck.core.capture import Transcript
from ssmcheck.core.pool import poisoned
from ssmcheck.core.tensors import bits
from ssmcheck.drift import lockstep
from ssmcheck.drift import run as drift_run
from ssmcheck.drift.adapter import KernelRaised
from ssmcheck.drift.adapter import resolve as resolve_kernel
from ssmcheck.drift.measure import CheckpointSums
from ssmcheck.drift.regimes import STEP_BLOCK, make_problem
from ssmcheck.drift.spec import build_cases, resolve
from ssmcheck.drift.stats import SignedErrorMoments, log_checkpoints

BROKEN = Path(__file__).parent / "broken_state_update_kernels.py"
SLOT_KERNELS = Path(__file__).parent / "slot_kernels.py"
_spec = importlib.util.spec_from_file_location("broken_state_update_kernels", BROKEN)
bk = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bk)


def _case(**options):
    settings_ = resolve({"nheads": "2", "headdim": "8", "dstate": "16", "batch": "2", **options}, {}, "test")
    [case] = build_cases(settings_, "torch")
    return case, settings_.tolerance


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_a_run_in_windows_of_a_few_steps_is_the_run_in_one_window(monkeypatch, rounding):
    case, tolerance = _case(regime="normal", state_dtype="fp16", rounding=rounding, steps=40, trials=2, seed=5)
    kernel = resolve_kernel("torch", 10, "software", False)
    whole = drift_run.run_case(case, kernel, tolerance, "cpu")
    step_bytes = 4 * (2 * 2 * 8 + 2 * 2 + 2 * 2 * 1 * 16)  # x, dt per head, B and C of one step, float32
    monkeypatch.setattr(lockstep, "WINDOW_BYTES", 7 * step_bytes)  # 40 steps in windows of 7
    windowed = drift_run.run_case(case, kernel, tolerance, "cpu")
    assert lockstep.StepWindow(make_problem(case.regime, case.shape(), case.dtype, 40, case.seed, "cpu")).size == 7
    assert windowed.run.checkpoints == whole.run.checkpoints and windowed.run.baseline == whole.run.baseline
    assert windowed.run.store_errors == whole.run.store_errors and whole.run.store_errors.count > 0


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize("regime", ["normal", "strided", "untied"])
def test_a_window_drawn_in_several_threads_holds_the_streams_steps(monkeypatch, regime, staged):
    """StepWindow.load draws its blocks as many at once as torch has threads: every step of a window that starts
    and ends inside a block is the stream's, whatever the threads, laid out in the window's buffer or (as for a
    GPU's) in the host arena first, poisoned (all bits set: NaN in every float dtype) and reused by the next."""
    if staged:
        def poisoned_arena(buffers):
            views = lockstep._in_arena(buffers)
            lockstep._ARENA[0].fill_(0xFF)
            return views

        monkeypatch.setattr(lockstep, "_staging", poisoned_arena)
    case, _ = _case(regime=regime, state_dtype="fp16", rounding="nearest", steps=3 * STEP_BLOCK, headdim="6",
                    dstate="10")
    problem = make_problem(case.regime, case.shape(), case.dtype, case.steps, case.seed, "cpu")
    monkeypatch.setattr(lockstep, "WINDOW_BYTES", 1 << 40)
    windows = []
    for threads in (1, 3):
        monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
        window = lockstep.StepWindow(problem)
        for buffer in (window.fused if problem.fused else window.packed).values():
            buffer.fill_(float("nan"))  # poisoned: a row the load leaves unwritten shows
        window.load(STEP_BLOCK // 2)  # a window of steps 128 .. 768, over three blocks
        windows.append(window)
    drawn = problem.host_inputs(STEP_BLOCK // 2 - 1, case.steps - STEP_BLOCK // 2 + 1)
    for window in windows:
        for n in (0, 1, STEP_BLOCK // 2, STEP_BLOCK, drawn.x.shape[0] - 1):
            window.counter.fill_(n)
            for name, t in window.inputs().given():
                assert torch.equal(t, getattr(drawn, name)[n]), (name, n)


def test_untied_gate_is_half_a_row_of_its_own_as_mamba1s_z():
    """`untied`'s z is the second half of a row of a buffer of its own (Mamba1's in_proj output [x | z]): its row
    stride is twice its width, not x's, and the first half holds x's values."""
    case, _ = _case(regime="untied", state_dtype="fp16", rounding="nearest", steps=8, headdim="6", dstate="10")
    problem = make_problem(case.regime, case.shape(), case.dtype, case.steps, case.seed, "cpu")
    window = lockstep.StepWindow(problem)
    window.load(3)
    step = window.inputs()
    width = step.z[0].numel()
    assert step.z.stride(0) == 2 * width != step.x.stride(0)
    assert step.z.untyped_storage().data_ptr() != step.x.untyped_storage().data_ptr()
    assert torch.equal(step.z, problem.host_inputs(2, 1).z[0]) and not step.z.isnan().any()
    assert torch.equal(window.fused["gate"][window.counter[0], :, :width].view(step.x.shape), step.x)


@pytest.mark.parametrize("window_steps", [100, STEP_BLOCK, 300])
def test_windows_going_through_a_run_draw_each_block_of_its_stream_once(monkeypatch, window_steps):
    """Consecutive windows smaller than the run: the block a window ends in is kept for the next, not drawn again
    (a 256-row case drew 2.2 times its steps so), nor the block the window's layout was taken from, and every step
    is the stream's."""
    case, _ = _case(regime="normal", state_dtype="fp16", rounding="nearest", steps=3 * STEP_BLOCK + 20, headdim="6",
                    dstate="10")
    problem = make_problem(case.regime, case.shape(), case.dtype, case.steps, case.seed, "cpu")
    calls = []

    def counted(generator, count):
        calls.append(count)
        return problem.draw_steps(generator, count)

    counting = replace(problem, draw_steps=counted)
    first = next(problem.host_steps())
    stored = replace(first, dt=first.dt[..., 0])  # (the window keeps dt per head, without its stride-0 axis)
    step_bytes = sum(t.numel() * t.element_size() for _, t in stored.given())
    monkeypatch.setattr(lockstep, "WINDOW_BYTES", window_steps * step_bytes)
    window = lockstep.StepWindow(counting)
    assert window.size == window_steps
    assert calls == [STEP_BLOCK]  # block 0, drawn to lay out the buffers, kept for the first window
    stream = problem.host_inputs(0, case.steps)
    for step in range(1, case.steps + 1):
        window.load(step)
        if step in (1, window_steps, window_steps + 1, STEP_BLOCK + 1, case.steps):
            for name, t in window.inputs().given():
                assert torch.equal(t, getattr(stream, name)[step - 1]), (name, step)
    assert calls == [STEP_BLOCK] * 3 + [20]


# (bf16-inputs ran here too before the sixtieth session made the half-precision inputs' regimes fused; gate-without-d
# has a fifth input, z.)
@pytest.mark.parametrize("regime", ["normal", "gate-without-d"])
def test_a_windows_step_is_its_inputs_whole_aligned_and_apart_at_fenced_steps(regime):
    case, _ = _case(regime=regime, state_dtype="fp16", rounding="nearest", steps=12, headdim="6", dstate="10")
    problem = make_problem(case.regime, case.shape(), case.dtype, case.steps, case.seed, "cpu")
    assert not problem.fused  # (a fused problem's inputs are views into one buffer by design)
    window = lockstep.StepWindow(problem)
    window.load(5)
    drawn = problem.host_inputs(4, 1)  # step 5, as drawn
    for separate in (False, True):
        step = window.inputs(separate=separate)
        given = dict(step.given())
        assert given.keys() == dict(drawn.given()).keys()
        for name, t in given.items():
            assert torch.equal(t, getattr(drawn, name)[0]), name
            assert name == "dt" or t.is_contiguous(), name  # (dt per head: a stride-0 view over headdim)
            # 128 bytes into its memory, as an input of its own starts (the allocator's alignment: 512 on CUDA)
            assert t.storage_offset() * t.element_size() % 128 == 0, name
        storages = {t.untyped_storage().data_ptr() for t in given.values()}
        # One gather a step, each input its own where fences must tell them apart.
        assert len(storages) == (len(given) if separate else len({t.dtype for t in given.values()}))


def _lock(case, kernel, trial_seed: int, device: str = "cpu", trial: int = 0) -> lockstep.Lockstep:
    """Trial `trial` of `case` on `device`."""
    problem = make_problem(case.regime, case.shape(), case.dtype, case.steps, case.seed, device)
    return lockstep.Lockstep(case, problem, lockstep.StepWindow(problem), kernel, trial, trial_seed, Transcript(),
                             SignedErrorMoments())


class _EagerGraph:
    """Stands in for a captured CUDA graph of `steps` steps: `replay` runs the lockstep's next steps eagerly.
    `replayed`: the steps replayed, shared by the trial's graphs."""

    def __init__(self, lock, replayed: list, steps: int = 1):
        self.lock, self.replayed, self.steps = lock, replayed, steps

    def replay(self):
        self.replayed.append(self.steps)
        for k in range(self.steps):
            outputs = self.lock._step(self.lock.step + 1 + k, check_inputs=False)
        if self.steps == 1:
            self.lock._graph_outputs = outputs
        else:
            self.lock._run_outputs = outputs


def _graphed_lock(case, kernel, trial_seed: int) -> tuple[lockstep.Lockstep, list]:
    """`_lock` whose try_graph runs the step and then "captures" the stand-in graph, and whose runs of steps
    (Lockstep.advance_run) are stand-ins too; with the steps the stand-ins replayed."""
    lock = _lock(case, kernel, trial_seed)
    replayed = []

    def try_graph():
        lock.advance(check_inputs=True)
        lock.graph = _EagerGraph(lock, replayed)

    def capture_run(n):
        lock.run_graph = _EagerGraph(lock, replayed, lockstep.RUN_STEPS)
        lock.run_graph.replay()
        return lock.state.clone(), lock._run_outputs[0].clone()

    lock.try_graph, lock._capture_run = try_graph, capture_run
    return lock, replayed


@pytest.mark.parametrize("seed", [0, 7, 12345])
def test_with_a_graph_a_nonfinite_state_is_found_at_its_step_from_the_checkpoints(seed):
    # forgets_decay overflows between two checkpoints; read back at the checkpoints only, the run still
    # names the step and element that the eager loop (read every step) names.
    case, tolerance = _case(regime="overflow", state_dtype="fp16", rounding="nearest", steps=120, trials=1,
                            seed=seed)
    kernel = resolve_kernel(f"{BROKEN}:forgets_decay", 10, "software", False)
    eager = drift_run.run_case(case, kernel, tolerance, "cpu").run.first_nonfinite
    assert eager is not None and eager.step not in log_checkpoints(case.steps)

    lock, replayed = _graphed_lock(case, kernel, sweep.case_seed(case.seed, {"trial": 0}))
    sums = CheckpointSums(), CheckpointSums()
    found = drift_run._trial(lock, log_checkpoints(case.steps), *sums, lambda: None, graph=True)
    assert found == eager
    assert sum(replayed) > eager.step  # replayed to the checkpoint past it, then again from the one before
    assert lockstep.RUN_STEPS in replayed  # some of them in runs of steps
    assert max(sums[0].sums) == eager.step  # measured where it stopped


def test_the_eager_loop_reads_every_step_when_there_is_no_graph():
    case, tolerance = _case(regime="normal", state_dtype="fp16", rounding="nearest", steps=32, trials=1,
                            batch="3")
    result = drift_run.run_case(case, resolve_kernel(f"{BROKEN}:inf_at_one_element", 10, "software", False),
                                tolerance, "cpu")
    where = result.run.first_nonfinite
    assert (where.step, where.batch, where.head, where.channel, where.state_index) == (
        bk.INF_STEP, bk.INF_BATCH, bk.INF_HEAD, bk.INF_CHANNEL, bk.INF_STATE_INDEX)
    assert result.run.decode_loop == "eager"


def test_a_saved_position_comes_back_bit_for_bit(device):
    case, _ = _case(regime="normal", state_dtype="bf16", rounding="stochastic", steps=16, trials=1, seed=2)
    kernel = resolve_kernel("builtin", 10, "software", runtime.environment().interpreter)
    lock = _lock(case, kernel, 99, device)  # the built-in kernel runs where the session's Triton does
    for _ in range(3):
        lock.advance()
    saved = lock.saved()
    lock.advance()
    first = (lock.state.clone(), lock.outputs[0].clone(), lock.ref.clone())
    lock.advance()
    lock.restore(saved)
    lock.advance()
    assert lock.step == 4
    assert all(torch.equal(a, b) for a, b in zip(first, (lock.state, lock.outputs[0], lock.ref), strict=True))


def test_which_runs_try_a_graph():
    builtin = resolve_kernel("builtin", 10, "software", True)
    module_kernel = resolve_kernel(f"{BROKEN}:forgets_decay", 10, "software", True)
    assert drift_run._graph_plan("cpu", 1, builtin) == (False, "eager")
    assert drift_run._graph_plan("cuda", 1, builtin) == (True, "eager")  # until the capture says otherwise
    assert drift_run._graph_plan("cuda", 3, builtin) == (False, "eager: --repeat compares every step's runs")
    tried, note = drift_run._graph_plan("cuda", 1, module_kernel)
    assert not tried and note.startswith("eager: a MODULE:FUNCTION kernel")
    assert builtin.graphable and builtin.takes_seed_tensor and not module_kernel.graphable


def test_with_a_graph_a_nonfinite_step_that_does_not_come_again_ends_nothing():
    # inf_at_one_element writes inf at its INF_STEP-th call only: replayed from the checkpoint before it, the
    # step is finite (as for a kernel whose output changes between identical runs); the trial carries on.
    case, _ = _case(regime="normal", state_dtype="fp16", rounding="nearest", steps=32, trials=1, batch="3")
    kernel = resolve_kernel(f"{BROKEN}:inf_at_one_element", 10, "software", False)
    lock, _ = _graphed_lock(case, kernel, 1)
    checkpoints = log_checkpoints(case.steps)
    assert bk.INF_STEP not in checkpoints
    sums = CheckpointSums(), CheckpointSums()
    assert drift_run._trial(lock, checkpoints, *sums, lambda: None, graph=True) is None
    assert lock.step == case.steps and sorted(sums[0].sums) == checkpoints  # every checkpoint measured


def test_strided_inputs_are_views_into_one_buffer_per_step_with_the_streams_values():
    case, _ = _case(regime="strided", state_dtype="fp16", rounding="nearest", steps=9, trials=1, batch="3")
    problem = make_problem(case.regime, case.shape(), case.dtype, case.steps, case.seed, "cpu")
    window = lockstep.StepWindow(problem)
    window.load(5)
    step, drawn = window.inputs(), problem.host_inputs(4, 1)
    width = 2 * 8 + 2 + 2 * 1 * 16  # x, dt per head, B and C of one row
    for name, view in step.given():
        assert torch.equal(view, getattr(drawn, name)[0]), name
        assert view.stride(0) == width and view.untyped_storage().data_ptr() == step.x.untyped_storage().data_ptr()
    assert step.dt.stride() == (width, 1, 0)  # per head, expanded over headdim
    # [x | B | C | dt] in each row, as vLLM's decode splits its conv output and takes dt beside it
    offsets = [t.storage_offset() - step.x.storage_offset() for t in (step.x, step.B, step.C, step.dt)]
    assert offsets == [0, 2 * 8, 2 * 8 + 16, 2 * 8 + 32]


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), batch=st.integers(1, 8), pad=st.sampled_from([None, -1, 0, 1, 3, 8, 2**31 - 1]))
def test_a_kernel_taking_slot_indices_decodes_one_trial_of_two_through_them_clear_of_its_pad_slot(seed, batch, pad):
    case, _ = _case(regime="normal", state_dtype="fp16", rounding="stochastic", seed=seed)
    kernel = SimpleNamespace(pad_slot_id=pad)
    first = [lockstep.slotted_from(case, kernel, trial, batch) for trial in (0, 1)]
    if pad is None:  # no slot indices taken
        assert first == [None, None]
        return
    (slot,) = [f for f in first if f is not None]  # exactly one of two trials
    assert slot >= 1 and not slot <= pad < slot + batch  # slot 0, vLLM's null block, and the pad slot stay spare


def test_a_trial_through_slot_indices_gives_the_rows_a_pool_in_the_states_layout_with_nan_spares(device):
    case, _ = _case(regime="strided", state_dtype="bf16", rounding="nearest", steps=4, trials=1, batch="3")
    kernel = resolve_kernel("builtin", 10, "software", runtime.environment().interpreter)
    trial = next(t for t in (0, 1) if lockstep.slotted_from(case, kernel, t, 3) is not None)
    lock = _lock(case, kernel, 5, device, trial)  # the built-in kernel runs where the session's Triton does
    initial = lock.problem.initial_state
    assert lock.slots.tolist() == [1, 2, 3] and lock.given.shape[0] == 5
    assert lock.state.stride() == initial.stride() and torch.equal(bits(lock.state), bits(initial))
    assert poisoned(lock.given[[0, 4]]).all()
    lock.advance(check_inputs=True)
    lock.advance()
    assert poisoned(lock.given[[0, 4]]).all() and not torch.equal(bits(lock.state), bits(initial))


def test_a_kernel_that_writes_a_spare_slot_of_its_pool_raises_at_a_checked_step(device):
    case, _ = _case(regime="normal", state_dtype="fp16", rounding="nearest", steps=4, trials=1)
    kernel = resolve_kernel(f"{SLOT_KERNELS}:null_block_cleared", 10, "software", runtime.environment().interpreter)
    trial = next(t for t in (0, 1) if lockstep.slotted_from(case, kernel, t, 2) is not None)
    lock = _lock(case, kernel, 5, device, trial)  # the built-in kernel inside runs where the session's Triton does
    lock.advance()  # unchecked: seen at the next checked step
    with pytest.raises(KernelRaised, match=r"the kernel wrote slot 0 of its state pool, which no row names \(rows on "
                                           r"slots 1..2 in state_batch_indices; trial \d, step 2\)"):
        lock.advance(check_inputs=True)
