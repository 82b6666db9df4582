"""Kernel ids: the numbers the compiled kernels know formats and scheme kinds by, read off the
registry (:data:`precsim.formats.core.REGISTRY`).

This is the one description the Triton kernels (``precsim.kernels.quant``, ``kernels.codes``) and
the numba engine (``precsim.engines.numba``) compile from, as microxcaling's
``_get_format_params`` reads a format's kernel parameters off its entry: a format added to
``REGISTRY`` gets its id, class and limits here with no other edit.

* **id** (:func:`fmt_id`): a small int per format a kernel can hold a state in, in registry
  order: 0 for fp64 and fp32 (nothing to round on a float32 carrier), then 1, 2, ... for each
  element and block format (e8m0, a scale only, has none). A row-scaled ``<element>_b<B>`` is
  :data:`ROW_SCALED` + its element's id (a slot code's format field holds 5 bits, so at most 15
  registry ids); the numba engine's compile-time code of it (:func:`fmt_code`) adds
  ``SCALED_STRIDE * B``.
* **class** (:func:`id_class`): :data:`NONE` (left as is), :data:`FLOAT` / :data:`INT` (element
  formats), :data:`TWO_LEVEL` (NVFP4: a rounded block scale under an FP32 scale per matrix),
  :data:`MX` (OCP MX: a power-of-two E8M0 block scale), :data:`ROW` (row-scaled).
* **limits** (:func:`limits_table`): per id, what :func:`precsim.formats.core.round_float` /
  ``round_int`` read of an element format (mantissa bits, emin, largest finite value, Inf or
  not, integer or not); per block id, its element's and scale's ids and its block size
  (:func:`block_params`).
* **scheme kinds**: :data:`SCHEME_KINDS` and their ids :data:`KIND_IDS` (the schemes,
  ``precsim.schemes``, hold one class per kind).
"""

from __future__ import annotations

import hashlib

import numpy as np

from .core import REGISTRY, FormatError, ScaledFormat, get

SCHEME_KINDS = ("conventional", "shared", "split")
KIND_IDS = {k: i for i, k in enumerate(SCHEME_KINDS)}

NONE, FLOAT, INT, TWO_LEVEL, MX, ROW = range(6)
ROW_SCALED = 16  # id of a row-scaled format: ROW_SCALED + its element's id
SCALED_STRIDE = 32  # the numba engine's code of a row-scaled format: its id + SCALED_STRIDE * B
# columns of limits_table(): mantissa bits, emin, largest finite value (qmax), Inf, integer
L_MB, L_EMIN, L_MAX, L_INF, L_INT = range(5)
FP32_MAX = float(np.finfo(np.float32).max)


def _class_of(f) -> int | None:
    """The kernel class of a registry entry (None: no kernel holds a state in it)."""
    if f.kind == "identity" or f.name == "fp32":
        return NONE
    if f.kind == "int":
        return INT
    if f.kind == "float":
        return FLOAT if f.signed and f.has_zero else None  # e8m0: a scale format only
    if f.kind == "block" and _class_of(f.element) in (FLOAT, INT):
        if f.two_level and _class_of(f.scale) == FLOAT:
            return TWO_LEVEL
        if not f.two_level and f.scale.kind == "float" and not f.scale.has_zero:
            return MX
    return None


def fmt_ids() -> dict[str, int]:
    """Every registry format a kernel covers, by name, with its id (see the module doc)."""
    out, nxt = {}, 1
    for name, f in REGISTRY.items():
        c = _class_of(f)
        if c is None:
            continue
        if c == NONE:
            out[name] = 0
        else:
            out[name] = nxt
            nxt += 1
    if nxt > ROW_SCALED:
        raise FormatError(f"{nxt - 1} kernel format ids; allowed: at most {ROW_SCALED - 1} "
                          "(a slot code's format field holds 5 bits, the upper half row-scaled)")
    return out


def covered(name) -> bool:
    """Whether the compiled kernels can hold a state in format ``name``."""
    f = get(name)
    base = f.element if isinstance(f, ScaledFormat) else f
    return base.name in fmt_ids()


