"""The autotune configs a kernel can run with: finding its autotuners, and pinning one config at a time.

Which config Triton's autotuner picks depends on the GPU, the Triton version and the shape, so a
bug that only one config has (the sm_90 wgmma race this project began from) can pass on one
machine and fail on another. To reach it, every `triton.runtime.Autotuner` reachable from the
kernel under test is found:

- in the module globals of the callable's module;
- in the modules that module imports, and the modules of the functions it imports, as long as
  they lie within the kernel's own package (its top-level package name), or, for a kernel loaded
  from a file, in the file's folder or below it.

An autotuner with a single config runs it without benchmarking, so pinning a config is setting
the autotuner's config list to that one config, and restoring the list afterwards. That is also
how an autotuned kernel runs in Triton's interpreter, which has no driver to benchmark with.

A kernel that picks its launch config another way (vLLM's state update reads tuned tables keyed by
batch × heads) can be reached the same way: a wrapper names, in its LAUNCH_TABLES attribute, objects
with a `configs` list that pinning sets and restores as it does an autotuner's (ssmcheck.peers.vllm).
"""

from __future__ import annotations

import inspect
import json
import types
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

# A wrapper that adapts another kernel's signature (ssmcheck.peers) names that kernel in this attribute:
# the search starts from the wrapped kernel's module, not the wrapper's.
ORIGIN = "autotune_origin"
# A wrapper's list of Tuned whose "autotuner" is a launch-config table of its own (the module docstring).
LAUNCH_TABLES = "launch_tables"
# --configs: "auto", the autotuner's pick (the first config in the interpreter); "all", each in turn.
CONFIGS = ("auto", "all")


@dataclass(frozen=True)
class Tuned:
    """One autotuned function: where it was found, and its autotuner."""

    name: str  # the kernel function's name, e.g. _chunk_scan_fwd_kernel
    module: str  # the module whose global it is
    autotuner: object  # triton.runtime.Autotuner, or a wrapper's launch table (LAUNCH_TABLES)
    picked_by: str = ""  # for a launch table: what picks its config when none is pinned

    def label(self) -> str:
        """`module.name (N configs)`, as the report names it; a launch table's says what picks from it."""
        picked = f", picked by {self.picked_by}" if self.picked_by else ""
        return f"{self.module}.{self.name} ({len(self.configs)} configs{picked})"

    @property
    def configs(self) -> list:
        return list(self.autotuner.configs)


def describe(config) -> dict:
    """A triton.Config as plain data: its kwargs and launch options (num_ctas and maxnreg only when set)."""
    described = {"kwargs": dict(config.kwargs), "num_warps": config.num_warps, "num_stages": config.num_stages}
    if getattr(config, "num_ctas", 1) != 1:
        described["num_ctas"] = config.num_ctas
    if getattr(config, "maxnreg", None) is not None:
        described["maxnreg"] = config.maxnreg
    return described


def described_text(described: dict) -> str:
    """`BLOCK_SIZE_M=128, ..., num_warps=4, num_stages=3` from `describe`'s dict, for tables and
    summaries (other keys, such as a function name or an index, are left out)."""
    launch = [f"{k}={v}" for k, v in described.items() if k in ("num_warps", "num_stages", "num_ctas", "maxnreg")]
    return ", ".join([f"{k}={v}" for k, v in described["kwargs"].items()] + launch)


def find(fn: Callable) -> list[Tuned]:
    """Every autotuner reachable from `fn`'s module (or its ORIGIN's) within its package, in a stable
    order (by module, then by name), each once, then fn's LAUNCH_TABLES. Searched once per module and
    process: every case of a sweep asks."""
    tables = list(getattr(fn, LAUNCH_TABLES, []))
    start = inspect.getmodule(inspect.unwrap(getattr(fn, ORIGIN, fn)))
    if start is None:
        return tables
    if start.__name__ not in _FOUND:
        _FOUND[start.__name__] = _search(start)
    return _FOUND[start.__name__] + tables


_FOUND: dict[str, list[Tuned]] = {}


