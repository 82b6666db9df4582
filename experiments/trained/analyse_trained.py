"""Tables, CSVs and figures of the trained-model studies (``studies.py analyse``), from the run
directories ``studies.py run`` wrote (or their packed copy): every number read from precsim's own
``metrics.csv`` / ``summary.json`` / ``layers.csv``; the head statistics from ``stats.json``
(``trace_stats`` over each recording, computed where the recording is)."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
EXP = HERE.parent
LN2 = math.log(2.0)
PUBLISHED_RATIO = 0.136 / 0.0038  # ReplaySSM's shared NVFP4 vs split KL, 36x
SYNTHETIC_RATIO = {"mamba2": 3.2, "gdn": 3.9}  # study 8 on the synthetic workload
SR_PAIRS = [("FP16", "conventional_fp16", "conventional_fp16_sr", "2.32% → −0.32%"),
            ("BF16", "conventional_bf16", "conventional_bf16_sr", "—"),
            ("INT8 block", "conventional_int8_b128", "conventional_int8_b128_sr", "2.87% → 0.00%"),
            ("FP8 E4M3 block", "conventional_fp8_b128", "conventional_fp8_b128_sr",
             "12.68% → 1.96%")]


# ---------------------------------------------------------------------------------------------
# head statistics (a trace dict: Mamba-2 dt (T,H), x (T,H,P), B/C (T,G,N), A (H,);
# GDN g, beta (T,H), q/k (T,G,K), v (T,H,V))


def trace_stats(d: dict, family: str) -> dict:
    """Per-head memory and the inputs' scales and tails of one layer's trace."""
    f = {k: np.asarray(v, dtype=np.float64) for k, v in d.items()}
    if family == "mamba2":
        rate = f["dt"] * -f["A"][None, :]
        x, extra = f["x"], {"B_rms": _rms(f["B"]), "C_rms": _rms(f["C"]),
                            "dt_median": float(np.median(f["dt"]))}
    else:
        rate = -f["g"]
        x, extra = f["v"], {"beta_mean": float(f["beta"].mean()), "k_rms": _rms(f["k"]),
                            "q_rms": _rms(f["q"])}
    hl = np.median(LN2 / np.maximum(rate, 1e-30), axis=0)  # per head, tokens
    xf = x.reshape(x.shape[0], x.shape[1], -1)
    rms_h = np.sqrt((xf ** 2).mean(axis=(0, 2)))
    tail = np.abs(xf).max(axis=(0, 2)) / rms_h  # per head: the largest |x| in its rms units
    kurt = ((xf / rms_h[None, :, None]) ** 4).mean()
    return {"half_life": hl.tolist(), "x_rms": _rms(x), "x_rms_spread": float(
        rms_h.max() / max(rms_h.min(), 1e-30)), "x_max_over_rms": float(np.median(tail)),
        "x_kurtosis": float(kurt), **extra}


def _rms(a) -> float:
    return float(np.sqrt(np.mean(np.square(a))))


def synthetic_stats(family: str, heads: int, head_dim: int, state_dim: int, steps=4096) -> dict:
    """``trace_stats`` of precsim's default synthetic workload at a layer shape (sequence 0)."""
    from precsim.config import to_config
    from precsim.workload import make_workload

    cfg = to_config({"model": {"family": family, "heads": heads, "head_dim": head_dim,
                               "state_dim": state_dim}, "run": {"steps": steps, "seqs": 1},
                     "metrics": {"window": min(256, steps)},
                     "schemes": {"fp32": {"kind": "conventional", "fmt": "fp32"}}})
    return trace_stats(make_workload(cfg).trace(0, steps), family)


def record_stats(rec: Path) -> dict:
    """``trace_stats`` of every layer of a ``precsim.record`` directory."""
    from precsim.workload import load_trace_arrays, recorded_layers

    meta = json.loads((rec / "record.json").read_text())
    fam = {int(la["layer"]): la["family"] for la in meta["layers"]}
    return {str(i): trace_stats(load_trace_arrays(p), fam[i])
            for i, p in recorded_layers(rec).items()}


# ---------------------------------------------------------------------------------------------
# reading runs


