"""Error-vs-length plots: log-log, one line per scheme, percentile bands across sequences; the
top-1 agreement (with the readout) on a linear axis from 0 to 1."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PANELS = (("rel_err", "relative output error", "‖y − y_ref‖ / ‖y_ref‖ (window mean)"),
          ("kl", "KL(p_ref ‖ p_sim)", "KL per token, nats (window mean)"),
          ("top1", "top-1 agreement with the truth", "share of steps whose argmax agrees"),
          ("state_drift", "state drift (held state)", "‖S − S_ref‖_F / ‖S_ref‖_F"))
LINEAR = {"top1"}  # panels on a linear y axis (a share in [0, 1])
DECADES = 3  # the y range shown per panel; a scheme far below it is marked at the bottom edge


_SUP = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def token_labels(x, _pos=None) -> str:
    """A length on the x axis: 256, 1K, 32K, 1M (plain text: no mathtext to parse)."""
    if x >= 1 << 20 and x % (1 << 20) == 0:
        return f"{int(x) >> 20}M"
    if x >= 1024 and x % 1024 == 0:
        return f"{int(x) >> 10}K"
    return f"{x:g}"


def power10_labels(y, _pos=None) -> str:
    """A decade on a log y axis as 10⁻³ (plain text: no mathtext to parse)."""
    if y <= 0:
        return ""
    e = math.log10(y)
    return f"10{str(round(e)).translate(_SUP)}" if abs(e - round(e)) < 1e-9 else ""


def minor_labels(ax, y, _pos=None) -> str:
    """Minor ticks of a log y axis spanning under ~1.5 decades are labelled (2e-3, 5e-3), so the
    axis never shows no value at all."""
    lo, hi = ax.get_ylim()
    if lo <= 0 or math.log10(hi / lo) > 1.5 or round(y / 10 ** math.floor(math.log10(y))) not in \
            (2, 3, 5):
        return ""
    return f"{y:.0e}".replace("e-0", "e-").replace("e+0", "e")


def plain_ticks(ax, x_tokens: bool = True, y_log: bool = True) -> None:
    """Log-axis tick labels as plain text (10⁻³ on y; lengths as 256, 1K, 32K on x): no
    mathtext to parse (~1 s of a process's first plot)."""
    if x_tokens:
        ax.xaxis.set_major_formatter(plt.FuncFormatter(token_labels))
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
    if y_log:
        ax.yaxis.set_major_formatter(plt.FuncFormatter(power10_labels))
        ax.yaxis.set_minor_formatter(plt.FuncFormatter(functools.partial(minor_labels, ax)))


def _series(rows, scheme, key):
    pts = [(r["step"], r.get(key, math.nan)) for r in rows if r["scheme"] == scheme]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_error_vs_length(rows: list[dict], labels: dict[str, str], path: Path,
                         title: str = "", budget: tuple[str, float] | None = None) -> Path:
    """Write a PNG with one panel per metric present in ``rows``: the mean across sequences with
    its p10–p90 band, markers where a curve has few points, the budget line ``(metric, value)``
    on its panel. A panel spans at most ``DECADES`` decades below its top; a scheme entirely
    below (e.g. FP32 at 1e-7 beside NVFP4 at 1e-1) is marked at the bottom edge with its value."""
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    panels = [p for p in PANELS if any(_shown(p[0], r.get(p[0])) for r in rows)] or [PANELS[0]]
    n_leg = math.ceil((len(schemes) + bool(budget)) / 4)  # legend rows under the panels
    fig, axes = plt.subplots(1, len(panels), figsize=(5.4 * len(panels), 4.23 + 0.17 * n_leg),
                             squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, ttl, ylabel) in zip(axes[0], panels, strict=True):
        lin = key in LINEAR
        ok = functools.partial(_shown, key)
        tops = [v for r in rows for k in (key, key + "_p90") if _finite_pos(v := r.get(k))]
        if budget and budget[0] == key:
            tops.append(budget[1])
        top = max(tops) if tops else 1.0
        floor = -math.inf if lin else top * 10.0 ** -DECADES
        below = []
        for i, s in enumerate(schemes):
            c = colors[i % len(colors)]
            x, y = _series(rows, s, key)
            yp = [v if ok(v) else math.nan for v in y]
            if not any(ok(v) for v in yp):
                continue
            lab = labels.get(s, s)
            if max(v for v in yp if ok(v)) < floor:
                below.append((c, lab, yp[-1]))
                continue
            few = sum(ok(v) for v in yp) <= 12
            # dashes tell apart schemes whose curves coincide (e.g. FP32 vs FP16-SR split)
            ax.plot(x, yp, color=c, lw=1.8, ls=("-", "--", "-.", ":")[i % 4], label=lab,
                    marker="o" if few else None, ms=4)
            xl, lo = _series(rows, s, key + "_p10")
            _, hi = _series(rows, s, key + "_p90")
            if any(ok(v) for v in lo) and lo != hi:
                lo = [v if ok(v) else math.nan for v in lo]
                hi = [v if ok(v) else math.nan for v in hi]
                ax.fill_between(xl, lo, hi, color=c, alpha=0.3, lw=0)
                ax.plot(xl, lo, color=c, lw=0.6, alpha=0.7)
                ax.plot(xl, hi, color=c, lw=0.6, alpha=0.7)
        if budget and budget[0] == key:
            ax.axhline(budget[1], color="k", ls=(0, (4, 3)), lw=1.2,
                       label=f"budget {key} ≤ {budget[1]:g}")
        ax.set_xscale("log", base=2)
        if lin:  # a share: zoom on the data, keep 1 (full agreement) in view
            seen = [v for s in schemes for v in _series(rows, s, key)[1] if ok(v)]
            lo_v = min(seen, default=0.0)
            ax.set_ylim(max(-0.03, lo_v - 0.05 * (1.0 - lo_v) - 0.01), 1.01)
        else:
            ax.set_yscale("log")
            top = [v for s in schemes for k in (key, key + "_p90")
                   for v in _series(rows, s, k)[1] if ok(v) and v > 0]
            if top:  # headroom: a curve at the top is not drawn on the frame
                ax.set_ylim(top=max(top) * 1.8)
        if below:
            ax.set_ylim(bottom=floor)
            for j, (c, lab, v) in enumerate(below):
                ax.annotate(f"▼ {lab}: {v:.2g} (below the axis)", xy=(0.02, 0.02 + 0.06 * j),
                            xycoords="axes fraction", color=c, fontsize=7.5,
                            bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none",
                                  "alpha": 0.85})  # readable over a curve passing beneath
        plain_ticks(ax, y_log=not lin)
        ax.set_xlabel("decode steps (tokens)")
        ax.set_ylabel(ylabel)
        ax.set_title(ttl, fontsize=10, y=1.0)  # a set y: no search for decorations above
        ax.grid(True, which="major", alpha=0.35)
        ax.grid(True, which="minor", alpha=0.12)
    legend: dict = {}  # label -> handle, each label once across the panels
    for ax in axes[0]:
        for hh, ll in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(ll, hh)
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=min(4, len(legend)),
               fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fixed_margins(fig, left=0.8, right=0.15, top=0.55, bottom=0.88 + 0.17 * n_leg, gap=0.95)
    return save_png(fig, path, dpi=130)