def _search(start: types.ModuleType) -> list[Tuned]:
    from triton.runtime.autotuner import Autotuner  # noqa: PLC0415 (triton: only once the runtime is configured)

    package = start.__name__.partition(".")[0]
    folder = Path(start.__file__).resolve().parent if getattr(start, "__file__", None) else None

    def within(module) -> bool:
        if module.__name__.partition(".")[0] == package:
            return True
        path = getattr(module, "__file__", None)
        return folder is not None and path is not None and Path(path).resolve().is_relative_to(folder)

    found: dict[int, Tuned] = {}
    seen: set[str] = set()
    queue = [start]
    while queue:
        module = queue.pop(0)
        if module.__name__ in seen:
            continue
        seen.add(module.__name__)
        for attr, value in sorted(vars(module).items()):
            autotuner = _autotuner_in(value, Autotuner)
            if autotuner is not None:
                found.setdefault(id(autotuner), Tuned(attr, module.__name__, autotuner))
            follow = value if isinstance(value, types.ModuleType) else inspect.getmodule(value)
            if follow is not None and within(follow):
                queue.append(follow)
    return sorted(found.values(), key=lambda t: (t.module, t.name))


def _autotuner_in(value, autotuner_class):
    """The Autotuner a global holds, directly or under wrappers such as triton.heuristics (`.fn` chains)."""
    for _ in range(8):  # wrappers nest a few deep at most
        if isinstance(value, autotuner_class):
            return value
        value = getattr(value, "fn", None)
        if value is None:
            return None
    return None


@contextmanager
def pinned(choices: dict[Tuned, int]) -> Iterator[list[str]]:
    """Run each autotuner in `choices` with only its config of that index; restore every list after.

    Yields the launches of a pinned function under another config, each once as a line: a launcher that keeps
    the configs it saw and launches the function directly, bypassing the autotuner (vLLM 0.33's keeps one per
    key), runs the config of an earlier call instead of the pin, and the case would then be judged as a config
    that never ran. Watched on the function each autotuner launches (a launch table has none)."""
    saved = {tuned: tuned.autotuner.configs for tuned in choices}
    bypassed: list[str] = []
    watched = []
    try:
        for tuned, index in choices.items():
            config = saved[tuned][index]
            tuned.autotuner.configs = [config]
            fn = getattr(tuned.autotuner, "fn", None)
            if fn is not None and "run" not in vars(fn):
                fn.run = _checked(fn.run, tuned.name, index, config, bypassed)
                watched.append(fn)
        yield bypassed
    finally:
        for fn in watched:
            del fn.run
        for tuned, configs in saved.items():
            tuned.autotuner.configs = configs


def _checked(run: Callable, name: str, index: int, config, bypassed: list[str]) -> Callable:
    """`run` (a pinned function's launch) noting in `bypassed` each launch whose config is not `config`."""
    wanted = config.all_kwargs()

    def checked(*args, **kwargs):
        if any(key not in kwargs or kwargs[key] != value for key, value in wanted.items()):
            ran = ", ".join(f"{key}={kwargs.get(key, '?')}" for key in wanted)
            line = f"{name} ran {ran} where its config {index} ({described_text(describe(config))}) was pinned"
            if line not in bypassed:
                bypassed.append(line)
        return run(*args, **kwargs)

    return checked


def bypassed_message(bypassed: list[str], verdict: str) -> str:
    """A case's message where its pinned config did not run (`pinned`'s lines): its own verdict is another
    config's."""
    return (f"the pinned config did not run: {'; '.join(bypassed)} (the kernel's launcher reuses a config it kept); "
            f"the verdict of what ran: {verdict}")


class _Recording(dict):
    """An autotuner's cache that records the keys looked up in it: Triton's Autotuner.run looks up its pick for
    the launch's key there at every launch (after tuning the key, where it was new)."""

    def __init__(self, cache: dict):
        super().__init__(cache)
        self.used: list = []

    def __getitem__(self, key):
        config = super().__getitem__(key)
        if key not in self.used:
            self.used.append(key)
        return config


