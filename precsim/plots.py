"""Error-vs-length plots: log-log, one line per scheme, percentile bands across sequences."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PANELS = (("rel_err", "relative output error"), ("kl", "KL(p_ref || p_sim)"),
          ("state_drift", "state drift (held state)"))


def _series(rows, scheme, key):
    pts = [(r["step"], r.get(key, math.nan)) for r in rows if r["scheme"] == scheme]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_error_vs_length(rows: list[dict], labels: dict[str, str], path: Path,
                         title: str = "") -> Path:
    """Write a PNG with one panel per metric present in ``rows``."""
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    panels = [(k, t) for k, t in PANELS
              if any(_finite_pos(r.get(k)) for r in rows)]
    if not panels:
        panels = [PANELS[0]]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, ttl) in zip(axes[0], panels, strict=True):
        for i, s in enumerate(schemes):
            c = colors[i % len(colors)]
            x, y = _series(rows, s, key)
            yp = [v if _finite_pos(v) else math.nan for v in y]
            if not any(_finite_pos(v) for v in yp):
                continue
            # dashes tell apart schemes whose curves coincide (e.g. FP32 vs FP16-SR split)
            ax.plot(x, yp, color=c, lw=1.6, ls=("-", "--", "-.", ":")[i % 4],
                    label=labels.get(s, s))
            xl, lo = _series(rows, s, key + "_p10")
            _, hi = _series(rows, s, key + "_p90")
            if any(_finite_pos(v) for v in lo) and lo != hi:
                ax.fill_between(xl, [v if _finite_pos(v) else math.nan for v in lo],
                                [v if _finite_pos(v) else math.nan for v in hi],
                                color=c, alpha=0.18, lw=0)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("decode steps (tokens)")
        ax.set_title(ttl, fontsize=10)
        ax.grid(True, which="major", alpha=0.35)
        ax.grid(True, which="minor", alpha=0.12)
    axes[0][0].legend(fontsize=7.5, loc="best")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=130)
    plt.close(fig)
    tmp.replace(path)
    return path


def _finite_pos(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0
