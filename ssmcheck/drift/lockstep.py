"""One trial of a drift case as device work: the kernel's step, the float64 reference and the baseline in
lockstep, with nothing read back to the host between checkpoints.

A decode step here is a fixed sequence of device operations that reads its inputs at a device-side
counter into a window of steps already on the device. So the same step can be captured once in a CUDA
graph and replayed, one launch per step instead of a hundred operations dispatched from Python:
- the three float64 recurrences (the reference, the baseline before rounding, and the exact update of
  the kernel's previous state, which the kernel's store is measured against) are one stacked step, with
  the rest of the float64 side in one function (drift.follow, compiled on CUDA);
- the per-store rounding errors accumulate in place on the device (stats.SignedErrorMoments);
- a device flag records whether the kernel's state or output went non-finite where the reference is
  finite; the runner reads it at checkpoints and, when it is set, replays from the last checkpoint one
  step at a time to find where (`localise`).

A graph is used only where it reproduces the eager step bit for bit (`try_graph`): its replay of a step
is compared with the same step run eagerly from the same state. A kernel that takes its seed as a host
integer bakes the seed of the captured step into the graph, one that draws from its own random stream
draws differently under replay, one that synchronises cannot be captured: those run eagerly, the same
sequence of operations dispatched from Python.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ssmcheck.core import outside, sweep
from ssmcheck.core.capture import Transcript
from ssmcheck.core.fences import Fenced
from ssmcheck.core.pool import poisoned, spare_slotted
from ssmcheck.core.tensors import bits
from ssmcheck.drift.adapter import DriftAdapter, KernelRaised
from ssmcheck.drift.follow import Follower
from ssmcheck.drift.measure import first_difference
from ssmcheck.drift.regimes import DecodeProblem, StepInputs
from ssmcheck.drift.stats import SignedErrorMoments
from ssmcheck.scan.regimes import C_ROW_PAD  # NaN after each batch row's C (regimes.C_APART_REGIMES)

# At most this many bytes of step inputs lie on the device at once (a window of steps). In windows of 64 MB the
# default GPU drift's 256-row case (321 kB a step) took 10.4-10.9 s on an H100, most of it drawing on the host: a
# window of 204 steps drew the one or two blocks of STEP_BLOCK steps it cut whole, in as many threads, each block
# twice. A window of 256 MB takes three blocks or more, drawn at once, and keeps the one it ends in for the next
# (`_kept`): 5.1 s (fiftieth session).
WINDOW_BYTES = 256 << 20


# Steps one replay of a trial's run graph advances (`Lockstep.advance_run`): RUN_STEPS steps captured one after
# another in one CUDA graph. A graph of one step costs its launch and the loop's Python every step, 21-37 us a step
# of the default GPU drift on an H100 where the device's own work is about 16 us, and twice that while compiling
# helpers hold the cores (sixty-sixth session): the host, not the device, bounded the decode loop.
RUN_STEPS = 16


# Spare slots after the live rows of a trial that decodes through slot indices (`slotted_from`; before them, at
# least one: slot 0, vLLM's null block).
SPARES_AFTER = 1


# A fused step buffer's columns: the conv output's [x | B | C] as vLLM's Mamba2 decode splits it, then dt. The gate
# z, where the regime has one (`untied`), is the second half of a row of a buffer of its own, [x | z], as Mamba1's z
# is a view of its in_proj output (whose x goes through the conv first): z's row stride is twice its width, x's
# another, and a kernel reading z at x's offsets reads values, not z's.
FUSED_ORDER = ("x", "B", "C", "dt")


class StepWindow:
    """Consecutive steps' inputs stacked on the device, and the counter a step reads them at.

    One per case: every trial decodes the same stream, so a run that fits in one window is drawn once."""

    def __init__(self, problem: DecodeProblem, drawn: dict[int, StepInputs] | None = None):
        """`drawn`: blocks of the stream drawn before, by index (drift.prefetch), taken instead of drawn again."""
        self.problem = problem
        # Whole blocks of the stream drawn before: `drawn`, then the block the window ends in (the next starts in it).
        # Block 0 is drawn here where it was not (its first step gives the layout), and the first window takes it.
        self._kept: dict = dict(drawn or {})
        if 0 not in self._kept:
            self._kept[0] = problem.block(0)
        first = _first_step(self._kept[0])
        self.dt_per_head = _dt_per_head(first)
        stored = self._stored(first)
        self.size = _window_steps(problem, stored)
        self.columns: dict[str, tuple[int, int, torch.Size]] = {}  # name -> (start, stop, shape) in its buffer
        if problem.fused:
            # One buffer per step: each batch row holds every input's values side by side, as a serving
            # engine's conv output holds x, B and C; a step's inputs are views into it (`inputs`). A gate, in a
            # buffer of its own: [x | z], each row x's values beside z's, as Mamba1's in_proj row holds them.
            start = 0
            given = dict(stored.given())
            for name in FUSED_ORDER:
                self.columns[name] = (start, start + given[name][0].numel(), given[name].shape[1:])
                start += given[name][0].numel()
            # The buffers by name, and the buffer each input lies in.
            self.fused = {"conv": torch.empty((self.size, first.x.shape[0], start), dtype=first.x.dtype,
                                              device=problem.device)}
            self._buffer_of = dict.fromkeys(FUSED_ORDER, "conv")
            if "z" in given:
                width = given["z"][0].numel()
                self.columns["z"] = (width, 2 * width, given["z"].shape[1:])
                self.fused["gate"] = torch.empty((self.size, first.x.shape[0], 2 * width), dtype=first.x.dtype,
                                                 device=problem.device)
                self._buffer_of["z"] = "gate"
        else:
            # Each input whole and contiguous, but a step's inputs of one dtype side by side in one row of a
            # buffer (`packed`), so that a step gathers them in one index_select: a kernel each is ~2 us of a
            # ~50 us step in a CUDA graph on an H200. Each starts on a 128-byte boundary, as an input of its own would.
            # Where the problem has C apart (regimes.C_APART_REGIMES), C's batch rows are C_ROW_PAD elements further
            # apart than whole, NaN between them (`_c_rows`).
            self.packed: dict[torch.dtype, torch.Tensor] = {}
            ends: dict[torch.dtype, int] = {}
            for name, t in stored.given():
                start = _aligned(ends.get(t.dtype, 0), t.element_size())
                width = t.numel() + (t.shape[0] * C_ROW_PAD if name == "C" and problem.c_apart else 0)
                self.columns[name] = (start, start + width, t.shape)
                ends[t.dtype] = start + width
            for dtype, end in ends.items():
                self.packed[dtype] = torch.empty((self.size, end), dtype=dtype, device=problem.device)
            self._dtypes = {name: t.dtype for name, t in stored.given()}
        self.counter = torch.zeros(1, dtype=torch.int64, device=problem.device)
        self.start = -1  # the window holds steps start + 1 .. start + count (numbered from 1)
        self.count = 0

    def _stored(self, steps: StepInputs) -> StepInputs:
        """`steps` as the window keeps them: a per-head dt without its stride-0 axis."""
        return _stored(steps, self.dt_per_head)

    def holds(self, step: int) -> bool:
        return self.start < step <= self.start + self.count

    def load(self, step: int) -> None:
        """Point the counter at `step`, first putting a window starting there on the device when the one
        there does not hold it."""
        if not self.holds(step):
            start = step - 1
            count = min(self.size, self.problem.nsteps - start)
            buffers = list((self.fused if self.problem.fused else self.packed).values())
            staged = _staging(buffers)
            # Block by block, as many drawn at once as torch has CPU threads: a window of 8192 steps at the default
            # GPU widths took ~0.12 s drawn in one thread and joined, ~12 s of the default GPU drift in all (on a
            # 2-core AMD EPYC; 0.04 s so in 2 threads, forty-first session).
            for at, part in self.problem.host_blocks(start, count, torch.get_num_threads(), self._kept):
                for name, values in self._stored(part).given():
                    lo, hi, _ = self.columns[name]
                    rows = slice(at, at + values.shape[0])
                    if self.problem.fused:
                        staged[id(self.fused[self._buffer_of[name]])][rows, :, lo:hi].copy_(values.flatten(2))
                        if name == "x" and "gate" in self.fused:  # the gate's row: [x | z]
                            staged[id(self.fused["gate"])][rows, :, :hi - lo].copy_(values.flatten(2))
                    elif name == "C" and self.problem.c_apart:  # each batch row's C, then C_ROW_PAD NaN
                        padded = staged[id(self.packed[values.dtype])][rows, lo:hi].unflatten(1, (values.shape[1], -1))
                        padded[..., :-C_ROW_PAD].copy_(values.flatten(2))
                        padded[..., -C_ROW_PAD:] = float("nan")
                    else:
                        staged[id(self.packed[values.dtype])][rows, lo:hi].copy_(values.flatten(1))
            for buffer in buffers:
                if staged[id(buffer)] is not buffer:
                    buffer[:count].copy_(staged[id(buffer)][:count])
            self.start, self.count = start, count
        self.counter.fill_(step - 1 - self.start)

    def inputs(self, separate: bool = False) -> StepInputs:
        """The current step's inputs, read at the counter (device operations only). `separate`: each input of a
        problem that is not fused in memory of its own, as a caller passes them, so that NaN fences around each
        (core.fences, core.outside) tell which one a kernel reads or writes past; else views into one row."""
        if self.problem.fused:
            rows = {key: b.index_select(0, self.counter)[0] for key, b in self.fused.items()}  # one gather a buffer
            step = StepInputs(**{name: rows[self._buffer_of[name]][:, lo:hi].unflatten(-1, shape)
                                 for name, (lo, hi, shape) in self.columns.items()})
        else:
            rows = {dtype: buffer.index_select(0, self.counter)[0] for dtype, buffer in self.packed.items()}
            step = StepInputs(**{name: _c_rows(rows[self._dtypes[name]][lo:hi], shape)
                                 if name == "C" and self.problem.c_apart else rows[self._dtypes[name]][lo:hi].view(shape)
                                 for name, (lo, hi, shape) in self.columns.items()})
            if separate:
                step = step.map(lambda _, t: t.clone())
        return replace(step, dt=step.dt[..., None].expand(step.x.shape)) if self.dt_per_head else step


def first_window_steps(problem: DecodeProblem, first_block: StepInputs) -> int:
    """The steps a StepWindow of `problem` holds at once, from the stream's first block."""
    first = _first_step(first_block)
    return _window_steps(problem, _stored(first, _dt_per_head(first)))


