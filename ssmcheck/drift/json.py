"""One drift case as the plain dict of the JSON report.

JSON case keys (always present; figures a case did not produce are null):
    id, status, message, seconds,
    params {kernel, state_dtype, rounding, regime, steps, batch, nheads, headdim, dstate, ngroups, model, seed, trials,
            config},
    checkpoints [{step, state_rel, out_rel, bias,    kernel vs float64 reference, mean over trials,
                  step_out_rel}]                     (step_out_rel: out vs the exact step from its own state),
    growth_exponent                                  alpha in state_rel ~ step**alpha,
    bias_z, store_bias_ulp                           z and mean of the per-store rounding error (ulps),
    store_bias_up {mean_ulp, z}                      the same mean with each error signed toward +inf, not along
                                                     its exact value, and its z (null: no steps ran),
    bias_resolution_ulp                              the smallest such mean the bias test could see at these
                                                     stores' count and spread (stochastic cases; else null),
    subnormal_stores {subnormal, flushed}            an fp16 state's stores whose exact value lay in fp16's
                                                     subnormal range, and of them those stored as 0 (0 and 0
                                                     for other state dtypes; null: no steps ran),
    misrounded_stores {count, stores, most_at}       stores farther from the exact update of the kernel's own state
                                                     than their rounding moves a value plus what float32 arithmetic
                                                     explains (drift.stats.store_sums), of `stores`, and the state
                                                     row holding the most, {batch, head, channel} (null: none),
    output_bias {dtype, count, mean_ulp, z, beyond,  an fp16/bf16 output's mean signed rounding error (ulps of its
                 mean_up_ulp, z_up}                  dtype, along the exact output of the kernel's own state, over
                                                     the checkpoints; the *_up pair signed toward +inf;
                                                     core.output_bias); null for fp32,
    baseline {checkpoints, growth_exponent, output_bias}   the rounded float64 recurrence vs the reference,
    ratio                                            worst kernel / baseline state drift over checkpoints,
    crossing_step, crossing_observed                 where state_rel reaches the tolerance,
    first_nonfinite {output, step, trial, batch, head, channel, state_index, reads_outside, unwritten},
    repeat {runs, identical, max_abs, run, output, trial, step, batch, head, channel}   with --repeat K > 1,
    decode_loop                                      "graph" (the steps ran as CUDA graph replays), "eager",
                                                     or "eager: " and why no graph (null: no steps ran);
                                                     on CUDA, where the float64 side (drift.follow) did not run
                                                     as its Triton kernel, "; float64 step torch.compile: " or
                                                     "; float64 step eager: " and why,
    slotted_trials                                   the trials that decoded through state_batch_indices, the
                                                     state's rows on slots of a pool with NaN spares (a kernel
                                                     taking slot indices: one trial of two; null: no steps ran),
    slots {seed, pool, pad_slot_id, slots, pad_rows, slot_indices, live, untouched, pad_out}   for a kernel taking slot
                                                     indices (drift.slots; each check {status, message, ...}),
                                                     and speculative, drafts, kept for one verifying draft
                                                     tokens (drift.speculative), and unslotted {status,
                                                     message, trial, steps} where every trial decoded through
                                                     slot indices: a short trial without them (drift.run),
    independence {status, message, widths, rows, heads, channels, state_indices, calls, seed_bit_30,
                  seed_bit_0}                        for a stochastic-
                                                     rounding case: twin state elements along each axis (and the
                                                     step called twice with two seeds: calls; with the first seed
                                                     and its bit 30, then bit 0, flipped, for a kernel that takes
                                                     a seed: seed_bit_30, seed_bit_0), each a list of
                                                     {distance, pairs, differ, expected, sigma} (neighbours and a
                                                     period apart): the twins whose stored bits differ and how
                                                     many independent draws would differ in (drift.independence);
                                                     null otherwise,
    stdout                                           what the kernel printed over the steps ("" when nothing).
"""

from __future__ import annotations

from dataclasses import asdict

from ssmcheck.core import outside
from ssmcheck.core.output_bias import OutputBias
from ssmcheck.drift.results import DriftResult, NonfiniteStep


def case_json(result: DriftResult) -> dict:
    run, v = result.run, result.verdict
    return {
        "id": result.case.id,
        "status": result.status.value,
        "message": v.message,
        "seconds": round(result.seconds, 4),
        "params": result.case.params(),
        "checkpoints": [asdict(c) for c in run.checkpoints] if run else [],
        "growth_exponent": v.growth_exponent,
        "bias_z": v.bias_z,
        "store_bias_ulp": v.store_bias_ulp,
        "store_bias_up": {"mean_ulp": run.store_errors.mean_up, "z": run.store_errors.z_up} if run else None,
        "bias_resolution_ulp": v.bias_resolution_ulp,
        "output_bias": _bias(run.output_bias) if run else None,
        "subnormal_stores": {"subnormal": run.store_errors.subnormal,
                             "flushed": run.store_errors.flushed} if run else None,
        "misrounded_stores": {"count": run.store_errors.misrounded, "stores": run.store_errors.count,
                              "most_at": _row(run.store_errors.misrounded_at)} if run else None,
        "baseline": {
            "checkpoints": [asdict(c) for c in run.baseline],
            "growth_exponent": v.baseline_growth_exponent,
            "output_bias": _bias(run.baseline_output_bias),
        } if run else None,
        "ratio": v.ratio,
        "crossing_step": v.crossing_step,
        "crossing_observed": v.crossing_observed,
        "first_nonfinite": _nonfinite(run.first_nonfinite) if run and run.first_nonfinite else None,
        "repeat": asdict(run.repeat) if run and run.repeat else None,
        "decode_loop": run.decode_loop if run else None,
        "slotted_trials": list(run.slotted_trials) if run else None,
        "slots": {**result.slot_layout, **{c.name: {"status": c.status.value, "message": c.message, **c.figures}
                                           for c in result.slots}} if result.slot_layout else None,
        "independence": {"status": result.independence.status.value, "message": result.independence.message,
                         **result.independence.figures} if result.independence else None,
        "stdout": result.stdout,
    }


def _bias(bias: OutputBias | None) -> dict | None:
    return None if bias is None else bias.as_dict()


def _nonfinite(where: NonfiniteStep) -> dict:
    return {**asdict(where), "reads_outside": outside.as_json(where.reads_outside)}


def _row(index: tuple[int, ...] | None) -> dict | None:
    return None if index is None else dict(zip(("batch", "head", "channel"), index))
