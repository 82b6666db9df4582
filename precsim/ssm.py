"""SSM families (registry): the recurrences in torch, vectorised over sequences and heads.

Each family gives the engine three operations on states ``(S, H, Dv, Dk)`` (sequences, heads,
value dim, key dim; every state row evolves on its own):

* ``conv_step``: one conventional update, returning the *unrounded* new state and its output;
* ``segment``: ReplaySSM over the positions between two flushes — outputs by output-only
  evaluation from a read copy plus the buffer, and the folded state from the master (DESIGN.md §3);
  the activations the buffer holds (Mamba-2: x, B; GDN: u, k) go through ``buffer_round``.

Inputs are dicts of tensors with a leading time axis: ``(m, S, H[, dim])``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

Rounder = Callable[[torch.Tensor], torch.Tensor]


def _decay_matrices(logdecay: torch.Tensor):
    """Cumulative log-decay ``Lc (m,S,H)`` and ``D[s,h,t,j] = Lc_t - Lc_j`` masked to j <= t."""
    Lc = torch.cumsum(logdecay, 0)
    Lh = Lc.permute(1, 2, 0)
    D = Lh[..., :, None] - Lh[..., None, :]
    m = logdecay.shape[0]
    causal = torch.ones(m, m, dtype=torch.bool, device=D.device).tril()
    ninf = torch.tensor(float("-inf"), dtype=D.dtype, device=D.device)
    return Lc, D, causal, ninf


@dataclass(frozen=True)
class Mamba2:
    """Mamba-2: ``S_t = a_t S_{t-1} + dt_t x_t B_t^T``, ``y_t = S_t C_t``; state (P, N)."""

    name: str = "mamba2"

    @staticmethod
    def state_dims(model) -> tuple[int, int]:
        return model.head_dim, model.state_dim

    @staticmethod
    def conv_step(S, inp, params):
        dt, x, B, C = inp["dt"], inp["x"], inp["B"], inp["C"]
        a = torch.exp(dt * params["A"])
        S_new = a[..., None, None] * S + (dt[..., None] * x)[..., :, None] * B[..., None, :]
        y = torch.einsum("shpn,shn->shp", S_new, C)
        return S_new, y

    @staticmethod
    def segment(read, master, inp, params, *, out_from_fold: bool, buffer_round: Rounder,
                u_from_master: bool = False):
        dt, C = inp["dt"], inp["C"]
        x, B = buffer_round(inp["x"]), buffer_round(inp["B"])
        Lc, D, causal, ninf = _decay_matrices(dt * params["A"])
        W = torch.exp(torch.where(causal, D, ninf)) * dt.permute(1, 2, 0)[..., None, :]
        G = torch.einsum("tshn,jshn->shtj", C, B)
        Y = torch.einsum("shtj,jshp->tshp", W * G, x)
        Y = Y + torch.exp(Lc)[..., None] * torch.einsum("shpn,tshn->tshp", read, C)
        w_last = W[..., -1, :].permute(2, 0, 1)  # (m, S, H)
        fold = torch.exp(Lc[-1])[..., None, None] * master + torch.einsum(
            "jshp,jshn->shpn", w_last[..., None] * x, B)
        if out_from_fold:  # a flush step's output comes from the unrounded folded state
            Y[-1] = torch.einsum("shpn,shn->shp", fold, C[-1])
        return Y, fold


@dataclass(frozen=True)
class GatedDeltaNet:
    """GDN: ``u_t = beta_t (v_t - alpha_t S_{t-1} k_t)``, ``S_t = alpha_t S_{t-1} + u_t k_t^T``,
    ``o_t = S_t q_t``; state (V, K)."""

    name: str = "gdn"

    @staticmethod
    def state_dims(model) -> tuple[int, int]:
        return model.head_dim, model.state_dim

    @staticmethod
    def conv_step(S, inp, params):
        g, beta, q, k, v = inp["g"], inp["beta"], inp["q"], inp["k"], inp["v"]
        alpha = torch.exp(g)
        Sk = torch.einsum("shvk,shk->shv", S, k)
        u = beta[..., None] * (v - alpha[..., None] * Sk)
        S_new = alpha[..., None, None] * S + u[..., :, None] * k[..., None, :]
        y = torch.einsum("shvk,shk->shv", S_new, q)
        return S_new, y

    @staticmethod
    def segment(read, master, inp, params, *, out_from_fold: bool, buffer_round: Rounder,
                u_from_master: bool = False):
        g, beta, q, v = inp["g"], inp["beta"], inp["q"], inp["v"]
        k = buffer_round(inp["k"])
        m = g.shape[0]
        Lc, D, causal, ninf = _decay_matrices(g)
        decay = torch.exp(torch.where(causal, D, ninf))  # (S,H,t,j), j <= t
        KK = torch.einsum("tshk,jshk->shtj", k, k)
        A_strict = (decay * KK).tril(-1)
        gam = torch.exp(Lc)  # (m,S,H)
        # alpha_t S_{t-1} k_t, checkpoint part (output-only: the state is never rebuilt)
        Sk0 = gam[..., None] * torch.einsum(
            "shvk,tshk->tshv", master if u_from_master else read, k)
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


FAMILIES = {"mamba2": Mamba2(), "gdn": GatedDeltaNet()}


def get_family(name: str):
    from .errors import check_choice

    check_choice("model.family", name, FAMILIES)
    return FAMILIES[name]


def family_params(family: str, params: dict, device, dtype) -> dict:
    """Per-head constants as tensors: Mamba-2 ``A (H,)``; GDN none (g, beta are inputs)."""
    out = {}
    if family == "mamba2":
        out["A"] = torch.as_tensor(params["A"], dtype=dtype, device=device)
    return out

