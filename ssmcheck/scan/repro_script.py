"""Reproduce one failing chunk-scan case: the kernel call on the inputs saved beside this script, judged
against the float64 reference output saved with them.

Standalone: it needs torch, triton and the kernel, not ssmcheck (`ssmcheck scan --repro` copies this file
beside the case's `inputs.pt`). Without a CUDA GPU the kernel runs in Triton's interpreter.
Exit codes as ssmcheck's: 0 pass, 1 fail, 3 non-finite, 4 the kernel raised.
"""

import importlib
import importlib.util
import math
import os
import sys
from pathlib import Path

import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # read when triton is first imported: before the kernel's import

HERE = Path(__file__).resolve().parent


def load_kernel(spec):
    """MODULE:FUNCTION, or path/to/file.py:FUNCTION (relative to the current directory or to this folder)."""
    where, _, name = spec.rpartition(":")
    if where.endswith(".py"):
        path = next(p for p in (Path(where), HERE / where) if p.exists())
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[path.stem] = module
        module_spec.loader.exec_module(module)
    else:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: modules of the current directory import
        module = importlib.import_module(where)
    for part in name.split("."):
        module = getattr(module, part)
    return module


def pin_configs(pins):
    """Run each autotuned function with one config, as the failing case did (its list cut to that config)."""
    from triton.runtime.autotuner import Autotuner

    for pin in pins:
        tuned = getattr(importlib.import_module(pin["module"]), pin["name"])
        while not isinstance(tuned, Autotuner):  # under wrappers such as triton.heuristics
            tuned = tuned.fn
        config = tuned.configs[pin["index"]]
        print(f"pinned {pin['name']} config {pin['index']}: {pin['config']}")
        tuned.configs = [config]


def call(fn, case, args, kwargs):
    """(y, states) of one call on fresh copies of the inputs, y written into a NaN-filled buffer; y on the
    case's own tokens (a call with pad tokens, seq_idx -1, has more: `live` says where the case's lie)."""
    if "out" in kwargs:
        kwargs = {**kwargs, "out": torch.full_like(kwargs["out"], math.nan)}
    result = fn(*args, **kwargs)
    y, states = (kwargs["out"].view(case["y_shape"]), result) if case["y_from_out"] else (result[0], result[1])
    live = case.get("live")
    return (y if live is None else y[:, live.to(y.device)]), states


def call_without_flags(fn, case, args, kwargs, **changes):
    """y of the call without the return flags (a tuple back is taken for (y, ...)), its keywords changed by
    `changes`: as ssmcheck calls for y alone (D and z kept: a training forward's call) and for the SSM part C·h
    alone (D and z None)."""
    kwargs = {k: v for k, v in kwargs.items() if k not in ("return_final_states", "return_varlen_states")}
    kwargs = {**kwargs, **changes}
    if "out" in kwargs:
        kwargs["out"] = torch.full_like(kwargs["out"], math.nan)
    result = fn(*args, **kwargs)
    y = kwargs["out"].view(case["y_shape"]) if case["y_from_out"] else (
        result[0] if isinstance(result, tuple) else result)
    live = case.get("live")
    return y if live is None else y[:, live.to(y.device)]


def call_both_flags(fn, args, kwargs):
    """(y, final_states, varlen_states) of the varlen call with both return flags, as Mamba2's inference prefill
    makes it on packed sequences (final_states then holds the row's final state: its last sequence's)."""
    result = fn(*args, **{**kwargs, "return_final_states": True, "return_varlen_states": True})
    if not (isinstance(result, tuple) and len(result) == 3):
        raise TypeError(f"expected (out, final_states, varlen_states) from a call with both return flags, got "
                        f"{type(result).__name__}")
    return result


def relative(out, ref):
    diff = torch.linalg.vector_norm(out.double() - ref)
    norm = torch.linalg.vector_norm(ref)
    return float(diff / norm) if norm > 0 else (0.0 if diff == 0 else math.inf)


