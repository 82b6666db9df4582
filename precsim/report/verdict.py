"""One run's verdict: what the command line prints at the end of a single run
(:func:`run_verdict`): every scheme against the budget, the recommendation, the knob that would
change the answer (:func:`knob`), and the per-layer block (:func:`per_layer_lines`)."""

from __future__ import annotations

import math
import shlex
from pathlib import Path

from .ranking import sig3
from .runs import costs

# in a whole-model run the same columns measure the model's logits against the float64-state
# reference (precsim.models)
MODEL_MEANING = {
    "rel_err": lambda b: f"the logits' relative RMS error <= {b:g} vs the float64-state reference",
    "kl": lambda b: f"KL(p_ref || p_scheme) <= {b:g} nats/token of the model's own next-token "
                    "distributions",
}


def _meaning(summary: dict, metric: str, budget: float) -> str:
    info = summary.get("info") or {}
    if info.get("workload") == "model" and metric in MODEL_MEANING:
        text = MODEL_MEANING[metric](budget)
        if (info.get("floor") or {}).get("baseline") == "fp32":
            text = text.replace("vs the float64-state reference", "vs the FP32-state baseline")
            text += " against the FP32-state baseline" if metric == "kl" else ""
        return text
    return BUDGET_MEANING[metric](budget)


BUDGET_MEANING = {
    "rel_err": lambda b: (f"the layer output's RMS error <= {100 * b:.3g}% of its RMS vs the "
                          f"float64 truth, i.e. an output SNR >= {-20 * math.log10(b):.1f} dB"
                          if b < 1 else "the layer output's relative RMS error vs float64"),
    "kl": lambda b: (f"KL(p_ref || p_sim) <= {b:g} nats/token through the random readout "
                     "(its size scales with metrics.logit_scale^2)"),
    "state_drift": lambda b: f"the held state's relative Frobenius error <= {b:g}",
}


def margin_text(value: float, budget: float) -> str:
    """'fits, 29% under' / 'fits, 2.5e+05x under' / 'misses by 42%' / 'misses by 3.1x'."""
    if not math.isfinite(value):
        return "misses (non-finite)"
    if value <= budget:
        if value <= 0:
            return "fits (exact)"
        r = budget / value
        return f"fits, {100 * (1 - 1 / r):.0f}% under" if r < 10 else f"fits, {r:.2g}x under"
    r = value / budget
    return f"misses by {100 * (r - 1):.0f}%" if r < 2 else f"misses, {r:.2g}x over"


def knob(scheme: str, info: dict, config: dict) -> str:
    """The setting most likely to bring a scheme that misses the budget within it."""
    kind, fmt, rd = info.get("kind"), info.get("fmt"), info.get("read_fmt")
    key = f"schemes.{scheme}"
    four = ("nvfp4", "mxfp4", "fp4_e2m1")
    if kind == "split":
        if rd in four:
            return f"an FP8 read copy ({key}.read_fmt=fp8_e4m3): its error is the read copy's"
        if info.get("rounding") == "rne" and fmt not in ("fp32", "fp64"):
            return f"stochastic rounding of the master ({key}.rounding=sr)"
        return f"a wider read copy ({key}.read_fmt=bf16)"
    if kind == "shared":
        L = int((config.get("replay") or {}).get("buffer_len") or 16)
        alt = f" or a wider checkpoint ({key}.fmt=fp8_e4m3)" if fmt in four else ""
        return (f"a longer buffer (replay.buffer_len={2 * L}: half the roundings of the "
                f"checkpoint){alt}")
    if info.get("rounding") == "rne" and fmt not in ("fp32", "fp64"):
        return f"stochastic rounding ({key}.rounding=sr)"
    return (f"a ReplaySSM split scheme with {fmt} as the read copy (kind=split, fmt=fp32, "
            f"read_fmt={fmt})")


