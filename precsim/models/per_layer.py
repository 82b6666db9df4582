"""``experiment=per_layer``: the cheapest per-layer assignment of state formats within a
whole-model budget, verified (docs/real-models.md, "Per-layer precision").

1. **Sensitivity**: whole-model runs in which one SSM layer at a time takes a candidate format
   while every other layer keeps the template scheme at FP32 (``BASE``); the error a layer adds in
   a format is its run's figure less the all-FP32 run's, in the metric's additive unit (KL: nats
   per token; ``rel_err``: its square, as independent errors add in quadrature). Every group runs
   in the same forward passes as the reference (``per_layer.groups_per_pass`` groups a pass).
2. **Assignment**: the fewest bytes per token with the summed added errors within the target.
   An exact multiple-choice knapsack by dynamic programming over the layers, keeping the Pareto
   front of (bytes, summed error) of the layers so far: exact for any byte costs, and small (the
   front holds at most one entry per distinct byte total, ~1,200 for 48 layers and 3 formats).
   A greedy upgrade by error per byte is not exact when formats' byte steps differ.
3. **Verification**: one whole-model run of the assignment beside every uniform scheme of the
   candidate formats. A miss tightens the target by the measured/predicted ratio (and below the
   missed assignment's prediction) and verifies again, ``per_layer.rounds`` times at most; the
   result says whether the assignment was verified within the budget.
"""

from __future__ import annotations

import dataclasses
import math
import time

ADD = {"kl": lambda v: v, "rel_err": lambda v: v * v}  # a figure in its additive unit
BACK = {"kl": lambda a: a, "rel_err": lambda a: math.sqrt(max(a, 0.0))}
BASE = "fp32"  # the other layers' format while one layer is lowered
ASSIGNED, UNIFORM = "per_layer", "uniform_"  # scheme names of the verification run


def final(result, name: str, metric: str) -> float:
    """A scheme's figure at the run's last window (inf when non-finite or dead)."""
    row = [r for r in result.rows if r["scheme"] == name][-1]
    v = row.get(metric, math.nan)
    dead = result.schemes[name].get("dead_at") is not None
    return math.inf if dead or v is None or not math.isfinite(v) else float(v)


def floor_add(result, metric: str) -> float:
    """The noise floor of a whole-model run in ``metric``'s additive unit (its interval's upper
    end; 0 where the floor does not measure the metric)."""
    fl = (result.info or {}).get("floor")
    if not fl or metric != "kl":
        return 0.0
    n = fl["noise"]
    hi = n.get("kl_hi")
    return float(hi if hi is not None and math.isfinite(hi) else n["kl"])


def with_layers(tmpl, layers: dict):
    return dataclasses.replace(tmpl, layers=dict(layers), label=None)


def compact(assign: dict[int, str]) -> dict:
    """A per-layer map: the most frequent format as ``default``, the other layers listed."""
    counts: dict[str, int] = {}
    for f in assign.values():
        counts[f] = counts.get(f, 0) + 1
    default = max(counts, key=lambda f: (counts[f], f))
    return {**{la: f for la, f in sorted(assign.items()) if f != default}, "default": default}


def cheapest(delta: dict[int, dict[str, float]], cost: dict[str, float], cap: float):
    """The assignment layer -> format of fewest summed ``cost`` whose summed ``delta`` is at
    most ``cap`` (None: none), and its summed delta. Exact (see the module docstring)."""
    fmts = list(cost)
    front = [(0.0, 0.0, ())]  # (bytes, summed error, format index per layer so far)
    for la in delta:
        nxt = [(round(b + cost[f], 6), e + delta[la][f], a + (i,))
               for b, e, a in front for i, f in enumerate(fmts)]
        nxt.sort(key=lambda x: (x[0], x[1]))
        front, best = [], math.inf
        for x in nxt:
            if x[1] <= cap and x[1] < best:
                front.append(x)
                best = x[1]
        if not front:
            return None, math.inf
    b, e, a = front[0]
    return {la: fmts[i] for la, i in zip(delta, a, strict=True)}, e


