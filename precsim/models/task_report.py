"""A task run's summary, table, per-item CSV, plots and files (``experiment=task_eval``;
:mod:`precsim.models.task` scores the items, this writes what they give)."""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from pathlib import Path

import numpy as np

from ..rundir import ITEMS_CSV, SUMMARY_FILE, TASK_DELTA_PLOT, TASK_LENGTH_PLOT
from ..tasks import METRICS
from ..taskstats import compare


def summarize(cfg, items, groups, per: dict, source: str, ld, timing: dict) -> dict:
    """The summary of a task run: per row of the table (the reference, the baseline, the noise
    floor, each scheme with its SR seeds pooled) the paired figures against the baseline, for
    the whole task and (built-in tasks) per length."""
    from .run import baseline_index, seed_names

    t = cfg.task
    b = baseline_index(cfg)
    base = groups[b]
    names = seed_names(cfg)
    table = [(g.name, [g.name], "fp32" if g.role == "baseline" else g.role)
             for g in groups if g.reference or g.role in ("baseline", "noise")]
    table[0] = (groups[0].name, [groups[0].name], "reference")
    table += [(n, runs, "scheme") for n, runs in names.items()]
    table = [(n, r, "baseline" if n == base.name else role) for n, r, role in table]
    metric = t.metric
    lengths = sorted({it.length for it in items if it.length is not None})
    by_len = {L: np.asarray([it.length == L for it in items]) for L in lengths}
    mc = any(it.kind == "mc" for it in items)
    bvec = per[base.name][metric]
    rows = {}
    for name, runs, role in table:
        s = np.stack([per[r][metric] for r in runs])
        keep = np.isfinite(bvec) & np.isfinite(s).all(axis=0)
        row = {"role": role, **compare(s[:, keep], bvec[keep], t.alpha, t.power, seed=t.seed)}
        for m in METRICS:
            v = np.stack([per[r][m] for r in runs])
            row[m] = float(np.nanmean(v)) if np.isfinite(v).any() else math.nan
        if lengths:
            row["by_length"] = {str(L): compare(s[:, m_], bvec[m_], t.alpha, t.power,
                                                seed=t.seed) for L, m_ in by_len.items()}
        rows[name] = row
    kinds = sorted({it.kind for it in items})
    return {
        "experiment": "task_eval", "complete": True,
        "task": {"source": source, "path": t.path, "name": t.name, "items": len(items),
                 "kinds": kinds, "metric": metric if mc else "exact_match (greedy)",
                 "lengths": lengths or None, "alpha": t.alpha, "power": t.power},
        "baseline": {"setting": cfg.metrics.baseline, "name": base.name},
        "model": {"path": str(cfg.model.path), "class": type(ld.model).__name__,
                  "dtype": str(next(ld.model.parameters()).dtype).replace("torch.", ""),
                  "device": ld.device, "scan_backend": ld.backend, "ssm_layers": ld.layers},
        "schemes": rows, "timing_s": timing,
        "sr_seeds": cfg.run.sr_seeds,
        "config": _config_dict(cfg),
        "_items": items, "_per": per, "_groups": [g.name for g in groups],
    }


def _config_dict(cfg) -> dict:
    from ..rundir import json_safe

    return json_safe(dataclasses.asdict(cfg))


# -- outputs ----------------------------------------------------------------------------------
def items_csv(summary: dict) -> str:
    """One line per item: where it came from, its gold, and each group's prediction and
    correctness (under ``task.metric``)."""
    items, per, names = summary["_items"], summary["_per"], summary["_groups"]
    metric = summary["config"]["task"]["metric"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["item", "line", "length", "kind", "gold", "choices",
                *[f"{n}:{c}" for n in names for c in ("pred", "correct", "lp_gold")]])
    for i, it in enumerate(items):
        cells = []
        for n in names:
            p = per[n]
            ok = p[metric][i]
            cells += [int(p[metric + ":pred"][i]), "" if math.isnan(ok) else int(ok),
                      f"{p['acc:lp_gold'][i]:.6g}"]
        w.writerow([i, it.line if it.length is None else "", it.length or "", it.kind,
                    it.gold, len(it.choices), *cells])
    return buf.getvalue()


