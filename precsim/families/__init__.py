"""SSM families (registry): each family is one module with its one naive step and torch segment.

A family module (``mamba2.py``, ``gdn.py``) defines:

* ``KEYS``: the per-step input keys (trace schema); ``state_dims(model)`` the state's ``(Dv, Dk)``;
* ``LABEL`` (its name in text), ``PARAMS`` (per-head constants), ``SKIP`` (an optional per-head
  skip parameter, or None), the inputs by role: ``DECAY_INPUT`` (``(steps, heads)``), ``VALUE``
  (the state's Dv axis), ``KEY`` (its Dk axis), ``QUERY`` (the readout), ``GROUPED`` (inputs a
  trace may hold per group of heads) and ``KERNEL_GROUPS`` (whether the engines read those per
  group, ``model.groups``, or expanded per head), ``KERNEL`` (the name of its compiled code:
  each engine maps it to its kernel set, e.g. ``numba.JIT``, ``triton.kernel_sets()``),
  ``DELTA_RULE`` (whether the update reads the state, as GDN's ``u_t``: the buffer then holds
  run-time values and ``replay.gdn_u_source`` applies), ``WEIGHT`` (the ``(steps, heads)`` input
  scaling a step's write), ``SHORT`` (its name in one-line messages);
* traces and synthetic inputs: ``MARKERS`` (keys that make a trace this family's, see
  :func:`family_of`), ``TRACE_AXES`` (its arrays and their axes), ``check_trace(data, where,
  groups_of)`` (values checked, expected shapes returned), ``TAGS`` (the synthetic inputs'
  random streams), ``random_params(rng, H, style, n_long)`` and ``random_inputs(w, z, p, xp)``
  (the synthetic workload);
* transformers (:mod:`precsim.models`): ``HF_MIXERS``, ``HF_ARCHITECTURES`` (its classes),
  ``HF_HOOKED`` (the functions the mixers call: one decode token, a chunk), ``HF_DIMS`` (the
  mixer's attributes of heads, Dv, Dk), ``hf_inputs``, ``hf_parse``, ``hf_build`` (a hooked
  call's arguments to precsim's inputs, its return value read and rebuilt);
* ``step(S, inp)``: **the** recurrence, one token, written once with operations NumPy and torch
  share, so it is the float64 oracle (:mod:`precsim.oracle`), the NumPy engine's step and the
  torch engine's conventional step alike. ``inp`` holds the token's inputs plus its decay ``a``;
  it returns the unrounded new state and the output;
* ``segment(read, master, inp, params, ...)``: ReplaySSM over the positions between two flushes
  (torch, chunked over the segment; outputs by output-only evaluation from a read copy plus the
  buffer, the folded state from the master), from the log-decays ``la``;
* ``log_decay(inp, params)``: the float64 per-step log-decay.

Decays are computed once, in float64, by :func:`decays`: every engine's float32 decay is the
correctly rounded float32 of the float64 decay (``decay_exp="exact"``), or the float32 ``exp`` a
fast GPU kernel computes (``"fast"``, see :func:`fast_exp32`). A new family is one module plus
one entry in ``FAMILIES`` (and its name in ``config.FAMILIES``); nothing outside this package
compares a family's name (tests/package/test_family_branches.py).
"""

from __future__ import annotations

import math

import torch

from ..errors import check_choice
from . import gdn, mamba2

FAMILIES = {"mamba2": mamba2, "gdn": gdn}
LOG2E_F32 = float(torch.tensor(1.0 / math.log(2.0), dtype=torch.float32))


def get_family(name: str):
    check_choice("model.family", name, FAMILIES)
    return FAMILIES[name]


def grouped_keys() -> tuple[str, ...]:
    """Every family's inputs that may come per group of heads."""
    return tuple(k for f in FAMILIES.values() for k in f.GROUPED)


def family_of(keys) -> str:
    """The family whose input keys a trace dict holds: the first in ``FAMILIES`` one of whose
    ``MARKERS`` it has (gdn where none: :func:`precsim.workload.validate_trace` then names the
    trace's fault)."""
    return next((n for n, f in FAMILIES.items() if any(k in keys for k in f.MARKERS)), "gdn")


def family_params(family: str, params: dict, device, dtype) -> dict:
    """Per-head constants as tensors: Mamba-2 ``A (H,)``; GDN none (g, beta are inputs)."""
    return {k: torch.as_tensor(params[k], dtype=dtype, device=device)
            for k in get_family(family).PARAMS if k in params}


def fast_exp32(x: torch.Tensor) -> torch.Tensor:
    """float32 ``exp`` as fast GPU kernels compute it: ``2^(x * log2 e)`` with the product
    rounded to float32 (Triton's ``tl.exp`` is ``ex2.approx.f32`` of that product on NVIDIA).
    Here the ``exp2`` is correctly rounded (evaluated in float64, rounded once; torch's float32
    ``exp2`` on the CPU is not); the GPU's ``ex2.approx`` adds up to ~2 ulp of its own, which the
    Triton engine reproduces by taking ``tl.exp`` itself (docs/performance.md)."""
    return torch.exp2((x.to(torch.float32) * LOG2E_F32).to(torch.float64)).to(torch.float32)


def decays(family: str, inp64: dict, params64: dict, dtype: torch.dtype,
           decay_exp: str = "exact", need_a: bool = True) -> dict:
    """Per-step decay ``a`` and log-decay ``la`` of a window in ``dtype`` (float64 inputs).

    ``exact``: both are the correctly rounded ``dtype`` values of the float64 ones (the truth's).
    ``fast``: ``a`` is the float32 exp of the float32 log-decay (:func:`fast_exp32`).
    ``need_a`` False: ``la`` alone (a ReplaySSM segment reads no ``a``).
    """
    la64 = FAMILIES[family].log_decay(inp64, params64)
    if not need_a:
        return {"la": la64 if dtype == torch.float64 else la64.to(dtype)}
    if dtype == torch.float64:
        return {"a": torch.exp(la64), "la": la64}
    la = la64.to(dtype)
    a = fast_exp32(la).to(dtype) if decay_exp == "fast" else torch.exp(la64).to(dtype)
    return {"a": a, "la": la}


__all__ = ["FAMILIES", "get_family", "family_of", "grouped_keys", "family_params", "decays",
           "fast_exp32"]
