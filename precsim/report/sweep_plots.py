"""The sweep's two plots: error vs length (:func:`plot_error_vs_length`) and error vs bytes per
step, the Pareto plot (:func:`plot_pareto`)."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from .groups import group_tags
from .ranking import Candidate, decide, pareto_front, sig3
from .runs import METRICS, Job, costs, scheme_rows

_KIND_MARKERS = {"conventional": "s", "shared": "^", "split": "o"}
_SERIES_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "<", ">", "h")


def _recommended(jobs: list[Job], budget: tuple[str, float] | None,
                 horizon: int | None) -> list[Candidate]:
    """Each comparable group's recommended configuration under ``budget`` (none without one)."""
    if budget is None or budget[0] not in METRICS:
        return []
    return [rec.best for _, _, rec in decide(jobs, budget[0], budget[1], horizon)
            if rec is not None and rec.best is not None]


def _budget_line(ax, budget: tuple[str, float]) -> None:
    ax.axhline(budget[1], color="k", ls=(0, (4, 3)), lw=1.2, zorder=4,
               label=f"budget: {budget[0]} ≤ {budget[1]:g}")


def _mark_recommended(ax, x: float, y: float, hollow: bool = False,
                      others: list[tuple[float, float]] = ()) -> None:
    """A star on the recommended point and a "recommended" label with a leader line, placed at
    the first offset (of seven around the point, the nearer first) that leaves 30 points of
    room to the other points ``others`` (data coordinates; the axes' limits must be final), else
    at the one with the most room, inside the axes."""
    ax.scatter([x], [y], marker="*", s=260, zorder=4.5, linewidths=1.2, edgecolors="k",
               facecolors="none" if hollow else "gold")
    to_px = ax.transData.transform
    pts = [to_px(p) for p in others if _pos(p[0]) and _pos(p[1]) and p != (x, y)]
    x0, y0 = to_px((x, y))
    dpi = ax.figure.dpi / 72  # points -> pixels

    box = ax.get_window_extent()

    def room(off):  # the distance from the label's centre to the nearest other point
        cx, cy = x0 + (off[0] + 30 * (1 if off[0] > 0 else -0.2)) * dpi, y0 + off[1] * dpi
        if not (box.x0 + 34 * dpi <= cx <= box.x1 - 34 * dpi
                and box.y0 + 8 * dpi <= cy <= box.y1 - 8 * dpi):
            return -1.0  # (outside the axes: over the ticks or the title)
        return min((max(abs(px - cx) - 34 * dpi, 0) + max(abs(py - cy) - 8 * dpi, 0)
                    for px, py in pts), default=math.inf)

    off = max([(-58, 26), (12, 26), (12, -30), (-58, -30), (40, -70), (-70, -70), (60, 40)],
              key=lambda o: min(room(o), 30 * dpi))  # (beyond 30 pt of room: the nearest)
    ax.annotate("recommended", (x, y), xytext=off, textcoords="offset points",
                fontsize=8, weight="bold", zorder=7,
                bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "0.3", "lw": 0.6},
                arrowprops={"arrowstyle": "-", "color": "0.2", "lw": 0.8, "shrinkB": 7})


def _same_curve(a: list, b: list, rel: float = 0.02) -> bool:
    """Whether two curves (values at the same steps) lie on top of each other on a log axis."""
    pairs = [(x, y) for x, y in zip(a, b, strict=False) if _pos(x) and _pos(y)]
    return len(pairs) == len(a) == len(b) and bool(pairs) and all(
        abs(x - y) <= rel * max(x, y) for x, y in pairs)


