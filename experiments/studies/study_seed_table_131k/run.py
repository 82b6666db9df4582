"""Study 1: The article's table at production size. Its definition, plot, result table and driver.

The preset is ``conf/experiment/study_seed_table_131k.yaml``; the results (``results.csv``, the
PNG, ``run_info.json``, ``run.log``) and ``NOTES.md`` are in this folder. One GPU, results into
this folder; ``--smoke``: the CPU at reduced sizes into ``experiments/_smoke/``; ``--notes``: the
PNG and the NOTES tables from ``results.csv`` again; ``--out DIR``: also ``DIR/studies.tar.gz``:

    python experiments/studies/study_seed_table_131k/run.py [--smoke | --notes | --out DIR]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # studies/: studylib
from studylib import (  # noqa: E402
    ARTICLE,
    STUDIES_DIR,
    Study,
    _lengths_of,
    at,
    curves,
    finals,
    g,
    main,
    md_table,
    shape_label,
    title_line,
)


def plot_seed_table(rows, path):
    curves(rows, path, lambda r: r["label"],
           title_line(rows, f"article's table, {shape_label(rows[0])}"),
           panels=(("rel_err", "relative output error (window mean)"),
                   ("kl", "KL(p_ref ‖ p_sim), nats/token"),
                   ("state_drift", "state drift ‖S−S_ref‖/‖S_ref‖")))


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


STUDY = Study(
    "study_seed_table_131k", 1, "The article's table at production size",
    "Does the article's five-config table keep its shape on the Nemotron-3-Super layer "
    "(128 × 64 × 128) over 131,072 steps on the GPU, beside the 4-head CPU table?",
    "shared climbs to the every-step level, split stays flat at the NVFP4 read error, "
    "FP16-SR split equals FP32 split; the FP32 row within 3x of the CPU table's at 32,768.",
    ARTICLE, plot_seed_table, table_seed_table, expected_gpu_s="~30 s (1 compile)")


if __name__ == "__main__":
    sys.exit(main(studies=[STUDY], prog=f"experiments/studies/{STUDY.name}/run.py"))
