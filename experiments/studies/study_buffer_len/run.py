"""Study 2: Buffer length. Its definition, plot, result table and driver.

The preset is ``conf/experiment/study_buffer_len.yaml``; the results (``results.csv``, the
PNG, ``run_info.json``, ``run.log``) and ``NOTES.md`` are in this folder. One GPU, results into
this folder; ``--smoke``: the CPU at reduced sizes into ``experiments/_smoke/``; ``--notes``: the
PNG and the NOTES tables from ``results.csv`` again; ``--out DIR``: also ``DIR/studies.tar.gz``:

    python experiments/studies/study_buffer_len/run.py [--smoke | --notes | --out DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # studies/: studylib
from studylib import (  # noqa: E402
    Study,
    finals,
    finish_figure,
    get_plt,
    loglog_axes,
    main,
    md_table,
    nbytes,
    positive,
    shape_label,
    title_line,
)


def plot_buffer_len(rows, path):
    plt = get_plt()
    fin = [r for r in finals(rows) if r["kind"] != "conventional"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    for i, lab in enumerate(dict.fromkeys(r["label"] for r in fin)):
        pts = sorted((r["buffer_len"], r["rel_err"], r["kl"], r["bytes_per_step"])
                     for r in fin if r["label"] == lab)
        x = [p[0] for p in pts]
        style = dict(ls=("-", "--", ":")[i % 3], marker="osD"[i % 3], ms=5, label=lab)
        axes[0].plot(x, [positive(p[1]) for p in pts], **style)
        axes[1].plot(x, [positive(p[2]) for p in pts], **style)
        line, = axes[2].plot([p[3] for p in pts], [positive(p[1]) for p in pts], **style)
        for p in pts if i < 2 else []:  # the FP16-SR split lies on the FP32 one
            axes[2].annotate(f"L={p[0]}", (p[3], positive(p[1])), fontsize=7,
                             xytext=(3, 4 if i == 0 else -10), textcoords="offset points",
                             color=line.get_color())
    step = fin[0]["step"] if fin else 0
    loglog_axes(axes[0], "buffer length L (steps)", f"relative output error at step {step:,}")
    loglog_axes(axes[1], "buffer length L (steps)", f"KL at step {step:,}, nats/token")
    loglog_axes(axes[2], "bytes per decode step per head (cost model)",
            f"relative output error at step {step:,}", xbase=10)
    fig.suptitle(title_line(rows, f"buffer length, {shape_label(rows[0])}"), fontsize=10)
    finish_figure(fig, list(axes), path)


def table_buffer_len(rows):
    fin = sorted(finals(rows), key=lambda r: (r["kind"], r["label"], r["buffer_len"]))
    ref = [r for r in fin if r["kind"] == "conventional"][:1]  # the same in every job
    fin = ref + [r for r in fin if r["kind"] != "conventional"]
    body = [[r["label"], str(r["buffer_len"]) if r["kind"] != "conventional" else "(any)",
             nbytes(r["bytes_per_step"]), r["rel_err"], r["kl"], r["state_drift"]] for r in fin]
    return md_table(["scheme", "L", "bytes/step/head", f"rel_err at {fin[0]['step']:,}",
                     "KL (nats/token)", "state drift"], body)


STUDY = Study(
    "study_buffer_len", 2, "Buffer length",
    "How do shared and split error and KL change with the replay buffer length "
    "L ∈ {4, 8, 16, 32, 64}, against the bytes per step each L costs; where is the knee?",
    "shared's error falls with L (fewer checkpoint roundings) while buffer traffic grows as "
    "(L+1)/2 entries per step; split was expected to be flat in L (its error is the read "
    "copy's).",
    "None published for L; the article and ReplaySSM use L = 16.",
    plot_buffer_len, table_buffer_len, gpu_jobs=5,
    expected_gpu_s="~60 s (5 jobs side by side, one compile per L)")


if __name__ == "__main__":
    sys.exit(main(studies=[STUDY], prog=f"experiments/studies/{STUDY.name}/run.py"))
