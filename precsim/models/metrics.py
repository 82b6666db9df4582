"""Whole-model metrics: per-token KL, top-1 agreement and logit error against the reference, and
the window rows (with bands across documents) of a whole-model Result."""

from __future__ import annotations

import math

import numpy as np
import torch

TOKEN_KEYS = ("kl", "top1", "rel", "lp", "arg", "margin")  # what run_parallel keeps per token


def own_metrics(ls: torch.Tensor, nxt: torch.Tensor | None = None,
                logp: torch.Tensor | None = None) -> dict[str, np.ndarray]:
    """Per position of one group's logits ``ls`` (float64): ``arg`` = its argmax (the greedy
    token), ``margin`` = top-1 minus top-2 logit, and with the next tokens ``nxt`` (same shape
    as ``ls`` without its last axis; < 0: none) ``lp`` = the log-probability it gives them (NaN
    where none): what task scoring and generation read."""
    top2 = torch.topk(ls, 2, dim=-1)
    out = {"arg": top2.indices[..., 0].double().cpu().numpy(),
           "margin": (top2.values[..., 0] - top2.values[..., 1]).cpu().numpy()}
    if nxt is not None:
        logp = torch.log_softmax(ls, -1) if logp is None else logp
        lp = torch.gather(logp, -1, nxt.clamp(min=0)[..., None])[..., 0]
        out["lp"] = torch.where(nxt >= 0, lp, torch.nan).cpu().numpy()
    return out


def token_metrics(lr: torch.Tensor, ls: torch.Tensor,
                  nxt: torch.Tensor | None = None) -> dict[str, np.ndarray]:
    """Per position (all axes but the last, the vocabulary) of the reference logits ``lr`` and a
    scheme's ``ls`` (float64): ``kl`` = KL(reference || scheme) (NaN if not finite), ``top1`` =
    1 where the argmaxes agree and the scheme's logits are finite, ``rel`` = ``||ls - lr|| /
    ||lr||``; and the scheme's own :func:`own_metrics` (``lp`` with ``nxt``)."""
    logp_r = torch.log_softmax(lr, -1)
    logp_s = torch.log_softmax(ls, -1)
    kl = torch.sum(torch.exp(logp_r) * (logp_r - logp_s), -1).clamp(min=0.0)
    kl = torch.where(torch.isfinite(kl), kl, torch.nan)
    top1 = (torch.argmax(ls, -1) == torch.argmax(lr, -1)) & torch.isfinite(ls).all(-1)
    rn = torch.linalg.vector_norm(lr, dim=-1)
    rel = torch.linalg.vector_norm(ls - lr, dim=-1) / torch.where(rn > 0, rn, 1.0)
    return {"kl": kl.cpu().numpy(), "top1": top1.double().cpu().numpy(),
            "rel": rel.cpu().numpy(), **own_metrics(ls, nxt, logp_s)}


BOOT = 1000  # bootstrap resamples of an interval
LEVEL = 0.95  # an interval's coverage


def boot_ci(vals: np.ndarray, seeds: int = 1, seed: int = 0, B: int = BOOT,
            level: float = LEVEL) -> tuple[float, float]:
    """The ``level`` percentile-bootstrap interval of the mean of ``vals`` (one value per
    document and SR seed, seed-major: ``seeds`` blocks of documents), resampling documents and
    seeds independently (a two-way bootstrap: both are random draws). NaN when there is one
    unit, or a value is not finite."""
    v = np.asarray(vals, dtype=np.float64).reshape(seeds, -1)
    S, K = v.shape
    if S * K < 2 or not np.isfinite(v).all():
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    ks = rng.integers(K, size=(B, K))
    ss = rng.integers(S, size=(B, S)) if S > 1 else np.zeros((B, 1), dtype=np.int64)
    means = v[ss[:, :, None], ks[:, None, :]].mean(axis=(1, 2))
    a = (1 - level) / 2
    lo, hi = np.quantile(means, [a, 1 - a])
    return float(lo), float(hi)


