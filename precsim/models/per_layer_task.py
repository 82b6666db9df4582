"""``experiment=per_layer metrics.budget_metric=accuracy`` over a task: the cheapest per-layer
assignment of state formats whose task-accuracy drop stays within ``metrics.budget``, verified
(docs/real-models.md, "Per-layer precision"; docs/tasks.md).

The steps of :mod:`precsim.models.per_layer` with the task's items in place of the documents,
scored by :mod:`precsim.models.task`'s functions (the same rows, batches and correctness):

1. **Sensitivity**: one-layer runs (that layer in a candidate format, every other layer at the
   template's FP32, ``BASE``) side by side on every item, ``per_layer.groups_per_pass`` a pass,
   each pass beside the float64 reference, the FP32-state baseline and the noise floor. A run's
   figure is its accuracy drop against the baseline (``task.metric``; SR seeds averaged), the drop
   a layer adds in a format that figure less the all-FP32 template run's. Drops add (summed
   over layers they predict the assignment's). Where the noise floor drops items (the model's
   own rounding noise flips them), a drop at or below its drop is taken at the floor.
2. **Assignment**: :func:`precsim.models.per_layer.cheapest` (the exact knapsack) over the added
   drops. Accuracy moves in steps of one item, so many layers add no drop at all; among equal
   drops the one whose gold answers lose the most log-likelihood counts as the larger (a
   tie-break below 1e-6 in all: it never moves a prediction by an item), so a missed
   verification, which tightens the target below the missed prediction, lifts the layers most
   at risk first.
3. **Verification**: one run of the assignment beside the uniform scheme of each candidate
   format, on every item, with the paired statistics of ``experiment=task_eval`` (items lost and
   gained, exact McNemar p, bootstrap interval of the change) against the baseline; a miss
   tightens the target and verifies again, ``per_layer.rounds`` times at most.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import numpy as np

METRIC = "accuracy_drop"  # info["per_layer"]["metric"]: every figure is a drop vs the baseline
TIE = 1e-6  # the log-likelihood tie-break's total over all layers (far below one item)


def _runs(cfg, name: str) -> list[str]:
    from .run import seed_names

    return seed_names(cfg)[name]


def _acc(per: dict, runs: list[str], metric: str, keep: np.ndarray) -> float:
    """A scheme's accuracy on the kept items, its SR seeds averaged."""
    return float(np.mean([per[r][metric][keep].mean() for r in runs])) if keep.any() \
        else math.nan


def _lp_loss(per: dict, runs: list[str], base: str, keep: np.ndarray) -> float:
    """The mean log-likelihood the gold answers lose against ``base`` (>= 0; a non-finite
    score counts as a large loss)."""
    b = per[base]["acc:lp_gold"][keep]
    out = []
    for r in runs:
        d = b - per[r]["acc:lp_gold"][keep]
        out.append(np.where(np.isfinite(d), np.maximum(d, 0.0), 1e6).mean() if d.size else 0.0)
    return float(np.mean(out))


