"""The floor of a whole-model verdict (docs/metrics.md, "The floor"): what the model's own
arithmetic and the FP32 state deployments ship already do to its next-token distributions, and
how each scheme's figure reads against it. Pure functions over a run's ``summary.json``
(``info.floor``, written by :func:`precsim.models.run.floor_figures`)."""

from __future__ import annotations

import math


def _g(v) -> str:
    if v is None or not math.isfinite(v):
        return "nan" if v is None or math.isnan(v) else "inf"
    return f"{v:.3g}"


def interval(lo, hi) -> str:
    """``[lo, hi]``, or ``n/a`` (one document and one seed: no interval)."""
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return "n/a"
    return f"[{_g(lo)}, {_g(hi)}]"


OUTPUT_FORMATS = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def output_rounding(model_dtype: str) -> float | None:
    """The layer-replay floor: the relative L2 error (``rel_err``'s measure) of one rounding to
    nearest of a layer's output to the model's dtype, which the model does to every SSM layer's
    output itself: measured on 65,536 standard-normal values (bf16 1.66e-3, fp16 2.07e-4, fp32
    2.6e-8). A replayed scheme whose rel_err is at or below it changes the layer's output by
    less than the model's own cast. None for float64 or an unknown dtype."""
    fmt = OUTPUT_FORMATS.get(model_dtype)
    if fmt is None:
        return None
    import numpy as np

    from . import formats as pf

    x = np.random.default_rng(0).standard_normal(1 << 16)
    q = pf.quantize(x, pf.get(fmt), "rne", seed=0)
    return float(np.linalg.norm(q - x) / np.linalg.norm(x))


def output_floor_of(path) -> dict:
    """``{"output_floor": {model_dtype, rel_err}}`` for a replay of the recording at ``path``
    (the record directory, or one of its ``layer_XX`` folders) whose model ran in bf16, fp16
    or fp32 (``record.json``'s ``model_dtype``), else ``{}``."""
    import json
    from pathlib import Path

    p = Path(path)
    for root in (p, p.parent):
        try:
            dt = json.loads((root / "record.json").read_text()).get("model_dtype")
        except (OSError, ValueError, AttributeError):
            continue
        x = output_rounding(dt) if isinstance(dt, str) else None
        return {} if x is None else {"output_floor": {"model_dtype": dt, "rel_err": x}}
    return {}


def output_floor_line(of: dict) -> str:
    """The every-layer replay's floor line (``info.output_floor``)."""
    return (f"floor: the model rounds each SSM layer's output to {of['model_dtype']} itself "
            f"(rel_err {_g(of['rel_err'])} for one such rounding); a scheme at or below it "
            "changes a layer's output less than the model's own cast does")


def noise_level(floor: dict, metric: str) -> float | None:
    """The floor's noise in ``metric`` (its interval's upper end where there is one): a scheme
    at or below it cannot be told from the model's own rounding. None for a metric the floor
    does not measure."""
    if metric != "kl":
        return None
    n = floor["noise"]
    hi = n.get("kl_hi")
    return float(hi) if hi is not None and math.isfinite(hi) else float(n["kl"])


def within_noise(v: float, floor: dict | None, metric: str) -> bool:
    lvl = noise_level(floor, metric) if floor else None
    return lvl is not None and math.isfinite(v) and v <= lvl


def floor_lines(floor: dict, metric: str, budget: float) -> list[str]:
    """The floor block of a verdict: the FP32 state against the float64 one, and the noise of
    the model's own arithmetic against the baseline, each with its 95% interval."""
    base = ("the FP32 state deployments ship" if floor["baseline"] == "fp32"
            else "the float64 state")
    f, n = floor["fp32_vs_fp64"], floor["noise"]
    dt = floor.get("model_dtype", "?")
    u = floor.get("dither") or 0
    ulp = f"2^{round(math.log2(u))}" if u > 0 else "0"
    return [
        f"baseline: {base} (metrics.baseline={floor['baseline']}); floor, 95% intervals "
        "over documents:",
        f"  FP32 state vs float64:    KL {_g(f['kl'])} {interval(f['kl_lo'], f['kl_hi'])}, "
        f"top-1 {f['top1']:.4f} (last window), {100 * f['flip_rate']:.2f}% of all tokens "
        "flipped",
        f"  the model's own noise:    KL {_g(n['kl'])} {interval(n['kl_lo'], n['kl_hi'])}, "
        f"top-1 {n['top1']:.4f}, {100 * n['flip_rate']:.2f}% flipped (SSM outputs dithered "
        f"at {dt}'s unit roundoff {ulp}, against the baseline)",
    ]