@contextmanager
def recorded_picks(tuned: list[Tuned]) -> Iterator[dict[str, list[dict]]]:
    """While inside, record the configs the autotuners in `tuned` launch with (their picks for the launches'
    keys); the dict yielded is filled on leaving: {function name: [{"index", **describe(config)}, ...]}, each
    distinct pick once, functions that launched nothing tuned left out. An autotuner with one config (pinned,
    or in the interpreter) runs it without a pick; a launcher that keeps the picks itself and launches the
    function directly (vLLM's, after a key's first launch) shows none."""
    picks: dict[str, list[dict]] = {}
    recordings = {}
    for t in tuned:
        cache = getattr(t.autotuner, "cache", None)
        if type(cache) is dict:  # Triton's Autotuner; a launch table has none
            recordings[t] = (cache, _Recording(cache))
            t.autotuner.cache = recordings[t][1]
    try:
        yield picks
    finally:
        for t, (cache, recording) in recordings.items():
            t.autotuner.cache = cache
            cache.update(recording)  # what it tuned meanwhile
            chosen = []
            for key in recording.used:
                config = dict.__getitem__(recording, key)
                entry = {"index": next((i for i, c in enumerate(t.configs) if c is config), None), **describe(config)}
                if entry not in chosen:
                    chosen.append(entry)
            if chosen:
                picks[t.name] = chosen


def picks_text(picks: dict[str, list[dict]]) -> str:
    """`_kernel config 3 (BLOCK=64, num_warps=4, num_stages=3)` for each pick of `recorded_picks`, joined."""
    return "; ".join(f"{name} config {pick['index']} ({described_text(pick)})"
                     for name, chosen in picks.items() for pick in chosen)


def header_line(configs: str, autotuned: list[str], interpreter: bool) -> str:
    """Which configs of the kernel's autotuned functions (`find`, as Tuned.label names them) run:
    '' when it has none."""
    if not autotuned:
        return ""
    if configs == "all":
        return f"configs: every config of {', '.join(autotuned)}, one function at a time"
    if interpreter:
        return f"configs: the first of each ({', '.join(autotuned)}): the interpreter cannot autotune"
    return f"configs: the autotuner's pick ({', '.join(autotuned)})"


def every_config(cases: list, tuned: list[Tuned]) -> list:
    """Each case once per config of each autotuned function, one function at a time (the others left
    to the autotuner, or to their first config in the interpreter): not the product of all. A case's
    `config` is the JSON text {"function", "index", **describe(config)} (text keeps the case hashable).

    Config-major: a config's cases come together, so that workers running at once compile different
    shapes of one config, and the other functions' autotuning for a shape happens once (then Triton's
    caches serve it), not once per worker per config as it would with each case's configs together."""
    from dataclasses import replace  # noqa: PLC0415

    configs = [json.dumps({"function": t.name, "index": i, **describe(c)}, sort_keys=True)
               for t in tuned for i, c in enumerate(t.configs)]
    if not configs:
        return cases
    return [replace(case, config=config) for config in configs for case in cases]


def pins(tuned: list[Tuned], config: str | None, interpreter: bool) -> dict[Tuned, int]:
    """The configs to pin for a case whose `config` is `every_config`'s text (None: no config of its own):
    its own and, in the interpreter, which cannot benchmark, every other autotuned function's first."""
    chosen = None if config is None else json.loads(config)
    choices = {t: 0 for t in tuned} if interpreter else {}
    for t in tuned:
        if chosen is not None and t.name == chosen["function"]:
            choices[t] = chosen["index"]
    return choices


def config_failures(results: list) -> list[str]:
    """With --configs all: each config that fails anywhere, e.g. `_kernel config 7 (BLOCK=128, ...,
    num_stages=4): nonfinite in 6/45 cases`. `results` are any command's: `.case.config`, `.status`."""
    by_config: dict[str, list] = {}
    for r in results:
        if r.case.config is not None and r.status.value != "skipped":
            by_config.setdefault(r.case.config, []).append(r)
    lines = []
    for config, members in by_config.items():
        bad = Counter(r.status.value for r in members if r.status.value in ("fail", "nonfinite", "error"))
        if bad:
            c = json.loads(config)
            counts = ", ".join(f"{status} in {n}/{len(members)} cases" for status, n in bad.items())
            lines.append(f"{c['function']} config {c['index']} ({described_text(c)}): {counts}")
    return lines


def config_label(config: str | None) -> str:
    """A case's config as a table shows it: `function#index`, '' for the autotuner's pick."""
    if config is None:
        return ""
    c = json.loads(config)
    return f"{c['function']}#{c['index']}"
