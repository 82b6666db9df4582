"""The float64 NumPy oracle: a plain per-step recurrence, readable like fla's ``naive.py``.

It is the ground truth every engine is tested against. No chunking, no tricks: one state per head,
updated one token at a time.
"""

from __future__ import annotations

import numpy as np

from .workload import validate_trace


def mamba2_step(S, dt, A, x, B):
    """One Mamba-2 update. S (..., P, N); dt, A (...); x (..., P); B (..., N)."""
    a = np.exp(dt * A)
    return a[..., None, None] * S + (dt[..., None, None] * x[..., :, None]) * B[..., None, :]


def gdn_step_delta(S, g, beta, k, v):
    """GDN in delta-rule form: S <- alpha S (I - beta k k^T) + beta v k^T. S (..., V, K)."""
    alpha = np.exp(g)[..., None, None]
    b = beta[..., None, None]
    K = k.shape[-1]
    proj = np.eye(K) - b * (k[..., :, None] * k[..., None, :])
    return alpha * (S @ proj) + b * (v[..., :, None] * k[..., None, :])


def gdn_step_u(S, g, beta, k, v):
    """GDN in corrected-value form: u = beta (v - alpha S k); S <- alpha S + u k^T."""
    alpha = np.exp(g)
    Sk = np.einsum("...vk,...k->...v", S, k)
    u = beta[..., None] * (v - alpha[..., None] * Sk)
    return alpha[..., None, None] * S + u[..., :, None] * k[..., None, :]


def decode(trace: dict, form: str = "u", return_state: bool = False):
    """Float64 outputs of a trace dict (keys as in trace files), shape (T, H, P) or (T, H, V).

    Mamba-2: ``y_t = S_t C_t (+ D x_t)``; GDN: ``o_t = S_t q_t`` (q used exactly as given).
    ``form`` picks the GDN update ("u" or "delta"); both are the same function.

    Example:
        >>> import numpy as np
        >>> T, H, P, N = 4, 2, 3, 5
        >>> rng = np.random.default_rng(0)
        >>> tr = dict(A=-np.ones(H), dt=np.full((T, H), .1), x=rng.normal(size=(T, H, P)),
        ...           B=rng.normal(size=(T, H, N)), C=rng.normal(size=(T, H, N)))
        >>> decode(tr).shape
        (4, 2, 3)
    """
    d = validate_trace({k: np.asarray(v) for k, v in trace.items()})
    d = {k: v.astype(np.float64) for k, v in d.items()}
    if "dt" in d:
        T, H, P = d["x"].shape
        N = d["B"].shape[2]
        S = np.zeros((H, P, N))
        y = np.empty((T, H, P))
        for t in range(T):
            S = mamba2_step(S, d["dt"][t], d["A"], d["x"][t], d["B"][t])
            y[t] = np.einsum("hpn,hn->hp", S, d["C"][t])
            if "D" in d:
                y[t] += d["D"][:, None] * d["x"][t]
    else:
        T, H, V = d["v"].shape
        K = d["k"].shape[2]
        step = gdn_step_u if form == "u" else gdn_step_delta
        S = np.zeros((H, V, K))
        y = np.empty((T, H, V))
        for t in range(T):
            S = step(S, d["g"][t], d["beta"][t], d["k"][t], d["v"][t])
            y[t] = np.einsum("hvk,hk->hv", S, d["q"][t])
    return (y, S) if return_state else y