def run_verdict(summary: dict, metric: str, budget: float, run_dir: Path | str) -> str:
    """What the CLI prints at the end of a run: every scheme's status against the budget at the
    run's last step (cheapest first), the recommendation with its margin, the knob that would
    change the answer on a near miss, and the report command for this directory and budget."""
    steps = int(summary.get("steps") or 0)
    cost = costs(summary)
    rows = []
    for name, figs in summary.get("figures", {}).items():
        info = summary.get("schemes", {}).get(name, {})
        v = (figs.get("final") or {}).get(metric)
        dead = info.get("dead_at")
        v = math.inf if v is None or not math.isfinite(v) or dead is not None else float(v)
        rows.append((float(cost.get(name, {}).get("bytes_per_step") or math.inf), v, name, info))
    rows.sort(key=lambda r: (r[0], r[1]))
    from ..floor import (
        confidence_note,
        floor_exceeds,
        floor_lines,
        interval,
        separation_line,
        within_noise,
    )

    floor = (summary.get("info") or {}).get("floor")
    # every-layer replays of a recording: the model's own cast of each layer's output
    of = None
    if metric == "rel_err":
        of = (summary.get("info") or {}).get("output_floor")
        wl = (summary.get("config") or {}).get("workload") or {}
        if of is None and wl.get("kind") == "trace" and wl.get("path"):  # one recorded layer
            from ..floor import output_floor_of

            of = output_floor_of(wl["path"]).get("output_floor")
    lines = [f"budget: {metric} <= {budget:g} at step {steps:,} "
             f"({_meaning(summary, metric, budget)}; metrics.budget_metric, metrics.budget)"]
    if floor:
        lines += floor_lines(floor, metric, budget)
    if of:
        from ..floor import output_floor_line

        lines.append(output_floor_line(of))
    w = max([len(r[2]) for r in rows] + [6])
    figs = summary.get("figures", {})
    ci = bool(floor) and metric in ("kl", "top1")
    lines.append(f"  {'scheme':<{w}}  {'B/step/head':>11}  {metric:>9}  "
                 + (f"{'95% interval':>22}  " if ci else "") + "status")
    for b, v, name, _ in rows:
        fin = figs.get(name, {}).get("final", {})
        band = f"{interval(fin.get(metric + '_lo'), fin.get(metric + '_hi')):>22}  " if ci else ""
        base = (floor.get("baseline_name") == name and floor.get("baseline") == "fp32"
                ) if floor else False
        tail = ("the baseline" if base else "within the floor's noise"
                if within_noise(v, floor, metric) else
                f"below floor ({sig3(of['rel_err'])})" if of and v <= of["rel_err"] else "")
        status = margin_text(v, budget) + (f" ({tail})" if tail else "")
        lines.append(f"  {name:<{w}}  {b:>11,.0f}  {sig3(v):>9}  {band}{status}")
    fits = [r for r in rows if r[1] <= budget]
    blocked = floor_exceeds(floor, metric, budget)
    if blocked:
        lines.append(blocked)
        fits = None
    if fits is None:
        pass
    elif not fits:
        b, v, name, info = min(rows, key=lambda r: (r[1], r[0]))
        hint = knob(name, info, summary.get("config", {}))
        lines.append(f"NO scheme is within the budget; the most accurate is {name} "
                     f"({metric}={sig3(v)}, {margin_text(v, budget)}); try {hint}")
    else:
        b, v, name, info = fits[0]
        top = max(r[0] for r in rows)
        save = f", {top / b:.2g}x fewer bytes than the costliest" if top > b * 1.01 else ""
        lines.append(f"recommended: {info.get('label', name)} [{name}]: {b:,.0f} B/step/head"
                     f"{save}; {metric}={sig3(v)}, {margin_text(v, budget)} the budget")
        if (summary.get("info") or {}).get("workload") == "model":  # how to serve it
            from ..serving import next_step_line

            lines.append(f"  {next_step_line(info)}")
        if floor and metric in ("kl",):
            fin = figs.get(name, {}).get("final", {})
            lines.append(f"  {confidence_note(fin, budget, metric)}")
            cheaper = [r for r in rows if r[0] < b]
            for other in ([cheaper[-1]] if cheaper else []) + [rows[-1]]:
                if other[2] != name:
                    sep = separation_line(floor, name, other[2])
                    if sep:
                        lines.append(sep)
        elif v > 0 and budget / v < 1.1:
            lines.append("  note: within 10% of the budget; check with more sequences "
                         "(run.seqs) or seeds before relying on it")
        for cb, cv, cname, cinfo in rows:
            if cb < b and cv <= 2 * budget and "per_layer" not in (summary.get("info") or {}):
                lines.append(f"  near miss: {cname} ({cb:,.0f} B) {margin_text(cv, budget)}; "
                             f"what could make it fit (at more bytes: rerun to compare): "
                             f"{knob(cname, cinfo, summary.get('config', {}))}")
    pl = (summary.get("info") or {}).get("per_layer")
    if pl:
        lines += per_layer_lines(pl)
    gen = (summary.get("info") or {}).get("generation")
    if gen:
        from ..floor import generation_lines

        lines += generation_lines(gen)
    lines.append("to compare with other runs: python -m precsim.report "
                 f"{shlex.quote(str(run_dir))} --metric {metric} --budget {budget:g}")
    return "\n".join(lines)


