"""Runs the studies of ``experiments/`` (issue 14) and writes each one's results.

Each study is one Hydra multirun of its preset ``conf/experiment/study_<name>.yaml``. For every
study this driver runs the command, collects the run directories' ``metrics.csv`` and
``summary.json`` into one tidy CSV (``results.csv``: one row per job, scheme and window end,
thinned to log-spaced window ends), draws the study's PNG, records the machine, date, command and
run time (``run_info.json``) and fills the result tables of its ``NOTES.md`` (between the
``results`` markers; the question and the finding outside them are kept).

    python experiments/run_studies.py                      # the GPU sizes, into experiments/
    python experiments/run_studies.py --out $OUT           # the same, one archive in $OUT
    python experiments/run_studies.py --unpack studies.tar.gz   # the archive into experiments/
    python experiments/run_studies.py --smoke              # CPU, reduced sizes, experiments/_smoke
    python experiments/run_studies.py --notes              # NOTES.md tables from the CSVs again
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import math
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXP = ROOT / "experiments"
STUDIES_DIR = EXP / "studies"  # one folder per study
ARCHIVE = "studies.tar.gz"
CSV_NAME = "results.csv"
INFO_NAME = "run_info.json"
BEGIN = "<!-- results:begin (written by experiments/run_studies.py; edits here are replaced) -->"
END = "<!-- results:end -->"
FINDING_MARK = "<!-- FINDING: to be written by a person from the numbers above -->"
# The tidy CSV's columns (tests/app/test_studies.py checks them).
CONFIG_COLS = ("model", "family", "heads", "head_dim", "state_dim", "workload", "steps", "seqs",
               "buffer_len", "drafts", "acceptance", "gdn_u_source", "decay_exp")
SCHEME_COLS = ("scheme", "label", "kind", "fmt", "rounding", "read_fmt", "sr_bits",
               "bytes_per_step", "dead_at")
METRIC_COLS = ("step", "rel_err", "rel_err_p10", "rel_err_p50", "rel_err_p90", "kl", "kl_p10",
               "kl_p50", "kl_p90", "rel_err_max", "state_drift", "read_drift")
TIDY_COLS = ("study", "job", *CONFIG_COLS, *SCHEME_COLS, *METRIC_COLS)
LENGTHS = (256, 1024, 4096, 32768, 131072)
PLOT_LOCK = threading.Lock()
SMOKE_BASE = ("run.steps=1024", "model.heads=2", "model.groups=1")


# -- reading results -------------------------------------------------------------------------
def _num(v):
    if v in (None, ""):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return v
    return int(f) if f.is_integer() and "." not in str(v) and "e" not in str(v) else f


def _thin(steps: list[int], points: int = 48) -> set[int]:
    """Window ends kept in the committed CSV: the ones nearest to ``points`` log-spaced steps,
    the reported lengths and the last."""
    if not steps:
        return set()
    lo, hi = steps[0], steps[-1]
    keep = {lo, hi, *[s for s in steps if s in LENGTHS]}
    if hi > lo:
        for k in range(points):
            target = lo * (hi / lo) ** (k / (points - 1))
            keep.add(min(steps, key=lambda s: abs(math.log(s / target))))
    return keep


def tidy_rows(study: str, sweep_dir: Path, thin: bool = True) -> list[dict]:
    """The tidy rows of every complete job under ``sweep_dir`` (see the module docstring)."""
    from precsim import report
    from precsim import result as res

    out = []
    for job in report.collect(sweep_dir):
        if job.summary is None:
            continue
        s = job.summary
        c = s["config"]
        m, r = c["model"], c["replay"]
        conf = {"model": m["name"], "family": m["family"], "heads": m["heads"],
                "head_dim": m["head_dim"], "state_dim": m["state_dim"],
                "workload": c["workload"]["kind"], "steps": s["steps"], "seqs": c["run"]["seqs"],
                "buffer_len": r["buffer_len"], "drafts": r["drafts"],
                "acceptance": r["acceptance"] if r["drafts"] else None,
                "gdn_u_source": r["gdn_u_source"] if m["family"] == "gdn" else None,
                "decay_exp": m.get("decay_exp", "exact")}
        rows = res.read_rows(job.path / res.METRICS_FILE)
        for name, info in s["schemes"].items():
            sc = c["schemes"][name]
            mine = sorted((x for x in rows if x["scheme"] == name), key=lambda x: x["step"])
            keep = _thin([x["step"] for x in mine]) if thin else {x["step"] for x in mine}
            base = {"study": study, "job": job.name, **conf, "scheme": name,
                    "label": info.get("label", name), "kind": sc["kind"], "fmt": sc["fmt"],
                    "rounding": sc["rounding"], "read_fmt": sc.get("read_fmt"),
                    "sr_bits": sc.get("sr_bits"),
                    "bytes_per_step": s.get("cost", {}).get(name, {}).get("bytes_per_step"),
                    "dead_at": info.get("dead_at")}
            for x in mine:
                if x["step"] in keep:
                    out.append({**base, **{k: x.get(k) for k in METRIC_COLS}})
    return out


def write_csv(rows: list[dict], path: Path, cols=TIDY_COLS) -> None:
    """Tidy CSV of ``rows`` with the columns ``cols`` (floats as %.6e, None as empty)."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else
                            f"{r[k]:.6e}" if isinstance(r[k], float) else r[k]) for k in cols})


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return [{k: _num(v) for k, v in r.items()} for r in csv.DictReader(f)]


def finals(rows: list[dict]) -> list[dict]:
    """The last window of every (job, scheme)."""
    last: dict = {}
    for r in rows:
        key = (r["job"], r["scheme"])
        if key not in last or r["step"] > last[key]["step"]:
            last[key] = r
    return list(last.values())


def at(rows: list[dict], job: str, scheme: str, step: int) -> dict | None:
    return next((r for r in rows if r["job"] == job and r["scheme"] == scheme
                 and r["step"] == step), None)


# -- formatting ------------------------------------------------------------------------------
def g(v, digits: int = 3) -> str:
    if v is None or v == "" or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, str):
        return v
    if v == 0:
        return "0"
    return f"{v:.{digits}g}" if 1e-3 <= abs(v) < 1e5 else f"{v:.{max(digits - 1, 1)}e}"


