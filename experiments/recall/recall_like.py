"""Issue 42 item 4: do the recall models' recorded SSM-layer inputs differ from every synthetic
preset in what decides the card's verdict? (CPU, a few minutes; ``recall_like.md`` has the result.)

    python experiments/recall/recall_like.py record --work W   # one MQAR item, 4,096 tokens
    python experiments/recall/recall_like.py stats --work W    # W/stats.csv
    python experiments/recall/recall_like.py verdicts --work W # W/verdicts.csv (split_nvfp4 runs)

``record``: the task_eval built-in MQAR item (key_len=4, depth=0.5, seed 0, 4,096 prompt tokens)
through ``full_mamba2_seed0`` and ``full_gdn_seed1`` by ``precsim.record`` in one forward pass
(chunk = 4,096). The all-GDN Qwen3.5 model needs one patch: transformers' cache raises on a cache
holding only linear-attention layers (``get_seq_length``, ``get_mask_sizes``: "can only be called
on Attention layers"), so its text model runs with ``use_cache=False``, which one chunk allows.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LN2 = math.log(2.0)
TOKENS = 4096
MODELS = {"mamba2": HERE / "checkpoints" / "full_mamba2_seed0",
          "gdn": HERE / "checkpoints" / "full_gdn_seed1"}
# the recorded layers' shapes (heads, head_dim/V, state_dim/K) for the synthetic presets
SHAPES = {"mamba2": (8, 32, 64), "gdn": (8, 32, 32)}
PRESETS = ["synthetic", "seed_article"]
CHECK = (256, 1024, 4096)


def item_ids() -> np.ndarray:
    from precsim.config import TaskConfig
    from precsim.tasks import builtin_items

    t = TaskConfig(name="mqar", lengths=[TOKENS], items=1, key_len=4, depth=0.5, seed=0)
    return np.asarray(builtin_items(t, 256)[0].context, dtype=np.int64)


def record(work: Path) -> None:
    import functools

    from transformers.models.qwen3_5 import modeling_qwen3_5 as q35

    orig = q35.Qwen3_5TextModel.forward

    @functools.wraps(orig)
    def forward(self, *args, **kw):  # one chunk: no cache to carry
        kw["use_cache"] = False
        kw.pop("past_key_values", None)
        return orig(self, *args, **kw)

    q35.Qwen3_5TextModel.forward = forward
    from precsim.record import main

    work.mkdir(parents=True, exist_ok=True)
    np.save(work / "mqar4096.npy", item_ids())
    for fam, ck in MODELS.items():
        rc = main(["--model", str(ck), "--out", str(work / f"rec_{fam}"), "--ids-file",
                   str(work / "mqar4096.npy"), "--tokens", str(TOKENS), "--chunk", str(TOKENS)])
        assert rc == 0, (fam, rc)


# ---------------------------------------------------------------------------------------------


def layer_stats(d: dict, family: str) -> dict:
    """What could decide the verdict: per-head memory (half-lives), the spread of the decay over
    tokens, the inputs' tails, and the float64 state's growth and shape."""
    from precsim.families import FAMILIES

    f = {k: np.asarray(v, dtype=np.float64) for k, v in d.items()}
    H = f["dt" if family == "mamba2" else "g"].shape[1]
    for k in ("B", "C", "q", "k"):
        if k in f and f[k].shape[1] != H:
            f[k] = np.repeat(f[k], H // f[k].shape[1], axis=1)
    if family == "mamba2":
        rate, x = f["dt"] * -f["A"][None, :], f["x"]
        extra = {"B_rms": _rms(f["B"]), "C_rms": _rms(f["C"]),
                 "dt_median": float(np.median(f["dt"]))}
    else:
        rate, x = -f["g"], f["v"]
        extra = {"beta_mean": float(f["beta"].mean()), "k_rms": _rms(f["k"]),
                 "q_rms": _rms(f["q"])}
    hl = np.median(LN2 / np.maximum(rate, 1e-30), axis=0)
    lr = np.log(np.maximum(rate, 1e-30))
    xf = x.reshape(x.shape[0], H, -1)
    rms_h = np.sqrt((xf ** 2).mean(axis=(0, 2)))
    # float64 state, the oracle's step (precsim.oracle.decode), RMS at the checkpoints
    fam = FAMILIES[family]
    a = np.exp(fam.log_decay(f, f))
    S = np.zeros((H, x.shape[2], f["B" if family == "mamba2" else "k"].shape[2]))
    srms = {}
    for t in range(x.shape[0]):
        S, _ = fam.step(S, {"a": a[t], **{k: f[k][t] for k in fam.KEYS}})
        if t + 1 in CHECK:
            srms[t + 1] = float(np.sqrt((S ** 2).mean()))
    s_h = S.reshape(H, -1)
    s_max = np.abs(s_h).max(1) / np.maximum(np.sqrt((s_h ** 2).mean(1)), 1e-300)
    return {
        "hl_median": float(np.median(hl)), "hl_p90": float(np.percentile(hl, 90)),
        "hl_max": float(hl.max()), "long_100": float((hl > 100).mean()),
        "long_1000": float((hl > 1000).mean()),
        "lograte_std": float(np.median(lr.std(0))),  # per head over tokens, median over heads
        "x_rms": _rms(x), "x_kurtosis": float(((xf / rms_h[None, :, None]) ** 4).mean()),
        "x_max_over_rms": float(np.median(np.abs(xf).max(axis=(0, 2)) / rms_h)),
        "x_rms_spread": float(rms_h.max() / max(rms_h.min(), 1e-30)),
        **{f"state_rms@{t}": v for t, v in srms.items()},
        "state_growth": srms[CHECK[-1]] / srms[CHECK[0]],
        "state_max_over_rms": float(np.median(s_max)),
        "half_lives": ";".join(f"{v:.3g}" for v in hl), **extra}


def _rms(a) -> float:
    return float(np.sqrt(np.mean(np.square(a))))


def synthetic_trace(family: str, kind: str, seed: int = 0, **wl) -> dict:
    from precsim.config import to_config
    from precsim.workload import make_workload

    H, P, N = SHAPES[family]
    cfg = to_config({"model": {"family": family, "heads": H, "head_dim": P, "state_dim": N},
                     "run": {"steps": TOKENS, "seqs": 1, "seed": seed},
                     "workload": {"kind": kind, **wl}, "metrics": {"window": 256},
                     "schemes": {"fp32": {"kind": "conventional", "fmt": "fp32"}}})
    return make_workload(cfg).trace(0, TOKENS)


def stats(work: Path, extra: list[str]) -> None:
    from precsim.workload import load_trace_arrays, recorded_layers

    rows = []
    for fam in MODELS:
        for i, p in recorded_layers(work / f"rec_{fam}").items():
            rows.append({"family": fam, "inputs": f"recall layer {i}",
                         **layer_stats(load_trace_arrays(p), fam)})
        for kind in PRESETS:
            rows.append({"family": fam, "inputs": f"preset {kind}",
                         **layer_stats(synthetic_trace(fam, kind), fam)})
        for spec in extra:  # kind:key=val,key=val (a candidate preset)
            kind, _, kv = spec.partition(":")
            wl = {k: float(v) for k, v in (s.split("=") for s in kv.split(",") if s)}
            rows.append({"family": fam, "inputs": f"candidate {spec}",
                         **layer_stats(synthetic_trace(fam, kind, **wl), fam)})
    write_csv(work / "stats.csv", rows)
    for r in rows:
        print(r["family"], r["inputs"], {k: (round(v, 4) if isinstance(v, float) else v)
                                         for k, v in r.items() if k not in
                                         ("family", "inputs", "half_lives")})


def write_csv(path: Path, rows: list[dict]) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, keys)
        w.writeheader()
        w.writerows(rows)


# ---------------------------------------------------------------------------------------------


def run_one(out: Path, args: list[str]) -> dict:
    cmd = [sys.executable, "-m", "precsim", "experiment=split_nvfp4", "run.seqs=1",
           f"run.steps={TOKENS}", "run.threads=1", f"hydra.run.dir={out}", *args]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)}\n{p.stderr[-2000:]}")
    rec = [ln for ln in p.stdout.splitlines() if ln.startswith("recommended:")]
    s = json.loads((out / "summary.json").read_text())
    figs = {k: v["final"]["rel_err"] for k, v in s["figures"].items()}
    return {"recommended": rec[0].split("[")[-1].rstrip("]").split("]")[0] if rec else "none",
            **figs}


def verdicts(work: Path, seeds: int, extra: list[str], only_extra: bool = False) -> None:
    from precsim.workload import recorded_layers

    jobs = []
    for fam in MODELS:
        rec = work / f"rec_{fam}"
        for i in ([] if only_extra else recorded_layers(rec)):
            jobs.append((fam, f"recall layer {i}", ["workload=trace", f"workload.path={rec}",
                                                    f"workload.layer={i}"]))
        H, P, N = SHAPES[fam]
        shape = [f"model={fam}", f"model.heads={H}", f"model.head_dim={P}",
                 f"model.state_dim={N}"]
        for kind in ([] if only_extra else PRESETS):
            jobs.append((fam, f"preset {kind}", [*shape, f"workload={kind}"]))
        for spec in extra:
            kind, _, kv = spec.partition(":")
            jobs.append((fam, f"candidate {spec}", [*shape, f"workload={kind}",
                                                     *[f"workload.{s}" for s in kv.split(",")
                                                       if s]]))
    rows = []
    for fam, what, args in jobs:
        for seed in range(seeds):
            tag = what.replace(" ", "_").replace(":", "_").replace("=", "")
            r = run_one(work / "runs" / f"{fam}_{tag}_s{seed}", [*args, f"run.seed={seed}"])
            rows.append({"family": fam, "inputs": what, "seed": seed, **r})
            print(rows[-1], flush=True)
    write_csv(work / ("verdicts_extra.csv" if only_extra else "verdicts.csv"), rows)


INTERVENTIONS = {  # GDN trace edits: one statistic of the recorded inputs set to the preset's
    "v_gauss": "v: Gaussian, each head's RMS kept (kurtosis 3, no tails)",
    "v_flat": "v: Gaussian, one RMS for all heads (no tails, no head spread)",
    "beta_half": "beta = 0.5 (the preset's mean)",
    "g_const": "g: each head's median over tokens (no decay spread)",
    "qk_random": "q, k: random unit directions (q / sqrt(K)), as the preset",
}


def intervene(work: Path, layers: list[int], seeds: int) -> None:
    from precsim.workload import load_trace_arrays, recorded_layers

    rows = []
    for i in layers:
        src = {k: np.asarray(v, dtype=np.float32)
               for k, v in load_trace_arrays(recorded_layers(work / "rec_gdn")[i]).items()}
        for j, name in enumerate(["none", *INTERVENTIONS]):
            rng = np.random.default_rng([42, i, j])  # the same edit whatever else runs
            d = dict(src)
            v = src["v"]
            if name == "v_gauss":
                rms = np.sqrt((v ** 2).mean(axis=(0, 2)))
                d["v"] = (rng.standard_normal(v.shape) * rms[None, :, None]).astype(np.float32)
            elif name == "v_flat":
                d["v"] = (rng.standard_normal(v.shape) * _rms(v)).astype(np.float32)
            elif name == "beta_half":
                d["beta"] = np.full_like(src["beta"], 0.5)
            elif name == "g_const":
                d["g"] = np.broadcast_to(np.median(src["g"], 0), src["g"].shape).astype(
                    np.float32).copy()
            elif name == "qk_random":
                K = src["k"].shape[2]
                for key, sc in (("k", 1.0), ("q", 1.0 / math.sqrt(K))):
                    z = rng.standard_normal(src[key].shape)
                    d[key] = (z / np.linalg.norm(z, axis=-1, keepdims=True) * sc).astype(
                        np.float32)
            folder = work / "edit" / f"gdn_l{i}_{name}"
            folder.mkdir(parents=True, exist_ok=True)
            for k, a in d.items():
                np.save(folder / f"{k}.npy", np.ascontiguousarray(a))
            for seed in range(seeds):
                r = run_one(work / "runs" / f"edit_gdn_l{i}_{name}_s{seed}",
                            ["workload=trace", f"workload.path={folder}", f"run.seed={seed}"])
                rows.append({"family": "gdn", "inputs": f"recall layer {i}", "edit": name,
                             "seed": seed, **r})
                print(rows[-1], flush=True)
    write_csv(work / "interventions.csv", rows)


def tables(work: Path) -> None:
    """Markdown tables from stats.csv, verdicts*.csv, interventions.csv (for recall_like.md)."""
    def read(name):
        f = work / name
        return list(csv.DictReader(open(f))) if f.is_file() else []

    g = lambda v, n=3: f"{float(v):.{n}g}"  # noqa: E731
    print("| family | inputs | half-life median | p90 | heads > 100 tok | heads > 1,000 tok "
          "| log-rate std | x/v kurtosis | max/RMS | head RMS spread | B/C or beta | "
          "state RMS @256 / @4K | state growth | state max/RMS |")
    print("|" + "---|" * 14)
    for r in read("stats.csv"):
        extra = (f"B {g(r['B_rms'], 2)} C {g(r['C_rms'], 2)}" if r["family"] == "mamba2"
                 else f"beta {g(r['beta_mean'], 2)}")
        print(f"| {r['family']} | {r['inputs']} | {g(r['hl_median'])} | {g(r['hl_p90'])} | "
              f"{float(r['long_100']):.0%} | {float(r['long_1000']):.0%} | "
              f"{g(r['lograte_std'], 2)} | {g(r['x_kurtosis'])} | {g(r['x_max_over_rms'])} | "
              f"{g(r['x_rms_spread'])} | {extra} | {g(r['state_rms@256'], 2)} / "
              f"{g(r['state_rms@4096'], 2)} | {g(r['state_growth'], 2)} | "
              f"{g(r['state_max_over_rms'])} |")
    print()
    short = {"conventional_fp32": "FP32", "shared_nvfp4_sr": "shared", "split_fp32_nvfp4": "split"}
    for name, key in (("verdicts.csv", None), ("verdicts_extra.csv", None),
                      ("interventions.csv", "edit")):
        rows = read(name)
        if not rows:
            continue
        groups = {}
        for r in rows:
            groups.setdefault((r["family"], r["inputs"], r.get(key, "") if key else ""),
                              []).append(r)
        print(f"| family | inputs |{' edit |' if key else ''} seeds | FP32 | shared NVFP4-SR "
              "(per seed) | split FP32 + NVFP4 | recommended (per seed) |")
        print("|" + "---|" * (7 if key else 6))
        for (fam, what, ed), rs in groups.items():
            shared = " / ".join(g(r["shared_nvfp4_sr"], 2) for r in rs)
            rec = " / ".join(short.get(r["recommended"], r["recommended"]) for r in rs)
            split = sorted({g(r["split_fp32_nvfp4"], 2) for r in rs})
            fp = max(float(r["conventional_fp32"]) for r in rs)
            print(f"| {fam} | {what} |{f' {ed} |' if key else ''} {len(rs)} | {fp:.2g} | "
                  f"{shared} | {' / '.join(split)} | {rec} |")
        print()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["record", "stats", "verdicts", "intervene", "tables"])
    ap.add_argument("--layers", default="0,1", help="intervene: GDN layers")
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--only-extra", action="store_true", help="verdicts: the candidates only")
    ap.add_argument("--extra", action="append", default=[],
                    help="a candidate preset, e.g. seed_article:long_memory_frac=0.375")
    a = ap.parse_args(argv)
    if a.what == "record":
        record(a.work)
    elif a.what == "stats":
        stats(a.work, a.extra)
    elif a.what == "tables":
        tables(a.work)
    elif a.what == "intervene":
        intervene(a.work, [int(x) for x in a.layers.split(",")], a.seeds)
    else:
        verdicts(a.work, a.seeds, a.extra, a.only_extra)


if __name__ == "__main__":
    main()