def run_per_layer(cfg, device: str = "cpu", progress: bool = True):
    """Sensitivity, assignment and verification (module docstring); returns the last
    verification's Result with ``info["per_layer"]``."""
    from ..config import scheme_at, slot
    from ..cost import scheme_cost
    from ..errors import PrecsimError
    from .run import measure, prepare

    pl, mc = cfg.per_layer, cfg.metrics
    if mc.budget_metric == "accuracy":  # over a task: its own summary, not a Result
        raise PrecsimError("metrics.budget_metric=accuracy runs over a task; allowed: the "
                           "command line (experiment=per_layer task.path=FILE.jsonl) or "
                           "precsim.models.per_layer_task.run(cfg)")
    tname = pl.scheme or next(iter(cfg.schemes))
    if cfg.schemes[tname].layers is not None:
        raise PrecsimError(f"schemes.{tname}.layers is set in the per-layer template; allowed: "
                           "a uniform scheme (per_layer.formats are its layers' choices)")
    tmpl = dataclasses.replace(cfg.schemes[tname], label=None)
    fmts, metric, budget = list(pl.formats), mc.budget_metric, mc.budget
    add, back = ADD[metric], BACK[metric]
    t0 = time.perf_counter()
    at = {f: scheme_at(with_layers(tmpl, {"default": f}), None) for f in [*fmts, BASE]}
    ld = prepare(cfg, device, {f"{tname}@{f}": s for f, s in at.items()})  # (scan backend)
    layers, m = ld.layers, cfg.model
    per_token = {f: scheme_cost(at[f].kind, at[f].fmt, at[f].read_fmt, family=m.family,
                                head_dim=m.head_dim, state_dim=m.state_dim,
                                buffer_len=cfg.replay.buffer_len,
                                buffer_dtype=cfg.replay.buffer_dtype)["bytes_per_step"] * m.heads
                 for f in fmts}  # one layer's bytes per token in each format

    # 1. sensitivity: one layer lowered at a time, the others at BASE
    groups = [("base", None, None)] + [(f"L{la}:{f}", la, f) for la in layers for f in fmts]
    values: dict = {}
    n = pl.groups_per_pass
    for i in range(0, len(groups), n):
        chunk = groups[i:i + n]
        sch = {name: with_layers(tmpl, {"default": BASE, **({la: f} if la is not None else {})})
               for name, la, f in chunk}
        r = measure(cfg, ld, sch, progress,
                    f"sensitivity {i // n + 1}/{math.ceil(len(groups) / n)}")
        values.update({name: final(r, name, metric) for name in sch})
    base = values["base"]
    raw = {la: {f: add(values[f"L{la}:{f}"]) - add(base) for f in fmts} for la in layers}
    # below the floor (the model's own noise, docs/metrics.md): a layer's added error cannot be
    # told from rounding noise there; the assignment takes it at the floor, not at 0
    noise = floor_add(r, metric)
    below = {la: {f: raw[la][f] <= noise for f in fmts} for la in layers}
    delta = {la: {f: max(noise if below[la][f] else 0.0, raw[la][f]) for f in fmts}
             for la in layers}
    sens_s = time.perf_counter() - t0

    # 2-3. assignment and verification, tightened on a miss
    uniform = {f"{UNIFORM}{f}": with_layers(tmpl, {"default": f}) for f in fmts}
    cap, rounds, r = add(budget) - add(base), [], None
    for _ in range(pl.rounds):
        assign, pred_add = cheapest(delta, per_token, cap)
        if assign is None:
            break
        sch = {ASSIGNED: with_layers(tmpl, compact(assign)), **uniform}
        r = measure(cfg, ld, sch, progress, f"verification {len(rounds) + 1}")
        v = final(r, ASSIGNED, metric)
        pred = back(add(base) + pred_add)
        rounds.append({"target": back(add(base) + cap), "predicted": pred, "measured": v,
                       "bytes_per_token": sum(per_token[f] for f in assign.values()),
                       "layers": compact(assign), "fits": v <= budget})
        if v <= budget:
            break
        ratio = (add(v) - add(base)) / pred_add if pred_add > 0 and math.isfinite(v) else 4.0
        cap = min(cap / max(ratio, 1.0), pred_add) * 0.9
    if r is None:  # nothing predicted to fit: the uniform schemes alone
        r = measure(cfg, ld, uniform, progress, "uniform schemes")
    uni = {f: final(r, f"{UNIFORM}{f}", metric) for f in fmts}
    fit = [f for f in fmts if uni[f] <= budget]
    best = min(fit, key=lambda f: (per_token[f], uni[f])) if fit else None
    r.info["per_layer"] = {
        "metric": metric, "budget": budget, "template": tname, "slot": slot(tmpl),
        "formats": fmts, "base_format": BASE, "base_value": base, "layers": layers,
        "layer_bytes_per_token": per_token,
        "sensitivity": {f: {la: values[f"L{la}:{f}"] for la in layers} for f in fmts},
        "added": {f: {la: max(0.0, raw[la][f]) for la in layers} for f in fmts},
        "floor": noise, "below_floor": {f: {la: below[la][f] for la in layers} for f in fmts},
        "rounds": rounds, "verified": bool(rounds and rounds[-1]["fits"]),
        "assignment": rounds[-1]["layers"] if rounds else None,
        "uniform": {f: {"scheme": f"{UNIFORM}{f}", "value": uni[f],
                        "bytes_per_token": per_token[f] * len(layers)} for f in fmts},
        "best_uniform": best, "sensitivity_runs": len(groups),
        "sensitivity_s": round(sens_s, 3)}
    return r
