"""Study 3: Mamba-2 vs GDN. Its definition, plot, result table and driver.

The preset is ``conf/experiment/study_mamba2_vs_gdn.yaml``; the results (``results.csv``, the
PNG, ``run_info.json``, ``run.log``) and ``NOTES.md`` are in this folder. One GPU, results into
this folder; ``--smoke``: the CPU at reduced sizes into ``experiments/_smoke/``; ``--notes``: the
PNG and the NOTES tables from ``results.csv`` again; ``--out DIR``: also ``DIR/studies.tar.gz``:

    python experiments/studies/study_mamba2_vs_gdn/run.py [--smoke | --notes | --out DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # studies/: studylib
from studylib import (  # noqa: E402
    Study,
    curves,
    finals,
    main,
    md_table,
    shape_label,
    title_line,
)


def plot_mamba2_vs_gdn(rows, path):
    # gdn_u_source does nothing for Mamba-2: draw its first job only (the table lists both)
    first = min((r["job"] for r in rows if r["family"] == "mamba2"), default=None)
    rows = [r for r in rows if r["family"] != "mamba2" or r["job"] == first]

    def key(r):
        u = f", S·k from {r['gdn_u_source']}" if r["gdn_u_source"] else ""
        return f"{r['label']}{u}"
    curves(rows, path, key, title_line(rows, "Mamba-2 vs GDN"),
           panels=(("rel_err", "relative output error (window mean)"),
                   ("state_drift", "state drift ‖S−S_ref‖/‖S_ref‖ (split: master)")),
           style_of=lambda r: "--" if r["gdn_u_source"] == "master" else "-",
           split_by=shape_label, color_of=lambda r: r["label"])


def table_mamba2_vs_gdn(rows):
    fin = sorted(finals(rows), key=lambda r: (r["family"], r["label"], str(r["gdn_u_source"])))
    body = [[shape_label(r), r["job"], r["gdn_u_source"] or "(n/a)", r["label"], r["rel_err"],
             r["kl"], r["state_drift"], r["read_drift"]] for r in fin]
    return md_table(["layer", "job", "S·k from", "scheme", f"rel_err at {fin[0]['step']:,}",
                     "KL (nats/token)", "state drift (master)", "read drift"], body)


STUDY = Study(
    "study_mamba2_vs_gdn", 3, "Mamba-2 vs GDN",
    "Does GDN (Qwen3.5 layer, 32 × 128 × 128) behave like Mamba-2 (Nemotron-3-Super) under "
    "split NVFP4, and does the read copy's error leak into GDN's state through "
    "u_t = β(v − α S k) when S k reads the read copy (replay.gdn_u_source=read vs master)?",
    "GDN's master drift with S·k from the read copy vs from the master; the two Mamba-2 jobs "
    "must agree (gdn_u_source does nothing there).",
    "None published for GDN.", plot_mamba2_vs_gdn, table_mamba2_vs_gdn, gpu_jobs=4,
    expected_gpu_s="~60 s (4 jobs side by side)")


if __name__ == "__main__":
    sys.exit(main(studies=[STUDY], prog=f"experiments/studies/{STUDY.name}/run.py"))
