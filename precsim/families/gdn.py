"""Gated DeltaNet: ``u_t = beta_t (v_t - a_t S_{t-1} k_t)``, ``S_t = a_t S_{t-1} + u_t k_t^T``,
``o_t = S_t q_t`` with ``a_t = exp(g_t)``.

State ``(V, K)`` per head. :func:`step` is the one naive step (NumPy or torch, any float dtype);
:func:`step_delta` the same function in delta-rule form (an identity the tests check);
:func:`segment` the torch ReplaySSM segment.
"""

from __future__ import annotations

import numpy as np
import torch

from .base import decay_matrices

name = "gdn"
KEYS = ("g", "beta", "q", "k", "v")
PARAMS = ()


def state_dims(model) -> tuple[int, int]:
    return model.head_dim, model.state_dim


def log_decay(inp: dict, params: dict):
    """``g`` itself (the log-decay is an input)."""
    return inp["g"]


def step(S, inp: dict):
    """One update from the decay ``inp["a"]``: returns the unrounded new state and ``o = S q``.

    Shapes: ``S (..., V, K)``; ``a``, ``beta`` ``(...)``; ``q``, ``k (..., K)``; ``v (..., V)``.
    """
    a, k = inp["a"], inp["k"]
    u = inp["beta"][..., None] * (inp["v"] - a[..., None] * (S * k[..., None, :]).sum(-1))
    S_new = a[..., None, None] * S + u[..., :, None] * k[..., None, :]
    return S_new, (S_new * inp["q"][..., None, :]).sum(-1)


def step_delta(S, inp: dict):
    """Delta-rule form (NumPy): ``S <- a S (I - beta k k^T) + beta v k^T``; same function."""
    a, b, k = inp["a"][..., None, None], inp["beta"][..., None, None], inp["k"]
    proj = np.eye(k.shape[-1]) - b * (k[..., :, None] * k[..., None, :])
    S_new = a * (S @ proj) + b * (inp["v"][..., :, None] * k[..., None, :])
    return S_new, (S_new * inp["q"][..., None, :]).sum(-1)


def segment(read, master, inp, params, *, out_from_fold: bool, buffer_round,
            u_from_master: bool = False):
    """ReplaySSM over one segment ``(m, S, H, ...)``: outputs and the unrounded folded state."""
    beta, q, v = inp["beta"], inp["q"], inp["v"]
    k = buffer_round(inp["k"])
    m = beta.shape[0]
    Lc, D = decay_matrices(inp["la"])
    decay = torch.exp(D)  # (S,H,t,j), j <= t
    KK = torch.einsum("tshk,jshk->shtj", k, k)
    A_strict = (decay * KK).tril(-1)
    gam = torch.exp(Lc)  # (m,S,H)
    # a_t S_{t-1} k_t, checkpoint part (output-only: the state is never rebuilt)
    Sk0 = gam[..., None] * torch.einsum("shvk,tshk->tshv", master if u_from_master else read, k)
    U = torch.zeros_like(v)
    for t in range(m):  # sequential: u_t needs the (buffer-rounded) u_j of j < t
        corr = torch.einsum("shj,jshv->shv", A_strict[:, :, t, :], U)
        U[t] = buffer_round(beta[t][..., None] * (v[t] - Sk0[t] - corr))
    QK = torch.einsum("tshk,jshk->shtj", q, k)
    Y = torch.einsum("shtj,jshv->tshv", decay * QK, U)
    Y = Y + gam[..., None] * torch.einsum("shvk,tshk->tshv", read, q)
    w_last = decay[..., -1, :].permute(2, 0, 1)
    fold = gam[-1][..., None, None] * master + torch.einsum(
        "jshv,jshk->shvk", w_last[..., None] * U, k)
    if out_from_fold:
        Y[-1] = torch.einsum("shvk,shk->shv", fold, q[-1])
    return Y, fold