def fmt_id(name) -> int:
    """The kernels' id of a format (5 bits; row-scaled: ROW_SCALED + its element's id)."""
    f = get(name)
    ids = fmt_ids()
    base = f.element if isinstance(f, ScaledFormat) else f
    if base.name not in ids:
        raise FormatError(f"format={f.name!r} is not covered by the compiled kernels; allowed: "
                          f"{', '.join(ids)}, or <element>_b<block size>")
    return ids[base.name] + (ROW_SCALED if isinstance(f, ScaledFormat) else 0)


def fmt_code(name) -> int:
    """The numba engine's compile-time code of a format: :func:`fmt_id`, plus
    ``SCALED_STRIDE * B`` for a row-scaled ``<element>_b<B>`` (its block is a constant there)."""
    f = get(name)
    return fmt_id(f) + (SCALED_STRIDE * f.block if isinstance(f, ScaledFormat) else 0)


def split_code(code: int) -> tuple[int, int]:
    """A :func:`fmt_code` as (id, block of a row-scaled format or 0)."""
    blk, fid = divmod(int(code), SCALED_STRIDE)
    return fid, blk


def _entries() -> dict[int, object]:
    """Registry entry of each id above 0."""
    return {i: REGISTRY[n] for n, i in fmt_ids().items() if i}


def id_class(fid: int) -> int:
    """The class of an id (a row-scaled id is :data:`ROW`)."""
    if fid >= ROW_SCALED:
        return ROW
    return NONE if fid <= 0 else _class_of(_entries()[fid])


def is_block(fid: int) -> bool:
    """Whether id ``fid`` scales blocks (two-level, MX, row-scaled)."""
    return id_class(fid) in (TWO_LEVEL, MX, ROW)


def element_id(fid: int) -> int:
    """The id of the elements of format id ``fid`` (itself for an element format)."""
    if fid >= ROW_SCALED:
        return fid - ROW_SCALED
    if id_class(fid) in (TWO_LEVEL, MX):
        return fmt_ids()[_entries()[fid].element.name]
    return fid


def _limits(f) -> tuple:
    if f.kind == "int":
        return (0, 0, float(f.qmax), 0, 1)
    return (f.mbits, f.emin, float(f.max_value), int(f.has_inf), 0)


def limits_table() -> np.ndarray:
    """float64 ``(ids, 5)``: row ``i`` = id ``i``'s element limits (columns ``L_MB``, ``L_EMIN``,
    ``L_MAX``, ``L_INF``, ``L_INT``); rows of id 0 and of block formats are zeros (row 0's
    ``L_MAX`` is fp32's largest value, the clamp of a scale-free element)."""
    ents = _entries()
    out = np.zeros((1 + len(ents), 5), dtype=np.float64)
    out[0, L_MAX] = FP32_MAX
    for i, f in ents.items():
        if _class_of(f) in (FLOAT, INT):
            out[i] = _limits(f)
    return out


def block_params(fid: int) -> dict:
    """What a block format's kernel code reads off its entry: ``element`` (id), ``block``,
    ``element_max``; two-level also ``scale`` (its id), ``scale_max``, ``scale_min_normal`` and
    ``tensor_max`` (element max x scale max, the per-matrix scale's divisor); MX ``emax`` (the
    element's largest exponent, the shared exponent's offset)."""
    f = _entries()[fid]
    el = f.element
    out = {"element": element_id(fid), "block": f.block, "element_max": float(el.max_value)}
    if f.two_level:
        out.update(scale=fmt_ids()[f.scale.name], scale_max=float(f.scale.max_value),
                   scale_min_normal=float(f.scale.min_normal),
                   tensor_max=float(el.max_value) * float(f.scale.max_value))
    else:
        out["emax"] = int(el.max_value).bit_length() - 1
    return out


def kernel_table() -> tuple:
    """The whole description as nested tuples (hashable: a Triton constexpr, so a change of
    the registry changes the kernels' cache keys): per id ``(class, limits, block params)``."""
    lim = limits_table()
    rows = []
    for i in range(lim.shape[0]):
        c = id_class(i)
        bp = tuple(sorted(block_params(i).items())) if c in (TWO_LEVEL, MX) else ()
        mb, emin, mx, inf, isint = lim[i].tolist()
        rows.append((c, (int(mb), int(emin), float(mx), int(inf), int(isint)), bp))
    return tuple(rows)


def table_key() -> str:
    """A short fingerprint of :func:`kernel_table`."""
    return hashlib.sha256(repr(kernel_table()).encode()).hexdigest()[:16]
