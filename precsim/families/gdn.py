"""Gated DeltaNet: ``u_t = beta_t (v_t - a_t S_{t-1} k_t)``, ``S_t = a_t S_{t-1} + u_t k_t^T``,
``o_t = S_t q_t`` with ``a_t = exp(g_t)``.

State ``(V, K)`` per head. :func:`step` is the one naive step (NumPy or torch, any float dtype);
:func:`step_delta` the same function in delta-rule form (an identity the tests check);
:func:`segment` the torch ReplaySSM segment.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..errors import PrecsimError
from .base import decay_matrices, inv_softplus, key_dot, softplus, step_dots, unit

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
SHORT = "GDN"  # its name in one-line messages
MARKERS = ("g",)  # keys that make a trace this family's
TRACE_AXES = {"g": 2, "beta": 2, "q": 3, "k": 3, "v": 3}  # a trace's arrays and their axes
TAGS = {"g": 5, "beta": 6, "q": 7, "k": 8, "v": 9}  # the synthetic inputs' random streams
# transformers (see mamba2.py): mixer and model classes, the hooked functions, (heads, Dv, Dk)
HF_MIXERS = ("Qwen3NextGatedDeltaNet", "Qwen3_5GatedDeltaNet", "Qwen3_5MoeGatedDeltaNet")
HF_ARCHITECTURES = ("Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM")
HF_HOOKED = ("torch_recurrent_gated_delta_rule", "torch_chunk_gated_delta_rule")
HF_DIMS = ("num_v_heads", "head_v_dim", "head_k_dim")


def state_dims(model) -> tuple[int, int]:
    return model.head_dim, model.state_dim


def random_params(rng, H: int, style: str, n_long: int) -> dict:
    """The synthetic workload's per-head constants (see mamba2.py): fla's / HF's
    initialisation, or the article's slow decays (``seed_article``)."""
    A = rng.uniform(1.0, 16.0, H)  # GDN: A_log = log U[1,16] (fla / HF init)
    dt0 = np.maximum(np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), H)), 1e-4)
    dt_bias = inv_softplus(dt0)
    if style == "seed_article":
        A = np.exp(rng.uniform(np.log(1e-2), np.log(1.0), H))
        A[:n_long] = np.exp(rng.uniform(np.log(1e-4), np.log(1e-3), n_long))
        dt_bias = np.zeros(H)
    return {"A_log": np.log(A), "dt_bias": dt_bias}


def random_inputs(w, z, p: dict, xp) -> dict:
    """One chunk of the synthetic workload (see mamba2.py): q and k L2-normalised, q scaled by
    1/sqrt(K)."""
    S, H, P, N = w.S, w.H, w.P, w.N
    raw = z("g", (S, H))
    g = -xp.exp(p["A_log"]) * softplus(xp, w.dt_noise * raw + p["dt_bias"])
    beta = 1.0 / (1.0 + xp.exp(-z("beta", (S, H))))
    q = unit(xp, z("q", (S, H, N))) / math.sqrt(N)  # L2 norm, then 1/sqrt(K)
    k = unit(xp, z("k", (S, H, N)))
    return {"g": g, "beta": beta, "q": q, "k": k, "v": z("v", (S, H, P))}


def check_trace(data: dict, where: str, groups_of) -> dict:
    """A trace's values checked; its arrays' expected shapes (see mamba2.py)."""
    T, H = data["g"].shape
    K, V = data["k"].shape[2], data["v"].shape[2]
    G = groups_of(data["k"], H, where, "k")
    expect = {"g": (T, H), "beta": (T, H), "q": (T, G, K), "k": (T, G, K), "v": (T, H, V)}
    if not (data["g"] <= 0).all():
        raise PrecsimError(f"{where}: g has values > 0; allowed: log-decay <= 0")
    b = data["beta"]
    if not ((b > 0) & (b < 1)).all():
        raise PrecsimError(f"{where}: beta outside (0, 1); allowed: sigmoid outputs in (0,1)")
    return expect


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
            u_from_master: bool = False, fold: bool = True):
    """ReplaySSM over one segment ``(m, S, H, ...)``: outputs and the unrounded folded state
    (None with ``fold`` False and ``out_from_fold`` False: the sum ``F`` and the fold, state-sized
    work at every step, are skipped for a segment left unfinished, whose fold nothing reads).

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
    want = fold or out_from_fold
    F = torch.zeros_like(master) if want else None  # sum_j w_j u_j k_j^T
    for t in range(m):  # sequential: u_t needs the (buffer-rounded) u_j of j < t
        u = buffer_round(beta[t][..., None] * (v[t] - Sk0[t] - CY[0, t]))
        CY[:, t:] += AM[:, t:, t, ..., None] * u  # (A_tt = 0: after its last use)
        if want:
            F += (w_last[t] * u)[..., None] * k[t][..., None, :]
    Y = CY[1] + gam[..., None] * key_dot(read, q)
    if not want:
        return Y, None
    fold = gam[-1][..., None, None] * master + F
    if out_from_fold:
        Y[-1] = key_dot(fold, q[-1])
    return Y, fold


def hf_inputs(a: dict, recurrent: bool, l2norm) -> tuple[dict, dict, torch.Tensor | None]:
    """GDN inputs as the transformers function uses them: float32 (float64 under a float64
    model), q/k per key head (a value head reads key head ``h // (Hv/Hk)``, as B/C's groups in
    Mamba-2; expanded by ``workload.expand_groups``), L2-normalised when the model asks, q
    scaled by 1/sqrt(K). State ``(b, H, V, K)`` (transformers keeps ``(b, H, K, V)``)."""
    q, k, v = a["query"], a["key"], a["value"]
    wide = torch.float64 if v.dtype == torch.float64 else torch.float32
    q, k, v = (t.transpose(0, 1).to(wide) for t in (q, k, v))  # q/k per key head (group)
    if a.get("use_qk_l2norm_in_kernel"):
        norm = l2norm or (lambda x, dim, eps: x * torch.rsqrt((x * x).sum(dim, True) + eps))
        q, k = norm(q, dim=-1, eps=1e-6), norm(k, dim=-1, eps=1e-6)
    q = q / (q.shape[-1] ** 0.5)
    inp = {"g": a["g"].transpose(0, 1).to(wide), "beta": a["beta"].transpose(0, 1).to(wide),
           "q": q, "k": k, "v": v}
    st = a.get("initial_state")
    state = st.transpose(-1, -2).to(wide).clone() if st is not None else None
    return inp, {}, state


def hf_parse(recurrent: bool, a: dict, raw) -> tuple:
    """The transformers function's own ``(y (T,b,H,V), state (b,H,V,K) or None)``."""
    out, st = raw
    return out.transpose(0, 1), (st.transpose(-1, -2) if st is not None else None)


def hf_build(recurrent: bool, a: dict, y: torch.Tensor, state):
    """The transformers function's return value from ``(y, state)``; ``state`` None: zeros."""
    if state is None:
        state = y.new_zeros((*y.shape[1:], a["key"].shape[-1]))
    out = y.transpose(0, 1).to(a["query"].dtype)
    st = state.transpose(-1, -2).float() if a.get("output_final_state") else None
    return out, st
