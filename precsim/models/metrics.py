"""Whole-model metrics: per-token KL, top-1 agreement and logit error against the reference, and
the window rows (with bands across documents) of a whole-model Result."""

from __future__ import annotations

import math

import numpy as np
import torch


def token_metrics(lr: torch.Tensor, ls: torch.Tensor) -> dict[str, np.ndarray]:
    """Per position (all axes but the last, the vocabulary) of the reference logits ``lr`` and a
    scheme's ``ls`` (float64): ``kl`` = KL(reference || scheme) (NaN if not finite), ``top1`` =
    1 where the argmaxes agree and the scheme's logits are finite, ``rel`` = ``||ls - lr|| /
    ||lr||``."""
    logp_r = torch.log_softmax(lr, -1)
    logp_s = torch.log_softmax(ls, -1)
    kl = torch.sum(torch.exp(logp_r) * (logp_r - logp_s), -1).clamp(min=0.0)
    kl = torch.where(torch.isfinite(kl), kl, torch.nan)
    top1 = (torch.argmax(ls, -1) == torch.argmax(lr, -1)) & torch.isfinite(ls).all(-1)
    rn = torch.linalg.vector_norm(lr, dim=-1)
    rel = torch.linalg.vector_norm(ls - lr, dim=-1) / torch.where(rn > 0, rn, 1.0)
    return {"kl": kl.cpu().numpy(), "top1": top1.double().cpu().numpy(),
            "rel": rel.cpu().numpy()}


def window_rows(tok: dict, groups, window: int, n: int) -> list[dict]:
    """Rows per scheme and window end (the layer-level columns): means over the window of each
    document's per-token values with bands across documents, the first flip (mean over
    documents, censored at the row's end) and the count of documents flipped, and the mean
    per-layer state drift at the last sample at or before the row's end."""
    from ..metrics import _bands

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
                row.update({k: c[0] for k, c in _bands(metric, [vals]).items()})
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


def result_rows(tok: dict, groups, window: int, n: int) -> dict:
    """The ``rows`` and ``per_step`` (``NAME`` logits error, ``NAME:kl``, ``NAME:top1``, shape
    ``(n, K)``) of a whole-model run's first ``n`` positions, as ``make_result`` takes them."""
    part = {g.name: {k: v[:, :n] for k, v in tok[g.name].items()} for g in groups[1:]}
    per_step = {(g.name if key == "rel" else f"{g.name}:{key}"): part[g.name][key].T
                for g in groups[1:] for key in ("rel", "kl", "top1")}
    return {"rows": window_rows(part, groups, window, n), "per_step": per_step}