def metrics(run: Path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    with (run / "metrics.csv").open() as f:
        for r in csv.DictReader(f):
            out.setdefault(r["scheme"], []).append(
                {k: (float(v) if v not in ("", None) else math.nan) for k, v in r.items()
                 if k != "scheme"})
    return out


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def smooth(a: np.ndarray, k: int) -> np.ndarray:
    return np.convolve(a, np.ones(k) / k, mode="valid")


def col(rows: list[dict], key: str) -> np.ndarray:
    return np.array([r[key] for r in rows])


def verdict_line(stdout: str) -> str:
    m = re.search(r"^(recommended: .*|NO configuration.*)$", stdout, re.M)
    return m.group(1) if m else "(no verdict line)"


def runs_log(work: Path) -> dict[str, dict]:
    out = {}
    for line in (work / "runs.jsonl").read_text().splitlines():
        d = json.loads(line)
        if d["rc"] == 0 or d["name"] not in out:
            out[d["name"]] = d
    return out


def cheapest_within(s: dict, figs: dict[str, float], budget: float) -> str | None:
    cost = {n: s["cost"][n]["bytes_per_step"] for n in figs}
    fit = [n for n, v in figs.items() if math.isfinite(v) and v <= budget]
    return min(fit, key=lambda n: cost[n]) if fit else None


def write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        w.writeheader()
        w.writerows(rows)


def md_table(rows: list[dict], cols: list[str] | None = None) -> str:
    cols = cols or list(dict.fromkeys(k for r in rows for k in r))
    fmt = lambda v: (f"{v:.3g}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int)  # noqa: E731
                     else str(v))
    return "\n".join(["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
                     + ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows])


def run_info(work: Path, names: list[str], out: Path, what: str) -> None:
    log = runs_log(work)
    host = {}
    for n in names:
        p = work / n / "summary.json"
        if p.exists():
            s = summary(work / n)
            host = {"host": s.get("host"), "device": s.get("device"),
                    "finished_at": s.get("finished_at")}
    (out / "run_info.json").write_text(json.dumps({
        "study": what, **host, "driver": "python experiments/trained/studies.py run "
        "(then analyse)", "commands": [{"name": n, "argv": " ".join(log[n]["argv"]).replace(
            str(HERE.parents[1]) + "/", ""),
                                        "rc": log[n]["rc"], "wall_s": log[n]["wall_s"]}
                                       for n in names if n in log]}, indent=1))


# ---------------------------------------------------------------------------------------------
# the studies


def study_kl(work: Path, out: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, names = [], []
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), squeeze=False)
    colors = {"conventional_fp32": "0.5", "shared_nvfp4_sr": "C3", "split_fp32_nvfp4": "C0",
              "split_fp16sr_nvfp4": "C2"}
    for i, m in enumerate(("mamba2", "gdn")):
        for j, h in enumerate(("val32k", "train131k")):
            name = f"{m}_{h}_pair"
            if not (work / name / "metrics.csv").exists():
                continue
            names.append(name)
            met, s = metrics(work / name), summary(work / name)
            ax = axes[i][j]
            for sch, r in met.items():
                step, kl = col(r, "step"), col(r, "kl")
                k = max(1, len(step) // 64)  # smooth to ~64 points for the eye
                ax.plot(step[k - 1:], smooth(kl, k), color=colors.get(sch), label=sch)
                ax.fill_between(step[k - 1:], smooth(col(r, "kl_p10"), k),
                                smooth(col(r, "kl_p90"), k),
                                color=colors.get(sch), alpha=0.15, lw=0)
                fin = s["figures"][sch]["final"]
                rows.append({"model": m, "documents": f"{h} ({s['info']['documents']} docs)",
                             "tokens": int(step[-1]), "scheme": sch,
                             "bytes_per_step_head": round(s["cost"][sch]["bytes_per_step"]),
                             "kl_mean": float(np.mean(kl)), "kl_last_window": float(kl[-1]),
                             "kl_last_p10": float(r[-1]["kl_p10"]),
                             "kl_last_p90": float(r[-1]["kl_p90"]),
                             "top1_mean": float(np.mean(col(r, "top1"))),
                             "state_drift_final": fin.get("state_drift")})
            ax.set(xscale="log", yscale="log", xlabel="tokens",
                   ylabel="KL(ref ‖ scheme), nats/token",
                   title=f"{m}, {h}: {s['info']['documents']} documents (bands p10-p90)")
            ax.legend(fontsize=7)
    fig.suptitle("Trained byte-level models: whole-model KL per token, shared NVFP4-SR vs split")
    fig.tight_layout()
    fig.savefig(out / "kl.png", dpi=110)
    plt.close(fig)
    write_csv(out / "results.csv", rows)
    ratios = []
    for m in ("mamba2", "gdn"):
        for h in ("val32k", "train131k"):
            g = {r["scheme"]: r for r in rows if r["model"] == m and r["documents"].startswith(h)}
            if not g:
                continue
            sh = g["shared_nvfp4_sr"]
            ratios.append({"model": m, "documents": sh["documents"], "tokens": sh["tokens"],
                           "shared KL (mean)": sh["kl_mean"],
                           "split FP32 KL (mean)": g["split_fp32_nvfp4"]["kl_mean"],
                           "ratio (mean)": sh["kl_mean"] / g["split_fp32_nvfp4"]["kl_mean"],
                           "ratio (last window)": sh["kl_last_window"]
                           / g["split_fp32_nvfp4"]["kl_last_window"],
                           "ratio vs split FP16-SR": sh["kl_mean"]
                           / g["split_fp16sr_nvfp4"]["kl_mean"],
                           "synthetic (study 8)": SYNTHETIC_RATIO[m],
                           "published": PUBLISHED_RATIO})
    run_info(work, names, out, "study_trained_kl")
    return md_table(ratios) + "\n\n" + md_table(rows)


def study_engines(work: Path, out: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, layer_rows, names, sr = [], [], [], []
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), squeeze=False)
    for i, m in enumerate(("mamba2", "gdn")):
        wn, tn = f"{m}_val32k_engines", f"{m}_trace_engines"
        if not (work / wn / "metrics.csv").exists():
            continue
        names += [wn, tn, f"rec_{m}"]
        met, s = metrics(work / wn), summary(work / wn)
        lay = {}
        if (work / tn / "layers.csv").exists():
            with (work / tn / "layers.csv").open() as f:
                for r in csv.DictReader(f):
                    lay.setdefault(r["scheme"], []).append(float(r["rel_err"]))
                    layer_rows.append({"model": m, **r})
        ff = s["info"].get("first_flip") or {}
        for sch, r in met.items():
            kl = col(r, "kl")
            flips = ff.get(sch) if isinstance(ff, dict) else None
            rows.append({"model": m, "scheme": sch, "label": s["schemes"][sch].get("label") or sch,
                         "bytes_per_step_head": round(s["cost"][sch]["bytes_per_step"]),
                         "kl_mean": float(np.mean(kl)), "kl_last_window": float(kl[-1]),
                         "top1_mean": float(np.mean(col(r, "top1"))),
                         "first_flip_median": _median_flip(flips, int(col(r, "step")[-1])),
                         "docs_flipped": s["figures"][sch]["final"].get("flipped"),
                         "layer_rel_err_median": float(np.median(lay[sch])) if sch in lay
                         else math.nan,
                         "layer_rel_err_worst": float(np.max(lay[sch])) if sch in lay
                         else math.nan})
        by = {r["scheme"]: r for r in rows if r["model"] == m}
        for fmt, rne, srn, t16 in SR_PAIRS:
            a, b = by[rne], by[srn]
            sr.append({"model": m, "format": fmt, "KL SR/RTN": b["kl_mean"] / a["kl_mean"],
                       "top-1 SR / RTN": f"{b['top1_mean']:.4f} / {a['top1_mean']:.4f}",
                       "layer rel_err SR/RTN (median layer)": b["layer_rel_err_median"]
                       / a["layer_rel_err_median"],
                       "Nemotron 3 Table 16 (accuracy drop RTN → SR)": t16})
        ax = axes[0][i]
        mr = [r for r in rows if r["model"] == m]
        ax.scatter([r["bytes_per_step_head"] for r in mr], [r["kl_mean"] for r in mr])
        for r in mr:
            ax.annotate(r["label"], (r["bytes_per_step_head"], r["kl_mean"]), fontsize=6)
        ax.set(xscale="log", yscale="log", xlabel="bytes per step and head",
               ylabel="KL per token, mean over 32,768 tokens x 8 documents", title=m)
    fig.suptitle("Trained models: the serving engines' state formats, whole model")
    fig.tight_layout()
    fig.savefig(out / "engines.png", dpi=110)
    plt.close(fig)
    write_csv(out / "results.csv", rows)
    if layer_rows:
        write_csv(out / "layers.csv", layer_rows)
    run_info(work, names, out, "study_trained_engines")
    cols = ["model", "label", "bytes_per_step_head", "kl_mean", "kl_last_window", "top1_mean",
            "first_flip_median", "docs_flipped", "layer_rel_err_median", "layer_rel_err_worst"]
    return md_table(sr) + "\n\n" + md_table(rows, cols)