def run(cfg, device: str = "cpu", progress: bool = True) -> dict:
    """Sensitivity, assignment and verification over ``cfg``'s task (module docstring): the
    last verification's task summary (:func:`precsim.models.task_report.summarize`) with
    ``per_layer`` (as :func:`precsim.models.per_layer.run_per_layer`'s ``info["per_layer"]``,
    figures in accuracy drops) and ``experiment: per_layer``."""
    from ..config import scheme_at, slot
    from ..cost import scheme_cost
    from ..errors import PrecsimError
    from .load import layer_shape
    from .per_layer import ASSIGNED, BASE, UNIFORM, cheapest, compact, with_layers
    from .run import baseline_index
    from .task import load, load_task, score

    pl, mc = cfg.per_layer, cfg.metrics
    tname = pl.scheme or next(iter(cfg.schemes))
    if cfg.schemes[tname].layers is not None:
        raise PrecsimError(f"schemes.{tname}.layers is set in the per-layer template; allowed: "
                           "a uniform scheme (per_layer.formats are its layers' choices)")
    tmpl = dataclasses.replace(cfg.schemes[tname], label=None)
    fmts, budget, metric = list(pl.formats), float(mc.budget), cfg.task.metric
    t0 = time.perf_counter()
    at = {f: scheme_at(with_layers(tmpl, {"default": f}), None) for f in [*fmts, BASE]}
    ld, tok = load(cfg, device, {f"{tname}@{f}": s for f, s in at.items()})
    vocab = int(ld.model.get_output_embeddings().weight.shape[0])
    items, source = load_task(cfg, tok, vocab)
    layers = ld.layers
    family, heads, head_dim, state_dim = layer_shape(ld.model)
    per_token = {f: scheme_cost(at[f].kind, at[f].fmt, at[f].read_fmt, family=family,
                                head_dim=head_dim, state_dim=state_dim,
                                buffer_len=cfg.replay.buffer_len,
                                buffer_dtype=cfg.replay.buffer_dtype)["bytes_per_step"] * heads
                 for f in fmts}  # one layer's bytes per token in each format
    b = baseline_index(cfg)

    # 1. sensitivity: one layer lowered at a time, the others at BASE; each figure is a drop
    # against its own pass's baseline
    groups = [("base", None, None)] + [(f"L{la}:{f}", la, f) for la in layers for f in fmts]
    values, lost, lp_loss, noise = {}, {}, {}, 0.0
    n = pl.groups_per_pass
    for i in range(0, len(groups), n):
        chunk = groups[i:i + n]
        sch = {name: with_layers(tmpl, {"default": BASE, **({la: f} if la is not None else {})})
               for name, la, f in chunk}
        c = dataclasses.replace(cfg, schemes=sch)
        gs, per, _ = score(c, ld, items, progress,
                           f"sensitivity {i // n + 1}/{math.ceil(len(groups) / n)}")
        bname = gs[b].name
        bvec = per[bname][metric]
        keep = np.isfinite(bvec)
        acc_b = _acc(per, [bname], metric, keep)
        for name in sch:
            runs = _runs(c, name)
            values[name] = acc_b - _acc(per, runs, metric, keep)
            lost[name] = float(np.mean([((bvec[keep] == 1) & (per[r][metric][keep] == 0)).sum()
                                        for r in runs]))
            lp_loss[name] = _lp_loss(per, runs, bname, keep)
        nz = next(g.name for g in gs if g.role == "noise")
        noise = max(noise, acc_b - _acc(per, [nz], metric, keep), 0.0)
    base = values["base"]
    raw = {la: {f: values[f"L{la}:{f}"] - base for f in fmts} for la in layers}
    below = {la: {f: noise > 0 and raw[la][f] <= noise for f in fmts} for la in layers}
    tie = {la: {f: TIE / len(layers) * (x / (1.0 + x))
                for f in fmts for x in [lp_loss[f"L{la}:{f}"]]} for la in layers}
    delta = {la: {f: max(noise if below[la][f] else 0.0, raw[la][f]) + tie[la][f]
                  for f in fmts} for la in layers}
    sens_s = time.perf_counter() - t0

    # 2-3. assignment and verification, tightened on a miss
    uniform = {f"{UNIFORM}{f}": with_layers(tmpl, {"default": f}) for f in fmts}
    cap, rounds, summary, seen = budget - base, [], None, []
    for _ in range(pl.rounds):
        assign, pred_add = cheapest(delta, per_token, cap)
        if assign is None or assign in seen:
            break
        seen.append(assign)
        sch = {ASSIGNED: with_layers(tmpl, compact(assign)), **uniform}
        summary = _verify(cfg, ld, items, sch, source, progress, f"verification {len(rounds) + 1}")
        row = summary["schemes"][ASSIGNED]
        v = 0.0 - row["delta"] if math.isfinite(row["delta"]) else math.inf
        pred = base + sum(delta[la][f] - tie[la][f] for la, f in assign.items())
        rounds.append({"target": base + cap, "predicted": pred, "measured": v,
                       "bytes_per_token": sum(per_token[f] for f in assign.values()),
                       "layers": compact(assign), "fits": v <= budget,
                       "drop_lo": 0.0 - row["delta_hi"], "drop_hi": 0.0 - row["delta_lo"],
                       "lost": row["lost"], "gained": row["gained"],
                       "p_mcnemar": row["p_mcnemar"], "mdd": row["mdd"]})
        if v <= budget:
            break
        ratio = (v - base) / pred_add if pred_add > 0 and math.isfinite(v) else 4.0
        cap = min(cap / max(ratio, 1.0), pred_add) * 0.9
    if summary is None:  # nothing predicted to fit: the uniform schemes alone
        summary = _verify(cfg, ld, items, uniform, source, progress, "uniform schemes")
    uni = {f: 0.0 - summary["schemes"][f"{UNIFORM}{f}"]["delta"] for f in fmts}
    uni = {f: v if math.isfinite(v) else math.inf for f, v in uni.items()}
    fit = [f for f in fmts if uni[f] <= budget]
    best = min(fit, key=lambda f: (per_token[f], uni[f])) if fit else None
    summary["experiment"] = "per_layer"
    summary["timing_s"] = {**summary["timing_s"], "sensitivity_s": round(sens_s, 3),
                           "wall_s": round(time.perf_counter() - t0, 3)}
    summary["per_layer"] = {
        "metric": METRIC, "task_metric": metric, "budget": budget, "template": tname,
        "slot": slot(tmpl), "formats": fmts, "base_format": BASE, "base_value": base,
        "layers": layers, "layer_bytes_per_token": per_token,
        "sensitivity": {f: {la: values[f"L{la}:{f}"] for la in layers} for f in fmts},
        "added": {f: {la: max(0.0, raw[la][f]) for la in layers} for f in fmts},
        "lost": {f: {la: lost[f"L{la}:{f}"] for la in layers} for f in fmts},
        "gold_lp_loss": {f: {la: lp_loss[f"L{la}:{f}"] for la in layers} for f in fmts},
        "floor": noise, "below_floor": {f: {la: below[la][f] for la in layers} for f in fmts},
        "rounds": rounds, "verified": bool(rounds and rounds[-1]["fits"]),
        "assignment": rounds[-1]["layers"] if rounds else None,
        "uniform": {f: {"scheme": f"{UNIFORM}{f}", "value": uni[f],
                        "bytes_per_token": per_token[f] * len(layers)} for f in fmts},
        "best_uniform": best, "sensitivity_runs": len(groups), "items": len(items),
        "sensitivity_s": round(sens_s, 3)}
    return summary