def fixed_margins(fig, *, left: float, right: float, top: float, bottom: float,
                  gap: float) -> None:
    """Margins around a row of panels and the gap between them, in inches. ``tight_layout``
    measured them by drawing the whole figure once more (~40% of a plot's time)."""
    w, h = fig.get_size_inches()
    fig.subplots_adjust(left=left / w, right=1 - right / w, top=1 - top / h, bottom=bottom / h,
                        wspace=gap / (w / len(fig.axes) - gap))


def save_png(fig, path: Path, **savefig_kw) -> Path:
    """Write ``fig`` to ``path`` atomically (a temporary name, then a rename) and close it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, **savefig_kw)
    plt.close(fig)
    tmp.replace(path)
    return path


def _shown(key: str, v) -> bool:
    """Whether ``v`` can be drawn on ``key``'s panel (log axes: positive; linear: finite)."""
    if key in LINEAR:
        return isinstance(v, (int, float)) and math.isfinite(v)
    return _finite_pos(v)


def _finite_pos(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def plot_heatmap(rows: list[dict], metric: str, path: Path, title: str) -> None:
    """Layer x scheme heatmap of ``metric`` (log colour scale), each cell labelled."""
    import numpy as np
    from matplotlib.colors import LogNorm

    layers = sorted({r["layer"] for r in rows})
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    z = np.full((len(layers), len(schemes)), np.nan)
    for r in rows:
        z[layers.index(r["layer"]), schemes.index(r["scheme"])] = r[metric]
    pos = z[np.isfinite(z) & (z > 0)]
    fig, ax = plt.subplots(figsize=(1.6 + 1.5 * len(schemes), 1.2 + 0.35 * len(layers)))
    norm = LogNorm(pos.min(), pos.max()) if pos.size and pos.max() > pos.min() else None
    im = ax.imshow(np.where(z > 0, z, np.nan), aspect="auto", cmap="viridis", norm=norm)
    for i in range(len(layers)):
        for j in range(len(schemes)):
            ax.text(j, i, _short_g(z[i, j]), ha="center", va="center", fontsize=8, color="white",
                    bbox={"facecolor": "black", "alpha": 0.35, "pad": 1, "lw": 0})
    ax.set_xticks(range(len(schemes)), schemes, rotation=20, ha="right")
    ax.set_yticks(range(len(layers)), [f"layer {la}" for la in layers])
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, label=metric)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _short_g(v) -> str:
    return "nan" if v is None or not math.isfinite(v) else f"{v:.3g}"