def _median_flip(flips, n: int):
    if not flips:
        return "none"
    v = [f if f is not None else math.inf for f in flips]
    med = float(np.median(v))
    return "none" if not math.isfinite(med) else int(med)


def study_verdict(work: Path, out: Path) -> str:
    log = runs_log(work)
    rows, names, stats = [], [], []
    for m in ("mamba2", "gdn"):
        for name, what, metric, budget in (
                (f"{m}_synthetic_split", "layer, synthetic workload (card default)", "rel_err",
                 0.0625),
                (f"{m}_trace_split", "layer, trained model's recorded inputs (worst layer)",
                 "rel_err", 0.0625),
                (f"{m}_val32k_split", "whole model, KL per token", "kl", 0.01),
                (f"{m}_val32k_split", "whole model, logits rel_err", "rel_err", 0.0625)):
            if not (work / name / "summary.json").exists():
                continue
            names.append(name)
            s = summary(work / name)
            figs = {n: s["figures"][n]["final"][metric] for n in s["figures"]}
            best = cheapest_within(s, figs, budget)
            rows.append({"model": m, "run": what, "budget": f"{metric} <= {budget}",
                         **{n: figs[n] for n in sorted(figs)},
                         "verdict": best or "none fits",
                         "precsim's line": "(computed from summary.json)" if "logits" in what
                         else verdict_line(log.get(name, {}).get("stdout_tail", ""))})
        sp = work / f"stats_{m}.json"
        if sp.exists():
            st = json.loads(sp.read_text())
            for src, d in st.items():
                hl = np.asarray(d["half_life"])
                stats.append({"model": m, "inputs": src, "heads": len(hl),
                              "half-life median": float(np.median(hl)),
                              "p10": float(np.percentile(hl, 10)),
                              "p90": float(np.percentile(hl, 90)),
                              "heads > 100": float(np.mean(hl > 100)),
                              "x/v rms": d["x_rms"], "rms spread over heads": d["x_rms_spread"],
                              "max/rms": d["x_max_over_rms"], "kurtosis": d["x_kurtosis"],
                              **{k: d[k] for k in ("B_rms", "C_rms", "k_rms", "beta_mean")
                                 if k in d}})
    write_csv(out / "results.csv", rows)
    if stats:
        write_csv(out / "head_stats.csv", stats)
        plot_memory(work, out / "head_memory.png")
    run_info(work, names, out, "study_trained_verdict")
    return md_table(rows) + ("\n\n" + md_table(stats) if stats else "")


