"""A state cache as a serving engine keeps one: a pool of per-sequence slots, here between two guard slots (and
paged, as vLLM's is) and filled with a NaN of ssmcheck's own before a kernel writes it, so that a slot it
leaves, or one it was not to write, shows bit for bit. The drift slot and speculative checks (drift.slots,
drift.speculative) and scan's cache-write check (scan.invariance) build their pools from these."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ssmcheck.core.tensors import bits, whole_storage

# A quiet NaN with a payload of its own, per dtype: a kernel's NaN has another payload.
POISON_BITS = {torch.float32: 0x7FC5A5A5, torch.float16: 0x7E5A, torch.bfloat16: 0x7FDA}


def inner_slots(count: int, size: int, generator: torch.Generator, skip: int | None = None) -> list[int]:
    """`count` distinct slots of a pool of `size`, drawn at random, never the first or the last (nor `skip`). A
    slot index clamped into range or wrapped around (-1) lands on those ends: left spare, a write there shows
    whatever the order of the stores, where a write into another row's slot races that row's own store (on a
    GPU the row's may land last and leave no trace)."""
    usable = [s for s in range(1, size - 1) if s != skip]
    return [usable[i] for i in torch.randperm(len(usable), generator=generator)[:count].tolist()]


def end_slots(count: int, size: int, generator: torch.Generator, skip: int | None = None) -> list[int]:
    """`count` (at least 2) distinct slots of a pool of `size` (never `skip`): its first and last, the rest drawn at
    random from between them, in a random order. A bounds or pad test off by one at either end skips one."""
    usable = [s for s in range(size) if s != skip]
    between = usable[1:-1]
    drawn = torch.randperm(len(between), generator=generator)[:count - 2].tolist()
    chosen = [usable[0], usable[-1], *(between[i] for i in drawn)]
    return [chosen[i] for i in torch.randperm(count, generator=generator).tolist()]


def nan_filled(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """A tensor of `shape` in like's dtype and device, every element the poison NaN."""
    pattern = torch.full(shape, POISON_BITS[like.dtype], dtype=bits(like).dtype, device=like.device)
    return pattern.view(like.dtype)


def poisoned(t: torch.Tensor) -> torch.Tensor:
    """Where `t` still holds the poison NaN (elementwise)."""
    return bits(t) == POISON_BITS[t.dtype]


def spare_slotted(state: torch.Tensor, first: int, after: int) -> torch.Tensor:
    """A pool of `first` spare slots, `state`'s rows, and `after` spare slots, in `state`'s layout (its strides, and
    its storage's other contents around each row, as a layer's slice of a stacked cache keeps them): row i on slot
    first + i, every element of the spares' memory the poison NaN. A kernel that reads a spare slot for a row's
    takes NaN into that row; one that writes a spare shows bit for bit (`poisoned`)."""
    storage = whole_storage(state)
    lead, tail = first * state.stride(0), after * state.stride(0)
    flat = nan_filled((lead + storage.numel() + tail,), state)
    flat[lead:lead + storage.numel()] = storage
    return flat.as_strided((first + state.shape[0] + after, *state.shape[1:]), state.stride(), state.storage_offset())


@dataclass
class PagedPool:
    """A pool between two guard slots (page i holds slot i - 1), paged as vLLM's cache is: each slot's state
    is followed by more of its page, so a kernel that takes the slot stride for the state's own size reads and
    writes across slots. `states` views every page's state (guards included), `pool` the slots a kernel is
    given; `states_before` and `pages_before` are a copy taken before the call."""
    pages: torch.Tensor
    states: torch.Tensor
    pages_before: torch.Tensor
    states_before: torch.Tensor

    @property
    def pool(self) -> torch.Tensor:
        return self.states[1:-1]

    @property
    def size(self) -> int:
        """A state's elements."""
        return self.states[0].numel()

    def changed_slots(self, written: set[int]) -> list[int]:
        """The slots, guards included (slots -1 and len(pool)), that a call changed (bit for bit) and was not to
        write."""
        return [i - 1 for i in range(self.states.shape[0])
                if i - 1 not in written and not torch.equal(bits(self.states_before[i]), bits(self.states[i]))]

    def past_states(self) -> list[int]:
        """The slots (guards included) whose page's rest, after the state, a call changed: no slot's memory."""
        return [i - 1 for i in range(self.pages.shape[0])
                if not torch.equal(bits(self.pages[i, self.size:]), bits(self.pages_before[i, self.size:]))]

    def past_states_text(self, slots: list[int]) -> str:
        """What `past_states` found, in words."""
        which = f"page after slot {slots[0]}'s state" if len(slots) == 1 else (
            f"pages after the states of slots {', '.join(map(str, slots))}")
        return (f"the {which} (the pool's slot stride is {self.pages.stride(0)} elements, a state {self.size}: a "
                "kernel that takes one for the other writes there)")


def paged_pool(contents: torch.Tensor, seed: int) -> PagedPool:
    """A PagedPool holding `contents` (one state per page, the guards first and last). The rest of each page
    holds finite values drawn from `seed`, not NaN: a kernel that reads a NaN there writes back a NaN of the
    same payload on the CPU, where NaN arithmetic keeps it, and the page would seem untouched."""
    size = contents[0].numel()
    pages = torch.empty((contents.shape[0], size + _page_gap(size)), dtype=contents.dtype, device=contents.device)
    generator = torch.Generator().manual_seed(seed)
    pages[:, size:] = torch.randn((pages.shape[0], pages.shape[1] - size), generator=generator).to(pages)
    states = pages[:, :size].unflatten(1, contents.shape[1:])
    states.copy_(contents)
    pages_before = pages.clone()
    return PagedPool(pages, states, pages_before, pages_before[:, :size].unflatten(1, contents.shape[1:]))


def _page_gap(size: int) -> int:
    # A quarter of a state more, in whole 16-element blocks (a page is aligned as the state is).
    return max(16, size // 64 * 16)
