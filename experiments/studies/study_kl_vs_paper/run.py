"""Study 8: KL ordering against the paper. Its definition, plot, result table and driver.

The preset is ``conf/experiment/study_kl_vs_paper.yaml``; the results (``results.csv``, the
PNG, ``run_info.json``, ``run.log``) and ``NOTES.md`` are in this folder. One GPU, results into
this folder; ``--smoke``: the CPU at reduced sizes into ``experiments/_smoke/``; ``--notes``: the
PNG and the NOTES tables from ``results.csv`` again; ``--out DIR``: also ``DIR/studies.tar.gz``:

    python experiments/studies/study_kl_vs_paper/run.py [--smoke | --notes | --out DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # studies/: studylib
from studylib import (  # noqa: E402
    REPLAY_KL,
    SMOKE_BASE,
    Study,
    finals,
    finish_figure,
    get_plt,
    main,
    md_table,
    shape_label,
    title_line,
)


def plot_kl_vs_paper(rows, path):
    plt = get_plt()
    fin = [r for r in finals(rows) if r["kind"] != "conventional"]
    models = list(dict.fromkeys(shape_label(r) for r in fin))
    labels = list(dict.fromkeys(r["label"] for r in fin))
    fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.8 / (len(labels) + 1)
    for i, lab in enumerate(labels):
        xs, ys, lo, hi = [], [], [], []
        for j, mdl in enumerate(models):
            r = next((r for r in fin if r["label"] == lab and shape_label(r) == mdl), None)
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
    fig.suptitle(title_line(rows, "KL, shared vs split"), fontsize=10)
    finish_figure(fig, [ax], path, ncol=2)


def table_kl_vs_paper(rows):
    fin = finals(rows)
    body = []
    for mdl in dict.fromkeys(shape_label(r) for r in fin):
        sub = {r["scheme"]: r for r in fin if shape_label(r) == mdl}
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


STUDY = Study(
    "study_kl_vs_paper", 8, "KL ordering against the paper",
    "Is shared NVFP4's KL above split's by the published ratio (0.136 vs 0.0038 ≈ 36x) over "
    "131,072 steps on the real layer shapes?",
    "the KL ratio shared / split per layer, with p10–p90 bands across 4 sequences.",
    REPLAY_KL, plot_kl_vs_paper, table_kl_vs_paper,
    smoke=(*SMOKE_BASE, "run.seqs=2"), gpu_jobs=2, expected_gpu_s="~40 s",
    notes=["The KL here comes from a fixed random readout head (vocab 1024, logit scale 3) "
           "on one layer's output, not a real model's logits: its size scales with the "
           "readout (KL ≈ logit_scale² · rel_err² / 2), so the ratio is the comparable "
           "figure, not the absolute KL."])


if __name__ == "__main__":
    sys.exit(main(studies=[STUDY], prog=f"experiments/studies/{STUDY.name}/run.py"))
