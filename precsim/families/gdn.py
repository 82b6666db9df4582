"""Gated DeltaNet: ``u_t = beta_t (v_t - a_t S_{t-1} k_t)``, ``S_t = a_t S_{t-1} + u_t k_t^T``,
``o_t = S_t q_t`` with ``a_t = exp(g_t)``.

State ``(V, K)`` per head. :func:`step` is the one naive step (NumPy or torch, any float dtype);
:func:`step_delta` the same function in delta-rule form (an identity the tests check);
:func:`segment` the torch ReplaySSM segment.
"""

from __future__ import annotations

import numpy as np
import torch

from .base import decay_matrices, key_dot, step_dots

name = "gdn"
LABEL = "Gated DeltaNet"  # the family's name in messages and reports
KEYS = ("g", "beta", "q", "k", "v")
PARAMS = ()
SKIP = None  # no per-head skip parameter
# the per-step inputs by role (see mamba2.py): decay input, values, keys, readout
DECAY_INPUT, VALUE, KEY, QUERY = "g", "v", "k", "q"
GROUPED = ("q", "k")  # a trace may keep key heads (head h reads h // (H / G))
KERNEL_GROUPS = False  # engines expand q/k per head (model.groups stays 1)
KERNEL = "gdn"  # the compiled code's name (see mamba2.py)
DELTA_RULE = True  # u_t = beta_t (v_t - a_t S_{t-1} k_t) reads the state (see mamba2.py)
WEIGHT = "beta"  # the (steps, heads) input that scales a step's write: u = beta (v - a S k)


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
    u = inp["beta"][..., None] * (inp["v"] - a[..., None] * key_dot(S, k))
    S_new = a[..., None, None] * S + u[..., :, None] * k[..., None, :]
    return S_new, key_dot(S_new, inp["q"])


def step_delta(S, inp: dict):
    """Delta-rule form (NumPy): ``S <- a S (I - beta k k^T) + beta v k^T``; same function."""
    a, b, k = inp["a"][..., None, None], inp["beta"][..., None, None], inp["k"]
    proj = np.eye(k.shape[-1]) - b * (k[..., :, None] * k[..., None, :])
    S_new = a * (S @ proj) + b * (inp["v"][..., :, None] * k[..., None, :])
    return S_new, (S_new * inp["q"][..., None, :]).sum(-1)


def segment(read, master, inp, params, *, out_from_fold: bool, buffer_round,
            u_from_master: bool = False):
    """ReplaySSM over one segment ``(m, S, H, ...)``: outputs and the unrounded folded state.

    The sums that involve the state are in fixed orders, the numba engine's bit for bit: over
    the key axis by :func:`key_dot`; over the segment's steps ``j = 0, 1, ...`` in order, each
    ``u_j``, once known, added to the later steps' corrections, to the outputs and to the fold
    (``0 + t_0 + t_1 + ...``, separate products and adds). The input-only matrices (``k_t . k_j``,
    ``q_t . k_j``) by :func:`step_dots` (key_dot's order), as the numba engine's host computes
    them for a window's segments at once."""
    beta, q, v = inp["beta"], inp["q"], inp["v"]
    k = buffer_round(inp["k"])
    m = beta.shape[0]
    Lc, D = decay_matrices(inp["la"])
    decay = torch.exp(D)  # (S,H,t,j), j <= t
    # the input-only coefficients of u_j in step t's correction (strictly lower) and output
    KK = step_dots(k, k)  # (S,H,t,j)
    QK = step_dots(q, k)
    AM = torch.stack(((decay * KK).tril(-1), decay * QK)).permute(0, 3, 4, 1, 2)
    gam = torch.exp(Lc)  # (m,S,H)
    w_last = decay[..., -1, :].permute(2, 0, 1)[..., None]  # (m,S,H,1)
    # a_t S_{t-1} k_t, checkpoint part (output-only: the state is never rebuilt)
    Sk0 = gam[..., None] * key_dot(master if u_from_master else read, k)
    CY = torch.zeros((2, *v.shape), dtype=v.dtype, device=v.device)  # sum_j A_tj u_j, M_tj u_j
    F = torch.zeros_like(master)  # sum_j w_j u_j k_j^T
    for t in range(m):  # sequential: u_t needs the (buffer-rounded) u_j of j < t
        u = buffer_round(beta[t][..., None] * (v[t] - Sk0[t] - CY[0, t]))
        CY[:, t:] += AM[:, t:, t, ..., None] * u  # (A_tt = 0: after its last use)
        F += (w_last[t] * u)[..., None] * k[t][..., None, :]
    Y = CY[1] + gam[..., None] * key_dot(read, q)
    fold = gam[-1][..., None, None] * master + F
    if out_from_fold:
        Y[-1] = key_dot(fold, q[-1])
    return Y, fold