def nbytes(v) -> str:
    return "–" if v is None else f"{v:,.0f}"


def md_table(head: list[str], body: list[list]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(x if isinstance(x, str) else g(x) for x in row) + " |"
              for row in body]
    return "\n".join(lines)


def _k(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


# -- plots -----------------------------------------------------------------------------------
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(fig, axes, path: Path, ncol: int = 3) -> None:
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    rows = math.ceil(len(labels) / ncol)
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, min(0.45, 0.035 * rows + 0.02), 1, 1))
    fig.savefig(path, dpi=110)
    _plt().close(fig)


def _loglog(ax, xlabel: str, ylabel: str, title: str = "", xbase: int = 2) -> None:
    ax.set_xscale("log", base=xbase)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.35)
    ax.grid(True, which="minor", alpha=0.1)


def _pos(v) -> float:
    return v if isinstance(v, (int, float)) and math.isfinite(v) and v > 0 else math.nan


def curves(rows: list[dict], path: Path, key_of: Callable[[dict], str], title: str,
           panels=(("rel_err", "relative output error (window mean)"),
                   ("kl", "KL(p_ref ‖ p_sim), nats/token")),
           style_of: Callable[[dict], str] | None = None, split_by=None,
           color_of: Callable[[dict], str] | None = None) -> None:
    """Log-log metric vs decode steps, one line per ``key_of(row)``; one panel per metric (and
    per value of ``split_by``). Colours by ``color_of`` (default: the line), line styles by
    ``style_of`` (default: cycled, so coinciding curves stay visible)."""
    plt = _plt()
    groups = sorted({split_by(r) for r in rows}) if split_by else [None]
    n = len(panels) * len(groups)
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4.6), squeeze=False)
    axes = list(axes[0])
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    keys = list(dict.fromkeys(key_of(r) for r in rows))
    color_of = color_of or key_of
    ckeys = list(dict.fromkeys(color_of(r) for r in rows))
    for gi, grp in enumerate(groups):
        sub = [r for r in rows if split_by is None or split_by(r) == grp]
        for pi, (metric, ylabel) in enumerate(panels):
            ax = axes[gi * len(panels) + pi]
            for i, k in enumerate(keys):
                pts = sorted((r["step"], _pos(r[metric])) for r in sub if key_of(r) == k)
                if not pts or all(math.isnan(p[1]) for p in pts):
                    continue
                first = next(r for r in sub if key_of(r) == k)
                ls = style_of(first) if style_of else ("-", "--", "-.", ":")[i % 4]
                c = colors[ckeys.index(color_of(first)) % 10]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], ls=ls, color=c,
                        lw=1.6, label=k, marker="o" if len(pts) <= 3 else None, ms=3)
            _loglog(ax, "decode steps (tokens)", ylabel, f"{grp}" if grp else "")
    fig.suptitle(title, fontsize=10)
    _finish(fig, axes, path, ncol=3 if len(keys) > 4 else len(keys) or 1)


def _shape(r: dict) -> str:
    return f"{r['model']} ({r['heads']}×{r['head_dim']}×{r['state_dim']})"


def _title(rows: list[dict], what: str) -> str:
    r = rows[0]
    return f"{what}: {r['steps']:,} steps, {r['workload']} workload, seqs={r['seqs']}"


def plot_seed_table(rows, path):
    curves(rows, path, lambda r: r["label"], _title(rows, f"article's table, {_shape(rows[0])}"),
           panels=(("rel_err", "relative output error (window mean)"),
                   ("kl", "KL(p_ref ‖ p_sim), nats/token"),
                   ("state_drift", "state drift ‖S−S_ref‖/‖S_ref‖")))


