"""Every recorded layer of a ``precsim.record`` directory, replayed one after another
(``workload=trace workload.path=DIR`` without ``workload.layer``).

Each layer is an ordinary run into ``OUT/layer_XX/`` (reused when complete). The directory's own
files: ``layers.csv`` (layer, scheme and the final figures), ``layers.png`` (a layer x scheme
heatmap of the budget metric at the last step) and ``summary.json`` whose figures are each
scheme's *worst* layer, so the verdict recommends the cheapest scheme that fits the budget on
every layer.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

KEYS = ("rel_err", "kl", "top1", "state_drift", "read_drift")


def is_record_dir(cfg) -> bool:
    """Whether ``cfg`` replays a whole record directory (no ``workload.layer``)."""
    return (cfg.workload.kind == "trace" and cfg.workload.layer is None
            and cfg.workload.path is not None and (Path(cfg.workload.path) / "record.json")
            .is_file())


def run_all(cfg, out: Path, say=print, progress: bool = True) -> dict:
    """Replay every layer of ``cfg.workload.path`` into ``out``; returns the combined summary."""
    from . import result as res
    from .api import run
    from .errors import PrecsimError
    from .result import reusable, write_outputs
    from .workload import recorded_layers

    layers = recorded_layers(Path(cfg.workload.path))
    if not layers:
        raise PrecsimError(f"workload.path={cfg.workload.path!r} holds no layer_XX traces; "
                           "allowed: a precsim.record directory")
    per_layer, rows = {}, []
    for layer in layers:
        c = copy.deepcopy(cfg)
        c.workload.layer = layer
        sub = out / f"layer_{layer:02d}"
        s = reusable(c, sub)
        if s is None:
            s = write_outputs(c, run(c, progress=progress), sub)
        per_layer[layer] = s
        for name, figs in s["figures"].items():
            fin = figs.get("final") or {}
            rows.append({"layer": layer, "scheme": name, "step": fin.get("step"),
                         **{k: fin.get(k, math.nan) for k in KEYS}})
        fin = {n: f.get("final", {}).get(cfg.metrics.budget_metric)
               for n, f in s["figures"].items()}
        say(f"layer {layer:>3}: " + "  ".join(f"{n}={_g(v)}" for n, v in fin.items()))
    first = per_layer[min(per_layer)]
    worst = {}
    for name in first["figures"]:
        vals = [p["figures"][name]["final"] for p in per_layer.values()]
        worst[name] = {"final": {k: _worst(k, [v.get(k) for v in vals]) for k in KEYS}}
        worst[name]["final"]["step"] = first["figures"][name]["final"].get("step")
        worst[name]["final"]["worst_layer"] = max(
            per_layer, key=lambda la, n=name: _key(per_layer[la]["figures"][n]["final"].get(
                cfg.metrics.budget_metric)))
    summary = {**{k: v for k, v in first.items() if k not in ("figures", "info")},
               "figures": worst, "layers": sorted(per_layer),
               "info": {"workload": "trace (every recorded layer)",
                        "layer_dirs": [f"layer_{la:02d}" for la in sorted(per_layer)]}}
    summary["schemes"] = {n: {**first["schemes"][n], "dead_at": min(
        (p["schemes"][n]["dead_at"] for p in per_layer.values()
         if p["schemes"][n].get("dead_at") is not None), default=None)}
        for n in first["schemes"]}
    out.mkdir(parents=True, exist_ok=True)
    res.atomic_write_text(out / "layers.csv", res.rows_to_csv(rows))
    if cfg.metrics.plot is not False:
        from .plots import plot_heatmap

        plot_heatmap(rows, cfg.metrics.budget_metric, out / "layers.png",
                     f"{Path(cfg.workload.path).name}: {len(per_layer)} layers, "
                     f"{first['steps']:,} steps, final {cfg.metrics.budget_metric}")
    res.write_json(out / res.SUMMARY_FILE, summary)  # last: it marks completion
    say(f"\nfigures below: each scheme's worst layer of {len(per_layer)} (every layer: "
        f"{out / 'layers.csv'}, {out / 'layers.png'})")
    return summary


def _key(v) -> float:
    return math.inf if v is None or not math.isfinite(v) else float(v)


def _worst(key: str, vals: list):
    """The worst of a figure over layers: the lowest top-1, the highest of the others."""
    fin = [float(v) for v in vals if v is not None and math.isfinite(v)]
    if len(fin) < len(vals):
        return math.nan
    return (min(fin) if key == "top1" else max(fin)) if fin else math.nan


def _g(v) -> str:
    return "nan" if v is None or not math.isfinite(v) else f"{v:.3g}"