def per_layer_lines(pl: dict) -> list[str]:
    """The per-layer block of a run's verdict: the assignment beside the best uniform scheme."""
    from ..rundir import SENS_CSV, SENS_PNG

    metric, budget = pl["metric"], pl["budget"]
    n = len(pl["layers"])
    lines = [f"per-layer assignment ({pl['template']}'s {pl['slot']} per layer, from "
             f"{', '.join(pl['formats'])}; sensitivity: {pl['sensitivity_runs']} one-layer runs, "
             f"{SENS_CSV}, {SENS_PNG}):"]
    below = pl.get("below_floor") or {}
    n_below = sum(bool(v) for per in below.values() for v in per.values())
    if n_below:
        which = "; ".join(
            f"{f}: " + ", ".join(f"L{la} below floor ({sig3(pl['added'][f][la])})"
                                 for la, v in per.items() if v)
            for f, per in below.items() if any(per.values()))
        lines.append(f"  {n_below} of {n * len(pl['formats'])} sensitivities are below the "
                     f"floor ({metric} {sig3(pl['floor'])}, the model's own noise) and are taken "
                     f"at it: {which}")
    for i, rd in enumerate(pl["rounds"], 1):
        lines.append(f"  verification {i}: {as_override(rd['layers'])}: "
                     f"{rd['bytes_per_token']:,.0f} B/token,"
                     f" {metric}={sig3(rd['measured'])} (predicted {sig3(rd['predicted'])}), "
                     f"{margin_text(rd['measured'], budget)}")
    best = pl["best_uniform"]
    u = pl["uniform"].get(best, {})
    ub = f" [{u['scheme']}]: {u['bytes_per_token']:,.0f} B/token, {metric}={sig3(u['value'])}" \
        if best else ""
    if not pl["rounds"]:
        lines.append(f"  NO assignment is predicted within the budget (the all-"
                     f"{pl['base_format']} runs give {metric}={sig3(pl['base_value'])})")
    elif not pl["verified"]:
        lines.append(f"  NOT VERIFIED: the assignment missed the budget in every one of "
                     f"{len(pl['rounds'])} verifications (per_layer.rounds); best uniform"
                     f"{ub or ': none fits'}")
    else:
        rd = pl["rounds"][-1]
        if best is None:
            lines.append(f"  verified: {rd['bytes_per_token']:,.0f} B/token over {n} SSM layers,"
                         f" {metric}={sig3(rd['measured'])}; no uniform scheme fits the budget")
        else:
            save = 100 * (1 - rd["bytes_per_token"] / u["bytes_per_token"])
            than = f"{save:.1f}% fewer" if save >= 0 else f"{-save:.1f}% more"
            lines.append(f"  verified: {rd['bytes_per_token']:,.0f} B/token, {than} than the "
                         f"best uniform{ub}; per-layer {metric}={sig3(rd['measured'])}, "
                         f"{margin_text(rd['measured'], budget)} the budget")
    if pl["rounds"]:
        lines.append(f"  as a scheme: schemes.{pl['template']}.layers='"
                     f"{as_override(pl['rounds'][-1]['layers'])}'")
    return lines


def as_override(layers: dict) -> str:
    """A per-layer map as Hydra writes it: ``{2: fp16, default: nvfp4}``."""
    return "{" + ", ".join(f"{k}: {v}" for k, v in layers.items()) + "}"