def docs_to_separate(a: np.ndarray, b: np.ndarray, alpha: float = 0.05,
                     power: float = 0.8) -> float:
    """Documents a paired two-sided test at ``alpha`` needs to tell the means of ``a`` and
    ``b`` (per-document values, paired) apart with ``power``, from their differences' mean and
    spread: ``((z_a/2 + z_power) * sd / |mean|)^2``; inf when they do not differ."""
    from scipy.stats import norm

    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if d.size < 2 or not np.isfinite(d).all() or d.mean() == 0:
        return math.inf
    z = norm.ppf(1 - alpha / 2) + norm.ppf(power)
    return float(math.ceil(max(2.0, (z * d.std(ddof=1) / abs(d.mean())) ** 2)))


def window_rows(tok: dict, groups, window: int, n: int, seeds: dict | None = None
                ) -> list[dict]:
    """Rows per scheme and window end (the layer-level columns): means over the window of each
    document's per-token values with bands across documents and their 95% bootstrap interval
    (``kl_lo``/``kl_hi``, ``top1_lo``/``top1_hi``: over documents, and over the SR seeds of a
    scheme in ``seeds``, name -> count, whose documents ``tok`` holds seed-major), the first
    flip (mean over documents, censored at the row's end) and the count of documents flipped,
    and the mean per-layer state drift at the last sample at or before the row's end."""
    from ..metrics import percentile_bands

    W = max(1, min(window, n))
    ends = list(range(W, n + 1, W))
    if not ends or ends[-1] != n:
        ends.append(n)
    rows = []
    for g in groups[1:]:
        t = tok[g.name]
        start = 0
        for end in ends:
            row = {"scheme": g.name, "step": end}
            for metric, key in (("rel_err", "rel"), ("kl", "kl"), ("top1", "top1")):
                vals = t[key][:, start:end].mean(axis=1)
                row.update({k: c[0] for k, c in percentile_bands(metric, [vals]).items()})
                if metric != "rel_err":
                    row[metric + "_lo"], row[metric + "_hi"] = boot_ci(
                        vals, (seeds or {}).get(g.name, 1), seed=end)
            row["rel_err_max"] = float(t["rel"][:, start:end].max())
            flips = [np.flatnonzero(d[:end] < 0.5) for d in t["top1"]]
            first = [f[0] + 1 if f.size else end for f in flips]
            row["first_flip"] = float(np.mean(first))
            row["flipped"] = int(sum(f.size > 0 for f in flips))
            for key, idx in (("state_drift", 1), ("read_drift", 2)):
                per_layer = []
                for samples in g.drift.values():
                    last = [s for s in samples if s[0] <= end]
                    if last and last[-1][idx] is not None:
                        per_layer.append(float(np.mean(last[-1][idx])))
                row[key] = float(np.mean(per_layer)) if per_layer else math.nan
            rows.append(row)
            start = end
    return rows


def first_flips(top1: np.ndarray) -> list[int | None]:
    """Per document: the first token (1-based) whose top-1 disagrees (None: none)."""
    out = []
    for d in np.atleast_2d(top1):
        f = np.flatnonzero(d < 0.5)
        out.append(int(f[0]) + 1 if f.size else None)
    return out


def row_dist(a: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per-row L2 distance ``||a - ref||`` (float64, on the tensors' device)."""
    return torch.linalg.vector_norm(a.reshape(a.shape[0], -1).double()
                                    - ref.reshape(ref.shape[0], -1).double(), dim=1)


def rel_ratio(d: np.ndarray, rn: np.ndarray) -> np.ndarray:
    """``d / rn`` where the reference's norm ``rn`` is positive; else 0 (no error) or inf."""
    return np.where(rn > 0, d / np.where(rn > 0, rn, 1.0), np.where(d > 0, np.inf, 0.0))


def result_rows(tok: dict, groups, window: int, n: int, seeds: dict | None = None) -> dict:
    """The ``rows`` and ``per_step`` (``NAME`` logits error, ``NAME:kl``, ``NAME:top1``, shape
    ``(n, K)``) of a whole-model run's first ``n`` positions, as ``make_result`` takes them:
    the scheme groups' (not the floor's: :func:`floor_figures`)."""
    rows_of = [groups[0], *(g for g in groups[1:] if g.role == "scheme")]
    part = {g.name: {k: v[:, :n] for k, v in tok[g.name].items()} for g in rows_of[1:]}
    per_step = {(g.name if key == "rel" else f"{g.name}:{key}"): part[g.name][key].T
                for g in rows_of[1:] for key in ("rel", "kl", "top1")}
    return {"rows": window_rows(part, rows_of, window, n, seeds), "per_step": per_step}
