"""Tables, figures and raw files of the corrected trained-model studies (``rerun.py``'s output):

    python experiments/trained/analyse_rerun.py raw --work W   # W: every rerun.py OUT under it
    python experiments/trained/analyse_rerun.py tables         # from the committed raw files

``raw`` turns the runs' ``windows.npz`` into each study's ``results_raw.csv.gz`` (one row per
run, group, SR seed, document and 256-token window: the mean KL per token against the FP32
state, and top-1 agreement) and copies ``bpb.json``, ``half_lives.json``, ``runs.jsonl`` and
``log.txt`` beside them. ``tables`` reads only the committed files and writes ``tables.md``, the
PNGs and ``results.csv`` of each study. Every statistic is :func:`stat` of the raw rows:
the mean over documents and SR seeds of each document's mean KL over its tokens, and a 95%
percentile-bootstrap interval resampling documents and SR seeds independently (2,000
resamples, seed 0); a ratio resamples both schemes' documents together (paired).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
EXP = HERE.parent
STUDIES = EXP / "studies"
KL_DIR, ENG_DIR, VER_DIR = (STUDIES / "study_trained_kl", STUDIES / "study_trained_engines",
                            STUDIES / "study_trained_verdict")
COLS = ["run", "model", "weights", "docs", "group", "scheme", "seed", "doc", "window_end", "kl",
        "top1"]
B = 2000
LABEL = {"mamba2": "Mamba-2", "gdn": "GDN"}
SHARED, SPLIT = "shared_nvfp4_sr", "split_fp32_nvfp4"
DECAY = (0.25, 1.0, 4.0, 16.0)  # the intervention's half-life scales (1: the model as trained)
SR_PAIRS = [("FP16", "conventional_fp16", "conventional_fp16_sr"),
            ("BF16", "conventional_bf16", "conventional_bf16_sr"),
            ("INT8 block (row)", "conventional_int8_b128", "conventional_int8_b128_sr"),
            ("FP8 E4M3 block (row)", "conventional_fp8_b128", "conventional_fp8_b128_sr")]


# ---------------------------------------------------------------------------------------------
# raw rows


def read_tarball(tf: Path) -> tuple[dict[str, dict], str | None]:
    """The runs of one ``raw.tar.gz`` (run name -> its ``windows.npz`` arrays) and, when the
    file is empty, truncated or otherwise unreadable, why (the runs whose ``windows.npz`` was read
    whole before the damage are kept)."""
    import zlib

    runs: dict[str, dict] = {}
    try:
        with tarfile.open(tf) as tar:
            for m in tar:
                if m.name.endswith("windows.npz"):
                    runs[m.name.split("/")[0]] = dict(np.load(io.BytesIO(
                        tar.extractfile(m).read())))
    except (tarfile.TarError, EOFError, OSError, zlib.error, ValueError) as e:
        return runs, " ".join(f"{type(e).__name__}: {e}".split())
    return runs, None


def raw(work: Path) -> None:
    """Each study's ``results_raw.csv.gz`` from the runs in ``work``: every ``raw.tar.gz`` under
    it (rerun.py's parts, and calls that redid failed runs with ``--match``), in sorted path
    order. A run that failed in one call and succeeded in another is taken from the call where
    it succeeded (failed runs are not in a tarball; they are in ``runs.jsonl`` with ``error``);
    a run present in several tarballs is taken from the last one, which is said. An empty or
    truncated tarball is skipped with a note (any run read whole before the damage, and listed
    as done in its folder's ``runs.jsonl``, is kept). ``gpu_run/runs.jsonl`` keeps EVERY entry of
    every call (the failures document themselves), each with ``call`` (its folder under
    ``work``) and ``used`` (whether this run's rows come from that call)."""
    runs, src, notes = {}, {}, []
    for tf in sorted(work.rglob("raw.tar.gz")):
        call = tf.parent.relative_to(work).as_posix()
        got, err = read_tarball(tf)
        if err is not None:
            listed = set()
            rj = tf.parent / "runs.jsonl"
            if rj.exists():
                listed = {d["name"] for d in map(json.loads, rj.read_text().splitlines())
                          if "error" not in d}
            kept = sorted(n for n in got if n in listed)
            got = {n: got[n] for n in kept}
            notes.append(f"{call}/raw.tar.gz unreadable ({err[:160]}): skipped"
                         + (f", except {', '.join(kept)} (read whole, listed done)" if kept
                            else ""))
        for name, arr in got.items():
            if name in runs:
                notes.append(f"{name}: in {src[name]} and {call}; {call}'s taken")
            runs[name], src[name] = arr, call
    for n in notes:
        print(f"note: {n}")
    docs = {"pair2k": "heldout2k", "engines2k": "heldout2k", "layers2k": "heldout2k",
            "pair16k": "heldout16k"}
    out = {KL_DIR: [], ENG_DIR: [], VER_DIR: []}
    for name, arr in sorted(runs.items()):
        kind, model, weights = name.split("_")
        dset = docs.get(kind, "heldout16k")
        dest = ENG_DIR if kind == "engines2k" else KL_DIR
        W = int(arr["window|tokens"]) if "window|tokens" in arr else 256
        for key, kl in arr.items():
            what, group = key.split("|")
            if what != "kl":
                continue
            top1 = arr[f"top1|{group}"]
            scheme, _, seed = group.partition("~seed")
            K, nw = kl.shape
            for d in range(K):
                for w in range(nw):
                    row = [name, model, weights, dset, group, scheme, int(seed or 0), d,
                           (w + 1) * W, f"{kl[d, w]:.6e}", f"{top1[d, w]:.6f}"]
                    out[dest].append(row)
                    if kind == "pair2k" and scheme in (SHARED, SPLIT, "conventional_fp32",
                                                       "noise_floor"):
                        out[VER_DIR].append(row)
    for dest, rows in out.items():
        with gzip.open(dest / "results_raw.csv.gz", "wt", newline="") as f:
            w = csv.writer(f)
            w.writerow(COLS)
            w.writerows(rows)
        print(f"{dest / 'results_raw.csv.gz'}: {len(rows):,} rows")
    gpu = KL_DIR / "gpu_run"
    gpu.mkdir(exist_ok=True)
    for f in ("bpb.json", "half_lives.json"):
        found = sorted(work.rglob(f))
        if len(found) > 1:
            print(f"note: {len(found)} {f} files; {found[-1].relative_to(work)}'s taken")
        for p in found[-1:]:
            shutil.copy(p, gpu / f)
    entries = []
    for p in sorted(work.rglob("runs.jsonl")):
        call = p.parent.relative_to(work).as_posix()
        for line in p.read_text().splitlines():
            if line.strip():
                d = json.loads(line)
                entries.append({**d, "call": call,
                                "used": "error" not in d and src.get(d["name"]) == call})
    (gpu / "runs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in entries))
    logs = [f"# analyse_rerun.py raw: {n}\n" for n in notes]
    for p in sorted(work.rglob("log.txt")):
        logs.append(f"## {p.relative_to(work).as_posix()}\n" + p.read_text())
    (gpu / "log.txt").write_text("".join(logs))
    print(f"{gpu}: runs.jsonl {len(entries)} entries ({sum(d['used'] for d in entries)} used, "
          f"{sum('error' in d for d in entries)} failed), log.txt, bpb.json, half_lives.json")


def load(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [{**r, "seed": int(r["seed"]), "doc": int(r["doc"]),
                 "window_end": int(r["window_end"]), "kl": float(r["kl"]),
                 "top1": float(r["top1"])} for r in csv.DictReader(f)]


def doc_matrix(rows: list[dict], run: str, scheme: str, upto: int | None = None,
               start: int = 0, field: str = "kl") -> np.ndarray:
    """``(seeds, documents)``: each document's mean of ``field`` over its windows ending in
    ``(start, upto]`` (all when ``upto`` is None)."""
    sel = [r for r in rows if r["run"] == run and r["scheme"] == scheme
           and r["window_end"] > start and (upto is None or r["window_end"] <= upto)]
    if not sel:
        raise KeyError(f"{run}/{scheme}: no rows")
    S = max(r["seed"] for r in sel) + 1
    K = max(r["doc"] for r in sel) + 1
    tot, n = np.zeros((S, K)), np.zeros((S, K))
    for r in sel:
        tot[r["seed"], r["doc"]] += r[field]
        n[r["seed"], r["doc"]] += 1
    return tot / n


def stat(a: np.ndarray, b: np.ndarray | None = None, seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``a`` (seeds x documents), or the ratio mean(a) / mean(b) (documents paired),
    and its 95% bootstrap interval: documents resampled, and each scheme's SR seeds
    resampled independently."""
    rng = np.random.default_rng(seed)
    K = a.shape[1]
    est = a.mean() if b is None else a.mean() / b.mean()
    vals = np.empty(B)
    for i in range(B):
        d = rng.integers(0, K, K)
        sa = rng.integers(0, a.shape[0], a.shape[0])
        ma = a[sa][:, d].mean()
        if b is None:
            vals[i] = ma
        else:
            sb = rng.integers(0, b.shape[0], b.shape[0])
            vals[i] = ma / b[sb][:, d].mean()
    lo, hi = np.quantile(vals, [0.025, 0.975])
    return float(est), float(lo), float(hi)


def fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 0.01:
        return f"{v:.3g}"
    return f"{v:.2e}"


def band(t) -> str:
    """``est [lo, hi]`` as the notes print it."""
    return f"{fmt(t[0])} [{fmt(t[1])}, {fmt(t[2])}]"


def rband(t) -> str:
    """A ratio: ``4.5× [3.9, 5.2]``."""
    return f"{t[0]:.2f}× [{t[1]:.2f}, {t[2]:.2f}]"


# ---------------------------------------------------------------------------------------------
# the studies' tables


def kl_tables(rows: list[dict], hl: dict, bpb: dict) -> tuple[str, list[dict]]:
    out, res = [], []
    out.append("### Shared NVFP4-SR / split FP32 + NVFP4, mean KL per token (nats) against "
               "the FP32 state\n")
    out.append("| model | weights | documents | shared KL | split KL | ratio shared/split | "
               "FP32 state vs float64 KL | model's own noise KL |")
    out.append("|---|---|---|---|---|---|---|---|")
    for m in ("mamba2", "gdn"):
        for run, dt, docs in ((f"pair2k_{m}_float32", "float32", "48 × 2,048"),
                              (f"pair2k_{m}_bfloat16", "bfloat16", "48 × 2,048"),
                              (f"pair16k_{m}_float32", "float32", "8 × 16,384")):
            a, b = doc_matrix(rows, run, SHARED), doc_matrix(rows, run, SPLIT)
            f32 = doc_matrix(rows, run, "conventional_fp32")
            nz = doc_matrix(rows, run, "noise_floor")
            r = stat(a, b)
            out.append(f"| {LABEL[m]} | {dt} | {docs} | {band(stat(a))} | {band(stat(b))} | "
                       f"**{rband(r)}** | {band(stat(f32))} | {band(stat(nz))} |")
            res.append({"table": "ratio", "model": m, "weights": dt, "run": run,
                        "shared_kl": stat(a)[0], "split_kl": stat(b)[0], "ratio": r[0],
                        "ratio_lo": r[1], "ratio_hi": r[2], "fp32_vs_fp64": stat(f32)[0],
                        "noise": stat(nz)[0]})
    # per-document: how many documents have shared above split
    out.append("\nDocuments where shared's KL exceeds split's (seed-averaged): " + "; ".join(
        f"{LABEL[m]} {dt} {int((doc_matrix(rows, f'pair2k_{m}_{dt}', SHARED).mean(0) > doc_matrix(rows, f'pair2k_{m}_{dt}', SPLIT).mean(0)).sum())}/48"  # noqa: E501
        for m in ("mamba2", "gdn") for dt in ("float32", "bfloat16")) + ".\n")
    # ratio vs length
    out.append("### The ratio as a function of length (float32 weights, 8 held-out documents "
               "× 16,384 tokens): over the first L tokens, and in the window (L/2, L]\n")
    longest = max(r["window_end"] for r in rows if r["run"] == "pair16k_mamba2_float32")
    Ls = [L for L in (256, 512, 1024, 2048, 4096, 8192, 16384) if L <= longest] or [longest]
    out.append("| model | " + " | ".join(f"{L:,}" for L in Ls) + " |")
    out.append("|---|" + "---|" * len(Ls))
    for m in ("mamba2", "gdn"):
        run = f"pair16k_{m}_float32"
        cum, win = [], []
        for L in Ls:
            c = stat(doc_matrix(rows, run, SHARED, L), doc_matrix(rows, run, SPLIT, L))
            s0 = 0 if L == Ls[0] else L // 2
            w = stat(doc_matrix(rows, run, SHARED, L, s0), doc_matrix(rows, run, SPLIT, L, s0))
            cum.append(c)
            win.append(w)
            res.append({"table": "length", "model": m, "weights": "float32", "run": run,
                        "length": L, "ratio": c[0], "ratio_lo": c[1], "ratio_hi": c[2],
                        "window_ratio": w[0], "window_lo": w[1], "window_hi": w[2]})
        out.append(f"| {LABEL[m]}, first L | " + " | ".join(rband(c) for c in cum) + " |")
        out.append(f"| {LABEL[m]}, window (L/2, L] | " + " | ".join(rband(w) for w in win)
                   + " |")
    # per layer
    out.append("\n### Per layer: NVFP4 on one SSM layer only (FP32 state elsewhere), float32 "
               "weights, 48 × 2,048\n")
    out.append("| model | layer | half-life, median over heads (tokens) | heads > 100 tokens | "
               "shared KL | split KL | ratio |")
    out.append("|---|---|---|---|---|---|---|")
    pts = []
    for m in ("mamba2", "gdn"):
        run = f"layers2k_{m}_float32"
        layers = sorted({int(r["scheme"].split("_L")[1]) for r in rows if r["run"] == run
                         and r["scheme"].startswith("shared_L")})
        for i in layers:
            h = np.asarray(hl[f"{m}|x1"]["per_layer"][str(i)])
            a, b = doc_matrix(rows, run, f"shared_L{i}"), doc_matrix(rows, run, f"split_L{i}")
            r = stat(a, b)
            pts.append((m, i, float(np.median(h)), r))
            out.append(f"| {LABEL[m]} | {i} | {np.median(h):.1f} | {(h > 100).mean():.0%} | "
                       f"{band(stat(a))} | {band(stat(b))} | {rband(r)} |")
            res.append({"table": "layer", "model": m, "weights": "float32", "run": run,
                        "layer": i, "half_life_median": float(np.median(h)), "ratio": r[0],
                        "ratio_lo": r[1], "ratio_hi": r[2]})
    rho = {}
    for m in ("mamba2", "gdn", "both"):
        p = [q for q in pts if m in ("both", q[0])]
        x = np.array([q[2] for q in p])
        y = np.array([q[3][0] for q in p])
        rho[m] = spearman(x, y)
    out.append("\nSpearman rank correlation of the per-layer ratio with the layer's median "
               "half-life: " + "; ".join(
                   f"{LABEL.get(m, 'both models')} ρ = {rho[m][0]:+.2f} (permutation p = "
                   f"{rho[m][1]:.3f}, {rho[m][2]} layers)" for m in rho) + ".\n")
    for m, v in rho.items():
        res.append({"table": "spearman", "model": m, "rho": v[0], "p": v[1], "n": v[2]})
    # decay intervention
    out.append("### Intervention: every head's half-life × k (A_log − ln k), float32 weights, "
               "8 held-out documents × 16,384 tokens\n")
    out.append("| model | k | half-life median over heads | heads > 1,000 tokens | bits/byte "
               "(held out) | shared KL | split KL | ratio shared/split |")
    out.append("|---|---|---|---|---|---|---|---|")
    for m in ("mamba2", "gdn"):
        for k in DECAY:
            run = f"pair16k_{m}_float32" if k == 1.0 else f"decay{k:g}_{m}_float32"
            h = np.asarray([v for vs in hl[f"{m}|x{k:g}"]["per_layer"].values() for v in vs])
            a, b = doc_matrix(rows, run, SHARED), doc_matrix(rows, run, SPLIT)
            r = stat(a, b)
            bb = bpb[f"{m}|float32|heldout_dedup|x{k:g}"]["bits_per_byte"]
            out.append(f"| {LABEL[m]} | {k:g} | {np.median(h):.1f} | {(h > 1000).mean():.0%} | "
                       f"{bb:.3f} | {band(stat(a))} | {band(stat(b))} | **{rband(r)}** |")
            res.append({"table": "decay", "model": m, "weights": "float32", "run": run,
                        "scale": k, "half_life_median": float(np.median(h)),
                        "bits_per_byte": bb, "ratio": r[0], "ratio_lo": r[1],
                        "ratio_hi": r[2]})
    return "\n".join(out) + "\n", res


def spearman(x: np.ndarray, y: np.ndarray, n_perm: int = 20000) -> tuple[float, float, int]:
    """Spearman's ρ and a two-sided permutation p-value (seed 0)."""
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))

    def rho(a, b):
        return float(np.corrcoef(a, b)[0, 1])

    r0 = rho(rx, ry)
    rng = np.random.default_rng(0)
    perm = np.array([rho(rx, rng.permutation(ry)) for _ in range(n_perm)])
    return r0, float((np.abs(perm) >= abs(r0) - 1e-12).mean()), len(x)


def bpb_table(bpb: dict) -> str:
    out = ["| model | weights | bits/byte, held out (near-duplicates dropped) | bits/byte, every "
           "validation file | tokens (held out / all) |", "|---|---|---|---|---|"]
    for m in ("mamba2", "gdn"):
        for dt in ("float32", "bfloat16"):
            a, b = bpb[f"{m}|{dt}|heldout_dedup|x1"], bpb[f"{m}|{dt}|val_all|x1"]
            out.append(f"| {LABEL[m]} | {dt} | **{a['bits_per_byte']:.3f}** | "
                       f"{b['bits_per_byte']:.3f} | {a['tokens']:,} / {b['tokens']:,} |")
    return "\n".join(out) + "\n"


def engines_tables(rows: list[dict]) -> tuple[str, list[dict]]:
    out = ["### SR against round-to-nearest, same format: whole-model KL ratio SR/RTN (< 1: "
           "SR better), 48 held-out documents × 2,048 tokens, 3 SR seeds\n",
           "| model | format | weights | KL RTN | KL SR | SR / RTN | documents where SR < RTN |",
           "|---|---|---|---|---|---|---|"]
    res = []
    ran = {r["run"] for r in rows}
    for m in ("mamba2", "gdn"):
        for lab, rtn, sr in SR_PAIRS:
            for dt in ("float32", "bfloat16"):
                run = f"engines2k_{m}_{dt}"
                if run not in ran:
                    out.append(f"| {LABEL[m]} | {lab} | {dt} | not run (see the notes) | | | |")
                    continue
                a, b = doc_matrix(rows, run, sr), doc_matrix(rows, run, rtn)
                r = stat(a, b)
                wins = int((a.mean(0) < b.mean(0)).sum())
                out.append(f"| {LABEL[m]} | {lab} | {dt} | {band(stat(b))} | {band(stat(a))} "
                           f"| **{rband(r)}** | {wins}/{a.shape[1]} |")
                res.append({"table": "sr", "model": m, "format": lab, "weights": dt,
                            "run": run, "kl_rtn": stat(b)[0], "kl_sr": stat(a)[0],
                            "ratio": r[0], "ratio_lo": r[1], "ratio_hi": r[2],
                            "sr_wins": wins})
    out.append("\n### Every scheme (mean KL per token against the FP32 state, top-1 agreement; "
               "SR schemes: 3 seeds pooled)\n")
    out.append("| model | weights | scheme | KL | top-1 agreement |")
    out.append("|---|---|---|---|---|")
    for m in ("mamba2", "gdn"):
        for dt in ("float32", "bfloat16"):
            run = f"engines2k_{m}_{dt}"
            if run not in ran:
                out.append(f"| {LABEL[m]} | {dt} | not run (see the notes) | | |")
            # "reference" is the baseline against itself (no KL: NaN in the raw rows)
            for s in dict.fromkeys(r["scheme"] for r in rows if r["run"] == run
                                   and r["scheme"] != "reference"):
                k = stat(doc_matrix(rows, run, s))
                t = stat(doc_matrix(rows, run, s, field="top1"))
                out.append(f"| {LABEL[m]} | {dt} | {s} | {band(k)} | {t[0]:.4f} |")
                res.append({"table": "scheme", "model": m, "weights": dt, "run": run,
                            "scheme": s, "kl": k[0], "kl_lo": k[1], "kl_hi": k[2],
                            "top1": t[0]})
    return "\n".join(out) + "\n", res


def verdict_tables(rows: list[dict], budget: float = 0.01) -> tuple[str, list[dict]]:
    out = ["| model | weights | FP32 state vs float64 | model's own noise | shared NVFP4-SR | "
           "split FP32 + NVFP4 | verdict (KL ≤ 0.01, upper end of the 95% interval) |",
           "|---|---|---|---|---|---|---|"]
    res = []
    for m in ("mamba2", "gdn"):
        for dt in ("float32", "bfloat16"):
            run = f"pair2k_{m}_{dt}"
            f32, nz = stat(doc_matrix(rows, run, "conventional_fp32")), stat(
                doc_matrix(rows, run, "noise_floor"))
            sh, sp = stat(doc_matrix(rows, run, SHARED)), stat(doc_matrix(rows, run, SPLIT))
            verdict = ("shared" if sh[2] <= budget else "split" if sp[2] <= budget else "FP32")
            out.append(f"| {LABEL[m]} | {dt} | {band(f32)} | {band(nz)} | {band(sh)} | "
                       f"{band(sp)} | **{verdict}** ({budget / sh[2]:.1f}× room) |")
            res.append({"model": m, "weights": dt, "run": run, "fp32_vs_fp64": f32[0],
                        "noise": nz[0], "shared": sh[0], "shared_hi": sh[2], "split": sp[0],
                        "verdict": verdict})
    return "\n".join(out) + "\n", res


def write_csv(path: Path, res: list[dict]) -> None:
    keys = list(dict.fromkeys(k for r in res for k in r))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        for r in res:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def plots(kl_res: list[dict], eng_res: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    for m, c in (("mamba2", "C0"), ("gdn", "C1")):
        L = [r for r in kl_res if r["table"] == "length" and r["model"] == m]
        x = [r["length"] for r in L]
        ax[0].plot(x, [r["ratio"] for r in L], "o-", c=c, label=f"{LABEL[m]}: first L tokens")
        ax[0].fill_between(x, [r["ratio_lo"] for r in L], [r["ratio_hi"] for r in L], color=c,
                           alpha=0.2)
        ax[0].plot(x, [r["window_ratio"] for r in L], "s--", c=c, ms=4,
                   label=f"{LABEL[m]}: window (L/2, L]")
        P = [r for r in kl_res if r["table"] == "layer" and r["model"] == m]
        hx = np.array([r["half_life_median"] for r in P])
        ax[1].errorbar(hx, [r["ratio"] for r in P],
                       yerr=[[r["ratio"] - r["ratio_lo"] for r in P],
                             [r["ratio_hi"] - r["ratio"] for r in P]], fmt="o", c=c,
                       capsize=3, label=LABEL[m])
        for r in P:
            ax[1].annotate(str(r["layer"]), (r["half_life_median"], r["ratio"]), fontsize=7,
                           xytext=(4, 2), textcoords="offset points")
        D = sorted((r for r in kl_res if r["table"] == "decay" and r["model"] == m),
                   key=lambda r: r["scale"])
        ax[2].errorbar([r["scale"] for r in D], [r["ratio"] for r in D],
                       yerr=[[r["ratio"] - r["ratio_lo"] for r in D],
                             [r["ratio_hi"] - r["ratio"] for r in D]], fmt="o-", c=c,
                       capsize=3, label=LABEL[m])
    ax[0].set(xscale="log", xlabel="tokens L", ylabel="KL shared / KL split",
              title="ratio vs length (8 held-out docs × 16K, float32 weights)")
    ax[1].set(xscale="log", xlabel="layer's median head half-life (tokens)",
              ylabel="KL shared / KL split (that layer only)",
              title="per layer (48 docs × 2K, float32 weights)")
    ax[2].set(xscale="log", xlabel="half-life scale k (A_log − ln k)",
              ylabel="KL shared / KL split", title="intervention on the decays (8 docs × 16K)")
    for a in ax:
        a.axhline(1, c="gray", lw=0.5)
        a.legend(fontsize=7)
        a.grid(alpha=0.3, which="both")
    fig.suptitle("shared NVFP4-SR vs split FP32 + NVFP4 on the trained models: 95% bootstrap "
                 "bands over documents and 3 SR seeds", fontsize=10)
    fig.tight_layout()
    fig.savefig(KL_DIR / "kl.png", dpi=90)
    plt.close(fig)

    S = [r for r in eng_res if r["table"] == "sr"]
    fig, ax = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    fmts = [p[0] for p in SR_PAIRS]
    for a, m in zip(ax, ("mamba2", "gdn"), strict=True):
        for j, (dt, c) in enumerate((("float32", "C0"), ("bfloat16", "C3"))):
            R = [next((r for r in S if r["model"] == m and r["format"] == f
                       and r["weights"] == dt), None) for f in fmts]
            if None in R:  # that run is missing
                a.plot([], [], "o", c=c, label=f"{dt} weights: not run")
                continue
            x = np.arange(len(fmts)) + (j - 0.5) * 0.2
            a.errorbar(x, [r["ratio"] for r in R], yerr=[[r["ratio"] - r["ratio_lo"] for r in R],
                                                        [r["ratio_hi"] - r["ratio"] for r in R]],
                       fmt="o", c=c, capsize=3, label=f"{dt} weights")
        a.axhline(1, c="gray", lw=0.8)
        a.set(xticks=range(len(fmts)), title=f"{LABEL[m]}: whole-model KL, SR / RTN",
              yscale="log")
        a.set_xticklabels(fmts, fontsize=8)
        a.legend(fontsize=8)
        a.grid(alpha=0.3, which="both")
    ax[0].set_ylabel("KL(SR) / KL(RTN)  (< 1: SR better)")
    fig.suptitle("48 held-out documents × 2,048 tokens, 3 SR seeds; 95% bootstrap intervals",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(ENG_DIR / "engines.png", dpi=90)
    plt.close(fig)


def claims_kl(rows: list[dict], bpb: dict, res: list[dict]) -> list[str]:
    """The KL study's claims: shared/split per run, over the first L tokens of the 16K runs, per
    layer; Spearman's ρ per model; half-life medians; bits/byte (``res``: kl_tables' rows)."""
    out = []
    for m in ("mamba2", "gdn"):
        for run in (f"pair2k_{m}_float32", f"pair2k_{m}_bfloat16", f"pair16k_{m}_float32",
                    *(f"decay{k:g}_{m}_float32" for k in (0.25, 4.0, 16.0))):
            a, b = doc_matrix(rows, run, SHARED), doc_matrix(rows, run, SPLIT)
            out.append(f"ratio {run} {SHARED}/{SPLIT} = {a.mean() / b.mean():.2f}")
            if run.startswith("pair2k"):
                out.append(f"wins {run} {SPLIT}<{SHARED} = "
                           f"{int((b.mean(0) < a.mean(0)).sum())}/{a.shape[1]}")
        for r in res:
            if r["model"] == m and r["table"] == "length":
                out.append(f"ratio {r['run']} {SHARED}/{SPLIT} upto={r['length']} = "
                           f"{r['ratio']:.2f}")
        for r in res:
            if r["model"] == m and r["table"] == "layer":
                i = r["layer"]
                out.append(f"ratio {r['run']} shared_L{i}/split_L{i} = {r['ratio']:.2f}")
        for dt in ("float32", "bfloat16"):
            for sp in ("heldout_dedup", "val_all"):
                k = f"{m}|{dt}|{sp}|x1"
                out.append(f"bpb {k} = {bpb[k]['bits_per_byte']:.3f}")
        for k in DECAY:
            if k != 1.0:
                key = f"{m}|float32|heldout_dedup|x{k:g}"
                out.append(f"bpb {key} = {bpb[key]['bits_per_byte']:.3f}")
        for r in res:
            if r["model"] == m and r["table"] == "decay":
                out.append(f"halflife {m}|x{r['scale']:g} = {r['half_life_median']:.1f}")
    for r in res:
        if r["table"] == "spearman":
            out.append(f"spearman {r['model']} = {r['rho']:.2f}")
    return out


def claims_engines(rows: list[dict]) -> list[str]:
    out = []
    ran = {r["run"] for r in rows}
    for m in ("mamba2", "gdn"):
        for _, rtn, sr in SR_PAIRS:
            for dt in ("float32", "bfloat16"):
                run = f"engines2k_{m}_{dt}"
                if run not in ran:
                    continue
                a, b = doc_matrix(rows, run, sr), doc_matrix(rows, run, rtn)
                out.append(f"ratio {run} {sr}/{rtn} = {stat(a, b)[0]:.2f}")
                out.append(f"wins {run} {sr}<{rtn} = {int((a.mean(0) < b.mean(0)).sum())}/"
                           f"{a.shape[1]}")
    for run in sorted(ran):  # error feedback against RTN at the same format
        for s in ("conventional_int8_b128", "conventional_int8_b128_ef",
                  "conventional_fp8_b128", "conventional_fp8_b128_ef"):
            out.append(f"mean {run} {s} = {fmt(doc_matrix(rows, run, s).mean())}")
    return out


def claims_verdict(rows: list[dict]) -> list[str]:
    out = []
    for m in ("mamba2", "gdn"):
        for dt in ("float32", "bfloat16"):
            run = f"pair2k_{m}_{dt}"
            for s in ("conventional_fp32", "noise_floor", SHARED, SPLIT):
                out.append(f"mean {run} {s} = {fmt(stat(doc_matrix(rows, run, s))[0])}")
    return out


def fill_notes(path: Path, tables_text: str, claim_lines: list[str]) -> None:
    """Put ``tables_text`` between the notes' results markers and ``claim_lines`` in their
    claims block (tests/experiments/test_trained_notes.py re-derives each claim from the raw
    file)."""
    text = path.read_text()
    begin, end = "<!-- results:begin -->", "<!-- results:end -->"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + begin + "\n" + tables_text + "\n" + end + rest.split(end, 1)[1]
    block = "<!-- claims\n" + "\n".join(claim_lines) + "\n-->"
    if "<!-- claims" in text:
        head, rest = text.split("<!-- claims", 1)
        text = head + block + rest.split("-->", 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def tables() -> None:
    gpu = KL_DIR / "gpu_run"
    hl = json.loads((gpu / "half_lives.json").read_text())
    bpb = json.loads((gpu / "bpb.json").read_text())
    kl_rows = load(KL_DIR / "results_raw.csv.gz")
    text, kl_res = kl_tables(kl_rows, hl, bpb)
    text = "### Bits per byte of the committed checkpoints\n\n" + bpb_table(bpb) + "\n" + text
    (KL_DIR / "tables.md").write_text(text)
    write_csv(KL_DIR / "results.csv", kl_res)
    eng_rows = load(ENG_DIR / "results_raw.csv.gz")
    etext, eng_res = engines_tables(eng_rows)
    (ENG_DIR / "tables.md").write_text(etext)
    write_csv(ENG_DIR / "results.csv", eng_res)
    vtext, v_res = verdict_tables(load(VER_DIR / "results_raw.csv.gz"))  # noqa: F841
    (VER_DIR / "tables_whole_model.md").write_text(vtext)
    write_csv(VER_DIR / "results_whole_model.csv", v_res)
    plots(kl_res, eng_res)
    fill_notes(KL_DIR / "NOTES.md", text, claims_kl(kl_rows, bpb, kl_res))
    fill_notes(ENG_DIR / "NOTES.md", etext, claims_engines(eng_rows))
    vrows = load(VER_DIR / "results_raw.csv.gz")
    fill_notes(VER_DIR / "NOTES.md", vtext, claims_verdict(vrows))
    print(text, etext, vtext, sep="\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("raw", "tables"))
    ap.add_argument("--work", type=Path)
    a = ap.parse_args(argv)
    if a.what == "raw":
        raw(a.work)
    else:
        tables()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
