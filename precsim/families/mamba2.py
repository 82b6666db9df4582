"""Mamba-2: ``S_t = a_t S_{t-1} + dt_t x_t B_t^T``, ``y_t = S_t C_t`` with ``a_t = exp(dt_t A)``.

State ``(P, N)`` per head. :func:`step` is the one naive step (NumPy or torch, any float dtype);
:func:`segment` the torch ReplaySSM segment.
"""

from __future__ import annotations

import math

import torch

from .base import decay_matrices

name = "mamba2"
LABEL = "Mamba-2"  # the family's name in messages and reports
KEYS = ("dt", "x", "B", "C")
PARAMS = ("A",)
SKIP = "D"  # an optional per-head parameter: y_t += D x_t (None: no skip)
# the per-step inputs by role: the (steps, heads) decay input, the values (the state's Dv
# axis), the keys (its Dk axis) and the readout (y = S C)
DECAY_INPUT, VALUE, KEY, QUERY = "dt", "x", "B", "C"
GROUPED = ("B", "C")  # inputs a trace may hold per group of heads (head h reads h // (H / G))
KERNEL_GROUPS = True  # the kernels read GROUPED per group (model.groups); else expanded per head
# the compiled code's name: the engines' kernel sets (numba_jit.mamba2, kernels.mamba2) by it
KERNEL = "mamba2"
# whether the update reads the state (a delta rule: u_t = f(S_{t-1}), replay.gdn_u_source); a
# plain outer-product update buffers its inputs and builds no state-size term per step
DELTA_RULE = False
WEIGHT = "dt"  # the (steps, heads) input that scales a step's write: S += dt x B^T


def state_dims(model) -> tuple[int, int]:
    return model.head_dim, model.state_dim


def log_decay(inp: dict, params: dict):
    """``dt A`` (float64 in, float64 out; NumPy or torch)."""
    return inp["dt"] * params["A"]


def step(S, inp: dict):
    """One update from the decay ``inp["a"]``: returns the unrounded new state and ``y = S C``.

    Shapes: ``S (..., P, N)``; ``a``, ``dt`` ``(...)``; ``x (..., P)``; ``B``, ``C (..., N)``.
    """
    a, dt, x, B = inp["a"], inp["dt"], inp["x"], inp["B"]
    S_new = a[..., None, None] * S + (dt[..., None] * x)[..., :, None] * B[..., None, :]
    return S_new, (S_new * inp["C"][..., None, :]).sum(-1)


def segment(read, master, inp, params, *, out_from_fold: bool, buffer_round,
            u_from_master: bool = False):
    """ReplaySSM over one segment ``(m, S, H, ...)``: outputs and the unrounded folded state."""
    dt, C = inp["dt"], inp["C"]
    x, B = buffer_round(inp["x"]), buffer_round(inp["B"])
    Lc, D = decay_matrices(inp["la"])
    W = torch.exp(D) * dt.permute(1, 2, 0)[..., None, :]
    # a step with a non-finite input (a dead scheme's layer below, in a whole model) must not
    # reach the outputs before it through the masked products (0 * NaN is NaN): its inputs enter
    # the sums as 0 and the outputs from it on are NaN. Finite segments: the same bits.
    ok = torch.isfinite(x).all(-1) & torch.isfinite(B).all(-1)  # (m, S, H)
    G = torch.einsum("tshn,jshn->shtj", C, torch.where(ok[..., None], B, 0.0))
    Y = torch.einsum("shtj,jshp->tshp", W * G, torch.where(ok[..., None], x, 0.0))
    Y = torch.where((torch.cumsum(~ok, 0) > 0)[..., None], math.nan, Y)
    Y = Y + torch.exp(Lc)[..., None] * torch.einsum("shpn,tshn->tshp", read, C)
    w_last = W[..., -1, :].permute(2, 0, 1)  # (m, S, H)
    fold = torch.exp(Lc[-1])[..., None, None] * master + torch.einsum(
        "jshp,jshn->shpn", w_last[..., None] * x, B)
    if out_from_fold:  # a flush step's output comes from the unrounded folded state
        Y[-1] = torch.einsum("shpn,shn->shp", fold, C[-1])
    return Y, fold