def worst_group(y, ref, sequence, position, chunk_size):
    """The largest relative error of y over (sequence, chunk, head) groups, and that group."""
    key = (sequence * (int(position.max()) // chunk_size + 1) + position // chunk_size).flatten()
    groups = int(key.max()) + 1
    diff2 = (y.double() - ref).square().sum(-1).flatten(0, 1)
    ref2 = ref.square().sum(-1).flatten(0, 1)
    num = torch.zeros(groups, y.shape[2], dtype=torch.float64).index_add_(0, key, diff2)
    den = torch.zeros(groups, y.shape[2], dtype=torch.float64).index_add_(0, key, ref2)
    rel = torch.where(den > 0, num / den, torch.where(num == 0, 0.0, math.inf)).sqrt().nan_to_num(nan=math.inf)
    where = int(rel.argmax())
    group, head = divmod(where, y.shape[2])
    chunks = int(position.max()) // chunk_size + 1
    return float(rel.flatten()[where]), f"sequence {group // chunks} chunk {group % chunks} head {head}"


def first_nonfinite(y, ref, sequence, position):
    bad = ~torch.isfinite(y) & torch.isfinite(ref)
    if not bad.any():
        return None
    row, token, head, channel = (int(i) for i in bad.nonzero()[0])
    return (f"y non-finite from sequence {int(sequence[row, token])} token {int(position[row, token])} head {head} "
            f"channel {channel}; {int(bad.sum())} elements")


def signed_bias(y, ref):
    """((mean, z) signed along each value, negative toward zero; (mean, z) signed toward +inf) of an output's errors
    in ulps of its dtype (fp16, bf16) at each reference value, each clipped to one ulp: ssmcheck's core.output_bias."""
    info = torch.finfo(y.dtype)
    emin, fraction_bits = round(math.log2(info.tiny)), round(-math.log2(info.eps))
    _, exponent = torch.frexp(ref.abs())
    exponent = torch.where(ref == 0, emin, torch.clamp(exponent.long() - 1, min=emin))
    ulp = torch.ldexp(torch.ones_like(ref), exponent - fraction_bits)
    sign = torch.sign(ref)
    along = sign * (y.double() - ref) / ulp
    kept = torch.isfinite(along)
    along = along[kept].clamp(-1, 1)
    return tuple(_mean_and_z(errors) for errors in (along, sign[kept] * along))


def _mean_and_z(errors):
    mean, error = float(errors.mean()), float(errors.std() / math.sqrt(errors.numel()))
    return mean, (mean / error if error > 0 else math.copysign(math.inf, mean) if mean else 0.0)


def bias_clauses(bias, outputs):
    """A clause for each output (name -> (stored, reference)) whose rounding bias, along its values or toward +inf,
    lies past the floor from the baseline's mean, at |z| past the limit (`bias`: those, saved; no mean for an output
    stored in fp32)."""
    clauses = []
    for name, (out, ref) in outputs.items():
        base = None if bias is None else bias["baseline_mean"][name]
        if base is None or out.dtype == torch.float32:
            continue
        base_up = bias["baseline_mean_up"][name]
        for (mean, z), base_mean, signed in zip(signed_bias(out, ref), (base, base_up),
                                                ("signed error", "error signed toward +inf")):
            if abs(mean - base_mean) > bias["floor"] and abs(z) > bias["z_limit"]:
                clauses.append(f"{name} stored with a bias: mean {signed} {mean:+.3f} ulp (z {z:.1f}; the "
                               f"same-precision baseline's {base_mean:+.3f})")
                break
    return clauses


def same_bits(a, b):
    """Bitwise equality (NaN equals the same NaN)."""
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def other_seeds(seed, check):
    """(how the message names the two seeds, what equal bits show the rounding does not depend on, the other seed):
    seed + 1, and `seed` with the check's bit flipped (ssmcheck's scan.draws.OTHER_SEEDS)."""
    seeds = [("two seeds", "the seed", seed + 1)]
    if "flipped_bit" in check:
        bit = check["flipped_bit"]
        seeds.append((f"seeds that differ only in bit {bit}", f"bit {bit} of the seed", seed ^ (1 << bit)))
    return seeds


def seed_ignored(first, second, check, seeds="two seeds", depends="the seed"):
    """The failing clause where the states stored with two seeds are the same bits everywhere and independent
    draws would almost surely have differed somewhere (ssmcheck's scan.draws); None otherwise."""
    if not same_bits(first, second):
        return None
    if math.exp(-check["expected"]) >= check["false_alarm"]:
        return None
    return (f"stochastic rounding: its states stored with {seeds} are the same bits in all {first.numel()} "
            f"elements, where independent draws differ in {check['expected']:.0f} on average: the rounding does not "
            f"depend on {depends}")


Y_ALONE = "the call without the return flags"
BOTH_FLAGS = "the call with both return flags"


def verdict(case, y, states, y_ssm, y_alone=None, both=None):
    """(status, message) as ssmcheck judges the case, from the saved reference and limits: the timed call's y and
    states, the SSM part's y, and the other calls ssmcheck made of the case (y alone; both return flags: y, the
    varlen states, and the final states against the call's own last varlen state)."""
    ref, limits = case["reference"], case["limits"]
    sequence, position = case["sequence"], case["position"]
    others = {}  # y of another call of the case's computation, by call
    if y_alone is not None:
        others[Y_ALONE] = y_alone.cpu()
    if both is not None:
        others[BOTH_FLAGS], final, varlen = (t.cpu() for t in both)
    nonfinite = first_nonfinite(y.cpu(), ref["y"], sequence, position)
    if nonfinite is None and (~torch.isfinite(states.cpu()) & torch.isfinite(ref["states"])).any():
        nonfinite = "final states non-finite"
    for call, other in others.items():
        found = first_nonfinite(other, ref["y"], sequence, position)
        if nonfinite is None and found is not None:
            nonfinite = f"{call}: {found}"
    if nonfinite is None and both is not None:
        if (~torch.isfinite(varlen) & torch.isfinite(ref["states"])).any():
            nonfinite = f"{BOTH_FLAGS}: varlen states non-finite"
        elif (~torch.isfinite(final) & torch.isfinite(varlen[-1:])).any():
            nonfinite = f"{BOTH_FLAGS}: final states non-finite"
    if nonfinite is not None:
        return "nonfinite", nonfinite
    group_rel, group = worst_group(y.cpu(), ref["y"], sequence, position, case["chunk_size"])
    states_rel = relative(states.cpu(), ref["states"])
    judged = [("y", relative(y.cpu(), ref["y"]), limits["y"]),
              ("states", states_rel, limits["states"]),
              (f"y in {group}", group_rel, limits["group"])]
    if y_ssm is not None:
        judged.append(("SSM part C·h", relative(y_ssm.cpu(), ref["y_ssm"]), limits["ssm"]))
    judged += [(f"y of {call}", relative(other, ref["y"]), limits["y"]) for call, other in others.items()]
    if both is not None:
        judged.append((f"varlen states of {BOTH_FLAGS}", relative(varlen, ref["states"]), limits["states"]))
        bounds = case["kwargs"]["cu_seqlens"]
        if int(bounds[-1]) != int(bounds[-2]):  # a last sequence of no tokens: the row's final state is an earlier one's
            # The final state of a packed row is its last sequence's: off it by more than the limit plus the timed
            # call's own states error, the call's final state is wrong (as ssmcheck judges it).
            judged.append((f"final states of {BOTH_FLAGS}, off its last sequence's varlen state",
                           relative(final, varlen[-1:].double()), limits["states"] + states_rel))
    failed = [f"{name} error {err:.3g} > limit {limit:.3g}" for name, err, limit in judged
              if not err <= limit]
    failed += bias_clauses(case.get("bias"), {"y": (y.cpu(), ref["y"]), "final states": (states.cpu(), ref["states"])})
    if failed:
        return "fail", "; ".join(failed)
    return "pass", ", ".join(f"{name} error {err:.3g} <= {limit:.3g}" for name, err, limit in judged)


def main():
    case = torch.load(HERE / "inputs.pt", weights_only=True)
    device = "cuda" if CUDA else "cpu"
    args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in case["args"]]
    kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in case["kwargs"].items()}
    if "interpret" in kwargs:
        kwargs["interpret"] = not CUDA
    print(f"case {case['id']} ({case['params']}) on {device}")
    print(f"ssmcheck's verdict: {case['expected']['status']}: {case['expected']['message']}")
    fn = load_kernel(case["kernel"])
    pin_configs(case["pins"])
    torch.manual_seed(case["params"]["seed"])  # for kernels that draw random bits from torch
    try:
        runs = [call(fn, case, args, kwargs) for _ in range(case["repeat"])]
        y_ssm = None
        if case["reference"]["y_ssm"] is not None:  # the SSM part alone
            y_ssm = call_without_flags(fn, case, args, kwargs, D=None, z=None)
        calls = case.get("calls", {})
        y_alone = call_without_flags(fn, case, args, kwargs) if calls.get("y_alone") else None
        both = call_both_flags(fn, args, kwargs) if calls.get("both_flags") else None
        seed_check = case.get("seed_check")
        reseeded = [(seeds, depends, call(fn, case, args, {**kwargs, "seed": seed})[1])
                    for seeds, depends, seed in other_seeds(kwargs["seed"], seed_check)] if seed_check else []
    except Exception as exc:  # noqa: BLE001 (a kernel that raises is this case's verdict)
        print(f"error: {type(exc).__name__}: {exc}")
        return 4
    (y, states), *again = runs
    for run, (y2, states2) in enumerate(again, start=2):
        for name, a, b in (("y", y, y2), ("states", states, states2)):
            if not same_bits(a, b):
                print(f"fail: nondeterministic: runs 1 and {run} differ in {name}")
                return 1
    status, message = verdict(case, y, states, y_ssm, y_alone, both)
    for seeds, depends, states2 in reseeded if status in ("pass", "fail") else ():
        clause = seed_ignored(states, states2, seed_check, seeds, depends)
        if clause is not None:
            status, message = "fail", clause if status == "pass" else f"{message}; {clause}"
            break
    if case.get("unmade"):
        print(f"not made here: the serving-shaped checks that failed in ssmcheck ({', '.join(case['unmade'])}; "
              "`ssmcheck scan --invariance` makes them): the verdict below judges the kernel's own calls alone")
    print(f"{status}: {message}")
    return {"pass": 0, "fail": 1, "nonfinite": 3}[status]


if __name__ == "__main__":
    sys.exit(main())