def format_table(summary: dict) -> str:
    """The task's table: per row, accuracy [95% Wilson], the change against the baseline
    [95% paired bootstrap], items lost/gained, exact McNemar p, minimum detectable change."""
    t, base = summary["task"], summary["baseline"]["name"]
    lines = [f"task {t['source']}: {t['items']} items ({', '.join(t['kinds'])}), "
             f"{t['metric']}; baseline {base}; {summary['model']['class']}"
             + (f" ({summary['model']['dtype']} weights)" if summary["model"].get("dtype")
                else "")]
    hdr = (f"{'scheme':<22} {'acc':>6} {'95% CI':>15} {'change':>8} {'95% CI':>17} "
           f"{'lost':>6} {'gained':>6} {'p':>9} {'MDD':>6}")
    lines += [hdr, "-" * len(hdr)]
    for name, r in summary["schemes"].items():
        ci = f"[{r['acc_lo']:.3f},{r['acc_hi']:.3f}]"
        label = name + (f" x{r['seeds']}" if r["seeds"] > 1 else "")
        if r["role"] == "baseline":
            lines.append(f"{label:<22} {r['acc']:>6.3f} {ci:>15} {'(baseline)':>8}")
            continue
        dci = f"[{r['delta_lo']:+.3f},{r['delta_hi']:+.3f}]"
        lost, gained = (f"{r['lost']:g}", f"{r['gained']:g}")
        lines.append(f"{label:<22} {r['acc']:>6.3f} {ci:>15} {r['delta']:>+8.3f} {dci:>17} "
                     f"{lost:>6} {gained:>6} {r['p_mcnemar']:>9.3g} {r['mdd']:>6.3f}")
    if t.get("lengths"):
        lines.append("")
        lines.append("accuracy by length: " + "  ".join(
            f"{name}: " + " ".join(f"{L}={r['by_length'][str(L)]['acc']:.2f}"
                                   for L in t["lengths"])
            for name, r in summary["schemes"].items()))
    return "\n".join(lines)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def plot(summary: dict) -> tuple[str, bytes] | None:
    """Accuracy against length (built-in tasks: one line per row, Wilson intervals), else each
    scheme's change against the baseline with its interval and minimum detectable change."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = summary["task"]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    if t.get("lengths"):
        Ls = t["lengths"]
        rows = list(summary["schemes"].items())
        markers = "osD^vP*Xh<>p"
        seen: dict[tuple, str] = {}
        for i, (name, r) in enumerate(rows):
            bl = [r["by_length"][str(L)] for L in Ls]
            acc = [b["acc"] for b in bl]
            # each row a little aside (in log2 length) and its own marker, so that rows with
            # the same accuracies stay visible; a row equal to an earlier one says so
            x = [L * 2 ** (0.04 * (i - (len(rows) - 1) / 2)) for L in Ls]
            same = seen.setdefault(tuple(acc), name)
            label = name if same == name else f"{name} (= {same})"
            line, = ax.plot(x, acc, marker=markers[i % len(markers)], label=label,
                            ls="--" if r["role"] in ("reference", "noise") else "-",
                            mfc="none" if same != name else None)
            ax.fill_between(x, [b["acc_lo"] for b in bl], [b["acc_hi"] for b in bl],
                            color=line.get_color(), alpha=0.08)
        ax.set_xscale("log", base=2)
        ax.set_xticks(Ls, [f"{L:,}" for L in Ls])
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel("accuracy (95% Wilson)")
        ax.set_ylim(-0.02, 1.02)
        per = t["items"] // max(1, len(Ls))
        ax.set_title(f"{t['source']}: {per} items a length")
        ax.legend(fontsize=8)
        name = TASK_LENGTH_PLOT
    else:
        rs = [(n, r) for n, r in summary["schemes"].items() if r["role"] != "baseline"]
        if not rs:
            plt.close(fig)
            return None
        y = np.arange(len(rs))
        d = np.asarray([r["delta"] for _, r in rs])
        lo = np.asarray([r["delta_lo"] for _, r in rs])
        hi = np.asarray([r["delta_hi"] for _, r in rs])
        ax.errorbar(d, y, xerr=[np.nan_to_num(d - lo), np.nan_to_num(hi - d)], fmt="o",
                    capsize=3)
        mdd = min((r["mdd"] for _, r in rs if math.isfinite(r["mdd"])), default=None)
        if mdd is not None:
            ax.axvspan(-mdd, mdd, color="0.85", label=f"smallest detectable change ({mdd:.3f})")
            ax.legend(fontsize=8)
        ax.axvline(0, color="k", lw=0.8)
        ax.set_yticks(y, [n for n, _ in rs])
        ax.set_xlabel(f"accuracy change vs {summary['baseline']['name']} (95% paired bootstrap)")
        ax.set_title(f"{t['source']}: {t['items']} items, {t['metric']}")
        name = TASK_DELTA_PLOT
    data = _png(fig)
    plt.close(fig)
    return name, data


def write(summary: dict, out: Path, plot_it: bool = True) -> dict:
    """Write the run directory: ``items.csv``, the plot, then ``summary.json`` (last: it marks
    the run complete); each atomically. Returns the summary as written."""
    from ..rundir import atomic_write_bytes, atomic_write_text, write_json

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / ITEMS_CSV, items_csv(summary))
    public = {k: v for k, v in summary.items() if not k.startswith("_")}
    if plot_it:
        p = plot(summary)
        if p is not None:
            atomic_write_bytes(out / p[0], p[1])
            public["plot"] = p[0]
    write_json(out / SUMMARY_FILE, public)
    return public
