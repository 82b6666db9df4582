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

from .rundir import RECORD_FILE

KEYS = ("rel_err", "kl", "top1", "state_drift", "read_drift")


def is_record_dir(cfg) -> bool:
    """Whether ``cfg`` replays a whole record directory (no ``workload.layer``)."""
    return (cfg.workload.kind == "trace" and cfg.workload.layer is None
            and cfg.workload.path is not None and (Path(cfg.workload.path) / RECORD_FILE)
            .is_file())


def check_record(cfg) -> None:
    """Every layer of the record directory ``cfg.workload.path``, before the first one runs:
    each folder readable (every ``.npy`` whole: a truncated file fails here, memory-mapped,
    nothing read), of the recording's family (``record.json``'s layers, else the first
    layer's), with its inputs' shapes consistent (``record.json``'s shapes when it lists them)
    and at least ``run.steps`` long. One-line PrecsimError naming the layer."""
    import json

    from .errors import PrecsimError
    from .families import FAMILIES, family_of
    from .workload import load_trace_arrays, recorded_layers, trace_dims

    root = Path(cfg.workload.path)
    where = f"workload.path={str(root)!r}"
    try:
        meta = json.loads((root / RECORD_FILE).read_text())
    except (OSError, ValueError) as e:
        raise PrecsimError(f"{where}: {RECORD_FILE} is not readable ({type(e).__name__}); "
                           "allowed: a complete precsim.record directory (record again)") from None
    listed = {int(m["layer"]): m for m in (meta.get("layers") or []) if isinstance(m, dict)
              and isinstance(m.get("layer"), int)} if isinstance(meta, dict) else {}
    families = {m.get("family") for m in listed.values()} - {None}
    want = families.pop() if len(families) == 1 else None
    first = None
    for layer, path in recorded_layers(root).items():
        name = path.name
        try:
            data = load_trace_arrays(path)
        except Exception as e:  # noqa: BLE001 - truncated, unreadable, not a .npy: the layer
            why = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
            raise PrecsimError(f"{where}: {name} is not a readable trace ({type(e).__name__}: "
                               f"{why}); allowed: a complete precsim.record directory (record "
                               "again, or remove that layer)") from None
        fam = family_of(data)
        expect = listed.get(layer, {}).get("family") or want or first
        if expect is not None and fam != expect:
            raise PrecsimError(f"{where}: {name} holds a {fam} trace in a {expect} recording; "
                               f"allowed: {expect} layers only (that folder is from another "
                               "recording)")
        first = first or fam
        missing = [k for k in FAMILIES[fam].KEYS if k not in data]
        if missing:
            raise PrecsimError(f"{where}: {name} lacks {', '.join(missing)}; allowed: a complete "
                               "precsim.record directory (record again)")
        try:
            H, P, N = trace_dims(data, fam)
        except (IndexError, ValueError):
            raise PrecsimError(f"{where}: {name} has inputs of the wrong rank; allowed: a "
                               "precsim.record layer (docs/workloads.md)") from None
        T = data[FAMILIES[fam].KEYS[0]].shape[0]
        for k in FAMILIES[fam].KEYS:
            a = data[k]
            if a.shape[0] != T:
                raise PrecsimError(f"{where}: {name}/{k} has {a.shape[0]} steps, "
                                   f"{FAMILIES[fam].KEYS[0]} {T}; allowed: one length per layer")
            shp = listed.get(layer, {}).get("shapes", {}).get(k)
            if shp is not None and list(a.shape) != list(shp):
                raise PrecsimError(f"{where}: {name}/{k} has shape {tuple(a.shape)}, {RECORD_FILE} "
                                   f"says {tuple(shp)}; allowed: the recording as written")
        if cfg.run.steps > T:
            raise PrecsimError(f"run.steps={cfg.run.steps} exceeds the trace length T={T} of "
                               f"{name} in {root}; allowed: 1..{T}")


def run_all(cfg, out: Path, run_layer, say=print) -> dict:
    """Replay every layer of ``cfg.workload.path`` into ``out``, each by ``run_layer(config,
    its directory)`` (its summary: :func:`precsim.api.run_layers` runs it, or reuses a complete
    one); returns the combined summary."""
    from . import rundir
    from .errors import PrecsimError
    from .floor import output_floor_of
    from .result import rows_to_csv
    from .workload import recorded_layers

    layers = recorded_layers(Path(cfg.workload.path))
    if not layers:
        raise PrecsimError(f"workload.path={cfg.workload.path!r} holds no layer_XX traces; "
                           "allowed: a precsim.record directory")
    check_record(cfg)  # every layer before the first runs
    per_layer, rows = {}, []
    for layer in layers:
        c = copy.deepcopy(cfg)
        c.workload.layer = layer
        s = run_layer(c, out / rundir.layer_dir_name(layer))
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
                        "layer_dirs": [rundir.layer_dir_name(la) for la in sorted(per_layer)],
                        **output_floor_of(cfg.workload.path)}}
    summary["schemes"] = {n: {**first["schemes"][n], "dead_at": min(
        (p["schemes"][n]["dead_at"] for p in per_layer.values()
         if p["schemes"][n].get("dead_at") is not None), default=None)}
        for n in first["schemes"]}
    out.mkdir(parents=True, exist_ok=True)
    rundir.atomic_write_text(out / rundir.LAYERS_CSV, rows_to_csv(rows))
    if cfg.metrics.plot is not False:
        from .plots import plot_heatmap

        plot_heatmap(rows, cfg.metrics.budget_metric, out / rundir.LAYERS_PLOT,
                     f"{Path(cfg.workload.path).name}: {len(per_layer)} layers, "
                     f"{first['steps']:,} steps, final {cfg.metrics.budget_metric}")
    rundir.write_json(out / rundir.SUMMARY_FILE, summary)  # last: it marks completion
    say(f"\nfigures below: each scheme's worst layer of {len(per_layer)} (every layer: "
        f"{out / rundir.LAYERS_CSV}, {out / rundir.LAYERS_PLOT})")
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