def plot_memory(work: Path, path: Path) -> None:
    """Per-head decay half-lives: the trained models' recorded layers, the same architecture
    at initialisation (the recipe's log) and the synthetic default at the layer shape (64
    heads, for a distribution)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = {"mamba2": (64, 64), "gdn": (32, 32)}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    bins = np.linspace(-1, 3.5, 37)
    for ax, m in zip(axes, ("mamba2", "gdn"), strict=True):
        st = json.loads((work / f"stats_{m}.json").read_text())
        tr = np.concatenate([v["half_life"] for k, v in st.items() if k.startswith("trained")])
        log = json.loads((HERE / m / "train_log.json").read_text())["half_life"]["init"]
        init = np.concatenate([np.asarray(v) for v in log["per_layer"].values()])
        syn = np.asarray(synthetic_stats(m, 64, *shapes[m], steps=1024)["half_life"])
        for a, lab, c in ((syn, "synthetic default (64 heads)", "C0"),
                          (init, "initialisation (recipe log)", "0.6"),
                          (tr, "trained, recorded", "C3")):
            ax.hist(np.log10(a), bins=bins, density=True, alpha=0.45, color=c,
                    label=f"{lab}: median {np.median(a):.1f}")
        ax.set(xlabel="log10 half-life (tokens)", ylabel="density of heads",
               title=f"{m}: per-head decay half-life")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def analyse(work: Path) -> None:
    for name, fn in (("study_trained_kl", study_kl), ("study_trained_engines", study_engines),
                     ("study_trained_verdict", study_verdict)):
        out = EXP / "studies" / name
        out.mkdir(exist_ok=True)
        text = fn(work, out)
        (out / "tables.md").write_text(text + "\n")
        print(f"## {name}\n\n{text}\n")
