"""Study 5: SR random bits. Its definition, plot, result table and driver.

The preset is ``conf/experiment/study_sr_bits.yaml``; the results (``results.csv``, the
PNG, ``run_info.json``, ``run.log``) and ``NOTES.md`` are in this folder. One GPU, results into
this folder; ``--smoke``: the CPU at reduced sizes into ``experiments/_smoke/``; ``--notes``: the
PNG and the NOTES tables from ``results.csv`` again; ``--out DIR``: also ``DIR/studies.tar.gz``:

    python experiments/studies/study_sr_bits/run.py [--smoke | --notes | --out DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # studies/: studylib
from studylib import (  # noqa: E402
    NEMOTRON,
    Study,
    finals,
    finish_figure,
    get_plt,
    main,
    md_table,
    positive,
    shape_label,
    title_line,
)


def plot_sr_bits(rows, path):
    plt = get_plt()
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
                    ax.plot([p[0] for p in pts], [positive(p[1]) for p in pts], ls, color=c,
                            label=f"{kind} {f}, SR" + (" + nvfp4 read" if kind == "split"
                                                       else ""))
            rne = [r for r in fin if r["fmt"] == f and r["rounding"] == "rne"]
            if rne:
                ax.axhline(positive(rne[0][metric]), color=c, ls=":", lw=1.2,
                           label=f"conventional {f}, RNE")
        ref = [r for r in fin if r["fmt"] == "fp32" and r["kind"] == "conventional"]
        if ref:
            ax.axhline(positive(ref[0][metric]), color="k", ls=":", lw=1, label="conventional fp32")
        ax.set_yscale("log")
        ax.set_xticks(sorted({r["sr_bits"] for r in fin if r["sr_bits"]}))
        ax.set_xlabel("SR random bits per rounding")
        ax.set_ylabel(ylab)
        ax.grid(True, alpha=0.3)
    fig.suptitle(title_line(rows, f"SR random bits, {shape_label(rows[0])}"), fontsize=10)
    finish_figure(fig, list(axes), path)


def table_sr_bits(rows):
    fin = sorted(finals(rows), key=lambda r: (r["kind"], r["fmt"], r["rounding"],
                                              r["sr_bits"] or 0))
    body = [[r["label"], r["fmt"], r["rounding"], str(r["sr_bits"] or "–"), r["rel_err"], r["kl"],
             r["state_drift"]] for r in fin]
    return md_table(["scheme", "state format", "rounding", "SR bits",
                     f"rel_err at {fin[0]['step']:,}", "KL (nats/token)", "state drift"], body)


STUDY = Study(
    "study_sr_bits", 5, "SR random bits",
    "How many random bits does stochastic rounding need for FP16 and FP8-E4M3 states "
    "rounded every step to stay unbiased over 131,072 steps?",
    "the error and state drift vs SR bits: where SR with few bits turns back into RNE-like "
    "bias (a stalled or drifting state).", NEMOTRON, plot_sr_bits, table_sr_bits, cost=7,
    expected_gpu_s="~80 s (3 compiles)")


if __name__ == "__main__":
    sys.exit(main(studies=[STUDY], prog=f"experiments/studies/{STUDY.name}/run.py"))
