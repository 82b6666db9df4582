"""Slot codes: one packed integer per kernel slot (a scheme), its fields, and the dispatch order.

A kernel takes each slot's code either as compile-time constants (one packed ``tl.constexpr``
per launch: a kernel compiled per configuration, the fastest) or, compiled with ``RUNTIME``, from
an int32 vector (:func:`runtime_meta`: one kernel serves every scheme, as a sweep over schemes
wants). The layout is defined here once: :func:`pack` builds a code from plain
ints, :func:`fields` reads one back on the host, and the kernels decode it with the same shifts
written as literal constexpr arithmetic (``CODE % 4``, ``(CODE // 4) % 32``, ...; a launch's codes
packed as ``CODES = sum_k code_k 2^(CODE_BITS k)``); ``tests/kernels`` evaluates the kernels'
decode lines against :func:`fields`, so the two cannot drift apart.
"""

from __future__ import annotations

from precsim.formats import ids

KIND_BITS, FMT_BITS, RND_BITS, OVF_BITS, SRB_BITS = 2, 5, 1, 1, 6  # formats: formats.ids
KIND_SHIFT = 0
FMT_SHIFT = KIND_SHIFT + KIND_BITS
RFMT_SHIFT = FMT_SHIFT + FMT_BITS
RND_SHIFT = RFMT_SHIFT + FMT_BITS
OVF_SHIFT = RND_SHIFT + RND_BITS
SRB_SHIFT = OVF_SHIFT + OVF_BITS
CODE_BITS = SRB_SHIFT + SRB_BITS
KINDS = ids.KIND_IDS  # scheme kinds (formats.ids)
MAX_SLOTS = 8  # schemes per launch (plus the truth)


def pack(kind: int, fmt: int, read_fmt: int = 0, rnd: int = 0, ovf: int = 0,
         srb: int = 0) -> int:
    """A slot code from its fields (kind 0 conventional / 1 shared / 2 split; format ids of
    ``formats.ids``; rounding 0 RNE / 1 SR; overflow 0 satfinite / 1 ieee; SR bits)."""
    vals = (kind, fmt, read_fmt, rnd, ovf, srb)
    widths = (KIND_BITS, FMT_BITS, FMT_BITS, RND_BITS, OVF_BITS, SRB_BITS)
    shifts = (KIND_SHIFT, FMT_SHIFT, RFMT_SHIFT, RND_SHIFT, OVF_SHIFT, SRB_SHIFT)
    code = 0
    for v, w, s in zip(vals, widths, shifts, strict=True):
        if not 0 <= v < (1 << w):
            raise ValueError(f"slot code field {v} does not fit in {w} bits")
        code |= v << s
    return code


def fields(code: int) -> dict:
    """The fields of a slot code (the inverse of :func:`pack`)."""
    def f(shift, bits):
        return (code >> shift) & ((1 << bits) - 1)
    return {"kind": f(KIND_SHIFT, KIND_BITS), "fmt": f(FMT_SHIFT, FMT_BITS),
            "read_fmt": f(RFMT_SHIFT, FMT_BITS), "rnd": f(RND_SHIFT, RND_BITS),
            "ovf": f(OVF_SHIFT, OVF_BITS), "srb": f(SRB_SHIFT, SRB_BITS)}


def slot_cost(code: int | None) -> int:
    """Rough relative cost of a slot per step (None: the float64 truth), for the dispatch order:
    every-step block quantisation (measured ~3.5x the truth per step on the H200) > ReplaySSM
    (~1.6x) > every-step element rounding > truth, conventional FP32."""
    if code is None:
        return 1
    f = fields(code)
    if f["kind"] != 0:
        return 4
    block = ids.is_block(f["fmt"])  # nvfp4, mxfp4, mxfp8, row-scaled
    return 6 + f["rnd"] if block else (3 + f["rnd"] if f["fmt"] > 0 else 1)


def dispatch_order(truth: bool, codes: list[int], lpt: bool = True) -> int:
    """The kernels' ``ORDER``: grid column k runs slot ``(ORDER >> 4k) & 15`` (slot 0 the truth
    when ``truth``). With ``lpt`` the costliest slots come first (longest-processing-time
    order: a launch's cheap programs fill the SMs behind the long ones instead of the long ones
    running alone at its end); else the identity."""
    costs = ([slot_cost(None)] if truth else []) + [slot_cost(c) for c in codes]
    order = sorted(range(len(costs)), key=lambda k: -costs[k]) if lpt else range(len(costs))
    return sum(k << (4 * pos) for pos, k in enumerate(order))



META_CODES, META_EFS = 16, 32  # offsets in a runtime launch's meta vector (kernels' RUNTIME)
_META: dict = {}


def runtime_meta(truth: bool, codes: list[int], order: int, efs: int, device):
    """The int32 vector a kernel compiled with ``RUNTIME`` reads its slots from: the slot of
    each grid column (``order`` unpacked), then each slot's code (at ``META_CODES``) and
    error-feedback code (``META_EFS``; ``efs`` packed as the kernels' ``EFS``). Built once per
    launch group and device and kept (a copy to the device per launch would wait for the GPU)."""
    import torch

    key = (truth, tuple(codes), order, efs, str(device))
    if key not in _META:
        meta = [0] * (META_EFS + MAX_SLOTS)
        for c in range(int(truth) + len(codes)):
            meta[c] = (order >> (4 * c)) & 15
        for k, code in enumerate(codes):
            meta[META_CODES + k] = code
            meta[META_EFS + k] = (efs // 64**k) % 64
        if len(_META) > 64:
            _META.clear()
        _META[key] = torch.tensor(meta, dtype=torch.int32, device=device)
    return _META[key]