def plot_buffer_len(rows, path):
    plt = _plt()
    fin = [r for r in finals(rows) if r["kind"] != "conventional"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    for i, lab in enumerate(dict.fromkeys(r["label"] for r in fin)):
        pts = sorted((r["buffer_len"], r["rel_err"], r["kl"], r["bytes_per_step"])
                     for r in fin if r["label"] == lab)
        x = [p[0] for p in pts]
        style = dict(ls=("-", "--", ":")[i % 3], marker="osD"[i % 3], ms=5, label=lab)
        axes[0].plot(x, [_pos(p[1]) for p in pts], **style)
        axes[1].plot(x, [_pos(p[2]) for p in pts], **style)
        line, = axes[2].plot([p[3] for p in pts], [_pos(p[1]) for p in pts], **style)
        for p in pts if i < 2 else []:  # the FP16-SR split lies on the FP32 one
            axes[2].annotate(f"L={p[0]}", (p[3], _pos(p[1])), fontsize=7,
                             xytext=(3, 4 if i == 0 else -10), textcoords="offset points",
                             color=line.get_color())
    step = fin[0]["step"] if fin else 0
    _loglog(axes[0], "buffer length L (steps)", f"relative output error at step {step:,}")
    _loglog(axes[1], "buffer length L (steps)", f"KL at step {step:,}, nats/token")
    _loglog(axes[2], "bytes per decode step per head (cost model)",
            f"relative output error at step {step:,}", xbase=10)
    fig.suptitle(_title(rows, f"buffer length, {_shape(rows[0])}"), fontsize=10)
    _finish(fig, list(axes), path)


def plot_mamba2_vs_gdn(rows, path):
    # gdn_u_source does nothing for Mamba-2: draw its first job only (the table lists both)
    first = min((r["job"] for r in rows if r["family"] == "mamba2"), default=None)
    rows = [r for r in rows if r["family"] != "mamba2" or r["job"] == first]

    def key(r):
        u = f", S·k from {r['gdn_u_source']}" if r["gdn_u_source"] else ""
        return f"{r['label']}{u}"
    curves(rows, path, key, _title(rows, "Mamba-2 vs GDN"),
           panels=(("rel_err", "relative output error (window mean)"),
                   ("state_drift", "state drift ‖S−S_ref‖/‖S_ref‖ (split: master)")),
           style_of=lambda r: "--" if r["gdn_u_source"] == "master" else "-",
           split_by=_shape, color_of=lambda r: r["label"])


def _front(pts):
    """Pareto front (min cost, min value) of (cost, value, ...) tuples."""
    best, out = math.inf, []
    for p in sorted(pts, key=lambda p: (p[0], p[1])):
        if p[1] < best:
            out.append(p)
            best = p[1]
    return out


def plot_precision_table(rows, path):
    plt = _plt()
    fin = finals(rows)
    models = list(dict.fromkeys(_shape(r) for r in fin))
    fig, axes = plt.subplots(2, len(models), figsize=(6.5 * len(models), 9), squeeze=False)
    reads = ["nvfp4", "mxfp4", "fp8_e4m3", "fp16"]
    markers = {"nvfp4": "o", "mxfp4": "s", "fp8_e4m3": "^", "fp16": "D", None: "x"}
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    upd = list(dict.fromkeys(f"{r['fmt']}/{r['rounding']}" for r in fin if r["kind"] == "split"))
    for j, mdl in enumerate(models):
        sub = [r for r in fin if _shape(r) == mdl]
        for i, metric in enumerate(("rel_err", "kl")):
            ax = axes[i][j]
            for r in sub:
                if r["kind"] == "split":
                    c = colors[upd.index(f"{r['fmt']}/{r['rounding']}") % 10]
                    ax.scatter(r["bytes_per_step"], _pos(r[metric]), color=c,
                               marker=markers.get(r["read_fmt"], "o"), s=30, zorder=3)
                else:
                    ax.scatter(r["bytes_per_step"], _pos(r[metric]), color="k", marker="x",
                               s=30, zorder=3)
                    ax.annotate(r["label"], (r["bytes_per_step"], _pos(r[metric])),
                                fontsize=6.5, xytext=(4, -10), textcoords="offset points",
                                zorder=5)  # above the markers of the crowded 4-bit corner,
                                # no box, so that the markers stay visible through it
            front = _front([(r["bytes_per_step"], _pos(r[metric])) for r in sub
                            if not math.isnan(_pos(r[metric]))])
            ax.plot([p[0] for p in front], [p[1] for p in front], "-", color="0.5", lw=1,
                    zorder=1, label="Pareto front")
            _loglog(ax, "bytes per decode step per head (cost model)",
                    "relative output error at the last window" if metric == "rel_err"
                    else "KL at the last window, nats/token", mdl if i == 0 else "", xbase=10)
    h = [plt.Line2D([], [], color=colors[k % 10], marker="o", ls="", label=f"split, update {u}")
         for k, u in enumerate(upd)]
    h += [plt.Line2D([], [], color="0.3", marker=markers[rf], ls="", label=f"read {rf}")
          for rf in reads]
    h += [plt.Line2D([], [], color="k", marker="x", ls="", label="conventional / shared"),
          plt.Line2D([], [], color="0.5", ls="-", label="Pareto front")]
    fig.legend(handles=h, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(_title(rows, "precision table"), fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sr_bits(rows, path):
    plt = _plt()
    fin = finals(rows)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    colors = {"fp16": "C0", "fp8_e4m3": "C3"}
    for metric, ax, ylab in (("rel_err", axes[0], "relative output error at the last window"),
                             ("state_drift", axes[1], "state drift at the last window")):
        for f, c in colors.items():
            for kind, ls in (("conventional", "o-"), ("split", "s--")):
                pts = sorted((r["sr_bits"], r[metric]) for r in fin if r["fmt"] == f
                             and r["kind"] == kind and r["rounding"] == "sr" and r["sr_bits"])
                if pts:
                    ax.plot([p[0] for p in pts], [_pos(p[1]) for p in pts], ls, color=c,
                            label=f"{kind} {f}, SR" + (" + nvfp4 read" if kind == "split"
                                                       else ""))
            rne = [r for r in fin if r["fmt"] == f and r["rounding"] == "rne"]
            if rne:
                ax.axhline(_pos(rne[0][metric]), color=c, ls=":", lw=1.2,
                           label=f"conventional {f}, RNE")
        ref = [r for r in fin if r["fmt"] == "fp32" and r["kind"] == "conventional"]
        if ref:
            ax.axhline(_pos(ref[0][metric]), color="k", ls=":", lw=1, label="conventional fp32")
        ax.set_yscale("log")
        ax.set_xticks(sorted({r["sr_bits"] for r in fin if r["sr_bits"]}))
        ax.set_xlabel("SR random bits per rounding")
        ax.set_ylabel(ylab)
        ax.grid(True, alpha=0.3)
    fig.suptitle(_title(rows, f"SR random bits, {_shape(rows[0])}"), fontsize=10)
    _finish(fig, list(axes), path)


def _profile(r: dict) -> str:
    """A job's acceptance, short: a rate, or a per-position profile's first entries."""
    acc = r["acceptance"]
    if not r["drafts"] or acc is None:
        return "–"
    if isinstance(acc, (str, list)):
        vals = [float(v) for v in (acc.strip("[]").split(",") if isinstance(acc, str) else acc)
                if str(v).strip()]
        return "p = " + ",".join(f"{v:g}" for v in vals[:4]) + ("…" if len(vals) > 4 else "")
    return f"p = {acc:g}"


def plot_speculative(rows, path):
    """Per layer and ReplaySSM scheme: the last window's error vs T, one line per acceptance
    profile, T = 0 drawn as T = 0 of every line."""
    plt = _plt()
    fin = [r for r in finals(rows) if r["kind"] != "conventional"]
    panels = list(dict.fromkeys((r["model"], r["label"]) for r in fin))
    ncol = min(3, len(panels))
    nrow = math.ceil(len(panels) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 4.2 * nrow), squeeze=False)
    axes = list(axes.reshape(-1))
    for ax, (model, lab) in zip(axes, panels, strict=False):
        sub = [r for r in fin if r["model"] == model and r["label"] == lab]
        base = [r for r in sub if not r["drafts"]]
        for i, prof in enumerate(dict.fromkeys(_profile(r) for r in sub if r["drafts"])):
            pts = sorted((r["drafts"], r["rel_err"]) for r in sub if _profile(r) == prof)
            pts = [(0, base[0]["rel_err"])] * bool(base) + pts
            ax.plot([p[0] for p in pts], [_pos(p[1]) for p in pts], "o-", color=f"C{i}",
                    label=prof)
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xticks([0, 1, 2, 4, 8], ["0", "1", "2", "4", "8"])
        ax.set_yscale("log")
        ax.set_xlabel("drafts T per verification")
        ax.set_ylabel("relative output error at the last window")
        ax.set_title(f"{model}: {lab}", fontsize=9)
        ax.grid(True, alpha=0.3)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(_title(rows, f"speculative decoding, L = {rows[0]['buffer_len']}"), fontsize=10)
    _finish(fig, axes[:len(panels)], path, ncol=4)


def plot_decay_exp(rows, path):
    curves(rows, path, lambda r: f"{r['label']}, exp {r['decay_exp']}",
           _title(rows, f"decay exp, {_shape(rows[0])}"),
           panels=(("rel_err", "relative output error (window mean)"),
                   ("state_drift", "state drift ‖S−S_ref‖/‖S_ref‖")),
           style_of=lambda r: "--" if r["decay_exp"] == "fast" else "-",
           color_of=lambda r: r["label"])


def plot_kl_vs_paper(rows, path):
    plt = _plt()
    fin = [r for r in finals(rows) if r["kind"] != "conventional"]
    models = list(dict.fromkeys(_shape(r) for r in fin))
    labels = list(dict.fromkeys(r["label"] for r in fin))
    fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.8 / (len(labels) + 1)
    for i, lab in enumerate(labels):
        xs, ys, lo, hi = [], [], [], []
        for j, mdl in enumerate(models):
            r = next((r for r in fin if r["label"] == lab and _shape(r) == mdl), None)
            if r is None:
                continue
            xs.append(j + i * width)
            ys.append(r["kl"])
            lo.append(r["kl"] - (r["kl_p10"] if r["kl_p10"] is not None else r["kl"]))
            hi.append((r["kl_p90"] if r["kl_p90"] is not None else r["kl"]) - r["kl"])
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=f"{lab} (p10–p90 across seqs)",
               color=f"C{i}")
    paper = len(models)
    ax.bar([paper, paper + width], [0.136, 0.0038], width, color=["C0", "C1"], hatch="//",
           edgecolor="k", label="ReplaySSM paper: shared 0.136, split 0.0038")
    ax.set_xticks([j + width * (len(labels) - 1) / 2 for j in range(len(models))] + [paper])
    ax.set_xticklabels(models + ["published (real model)"], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("KL(p_ref ‖ p_sim) at the last window, nats/token")
    ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(_title(rows, "KL, shared vs split"), fontsize=10)
    _finish(fig, [ax], path, ncol=2)


# -- result tables (NOTES.md) ----------------------------------------------------------------
def _lengths_of(rows):
    return [L for L in LENGTHS if any(r["step"] == L for r in rows)]


def table_seed_table(rows):
    fin = finals(rows)
    Ls = _lengths_of(rows)
    cpu = {}
    f = STUDIES_DIR / "seed_table" / "summary.json"
    if f.is_file():
        s = json.loads(f.read_text())
        cpu = {k: v.get("32768", {}).get("rel_err") for k, v in s["figures"].items()}
    head = ["scheme"] + [f"rel_err to {L:,}" for L in Ls] + ["KL at end (nats)",
                                                             "CPU 4-head rel_err at 32,768"]
    body = [[r["label"]] + [(at(rows, r["job"], r["scheme"], L) or {}).get("rel_err")
                            for L in Ls] + [r["kl"], cpu.get(r["scheme"])] for r in fin]
    out = md_table(head, body)
    fp = next((r for r in fin if r["scheme"] == "conventional_fp32"), None)
    x = at(rows, fp["job"], fp["scheme"], 32768) if fp else None
    if x and cpu.get("conventional_fp32"):
        out += (f"\n\nFP32 row at 32,768: {g(x['rel_err'])} here vs {g(cpu['conventional_fp32'])}"
                f" in the CPU table: ratio {x['rel_err'] / cpu['conventional_fp32']:.2f} "
                "(acceptance: within 3x).")
    return out


def table_buffer_len(rows):
    fin = sorted(finals(rows), key=lambda r: (r["kind"], r["label"], r["buffer_len"]))
    ref = [r for r in fin if r["kind"] == "conventional"][:1]  # the same in every job
    fin = ref + [r for r in fin if r["kind"] != "conventional"]
    body = [[r["label"], str(r["buffer_len"]) if r["kind"] != "conventional" else "(any)",
             nbytes(r["bytes_per_step"]), r["rel_err"], r["kl"], r["state_drift"]] for r in fin]
    return md_table(["scheme", "L", "bytes/step/head", f"rel_err at {fin[0]['step']:,}",
                     "KL (nats/token)", "state drift"], body)


def table_mamba2_vs_gdn(rows):
    fin = sorted(finals(rows), key=lambda r: (r["family"], r["label"], str(r["gdn_u_source"])))
    body = [[_shape(r), r["job"], r["gdn_u_source"] or "(n/a)", r["label"], r["rel_err"],
             r["kl"], r["state_drift"], r["read_drift"]] for r in fin]
    return md_table(["layer", "job", "S·k from", "scheme", f"rel_err at {fin[0]['step']:,}",
                     "KL (nats/token)", "state drift (master)", "read drift"], body)


def table_precision_table(rows, budgets=(0.01, 0.0625, 0.25)):
    fin = finals(rows)
    out = []
    for mdl in dict.fromkeys(_shape(r) for r in fin):
        sub = [r for r in fin if _shape(r) == mdl]
        split = [r for r in sub if r["kind"] == "split"]
        reads = list(dict.fromkeys(r["read_fmt"] for r in split))
        upds = list(dict.fromkeys(f"{r['fmt']}/{r['rounding']}" for r in split))
        for metric, unit in (("rel_err", "relative output error"), ("kl", "KL, nats/token")):
            body = []
            for u in upds:
                cell = {r["read_fmt"]: r for r in split if f"{r['fmt']}/{r['rounding']}" == u}
                body.append([f"update {u}"] + [
                    f"{g(cell[rf][metric])} ({cell[rf]['bytes_per_step']:,.0f} B)"
                    if rf in cell else "–" for rf in reads])
            out.append(f"**{mdl}, split, {unit} at step {sub[0]['step']:,}** (bytes per step "
                       "per head in brackets)\n\n" + md_table(["", *[f"read {x}" for x in reads]],
                                                             body))
        refs = [[r["label"], nbytes(r["bytes_per_step"]), r["rel_err"], r["kl"]]
                for r in sub if r["kind"] != "split"]
        out.append(f"**{mdl}, references**\n\n" + md_table(
            ["scheme", "bytes/step/head", "rel_err", "KL (nats/token)"], refs))
        rec = []
        for b in budgets:
            ok = sorted((r for r in sub if _pos(r["rel_err"]) <= b),
                        key=lambda r: (r["bytes_per_step"], r["rel_err"]))
            rec.append([f"rel_err ≤ {b:g}"] + ([ok[0]["label"], nbytes(ok[0]["bytes_per_step"]),
                                                ok[0]["rel_err"]] if ok else ["none fits", "–",
                                                                               "–"]))
        out.append(f"**{mdl}, cheapest scheme within a budget (at the last window)**\n\n" +
                   md_table(["budget", "scheme", "bytes/step/head", "rel_err"], rec))
    return "\n\n".join(out)


def table_sr_bits(rows):
    fin = sorted(finals(rows), key=lambda r: (r["kind"], r["fmt"], r["rounding"],
                                              r["sr_bits"] or 0))
    body = [[r["label"], r["fmt"], r["rounding"], str(r["sr_bits"] or "–"), r["rel_err"], r["kl"],
             r["state_drift"]] for r in fin]
    return md_table(["scheme", "state format", "rounding", "SR bits",
                     f"rel_err at {fin[0]['step']:,}", "KL (nats/token)", "state drift"], body)


def table_speculative(rows):
    fin = sorted(finals(rows), key=lambda r: (r["model"], r["label"], _profile(r), r["drafts"]))
    fin = [r for r in fin if (r["drafts"] and r["kind"] != "conventional") or (  # conventional:
        not r["drafts"] and not any(  # T = 0 only (drafts change nothing), once per layer
            x is not r and not x["drafts"] and (x["model"], x["label"]) == (r["model"],
                                                                            r["label"])
            and x["job"] < r["job"] for x in fin))]
    body = [[r["model"], r["label"], str(r["drafts"]), _profile(r), r["rel_err"], r["kl"],
             r["state_drift"], nbytes(r["bytes_per_step"])] for r in fin]
    return md_table(["layer", "scheme", "drafts T", "acceptance", f"rel_err at "
                     f"{fin[0]['step']:,}", "KL (nats/token)", "state drift",
                     "bytes/step/head"], body)


def table_decay_exp(rows):
    fin = finals(rows)
    body = []
    for lab in dict.fromkeys(r["label"] for r in fin):
        e = next((r for r in fin if r["label"] == lab and r["decay_exp"] == "exact"), None)
        f = next((r for r in fin if r["label"] == lab and r["decay_exp"] == "fast"), None)
        ratio = f["rel_err"] / e["rel_err"] if e and f and e["rel_err"] else None
        body.append([lab, e and e["rel_err"], f and f["rel_err"], ratio,
                     e and e["state_drift"], f and f["state_drift"]])
    return md_table(["scheme", f"rel_err at {fin[0]['step']:,}, exact exp", "… fast exp",
                     "fast / exact", "state drift, exact", "state drift, fast"], body)


def table_kl_vs_paper(rows):
    fin = finals(rows)
    body = []
    for mdl in dict.fromkeys(_shape(r) for r in fin):
        sub = {r["scheme"]: r for r in fin if _shape(r) == mdl}
        for r in sub.values():
            body.append([mdl, r["label"], r["kl"], r["kl_p10"], r["kl_p90"], r["rel_err"]])
        sh, sp = sub.get("shared_nvfp4_sr"), sub.get("split_fp32_nvfp4")
        if sh and sp and sp["kl"]:
            body.append([mdl, "**ratio shared / split (FP32 update)**", sh["kl"] / sp["kl"], None,
                         None, sh["rel_err"] / sp["rel_err"] if sp["rel_err"] else None])
    body.append(["ReplaySSM paper (real model)", "shared NVFP4 / split", 0.136, None, None, None])
    body.append(["", "ratio", 0.136 / 0.0038, None, None, None])
    return md_table(["layer", "scheme", f"KL at step {fin[0]['step']:,} (nats/token)",
                     "KL p10", "KL p90", "rel_err"], body)


# -- the studies -----------------------------------------------------------------------------
@dataclass
class Study:
    name: str  # preset conf/experiment/<name>.yaml and folder experiments/<name>/
    number: int
    title: str
    question: str
    look_for: str
    published: str
    plot: Callable
    table: Callable
    smoke: tuple[str, ...] = SMOKE_BASE
    gpu_jobs: int = 1  # joblib workers on the GPU (a multirun's jobs side by side)
    expected_gpu_s: str = ""
    cost: int = 1  # relative GPU time: the costliest studies start first
    notes: list[str] = field(default_factory=list)

    @property
    def command(self) -> str:
        return f"python -m precsim -m experiment={self.name} run.device=cuda"


NEMOTRON = ("Nemotron 3 (median accuracy drop vs an FP32 SSM cache; RTN vs SR): FP16 2.32% vs "
            "-0.32%, INT8 block 128 2.87% vs 0.00%, FP8 block 128 12.68% vs 1.96%.")
REPLAY_KL = ("ReplaySSM: KL 0.136 (shared NVFP4 checkpoint) vs 0.0038 (split precision), a ratio "
             "of ~36x, measured on a real model's next-token distributions.")
ARTICLE = ("The article's table (docs/workloads.md, experiments/studies/seed_table/NOTES.md): "
           "conventional FP32 1.8e-07 … 1.8e-06; conventional NVFP4 every step 0.681 … 1.198; "
           "shared NVFP4 checkpoint 0.243 … 1.187; split FP32 + NVFP4 0.078 … 0.090; split "
           "FP16-SR + NVFP4 0.079 … 0.091 (1–256 … to 32,768 steps).")

STUDIES = [
    Study("study_seed_table_131k", 1, "The article's table at production size",
          "Does the article's five-config table keep its shape on the Nemotron-3-Super layer "
          "(128 × 64 × 128) over 131,072 steps on the GPU, beside the 4-head CPU table?",
          "shared climbs to the every-step level, split stays flat at the NVFP4 read error, "
          "FP16-SR split equals FP32 split; the FP32 row within 3x of the CPU table's at 32,768.",
          ARTICLE, plot_seed_table, table_seed_table, expected_gpu_s="~30 s (1 compile)"),
    Study("study_buffer_len", 2, "Buffer length",
          "How do shared and split error and KL change with the replay buffer length "
          "L ∈ {4, 8, 16, 32, 64}, against the bytes per step each L costs; where is the knee?",
          "shared's error falls with L (fewer checkpoint roundings) while buffer traffic grows as "
          "(L+1)/2 entries per step; split was expected to be flat in L (its error is the read "
          "copy's).",
          "None published for L; the article and ReplaySSM use L = 16.",
          plot_buffer_len, table_buffer_len, gpu_jobs=5,
          expected_gpu_s="~60 s (5 jobs side by side, one compile per L)"),
    Study("study_mamba2_vs_gdn", 3, "Mamba-2 vs GDN",
          "Does GDN (Qwen3.5 layer, 32 × 128 × 128) behave like Mamba-2 (Nemotron-3-Super) under "
          "split NVFP4, and does the read copy's error leak into GDN's state through "
          "u_t = β(v − α S k) when S k reads the read copy (replay.gdn_u_source=read vs master)?",
          "GDN's master drift with S·k from the read copy vs from the master; the two Mamba-2 jobs "
          "must agree (gdn_u_source does nothing there).",
          "None published for GDN.", plot_mamba2_vs_gdn, table_mamba2_vs_gdn, gpu_jobs=4,
          expected_gpu_s="~60 s (4 jobs side by side)"),
    Study("study_precision_table", 4, "The precision table a user picks from",
          "Which split update format {fp32, bf16-SR, fp16-SR, fp8_e4m3-SR, fp8_e5m2-SR} × read "
          "format {nvfp4, mxfp4, fp8_e4m3, fp16} (plus conventional and shared references) is "
          "cheapest at a given error over 131,072 steps, on the Nemotron-3-Super and Qwen3.5 "
          "layer shapes?",
          "the Pareto front of error vs bytes per step; whether the update format matters at all "
          "once the read format is fixed; the recommendation at three budgets.",
          f"{NEMOTRON} (a conventional FP16-SR cache is the production reference.)",
          plot_precision_table, table_precision_table, gpu_jobs=2, cost=9,
          expected_gpu_s="~150 s (2 jobs side by side, 4 compiles each)"),
    Study("study_sr_bits", 5, "SR random bits",
          "How many random bits does stochastic rounding need for FP16 and FP8-E4M3 states "
          "rounded every step to stay unbiased over 131,072 steps?",
          "the error and state drift vs SR bits: where SR with few bits turns back into RNE-like "
          "bias (a stalled or drifting state).", NEMOTRON, plot_sr_bits, table_sr_bits, cost=7,
          expected_gpu_s="~80 s (3 compiles)"),
    Study("study_speculative", 6, "Speculative decoding",
          "Do speculative decoding's drafts (T ∈ {1, 2, 4, 8} per verification, per-position "
          "acceptance profiles typical of MTP heads) cost shared or split ReplaySSM precision on "
          "the Nemotron-3-Super and Qwen3.5 layers over 131,072 steps, and what do they do to the "
          "bytes per step?",
          "the error vs T per profile against T = 0; drafts make flushes more frequent (flush "
          "when committed + 2T > L), i.e. more checkpoint roundings for shared and more state "
          "writes per step.",
          "None published for precision; ReplaySSM's throughput gains (1.85× Nemotron-3-Super, "
          "2.10× Qwen3.5-122B) are with MTP drafts.", plot_speculative, table_speculative,
          cost=8, expected_gpu_s="to be measured (tests/gpu/gpu_check_drafts.py)",
          notes=["Profiles (assumed, typical of MTP heads; draft i accepted with p_i once drafts "
                 "1..i-1 were): [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2] and [0.7, 0.5, 0.4, "
                 "0.3, 0.2, 0.2, 0.2, 0.2]; T uses the first T entries. The T = 0 jobs run once "
                 "per profile (the same numbers)."]),
    Study("study_decay_exp", 7, "The decay's own precision",
          "How much of a 'FP32 baseline' error is the float32 exp of the decay (fast, as real "
          "kernels compute it) rather than the FP32 state, over 131,072 steps?",
          "conventional FP32 with the exact vs the fast exp (ratio), against the FP16 states.",
          ARTICLE + " (Which exp the article's FP32 row used is not stated; the study tests both.)",
          plot_decay_exp, table_decay_exp, gpu_jobs=2, expected_gpu_s="~40 s",
          notes=["On the GPU the fast exp is the kernels' own `tl.exp` (ex2.approx); on the CPU "
                 "it is emulated as the exactly rounded exp2 of the float32 product."]),
    Study("study_kl_vs_paper", 8, "KL ordering against the paper",
          "Is shared NVFP4's KL above split's by the published ratio (0.136 vs 0.0038 ≈ 36x) over "
          "131,072 steps on the real layer shapes?",
          "the KL ratio shared / split per layer, with p10–p90 bands across 4 sequences.",
          REPLAY_KL, plot_kl_vs_paper, table_kl_vs_paper,
          smoke=(*SMOKE_BASE, "run.seqs=2"), gpu_jobs=2, expected_gpu_s="~40 s",
          notes=["The KL here comes from a fixed random readout head (vocab 1024, logit scale 3) "
                 "on one layer's output, not a real model's logits: its size scales with the "
                 "readout (KL ≈ logit_scale² · rel_err² / 2), so the ratio is the comparable "
                 "figure, not the absolute KL."]),
]
BY_NAME = {s.name: s for s in STUDIES}


# -- running ---------------------------------------------------------------------------------
def study_command(st: Study, sweep_dir: Path, device: str, smoke: bool,
                  extra: tuple[str, ...] = ()) -> list[str]:
    cmd = [sys.executable, "-m", "precsim", "-m", f"experiment={st.name}", f"run.device={device}",
           "run.progress=false", f"hydra.sweep.dir={sweep_dir}",
           "hydra.sweep.subdir=job${hydra.job.num}"]
    if smoke:
        cmd += list(st.smoke)
    elif st.gpu_jobs > 1 and _has_joblib():  # else Hydra's basic launcher: jobs in turn
        cmd += ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={st.gpu_jobs}"]
    return cmd + list(extra)


def _has_joblib() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is not None
    except ModuleNotFoundError:  # no hydra_plugins namespace at all
        return False


def machine() -> dict:
    out = {"host": platform.node(), "platform": platform.platform(), "cpus": os.cpu_count(),
           "python": platform.python_version()}
    try:
        import torch

        out["torch"] = torch.__version__
        if torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - no torch: machine info without it
        pass
    return out


def run_study(st: Study, work: Path, dest: Path, device: str, smoke: bool,
              extra: tuple[str, ...] = (), concurrent: int = 1,
              timeout_s: float | None = None) -> dict:
    """Run one study's command into ``work/<name>``, write its CSV, PNG, run_info.json and NOTES
    into ``dest/<name>``. Returns the run info."""
    sweep = work / st.name
    if sweep.exists():
        shutil.rmtree(sweep)
    if concurrent > 1 and device == "cpu":  # studies side by side: one core each
        extra = (*extra, "run.threads=1")
    cmd = study_command(st, sweep, device, smoke, extra)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    started = dt.datetime.now(dt.timezone.utc)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
        rc = proc.returncode
    except subprocess.TimeoutExpired:  # stop this study's process group; keep finished jobs
        os.killpg(proc.pid, signal.SIGTERM)
        stdout, stderr = proc.communicate()
        rc, stderr = "timeout", stderr + f"\nstopped after --timeout={timeout_s} s"
    wall = time.perf_counter() - t0
    out = dest / st.name
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.log").write_text(stdout[-20000:] + "\n--- stderr ---\n" + stderr[-20000:])
    rows = tidy_rows(st.name, sweep) if sweep.is_dir() else []
    summaries = [(f.parent.name, json.loads(f.read_text()))
                 for f in sorted(sweep.glob("*/summary.json"))]
    shown = [c if not c.startswith("hydra.sweep.dir=") else "hydra.sweep.dir=<work>/" + st.name
             for c in cmd[1:]]
    info = {"study": st.name, "number": st.number, "smoke": smoke,
            "command": "python " + shlex.join(shown), "started_utc": started.isoformat(
                timespec="seconds"), "wall_s": round(wall, 1), "returncode": rc,
            "concurrent_studies": concurrent, "machine": machine(),
            "jobs": [{"job": name, "engine": s.get("engine"),
                      "device": s.get("device"), "wall_s": s.get("wall_s"),
                      "model": s["config"]["model"]["name"], "steps": s.get("steps")}
                     for name, s in summaries]}
    (out / INFO_NAME).write_text(json.dumps(info, indent=1) + "\n")
    with PLOT_LOCK:  # matplotlib is not thread-safe; studies run in threads
        if rows:
            write_csv(rows, out / CSV_NAME)
            replot(st, out)
        write_notes(st, out)
    status = "ok" if rc == 0 and rows else f"FAILED (rc {rc}; see run.log)"
    print(f"{st.name}: {status}, {wall:.0f} s, {len(rows)} CSV rows -> {out}", flush=True)
    return info


def replot(st: Study, folder: Path) -> Path | None:
    """The study's PNG drawn from its CSV (so a figure always matches the committed numbers)."""
    if not (folder / CSV_NAME).is_file():
        return None
    path = folder / f"{st.name.removeprefix('study_')}.png"
    st.plot(read_csv(folder / CSV_NAME), path)
    return path


# -- NOTES.md --------------------------------------------------------------------------------
def results_block(st: Study, folder: Path) -> str:
    info_f, csv_f = folder / INFO_NAME, folder / CSV_NAME
    if not info_f.is_file() or not csv_f.is_file():
        return "_No results yet: run `python experiments/run_studies.py` (GPU)._"
    info = json.loads(info_f.read_text())
    rows = read_csv(csv_f)
    m = info["machine"]
    hw = m.get("gpu") or f"CPU ({m.get('cpus')} cores)"
    engines = sorted({f"{j['engine']} on {j['device']}" for j in info["jobs"]})
    jobs_s = [j["wall_s"] for j in info["jobs"] if j.get("wall_s") is not None]
    lines = []
    if info.get("smoke"):
        lines.append("**SMOKE RUN (reduced sizes, CPU): a check of the pipeline, not the study's "
                     "result.**\n")
    if info.get("returncode") != 0:
        lines.append(f"**Incomplete: the command ended with {info.get('returncode')!r}; "
                     f"{len(info['jobs'])} job(s) complete (see run.log).**\n")
    lines += [f"Run {info['started_utc']} on {m['host']}: {hw}, torch {m.get('torch', '?')}; "
              f"engines: {', '.join(engines) or '–'}.",
              f"Command: `{info['command']}`.",
              f"Run time: {info['wall_s']:.0f} s for the whole command (process start-up and "
              f"Triton compilation included; {info['concurrent_studies']} studies side by side), "
              f"{len(jobs_s)} job(s) of {g(min(jobs_s) if jobs_s else None)}–"
              f"{g(max(jobs_s) if jobs_s else None)} s engine wall time each.",
              "",
              "Units: rel_err = ‖y − y_ref‖₂ / ‖y_ref‖₂ over the layer output, the mean of the "
              "256-step window ending at the step named (dimensionless); KL in nats per token "
              "through the fixed readout head (vocab 1024, logit scale 3); state drift "
              "‖S − S_ref‖_F / ‖S_ref‖_F; bytes per decode step per head from the cost model "
              "(precsim/cost.py).",
              "",
              st.table(rows),
              "",
              f"![{st.title}]({st.name.removeprefix('study_')}.png)",
              "",
              f"Files: `{CSV_NAME}` (tidy: one row per job, scheme and window end; window ends "
              "thinned to ~48 log-spaced ones), the PNG, `run_info.json`, `run.log`."]
    return "\n".join(lines)


def write_notes(st: Study, folder: Path) -> Path:
    """Write NOTES.md, or replace only its results block when it exists."""
    path = folder / "NOTES.md"
    block = f"{BEGIN}\n{results_block(st, folder)}\n{END}"
    if path.is_file() and BEGIN in path.read_text():
        text = path.read_text()
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1] if END in rest else ""
        path.write_text(head + block + tail)
        return path
    extra = "".join(f"\n\n{n}" for n in st.notes)
    path.write_text(f"""# Study {st.number}: {st.title}

**Question.** {st.question}

**Command** (one GPU; `python experiments/run_studies.py` runs every study and writes this
folder):

    {st.command}

CPU check at reduced size: `python experiments/run_studies.py --smoke --only {st.name}`.
Expected GPU time (H200): {st.expected_gpu_s or '–'}.{extra}

**What to look for.** {st.look_for}

**Published numbers.** {st.published}

## Results

{block}

## Finding

{FINDING_MARK}
_Not written yet: two or three sentences from the numbers above, by a person, after the GPU run._

## Comparison with the published numbers

{FINDING_MARK}
_Not written yet._
""")
    return path


# -- archive ---------------------------------------------------------------------------------
def pack(dest: Path, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / ARCHIVE
    with tarfile.open(path, "w:gz") as tar:
        for st in STUDIES:
            if (dest / st.name).is_dir():
                tar.add(dest / st.name, arcname=st.name)
    return path


def unpack(archive: Path, into: Path = STUDIES_DIR) -> list[str]:
    """Extract the archive's study folders into ``into`` (member names checked), then refresh
    every NOTES.md results block."""
    names = []
    with tarfile.open(archive) as tar:
        members = []
        for mem in tar.getmembers():
            top = mem.name.split("/", 1)[0]
            if top not in BY_NAME or ".." in Path(mem.name).parts or not (mem.isfile()
                                                                          or mem.isdir()):
                raise SystemExit(f"{archive}: unexpected member {mem.name!r}")
            members.append(mem)
            names.append(top)
        for mem in members:
            if mem.isfile():
                target = into / mem.name
                if target.name == "NOTES.md" and target.is_file():
                    continue  # keep what a person wrote; its results block is refreshed below
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(mem).read())
    done = list(dict.fromkeys(names))
    for n in done:
        write_notes(BY_NAME[n], into / n)  # the PNG came with the archive
    return done


# -- main ------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true",
                   help="reduced sizes on the CPU, into experiments/_smoke (not committed)")
    p.add_argument("--only", help="comma-separated study names (default: all)")
    p.add_argument("--jobs", type=int, help="studies run side by side (default: 4 on the GPU, "
                   "1 with --smoke)")
    p.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda, cpu with --smoke")
    p.add_argument("--dest", type=Path, help="where study folders go (default: experiments/, "
                   "experiments/_smoke with --smoke, a temporary folder with --out)")
    p.add_argument("--out", type=Path, help=f"also write one archive {ARCHIVE} of every study "
                   "folder into this directory")
    p.add_argument("--timeout", type=float, help="seconds per study; a study past it is stopped "
                   "and its finished jobs are kept (default: none)")
    p.add_argument("--deadline", type=float, help="seconds for the whole run: each study is "
                   "stopped at it (finished jobs kept), a study not started 30 s before it is "
                   "skipped, and the archive is written")
    p.add_argument("--work", type=Path, help="Hydra run directories (default: a temporary one)")
    p.add_argument("--unpack", type=Path, metavar="ARCHIVE",
                   help="extract an archive of --out into experiments/ and refresh the NOTES")
    p.add_argument("--notes", action="store_true",
                   help="redraw every PNG and refresh every NOTES.md results block from the "
                   "study CSVs under --dest (default: experiments/)")
    a = p.parse_args(argv)
    if a.unpack:
        print("unpacked:", ", ".join(unpack(a.unpack)))
        return 0
    if a.notes:
        for st in STUDIES:
            folder = (a.dest or STUDIES_DIR) / st.name
            folder.mkdir(parents=True, exist_ok=True)
            replot(st, folder)
            print(write_notes(st, folder))
        return 0
    studies = STUDIES if not a.only else [BY_NAME[n.strip()] for n in a.only.split(",")]
    device = a.device or ("cpu" if a.smoke else "cuda")
    jobs = a.jobs or (1 if a.smoke else 4)
    tmp = None
    if a.dest:
        dest = a.dest
    elif a.out:
        dest = Path(tmp := tempfile.mkdtemp(prefix="studies_")) / "results"
    else:
        dest = EXP / "_smoke" if a.smoke else STUDIES_DIR
    work = a.work or Path(tempfile.mkdtemp(prefix="studies_work_"))
    t0 = time.perf_counter()

    def one(st: Study) -> dict:
        left = a.deadline - (time.perf_counter() - t0) if a.deadline else math.inf
        if left < 30:
            print(f"{st.name}: not run ({left:.0f} s left of --deadline={a.deadline:g})")
            return {"study": st.name, "returncode": "not run"}
        limit = min(a.timeout or math.inf, left)
        return run_study(st, work, dest, device, a.smoke, concurrent=min(jobs, len(studies)),
                         timeout_s=None if math.isinf(limit) else limit)

    # the longest first, so that the side-by-side slots stay busy
    order = sorted(studies, key=lambda st: -st.cost)
    with ThreadPoolExecutor(max_workers=jobs) as ex:
        infos = list(ex.map(one, order))
    print(f"all studies: {time.perf_counter() - t0:.0f} s")
    if a.out:
        print("archive:", pack(dest, a.out))
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(i["returncode"] == 0 for i in infos) else 1


if __name__ == "__main__":
    sys.exit(main())