def _first_step(block: StepInputs) -> StepInputs:
    return block.map(lambda _, t: t[0])


def _dt_per_head(step: StepInputs) -> bool:
    """Whether dt is Mamba2's: one value per head, expanded over headdim."""
    return step.dt.stride(2) == 0


def _stored(step: StepInputs, dt_per_head: bool) -> StepInputs:
    return replace(step, dt=step.dt[..., 0]) if dt_per_head else step


def _window_steps(problem: DecodeProblem, stored: StepInputs) -> int:
    per_step = sum(t.numel() * t.element_size() for _, t in stored.given())
    return max(1, min(problem.nsteps, WINDOW_BYTES // per_step))


def _c_rows(columns: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """C of `shape` (batch, ngroups, dstate) as a view into its window columns, each batch row C_ROW_PAD elements
    past the last's end: batch stride ngroups * dstate + C_ROW_PAD, where B's is ngroups * dstate."""
    return columns.unflatten(0, (shape[0], -1))[:, :shape[1] * shape[2]].unflatten(1, shape[1:])


def _staging(buffers: list[torch.Tensor]) -> dict[int, torch.Tensor]:
    """Where a window's blocks are laid out before each of `buffers` gets them, by the buffer's id: the buffer itself
    in host memory, else a view like it into the process's host arena (`_arena`), which then moves in one copy (a
    block's copy from pageable memory waits for the device)."""
    if buffers[0].device.type == "cpu":
        return {id(buffer): buffer for buffer in buffers}
    return _in_arena(buffers)


def _in_arena(buffers: list[torch.Tensor]) -> dict[int, torch.Tensor]:
    """A view like each of `buffers`, by the buffer's id, side by side in the host arena."""
    sizes = [_aligned(buffer.numel() * buffer.element_size(), 1) for buffer in buffers]
    arena, views, at = _arena(sum(sizes)), {}, 0
    for buffer, size in zip(buffers, sizes):
        views[id(buffer)] = arena[at:at + buffer.numel() * buffer.element_size()].view(buffer.dtype).view(buffer.shape)
        at += size
    return views


# Host memory windows are staged in, kept for the process's life and grown as a window needs, pinned where the host
# allows it: a new host tensor a window cost its pages' first touch, and its copy to the device went through the
# driver's bounce buffers. With drift.prefetch, the default GPU drift's window loads took 2.7 s where they took
# 9.8 s (warm, two H100s; sixty-sixth session).
_ARENA: list[torch.Tensor] = []


def _arena(size: int) -> torch.Tensor:
    if not _ARENA or _ARENA[0].numel() < size:
        _ARENA.clear()  # (the smaller one freed before the larger is taken)
        try:
            _ARENA.append(torch.empty(size, dtype=torch.uint8, pin_memory=True))
        except RuntimeError:  # no page-locked memory to be had: pageable
            _ARENA.append(torch.empty(size, dtype=torch.uint8))
    return _ARENA[0]


@dataclass
class Saved:
    """A trial's position, for going back to it (`Lockstep.restore`)."""

    step: int
    state: torch.Tensor
    ref: torch.Tensor
    baseline: torch.Tensor
    store_errors: torch.Tensor | None
    tripped: torch.Tensor


class Lockstep:
    """One trial: the kernel's state, the reference and the baseline, advanced one step at a time."""

    def __init__(self, case, problem: DecodeProblem, window: StepWindow, kernel: DriftAdapter, trial: int,
                 trial_seed: int, transcript: Transcript, store_errors: SignedErrorMoments, repeat: int = 1):
        self.case, self.problem, self.window, self.kernel = case, problem, window, kernel
        self.trial, self.trial_seed, self.transcript = trial, trial_seed, transcript
        device = problem.device
        batch = problem.initial_state.shape[0]
        # Where this trial decodes through slot indices, the state's rows lie on slots first_slot.. of a pool
        # (`_pooled`) and every call passes them in state_batch_indices, as a serving engine's decode does.
        self.first_slot = slotted_from(case, kernel, trial, batch)
        self.slots = None if self.first_slot is None else torch.arange(
            self.first_slot, self.first_slot + batch, dtype=torch.int32, device=device)
        # The state lives between NaN fences for the whole trial (core.fences), one tensor from step to step:
        # a read past it is NaN in the step's results, a write past it is seen at the checked steps.
        self._state_fences = Fenced({"state": self._pooled(problem.initial_state)})
        self.given = self._state_fences.tensors["state"]  # what the kernel is given: the state, or its pool
        self.state = self._rows(self.given)
        self.ref = self.state.double()
        self.baseline = self.ref.clone()
        self.bits = torch.Generator(device=device).manual_seed(trial_seed)  # the baseline's SR draws
        self.store_errors = store_errors  # shared by the case's trials
        self.repeat = repeat  # runs of every step's kernel call from the same state (eager only)
        self.differs: dict | None = None  # with repeat > 1: where a run first differed from the first
        self.max_abs = 0.0  # and the largest |difference| seen
        self.tripped = torch.zeros(self.state.shape[:-1], dtype=torch.bool, device=device)  # per state row
        self.A64, self.D64, self.dt_bias64 = problem.A.double(), problem.D.double(), problem.dt_bias.double()
        self.follow = Follower(device)  # the float64 side of every step (drift.follow)
        self.seeds = torch.empty(window.size, dtype=torch.int64, device=device)  # this trial's, per window step
        self.step = 0  # steps run
        # out, ref_out, baseline_out and the exact out of the kernel's own previous state (drift.follow)
        self.outputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.graph = None  # a captured step, once try_graph found it faithful
        self.graph_note = "eager"  # how the steps ran: "graph", or why not
        self.run_graph = None  # RUN_STEPS captured steps, once advance_run found them the same as single replays
        self.run_tried = False
        window.load(1)  # the counter back at the first step (the window may hold it from an earlier trial)
        self._graph_outputs = None
        self._seeds_start = None
        self._checked = None  # the last step whose inputs were fenced: (step, state before it, inputs, seed)

    def _pooled(self, state: torch.Tensor) -> torch.Tensor:
        """What the kernel is given for `state`: itself, or where this trial decodes through slot indices a pool
        holding its rows on `slots`, the spare slots around them NaN (core.pool.spare_slotted)."""
        return state if self.slots is None else spare_slotted(state, self.first_slot, SPARES_AFTER)

    def _rows(self, given: torch.Tensor) -> torch.Tensor:
        """The state's rows in what `_pooled` gave the kernel (a view)."""
        return given if self.slots is None else given[self.first_slot:self.first_slot + len(self.slots)]

    def _spare_written(self) -> int | None:
        """The first spare slot of the pool whose bits a call changed, or None (none, or no pool)."""
        if self.slots is None:
            return None
        spares = [*range(self.first_slot), *range(self.first_slot + len(self.slots), self.given.shape[0])]
        kept = poisoned(self.given[spares]).flatten(1).all(1).tolist()
        return next((slot for slot, ok in zip(spares, kept) if not ok), None)

    @property
    def decode_loop(self) -> str:
        """How the steps ran (DriftRun.decode_loop): graph_note, and on CUDA how the float64 side ran where that was
        not its first fast step (Follower.note)."""
        note = self.follow.note
        return self.graph_note if note is None else f"{self.graph_note}; float64 step {note}"

    def seed(self, step: int) -> int:
        """The kernel's seed at `step`: new every step, reproducible from the trial's seed."""
        return sweep.case_seed(self.trial_seed, {"step": step})

    def advance(self, check_inputs: bool = False) -> None:
        """Run the next step: a graph replay when there is a graph, else eagerly."""
        n = self._ready()
        if self.graph is not None and not check_inputs:
            self.graph.replay()
            self.outputs = self._graph_outputs
        else:
            self.outputs = self._step(n, check_inputs)
        self.step = n

    def run_fits(self) -> bool:
        """Whether the next RUN_STEPS steps can run as one replay of the run graph: there is a step graph, and
        the window holds them all (the graph reads each step's inputs at the device's counter)."""
        if self.graph is None or (self.run_tried and self.run_graph is None):
            return False
        return self.window.holds(self._ready() + RUN_STEPS - 1)

    def advance_run(self) -> int:
        """Run the next RUN_STEPS steps (run_fits) as one replay of the run graph, captured at the first call and
        kept where its replay ends in the same bits as RUN_STEPS replays of the step graph from the same position
        (those replays are then the steps run), else those steps replayed one at a time from here on. Returns the
        steps run: none where the capture failed, the trial eager from here on."""
        if self.run_graph is not None:
            self.run_graph.replay()
            self.outputs = self._run_outputs
            self.step += RUN_STEPS
            return RUN_STEPS
        self.run_tried = True
        before = self.saved()
        replayed = self._capture_run(self._ready())
        if replayed is None:
            return 0
        self.restore(before)
        for _ in range(RUN_STEPS):
            self.advance()
        if not (_same_bits(replayed[0], self.state) and _same_bits(replayed[1], self.outputs[0])):
            self.run_graph = None
            self.graph_note = "graph (one step a replay: a run of steps in one graph differs from its steps' replays)"
        return RUN_STEPS

    def _capture_run(self, n: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Capture steps n .. n + RUN_STEPS - 1 in one graph and replay it once: (the state, the last output) it
        left; None where the capture failed (run_graph stays None)."""
        graph = torch.cuda.CUDAGraph()
        try:
            graph.register_generator_state(self.bits)
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                for k in range(RUN_STEPS):
                    outputs = self._step(n + k, check_inputs=False)
        except Exception:  # noqa: BLE001 (a kernel whose run of steps cannot be captured runs eagerly)
            # As in _capture: the generator stays registered with the failed capture.
            self.bits = torch.Generator(device=self.problem.device).manual_seed(self.trial_seed + 2)
            self.graph = None  # the step graph draws from the old generator: eager from here on
            self.graph_note = "eager: a run of steps was not captured"
            return None
        graph.replay()
        self.run_graph, self._run_outputs = graph, outputs
        return self.state.clone(), outputs[0].clone()

    def _ready(self) -> int:
        """The next step's number, its inputs and this trial's seeds for its window on the device."""
        n = self.step + 1
        if not self.window.holds(n):
            self.window.load(n)
        if self.kernel.takes_seed_tensor and self._seeds_start != self.window.start:
            host = sweep.step_seeds(self.trial_seed, self.window.start + 1, self.window.count)  # self.seed's
            self.seeds[: self.window.count].copy_(torch.tensor(host, dtype=torch.int64))
            self._seeds_start = self.window.start
        return n

    def _step(self, n: int, check_inputs: bool):
        """Step n as device operations; raises drift.adapter.KernelRaised."""
        step = self.window.inputs(separate=check_inputs)
        if self.kernel.takes_seed_tensor:
            seed = self.seeds.index_select(0, self.window.counter)
        else:
            seed = self.seed(n) if self.kernel.takes_seed else 0
        before = self.state.clone()
        out = self.kernel.call(self.given, self.problem, step, self.case.rounding, seed,
                               f"trial {self.trial}, step {n}", check_inputs=check_inputs,
                               transcript=self.transcript, slots=self.slots)
        self._checked = (n, before, step, seed) if check_inputs else None
        if check_inputs and self._state_fences.breached() is not None:
            raise KernelRaised(f"the kernel wrote outside its state: into the NaN fence ssmcheck puts either side of "
                               f"the state's memory (trial {self.trial}, step {n})")
        if check_inputs and (spare := self._spare_written()) is not None:
            raise KernelRaised(f"the kernel wrote slot {spare} of its state pool, which no row names (rows on slots "
                               f"{self.first_slot}..{self.first_slot + len(self.slots) - 1} in "
                               f"state_batch_indices; trial {self.trial}, step {n})")
        for run in range(2, self.repeat + 1):  # the same call again, from the same state, inputs and seed
            self._compare_run(run, n, before, step, seed, out)
        uniform = None
        if self.case.rounding == "stochastic":  # the baseline's draws, from a generator a CUDA graph advances
            uniform = torch.rand(self.state.shape, generator=self.bits, dtype=torch.float64, device=self.state.device)
        ref_out, baseline_out, exact_out = self.follow(
            ref=self.ref, baseline=self.baseline, before=before, after=self.state, out=out, x=step.x, dt=step.dt,
            z=step.z, A=self.A64, B=step.B, C=step.C, D=self.D64, dt_bias=self.dt_bias64,
            sums=self.store_errors.running(self.state.device, self.state.shape[:-1]), tripped=self.tripped,
            uniform=uniform, dt_softplus=self.problem.dt_softplus, dtype=self.case.dtype, rounding=self.case.rounding)
        self.window.counter.add_(1)
        return out, ref_out, baseline_out, exact_out

    def reads_outside(self) -> list[tuple[str, ...]] | None:
        """For the step just run, non-finite: the inputs whose NaN fences its non-finite values came from
        (core.outside: the call made again from the state before it); None where that step's inputs were
        not fenced, the values are the kernel's own, or a call again raised."""
        if self._checked is None or self._checked[0] != self.step:
            return None
        n, before, step, seed = self._checked

        def call(nan_fences):
            given = Fenced({"state": self._pooled(before)}, nan_fences).tensors["state"]
            out = self.kernel.call(given, self.problem, step, self.case.rounding, seed, f"trial {self.trial}, "
                                   f"step {n}, fences", check_inputs=True, nan_fences=nan_fences, slots=self.slots)
            return out, self._rows(given)

        try:
            return outside.reads_outside(call, [*self.kernel.fenced_storages(self.problem, step), ("state",)])
        except Exception:  # noqa: BLE001 (advisory: the verdict stands as measured)
            return None

    def _compare_run(self, run: int, n: int, saved: torch.Tensor, step: StepInputs, seed, out: torch.Tensor) -> None:
        given = self._pooled(saved.clone())
        again = self._rows(given)
        again_out = self.kernel.call(given, self.problem, step, self.case.rounding, seed,
                                     f"trial {self.trial}, step {n}, run {run}", transcript=self.transcript,
                                     slots=self.slots)
        difference = first_difference((self.state, out), (again, again_out))
        if difference is None:
            return
        output, index, largest = difference
        self.max_abs = max(self.max_abs, largest)
        if self.differs is None:
            self.differs = dict(run=run, output=output, trial=self.trial, step=n, batch=index[0], head=index[1],
                                channel=index[2])

    def try_graph(self) -> str | None:
        """Capture the next step in a CUDA graph and keep it if its replay equals the eager step bit for bit
        (None), else say why not and run eagerly from here on. Runs that next step either way."""
        n = self._ready()
        before = self.saved()
        self.graph_note = self._capture(n, before)
        return None if self.graph is not None else self.graph_note

    def _capture(self, n: int, before: Saved) -> str:
        graph = torch.cuda.CUDAGraph()
        try:
            graph.register_generator_state(self.bits)
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                outputs = self._step(n, check_inputs=False)
        except Exception as exc:  # noqa: BLE001 (a kernel that cannot be captured runs eagerly)
            # The baseline's generator stays registered with the failed capture: draw from a new one.
            self.bits = torch.Generator(device=self.problem.device).manual_seed(self.trial_seed + 1)
            self.restore(before)
            self.advance(check_inputs=True)
            return f"eager: not captured: {type(exc).__name__}: {exc}".splitlines()[0]
        graph.replay()
        replayed = (self.state.clone(), outputs[0].clone())
        self.restore(before)
        self.advance(check_inputs=True)
        if not (_same_bits(replayed[0], self.state) and _same_bits(replayed[1], self.outputs[0])):
            return "eager: a replay differs from the eager step (a seed or random stream a graph cannot advance)"
        self.graph, self._graph_outputs = graph, outputs
        return "graph"

    def went_nonfinite(self) -> bool:
        """Whether a step since the flag was last cleared left the kernel's state or output non-finite where the
        reference's is finite (a read back)."""
        return bool(self.tripped.any())

    def saved(self) -> Saved:
        return Saved(self.step, self.state.clone(), self.ref.clone(), self.baseline.clone(),
                     self.store_errors.saved(), self.tripped.clone())

    def restore(self, saved: Saved) -> None:
        """Back to `saved`, in place (a graph keeps reading the same tensors)."""
        self.step = saved.step
        for mine, theirs in ((self.state, saved.state), (self.ref, saved.ref), (self.baseline, saved.baseline),
                             (self.tripped, saved.tripped)):
            mine.copy_(theirs)
        self.store_errors.restore(saved.store_errors)
        if saved.step < self.problem.nsteps:
            self.window.load(saved.step + 1)


def slotted_from(case, kernel: DriftAdapter, trial: int, batch: int) -> int | None:
    """The first live slot where `trial` of `case` decodes through slot indices, else None.

    A kernel that takes slot indices (a serving engine's decode passes them every step) decodes one trial of
    two through them, a coin per case picking which (a round-to-nearest case's one trial: about every other
    case). So a path of its own for state_batch_indices, rounding or stepping otherwise than the other, drifts
    over the whole run, where the slot check (drift.slots) sees one step. The rows lie on consecutive slots after
    the pad slot where that is a slot of the pool, else after slot 0 (vLLM's null block)."""
    if kernel.pad_slot_id is None or (sweep.case_seed(case.seed, {"slots": case.id}) + trial) % 2 == 0:
        return None
    return kernel.pad_slot_id + 1 if 0 <= kernel.pad_slot_id <= batch else 1


def _aligned(count: int, element_size: int) -> int:
    """The first element at or after `count` that starts a 128-byte line."""
    line = 128 // element_size
    return -(-count // line) * line


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool((bits(a) == bits(b)).all())
