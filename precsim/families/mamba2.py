"""Mamba-2: ``S_t = a_t S_{t-1} + dt_t x_t B_t^T``, ``y_t = S_t C_t`` with ``a_t = exp(dt_t A)``.

State ``(P, N)`` per head. :func:`step` is the one naive step (NumPy or torch, any float dtype);
:func:`segment` the torch ReplaySSM segment.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import PrecsimError
from .base import decay_matrices, inv_softplus, softplus

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
SHORT = "Mamba-2"  # its name in one-line messages
MARKERS = ("dt", "A")  # keys that make a trace this family's
TRACE_AXES = {"A": 1, "dt": 2, "x": 3, "B": 3, "C": 3}  # a trace's arrays and their axes
TAGS = {"dt": 1, "x": 2, "B": 3, "C": 4}  # the synthetic inputs' random streams (workload.normals)
# transformers (precsim.models): the mixer and model classes of this family (all tested,
# tests/models/), the module-level functions the mixers call (one decode token, a
# whole chunk) that precsim.models.hook replaces, and the mixer's attributes (heads, Dv, Dk)
HF_MIXERS = ("Mamba2Mixer", "NemotronHMamba2Mixer", "BambaMixer", "FalconH1Mixer",
             "Zamba2MambaMixer", "GraniteMoeHybridMambaLayer")
HF_ARCHITECTURES = ("Mamba2ForCausalLM", "NemotronHForCausalLM", "BambaForCausalLM",
                    "FalconH1ForCausalLM", "Zamba2ForCausalLM", "GraniteMoeHybridForCausalLM")
HF_HOOKED = ("mamba2_selective_state_update", "mamba2_chunk_scan")
HF_DIMS = ("num_heads", "head_dim", "ssm_state_size")


def state_dims(model) -> tuple[int, int]:
    return model.head_dim, model.state_dim


def random_params(rng, H: int, style: str, n_long: int) -> dict:
    """The synthetic workload's per-head constants (NumPy's ``rng``): mamba_ssm's
    initialisation, or (``seed_article``) the article's slow decay everywhere, very slow on the
    first ``n_long`` heads."""
    if style == "seed_article":
        A = -np.exp(rng.uniform(np.log(1e-2), np.log(1.0), H))
        A[:n_long] = -np.exp(rng.uniform(np.log(1e-4), np.log(1e-3), n_long))
        return {"A": A, "dt_bias": np.zeros(H)}
    A = -rng.uniform(1.0, 16.0, H)  # mamba_ssm: A ~ U[1,16], stored as A_log
    dt0 = np.maximum(np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), H)), 1e-4)
    return {"A": A, "dt_bias": inv_softplus(dt0)}


def random_inputs(w, z, p: dict, xp) -> dict:
    """One chunk of the synthetic workload ``w`` (its ``S, H, P, N, G``, ``style``,
    ``dt_noise``): ``z(key, tail)`` an input's standard normals, ``p`` the per-head constants,
    ``xp`` the array library (NumPy or torch)."""
    S, H, P, N, G = w.S, w.H, w.P, w.N, w.G
    z_dt = z("dt", (S, H))
    if w.style == "seed_article":
        dt, bc = softplus(xp, z_dt), 1.0 / math.sqrt(N)
    else:
        dt, bc = softplus(xp, w.dt_noise * z_dt + p["dt_bias"]), 1.0
    return {"dt": dt, "x": z("x", (S, H, P)), "B": z("B", (S, G, N)) * bc,
            "C": z("C", (S, G, N)) * bc}


def check_trace(data: dict, where: str, groups_of) -> dict:
    """A trace's values checked (one-line PrecsimError); returns each array's expected shape.
    ``groups_of(a, H, where, key)``: the group count of a grouped input."""
    T, H = data["dt"].shape
    P, N = data["x"].shape[2], data["B"].shape[2]
    G = groups_of(data["B"], H, where, "B")
    expect = {"A": (H,), "dt": (T, H), "x": (T, H, P), "B": (T, G, N), "C": (T, G, N)}
    if "D" in data:
        expect["D"] = (H,)
        if data["D"].ndim != 1 or not np.isfinite(data["D"]).all():
            raise PrecsimError(f"{where}: D must be finite with shape ({H},), got "
                               f"{data['D'].shape}")
    if not (data["A"] < 0).all():
        raise PrecsimError(f"{where}: A={data['A'].min():.3g}..{data['A'].max():.3g}; "
                           "allowed: negative values (A = -exp(A_log))")
    if not (data["dt"] > 0).all():
        raise PrecsimError(f"{where}: dt has values <= 0; allowed: positive (after softplus)")
    return expect


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
            u_from_master: bool = False, fold: bool = True):
    """ReplaySSM over one segment ``(m, S, H, ...)``: outputs and the unrounded folded state
    (None with ``fold`` False and ``out_from_fold`` False: a segment left unfinished, whose fold
    nothing reads, costs no state-sized work beyond its outputs)."""
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
    if not (fold or out_from_fold):
        return Y, None
    w_last = W[..., -1, :].permute(2, 0, 1)  # (m, S, H)
    fold = torch.exp(Lc[-1])[..., None, None] * master + torch.einsum(
        "jshp,jshn->shpn", w_last[..., None] * x, B)
    if out_from_fold:  # a flush step's output comes from the unrounded folded state
        Y[-1] = torch.einsum("shpn,shn->shp", fold, C[-1])
    return Y, fold


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float64 else t.float()


def hf_inputs(a: dict, recurrent: bool, _l2norm=None) -> tuple[dict, dict, torch.Tensor | None]:
    """``(inputs, constants, state before the call)`` of a transformers Mamba-2 function's
    arguments ``a`` (precsim.models.hook's Step), its own dt arithmetic applied."""
    bias, D = a.get("dt_bias"), a.get("D")
    if recurrent:  # state (b,H,P,N), hidden_states (b,H,P), dt (b,H,P), A (H,P,N), B/C (b,G,N)
        x, dt, A = a["hidden_states"][None], a["dt"][None, :, :, 0], a["A"][:, 0, 0]
        bias, D = (None if t is None else t[:, 0] for t in (bias, D))
        Bg, Cg = a["B"][None], a["C"][None]
        state = a["state"]
    else:  # hidden_states (b,l,H,P), dt (b,l,H), A (H,), B/C (b,l,G,N), initial_states (b,H,P,N)
        x, dt, A = a["hidden_states"].transpose(0, 1), a["dt"].transpose(0, 1), a["A"]
        Bg, Cg = a["B"].transpose(0, 1), a["C"].transpose(0, 1)
        state = a.get("initial_states")
    if bias is not None:
        dt = dt + bias.to(dt.dtype)
    if a.get("dt_softplus"):
        dt = F.softplus(dt)
    if not recurrent:  # the chunked function also clamps dt to dt_limit
        lim = a.get("dt_limit", (0.0, float("inf")))
        dt = torch.clamp(dt, min=lim[0], max=lim[1])
    inp = {"dt": _wide(dt), "x": _wide(x), "B": _wide(Bg), "C": _wide(Cg)}
    const = {"A": _wide(A.detach())}
    if D is not None:
        const["D"] = D.detach().to(inp["x"].dtype)
    return inp, const, None if state is None else state.clone()


def hf_parse(recurrent: bool, a: dict, raw) -> tuple:
    """The transformers function's own ``(y (T,b,H,P), state (b,H,P,N) or None)`` from its
    return value ``raw``."""
    if recurrent:
        return raw[None], a["state"].clone()
    if isinstance(raw, tuple):
        return raw[0].transpose(0, 1), raw[1]
    return raw.transpose(0, 1), None


def hf_build(recurrent: bool, a: dict, y: torch.Tensor, state):
    """The transformers function's return value (and in-place cache update) from ``(y,
    state)``; ``state`` None: zeros."""
    if state is None:
        state = y.new_zeros((*y.shape[1:], a["B"].shape[-1]))
    if recurrent:
        a["state"].copy_(state.to(a["state"].dtype))
        out = y[0]
        if a.get("z") is not None:
            out = out * F.silu(a["z"])
        return out.to(a["hidden_states"].dtype)
    out = y.transpose(0, 1).to(torch.float64 if a["hidden_states"].dtype == torch.float64
                               else torch.float32)
    if a.get("return_final_states"):
        return out, state.to(out.dtype)
    return out