def _verify(cfg, ld, items, schemes: dict, source: str, progress: bool, desc: str) -> dict:
    """One run of ``schemes`` on every item: the task summary (paired against the baseline)."""
    from .task import score
    from .task_report import summarize

    c = dataclasses.replace(cfg, schemes=dict(schemes))
    groups, per, run_s = score(c, ld, items, progress, desc)
    return summarize(c, items, groups, per, source, ld, {"model_s": round(run_s, 3)})


def run_cli(c, out: Path, say, progress: bool = True) -> dict:
    """From the command line (``precsim.cli``, a per_layer config with a task): run, write the run
    directory (``sensitivity.csv`` and its heatmap, then the verification's ``items.csv``, plot
    and ``summary.json``, last), print the task table and the assignment."""
    from .. import engines
    from ..report import per_layer_lines
    from ..result import write_sensitivity
    from ..rundir import ITEMS_CSV, SENS_CSV, SUMMARY_FILE
    from .task_report import format_table, write

    summary = run(c, engines.resolve_device(c.run.device), progress=progress)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plot = c.metrics.plot is not False
    write_sensitivity(summary["per_layer"], out, plot)
    public = write(summary, out, plot)
    say(format_table(public))
    say("\n".join(["", *per_layer_lines(public["per_layer"])]))
    say(f"\n-> {out} ({ITEMS_CSV}, {SUMMARY_FILE}, {SENS_CSV})")
    return public
