"""Study 7: The decay's own precision. Its definition, plot, result table and driver.

The preset is ``conf/experiment/study_decay_exp.yaml``; the results (``results.csv``, the
PNG, ``run_info.json``, ``run.log``) and ``NOTES.md`` are in this folder. One GPU, results into
this folder; ``--smoke``: the CPU at reduced sizes into ``experiments/_smoke/``; ``--notes``: the
PNG and the NOTES tables from ``results.csv`` again; ``--out DIR``: also ``DIR/studies.tar.gz``:

    python experiments/studies/study_decay_exp/run.py [--smoke | --notes | --out DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # studies/: studylib
from studylib import (  # noqa: E402
    ARTICLE,
    Study,
    curves,
    finals,
    main,
    md_table,
    shape_label,
    title_line,
)


def plot_decay_exp(rows, path):
    curves(rows, path, lambda r: f"{r['label']}, exp {r['decay_exp']}",
           title_line(rows, f"decay exp, {shape_label(rows[0])}"),
           panels=(("rel_err", "relative output error (window mean)"),
                   ("state_drift", "state drift ‖S−S_ref‖/‖S_ref‖")),
           style_of=lambda r: "--" if r["decay_exp"] == "fast" else "-",
           color_of=lambda r: r["label"])


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


STUDY = Study(
    "study_decay_exp", 7, "The decay's own precision",
    "How much of a 'FP32 baseline' error is the float32 exp of the decay (fast, as real "
    "kernels compute it) rather than the FP32 state, over 131,072 steps?",
    "conventional FP32 with the exact vs the fast exp (ratio), against the FP16 states.",
    ARTICLE + " (Which exp the article's FP32 row used is not stated; the study tests both.)",
    plot_decay_exp, table_decay_exp, gpu_jobs=2, expected_gpu_s="~40 s",
    notes=["On the GPU the fast exp is the kernels' own `tl.exp` (ex2.approx); on the CPU "
           "it is emulated as the exactly rounded exp2 of the float32 product."])


if __name__ == "__main__":
    sys.exit(main(studies=[STUDY], prog=f"experiments/studies/{STUDY.name}/run.py"))
