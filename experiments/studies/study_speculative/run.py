"""Study 6: Speculative decoding. Its definition, plot, result table and driver.

The preset is ``conf/experiment/study_speculative.yaml``; the results (``results.csv``, the
PNG, ``run_info.json``, ``run.log``) and ``NOTES.md`` are in this folder. One GPU, results into
this folder; ``--smoke``: the CPU at reduced sizes into ``experiments/_smoke/``; ``--notes``: the
PNG and the NOTES tables from ``results.csv`` again; ``--out DIR``: also ``DIR/studies.tar.gz``:

    python experiments/studies/study_speculative/run.py [--smoke | --notes | --out DIR]
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # studies/: studylib
from studylib import (  # noqa: E402
    Study,
    finals,
    finish_figure,
    get_plt,
    main,
    md_table,
    nbytes,
    positive,
    profile_label,
    title_line,
)


def plot_speculative(rows, path):
    """Per layer and ReplaySSM scheme: the last window's error vs T, one line per acceptance
    profile, T = 0 drawn as T = 0 of every line."""
    plt = get_plt()
    fin = [r for r in finals(rows) if r["kind"] != "conventional"]
    panels = list(dict.fromkeys((r["model"], r["label"]) for r in fin))
    ncol = min(3, len(panels))
    nrow = math.ceil(len(panels) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 4.2 * nrow), squeeze=False)
    axes = list(axes.reshape(-1))
    for ax, (model, lab) in zip(axes, panels, strict=False):
        sub = [r for r in fin if r["model"] == model and r["label"] == lab]
        base = [r for r in sub if not r["drafts"]]
        for i, prof in enumerate(dict.fromkeys(profile_label(r) for r in sub if r["drafts"])):
            pts = sorted((r["drafts"], r["rel_err"]) for r in sub if profile_label(r) == prof)
            pts = [(0, base[0]["rel_err"])] * bool(base) + pts
            ax.plot([p[0] for p in pts], [positive(p[1]) for p in pts], "o-", color=f"C{i}",
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
    fig.suptitle(title_line(rows, f"speculative decoding, L = {rows[0]['buffer_len']}"),
                 fontsize=10)
    finish_figure(fig, axes[:len(panels)], path, ncol=4)


def table_speculative(rows):
    fin = sorted(finals(rows),
                 key=lambda r: (r["model"], r["label"], profile_label(r), r["drafts"]))
    fin = [r for r in fin if (r["drafts"] and r["kind"] != "conventional") or (  # conventional:
        not r["drafts"] and not any(  # T = 0 only (drafts change nothing), once per layer
            x is not r and not x["drafts"] and (x["model"], x["label"]) == (r["model"],
                                                                            r["label"])
            and x["job"] < r["job"] for x in fin))]
    body = [[r["model"], r["label"], str(r["drafts"]), profile_label(r), r["rel_err"], r["kl"],
             r["state_drift"], nbytes(r["bytes_per_step"])] for r in fin]
    return md_table(["layer", "scheme", "drafts T", "acceptance", f"rel_err at "
                     f"{fin[0]['step']:,}", "KL (nats/token)", "state drift",
                     "bytes/step/head"], body)


STUDY = Study(
    "study_speculative", 6, "Speculative decoding",
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
           "per profile (the same numbers)."])


if __name__ == "__main__":
    sys.exit(main(studies=[STUDY], prog=f"experiments/studies/{STUDY.name}/run.py"))