def floor_exceeds(floor: dict | None, metric: str, budget: float) -> str | None:
    """The verdict's line when the floor's noise alone exceeds the budget (no state format can
    then be told apart at this budget), else None."""
    if not floor or metric != "kl":
        return None
    n = floor["noise"]["kl"]
    if not (math.isfinite(n) and n > budget):
        return None
    dt = floor.get("model_dtype", "?")
    fix = ("model.dtype=float32 (the floor falls to float32 noise; the state format's own "
           "effect then shows)" if dt in ("bfloat16", "float16") else "more documents")
    lo = floor["noise"].get("kl_hi")
    allow = lo if lo is not None and math.isfinite(lo) else n
    return (f"NO recommendation: the model's own floor (KL {_g(n)} from rounding its {dt} "
            f"arithmetic once) exceeds the budget {budget:g}, so no state format can be told "
            f"apart at this budget; rerun with {fix}, or set metrics.budget >= {_g(allow)} "
            "(the least budget this floor allows)")


def confidence_note(fig: dict, budget: float, metric: str) -> str:
    """Whether a scheme that fits on its mean fits with 95% confidence (its interval's upper
    end within the budget)."""
    hi = fig.get(f"{metric}_hi")
    if hi is None or not math.isfinite(hi):
        return "no interval (one document: set run.seqs >= 2)"
    if hi <= budget:
        return f"fits with 95% confidence (interval {interval(fig[metric + '_lo'], hi)})"
    return (f"fits on its mean only: its 95% interval reaches {_g(hi)}; more documents "
            "(run.seqs) would settle it")


def separation_line(floor: dict, a: str, b: str) -> str | None:
    """How many documents a paired test (alpha 0.05, power 0.8) would need to tell schemes
    ``a`` and ``b`` apart, from their per-document KL at the last window."""
    from .models.metrics import docs_to_separate

    sch = floor.get("schemes") or {}
    if a not in sch or b not in sch:
        return None
    K = len(floor["noise"]["per_doc_kl"])

    def per_doc(name):
        v = sch[name]["per_doc_kl"]
        S = max(1, len(v) // K)
        return [sum(v[s * K + k] for s in range(S)) / S for k in range(K)]

    n = docs_to_separate(per_doc(a), per_doc(b))
    if not math.isfinite(n):
        return f"  {a} and {b} do not differ on these documents"
    return (f"  telling {a} from {b}: ~{n:,.0f} documents (paired, 5% level, 80% power; "
            f"this run has {K})")


def generation_lines(gen: dict) -> list[str]:
    """``model.mode=generate``'s block of a verdict: per scheme, the share of continuations
    identical to the baseline's, the median first divergence and the baseline's median margin
    there (a small margin: a near-tie the state's error tipped)."""
    import statistics

    G = gen["new_tokens"]
    lines = [f"generation ({G} greedy tokens after each prompt, against {gen['baseline']}'s; "
             f"{'generations.txt'} shows the first documents):"]
    rows = {**gen["schemes"], "(the model's own noise)": gen["noise"]}
    w = max(len(n) for n in rows)
    for name, g in rows.items():
        first = [f for f in g["first_divergence"] if f is not None]
        med = f"median first divergence at token {statistics.median(first):g}" if first \
            else "no divergence"
        mb = g["margin_at_divergence_baseline"]
        marg = f", baseline margin there {statistics.median(mb):.3g}" if mb else ""
        lines.append(f"  {name:<{w}}  identical {100 * g['identical_rate']:5.1f}%  "
                     f"({len(first)}/{len(g['first_divergence'])} diverge; {med}{marg})")
    return lines