def plot_error_vs_length(jobs: list[Job], path: Path, budget: tuple[str, float] | None = None,
                         horizon: int | None = None) -> Path:
    """rel_err and KL vs length of every (job, scheme); a scheme with the same curve in every
    job (the baseline) is drawn once. Line style by scheme kind; each highlighted curve has a
    marker of its own (markers staggered along the curve), and a curve lying on top of another
    says so in the legend. With ``budget`` ``(metric, value)``: the budget line on its panel and
    the recommended configuration drawn bold, first in the legend."""
    from ..plots import fixed_margins, plain_ticks, plt, save_png

    done = [j for j in jobs if j.summary is not None]
    tags = group_tags(done)
    recs = {(c.label, c.bytes_per_step) for c in _recommended(done, budget, horizon)}
    series, seen = [], {}
    for j in done:
        per_scheme = scheme_rows(j)
        cost = costs(j.summary)
        for s, info in j.summary.get("schemes", {}).items():
            mine = per_scheme[s]
            label = info.get("label", s)
            key = (label, f"{mine[-1].get('rel_err', math.nan):.3g}" if mine else "")
            if key in seen:  # same configuration, same result: drawn once, without a job tag
                seen[key][3] = ""
                continue
            b = cost.get(s, {}).get("bytes_per_step")
            item = [info.get("kind", ""), label, mine, tags.get(j.name, ""),
                    (label, float(b)) in recs if b is not None else False]
            seen[key] = item
            series.append(item)
    n_label = Counter(x[1] for x in series)  # a job's tag only where the label is ambiguous
    series = [(k, f"{t}: {lab}" if t and n_label[lab] > 1 else lab, rs, r)
              for k, lab, rs, t, r in series]
    panels = [m for m in ("rel_err", "kl")
              if any(_pos(r.get(m)) for _k, _l, rs, _r in series for r in rs)]
    panels = panels or ["rel_err"]
    # the configurations on a Pareto front (bytes vs final rel_err, per comparable group) are
    # drawn in colour; the others are faded, without a legend entry, so 25 stay readable
    front_labels = set()
    for _g, cs, _ in decide(done, panels[0], None, horizon):
        front = pareto_front(_drawable(cs))  # (and what coincides with it: not hidden)
        front_labels |= {(c.tag + ": " if c.tag and n_label[c.label] > 1 else "") + c.label
                         for c in _drawable(cs) if any(_coincide(c, f) for f in front)}
    hi = [x for x in series if x[1] in front_labels or x[3]] or series[:10]
    hi.sort(key=lambda x: not x[3])  # the recommended first
    # a curve on top of an earlier one (on the first panel): said in the legend
    on_top: dict[int, int] = {}
    for i, (_k, _l, rs, _r) in enumerate(hi):
        ys = [r.get(panels[0]) for r in rs]
        for k in range(i):
            if k not in on_top and _same_curve(ys, [r.get(panels[0]) for r in hi[k][2]]):
                on_top[i] = k
                break
    names = []
    for i, (_k, lab, _rs, rec) in enumerate(hi):
        name = ("★ recommended: " if rec else "") + lab
        if i in on_top:
            name += f"  (lies on #{on_top[i] + 1})"
        names.append(f"#{i + 1} {name}")
    ncol = 1 if len(hi) <= 6 else 2
    n_extra = bool(budget and budget[0] in panels) + (len(hi) < len(series))
    extra = 0.22 * math.ceil((len(hi) + n_extra + 1) / ncol)
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.4 + extra),
                             squeeze=False)
    cmap = plt.get_cmap("tab10")
    styles = {"conventional": ":", "shared": "--", "split": "-"}
    for ax, m in zip(axes[0], panels, strict=True):
        for _kind, lab, rs, _rec in series:
            if any(lab == x[1] for x in hi):
                continue
            y = [r.get(m) if _pos(r.get(m)) else math.nan for r in rs]
            ax.plot([r["step"] for r in rs], y, lw=0.8, color="0.75", zorder=1,
                    marker="o" if len(rs) < 4 else None, ms=2)
        for i, (kind, _lab, rs, rec) in enumerate(hi):
            y = [r.get(m) if _pos(r.get(m)) else math.nan for r in rs]
            every = max(1, len(rs) // 8)
            ax.plot([r["step"] for r in rs], y, lw=3.2 if rec else 1.8, label=names[i],
                    color=cmap(i % 10), zorder=5 if rec else 3, ls=styles.get(kind, "-."),
                    marker=_SERIES_MARKERS[i % len(_SERIES_MARKERS)],
                    markevery=(i % every, every), ms=5 if i in on_top else 3.5,
                    mfc="none" if i in on_top else None)
        vals = [r.get(m) for *_, rs, _r in series for r in rs]
        exact = not any(_pos(v) for v in vals)  # every value 0: a linear axis (log has none)
        if budget and budget[0] == m:
            _budget_line(ax, budget)
            vals.append(budget[1])
        ax.set_xscale("log", base=2)
        steps = [r["step"] for *_, rs, _r in series for r in rs if r.get("step")]
        if steps:  # (curves of NaN alone set no x range: the log axis would get 0..1)
            ax.set_xlim(min(steps) / 1.1, max(steps) * 1.1)
        if not exact:
            ax.set_yscale("log")
        plain_ticks(ax, y_log=not exact)
        clip_low(ax, vals, [(lab, rs[-1].get(m), "C0") for _k, lab, rs, _r in series if rs])
        ax.set_xlabel("decode steps (tokens)")
        ax.set_ylabel({"rel_err": "‖y − y_ref‖ / ‖y_ref‖", "kl": "KL per token (nats)"}[m])
        ax.set_title({"rel_err": "relative output error", "kl": "KL(p_ref || p_sim)"}[m])
        ax.grid(True, alpha=0.3)
    fixed_margins(fig, left=0.75, right=0.2, top=0.35, bottom=0.5 + extra, gap=0.9)
    legend: dict = {}
    for ax in axes[0]:
        for hh, ll in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(ll, hh)
    handles, labels = list(legend.values()), list(legend)
    if len(hi) < len(series):
        from matplotlib.lines import Line2D

        handles.append(Line2D([], [], color="0.75", lw=0.8))
        labels.append(f"{len(series) - len(hi)} other configurations (not on the Pareto front)")
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=7.5, frameon=False,
               title="Pareto front (bytes/step vs final " + panels[0] + ")", title_fontsize=8)
    return save_png(fig, path, dpi=120, bbox_inches="tight")


