"""Study 4: The precision table a user picks from. Its definition, plot, result table and driver.

The preset is ``conf/experiment/study_precision_table.yaml``; the results (``results.csv``, the
PNG, ``run_info.json``, ``run.log``) and ``NOTES.md`` are in this folder. One GPU, results into
this folder; ``--smoke``: the CPU at reduced sizes into ``experiments/_smoke/``; ``--notes``: the
PNG and the NOTES tables from ``results.csv`` again; ``--out DIR``: also ``DIR/studies.tar.gz``:

    python experiments/studies/study_precision_table/run.py [--smoke | --notes | --out DIR]
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # studies/: studylib
from studylib import (  # noqa: E402
    NEMOTRON,
    Study,
    finals,
    g,
    get_plt,
    loglog_axes,
    main,
    md_table,
    nbytes,
    pareto_points,
    positive,
    shape_label,
    title_line,
)


def plot_precision_table(rows, path):
    plt = get_plt()
    fin = finals(rows)
    models = list(dict.fromkeys(shape_label(r) for r in fin))
    fig, axes = plt.subplots(2, len(models), figsize=(6.5 * len(models), 9), squeeze=False)
    reads = ["nvfp4", "mxfp4", "fp8_e4m3", "fp16"]
    markers = {"nvfp4": "o", "mxfp4": "s", "fp8_e4m3": "^", "fp16": "D", None: "x"}
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    upd = list(dict.fromkeys(f"{r['fmt']}/{r['rounding']}" for r in fin if r["kind"] == "split"))
    for j, mdl in enumerate(models):
        sub = [r for r in fin if shape_label(r) == mdl]
        for i, metric in enumerate(("rel_err", "kl")):
            ax = axes[i][j]
            for r in sub:
                if r["kind"] == "split":
                    c = colors[upd.index(f"{r['fmt']}/{r['rounding']}") % 10]
                    ax.scatter(r["bytes_per_step"], positive(r[metric]), color=c,
                               marker=markers.get(r["read_fmt"], "o"), s=30, zorder=3)
                else:
                    ax.scatter(r["bytes_per_step"], positive(r[metric]), color="k", marker="x",
                               s=30, zorder=3)
                    ax.annotate(r["label"], (r["bytes_per_step"], positive(r[metric])),
                                fontsize=6.5, xytext=(4, -10), textcoords="offset points",
                                zorder=5)  # above the markers of the crowded 4-bit corner,
                                # no box, so that the markers stay visible through it
            front = pareto_points([(r["bytes_per_step"], positive(r[metric])) for r in sub
                            if not math.isnan(positive(r[metric]))])
            ax.plot([p[0] for p in front], [p[1] for p in front], "-", color="0.5", lw=1,
                    zorder=1, label="Pareto front")
            loglog_axes(ax, "bytes per decode step per head (cost model)",
                    "relative output error at the last window" if metric == "rel_err"
                    else "KL at the last window, nats/token", mdl if i == 0 else "", xbase=10)
    h = [plt.Line2D([], [], color=colors[k % 10], marker="o", ls="", label=f"split, update {u}")
         for k, u in enumerate(upd)]
    h += [plt.Line2D([], [], color="0.3", marker=markers[rf], ls="", label=f"read {rf}")
          for rf in reads]
    h += [plt.Line2D([], [], color="k", marker="x", ls="", label="conventional / shared"),
          plt.Line2D([], [], color="0.5", ls="-", label="Pareto front")]
    fig.legend(handles=h, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(title_line(rows, "precision table"), fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table_precision_table(rows, budgets=(0.01, 0.0625, 0.25)):
    fin = finals(rows)
    out = []
    for mdl in dict.fromkeys(shape_label(r) for r in fin):
        sub = [r for r in fin if shape_label(r) == mdl]
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
            ok = sorted((r for r in sub if positive(r["rel_err"]) <= b),
                        key=lambda r: (r["bytes_per_step"], r["rel_err"]))
            rec.append([f"rel_err ≤ {b:g}"] + ([ok[0]["label"], nbytes(ok[0]["bytes_per_step"]),
                                                ok[0]["rel_err"]] if ok else ["none fits", "–",
                                                                               "–"]))
        out.append(f"**{mdl}, cheapest scheme within a budget (at the last window)**\n\n" +
                   md_table(["budget", "scheme", "bytes/step/head", "rel_err"], rec))
    return "\n\n".join(out)


STUDY = Study(
    "study_precision_table", 4, "The precision table a user picks from",
    "Which split update format {fp32, bf16-SR, fp16-SR, fp8_e4m3-SR, fp8_e5m2-SR} × read "
    "format {nvfp4, mxfp4, fp8_e4m3, fp16} (plus conventional and shared references) is "
    "cheapest at a given error over 131,072 steps, on the Nemotron-3-Super and Qwen3.5 "
    "layer shapes?",
    "the Pareto front of error vs bytes per step; whether the update format matters at all "
    "once the read format is fixed; the recommendation at three budgets.",
    f"{NEMOTRON} (a conventional FP16-SR cache is the production reference.)",
    plot_precision_table, table_precision_table, gpu_jobs=2, cost=9,
    expected_gpu_s="~150 s (2 jobs side by side, 4 compiles each)")


if __name__ == "__main__":
    sys.exit(main(studies=[STUDY], prog=f"experiments/studies/{STUDY.name}/run.py"))