def plot_pareto(jobs: list[Job], path: Path, budget: tuple[str, float] | None = None,
                horizon: int | None = None) -> Path:
    """rel_err and KL (and the budget's metric) at the last reported length <= the horizon vs
    bytes per step. Each comparable group's front is a staircase of numbered markers (the
    number inside the marker), listed under the panel; points off the front are grey markers
    by scheme kind (legend), without text. With ``budget``: the budget line on its panel and
    each group's recommended configuration starred and labelled "recommended" on every
    panel."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    from ..plots import fixed_margins, plain_ticks, plt, save_png

    done = [j for j in jobs if j.summary is not None]
    panels = ["rel_err", "kl"]
    if budget and budget[0] in METRICS and budget[0] not in panels:
        panels.append(budget[0])
    recs = _recommended(done, budget, horizon)
    rec_keys = {(r.label, r.bytes_per_step) for r in recs}
    per = {m: [(g, _drawable(cs)) for g, cs, _ in decide(done, m, None, horizon)]
           for m in panels}
    fronts = {m: [(g, pareto_front(cs)) for g, cs in per[m]] for m in panels}
    n_lines = max(sum(2 * len(f) + (len(fronts[m]) > 1) for _, f in fronts[m])
                  for m in panels)  # (a front point may take a "same point" line)
    extra = 0.17 * n_lines + 0.5
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 5.2 + extra),
                             squeeze=False)
    front_colors = ("C3", "C0", "C2", "C4", "C1", "C5")
    for ax, m in zip(axes[0], panels, strict=True):
        cs = [c for _, gc in per[m] for c in gc]
        lines, kinds_seen, placed = [], set(), 0
        for gi, ((g, gcs), (_, front)) in enumerate(zip(per[m], fronts[m], strict=True)):
            color = front_colors[gi % len(front_colors)]
            kinds = {(j.name, s): (i or {}).get("kind", "") for j in g.jobs
                     for s, i in j.summary.get("schemes", {}).items()}
            off = [c for c in gcs if c not in front]
            for k in sorted({kinds.get((c.job, c.scheme), "") for c in off}):
                pts = [c for c in off if kinds.get((c.job, c.scheme), "") == k]
                lab = f"{k or 'other'} (off the front)"
                ax.scatter([c.bytes_per_step for c in pts], [c.value for c in pts], s=22,
                           alpha=0.6, color="0.55", marker=_KIND_MARKERS.get(k, "D"), zorder=2,
                           label=None if lab in kinds_seen else lab)
                kinds_seen.add(lab)
            glabel = "Pareto front" + (f" (group {gi + 1})" if len(per[m]) > 1 else "")
            ax.plot([c.bytes_per_step for c in front], [c.value for c in front], "-",
                    color=color, drawstyle="steps-post", label=glabel, zorder=3, lw=1.4)
            ax.scatter([c.bytes_per_step for c in front], [c.value for c in front], s=130,
                       color=color, zorder=4, edgecolors="white", linewidths=0.6)
            n_label = Counter(c.label for c in gcs)
            if len(per[m]) > 1:
                lines.append(f"group {gi + 1}: {g.title}")
            for c in front:
                placed += 1
                star = bool(budget and budget[0] == m and (c.label, c.bytes_per_step) in rec_keys)
                ax.text(c.bytes_per_step, c.value, str(placed), ha="center", va="center",
                        fontsize=6.5, color="k" if star else "white", weight="bold", zorder=5,
                        clip_on=True)  # (one below the axis would stretch the figure)
                same = [o.label for o in off if _coincide(o, c)]
                lines.append(f"{placed:>2}. {c.bytes_per_step:>9,.0f} B  {m}={sig3(c.value):<8} "
                             f"{c.label}" + (f" [{c.tag}]" if c.tag and n_label[c.label] > 1
                                             else "") + ("   <- recommended" if star else ""))
                if same:  # on a line of its own: the list stays within its panel
                    more = f" (+{len(same) - 2} more)" if len(same) > 2 else ""
                    lines.append(f"{'':>17}same point: {'; '.join(same[:2])}{more}")
        vals = [c.value for c in cs]
        if budget and budget[0] == m:
            _budget_line(ax, budget)
            vals.append(budget[1])
        clip_low(ax, vals, [(c.label, c.value, "C3") for c in cs])
        ax.annotate("Pareto front:\n" + "\n".join(lines), xy=(0, 0), xycoords="axes fraction",
                    xytext=(0, -40), textcoords="offset points", va="top", fontsize=6.5,
                    family="monospace")
        if not cs:  # nothing above zero to draw (every scheme exact): an empty linear panel
            ax.set_title(f"{m}: every value 0", fontsize=9)
            continue
        ax.set_xscale("log")
        ax.set_yscale("log")
        plain_ticks(ax, x_tokens=False)
        xs = [c.bytes_per_step for c in cs]
        lo, hi = min(xs) / 1.25, max(xs) * 1.25
        ax.set_xlim(lo, hi)
        ticks = [k * 2.0 ** e for e in range(-2, 40) for k in (1, 1.5)
                 if lo <= k * 2.0 ** e <= hi]
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(
            lambda x, _: f"{x / 1024:g}K" if x >= 1024 else f"{x:g}"))
        ax.set_xlabel("bytes per decode step per head (cost model)")
        at = f"the largest length ≤ {horizon:,}" if horizon else "the last reported length"
        ax.set_ylabel(f"{m} at {at}")
        nf = sum(len(f) for _, f in fronts[m])
        ax.set_title(f"{m} vs cost: {len(cs)} configurations, {nf} on the front"
                     + (f" ({len(per[m])} groups)" if len(per[m]) > 1 else ""), fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        for r in recs:
            hit = next((c for c in cs if (c.job, c.scheme) == (r.job, r.scheme)), None) or \
                next((c for c in cs if (c.label, c.bytes_per_step) ==
                      (r.label, r.bytes_per_step)), None)
            if hit is not None and hit.value >= ax.get_ylim()[0]:
                _mark_recommended(ax, hit.bytes_per_step, hit.value,
                                  hollow=not (budget and budget[0] == m),
                                  others=[(c.bytes_per_step, c.value) for c in cs])
        # inside, top right: a Pareto plot's empty corner (costly and inaccurate)
        ax.legend(fontsize=7, loc="upper right", framealpha=0.9)
    # (bbox_inches="tight" crops what the fixed margins leave over)
    fixed_margins(fig, left=0.75, right=0.2, top=0.35, bottom=0.5 + extra, gap=0.9)
    return save_png(fig, path, dpi=120, bbox_inches="tight")


def _coincide(a: Candidate, b: Candidate, rel: float = 0.005) -> bool:
    """Whether two points would be drawn on top of each other."""
    return (abs(a.bytes_per_step - b.bytes_per_step) <= rel * b.bytes_per_step
            and abs(a.value - b.value) <= rel * b.value)


def clip_low(ax, values, named, decades: float = 3.0) -> None:
    """Show at most ``decades`` decades below the largest value; name what lies below (an FP32
    baseline at 1e-7 would otherwise take most of the height)."""
    vals = [v for v in values if _pos(v)]
    if not vals:
        return
    floor = max(vals) * 10.0 ** -decades
    if min(vals) >= floor:
        return
    ax.set_ylim(bottom=floor, top=max(vals) * 1.6)
    below = {lab: v for lab, v, _ in named if _pos(v) and v < floor}
    text = "; ".join(f"{lab}: {sig3(v)}" for lab, v in list(below.items())[:3])
    ax.annotate(f"▼ below the axis: {text}", xy=(0.01, 0.015), xycoords="axes fraction",
                fontsize=7, color="0.2")


def _pos(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def _drawable(cands: list[Candidate]) -> list[Candidate]:
    """The candidates a log axis can show (a finite, positive metric)."""
    return [c for c in cands if _pos(c.value)]

