"""Fake quantisation inside Triton kernels: the twin of ``precsim.formats`` (core.py).

A state tile is ``[R, NB, BLK]`` float32 (rows, blocks, elements of a block; the last two axes are
the state's last axis, the one block scales run along). Every function mirrors
``formats.core.round_float`` / ``quantize_block`` operation for operation — IEEE divisions
(``div_rn``), exact power-of-two scales built from bits, RNE through the 2^23 trick — so RNE and SR
results are bit-identical to the torch/NumPy paths (tests check).

NVFP4's per-matrix FP32 scale (``amax / 2688``) is the max over the whole tile: the engines give a
program a whole head, so the reduction stays inside the program.

Formats come as ids (``precsim.formats.ids``: one table read off the registry, with each id's
class and limits), so a scheme can be passed as constexprs; the chains below that pick a format's
constants are unrolled over that table (``tl.static_range``), so a format added to the registry
compiles here with no edit, and the table is a constexpr global, part of every kernel's cache key.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from precsim.formats import ids

from precsim import formats as pf

from .rng import SRC_IDS, sr_increment

RNE, SR = 0, 1
SATFINITE, IEEE = 0, 1
SCOPE_MATRIX, SCOPE_NONE = 0, 1
SFLOOR_NORMAL, SCALE_DIVIDE = 1, 2  # bits of the SFLOOR constexpr (see scale_flags)
# the kernels' format table (formats.ids.kernel_table) as constexprs: the number of ids, and per
# id its class, its element limits and (block formats) its block parameters
TABLE = tl.constexpr(ids.kernel_table())
N_IDS = tl.constexpr(len(ids.kernel_table()))
FP32_MAX = tl.constexpr(ids.FP32_MAX)
ROW = tl.constexpr(ids.ROW_SCALED)  # a row-scaled format <elem>_b<B>: ROW + its element's id


@triton.constexpr_function
def id_class(k):
    """The class of id ``k`` (``formats.ids``: FLOAT, INT, TWO_LEVEL, MX)."""
    return TABLE.value[k][0]


@triton.constexpr_function
def limit(k, i):
    """Column ``i`` of id ``k``'s element limits (``formats.ids.limits_table``)."""
    return TABLE.value[k][1][i]


@triton.constexpr_function
def block_param(k, key):
    """Block format id ``k``'s parameter ``key`` (``formats.ids.block_params``)."""
    return dict(TABLE.value[k][2])[key]


def fmt_id(name: str) -> int:
    """A format's id (``formats.ids.fmt_id``)."""
    return ids.fmt_id(name)


def scale_flags(scale_floor: str = "subnormal", scale_mode: str = "reciprocal") -> int:
    """The SFLOOR constexpr: bit 0 = NVFP4 scale_floor "normal", bit 1 = scale_mode "divide"."""
    return (SFLOOR_NORMAL * int(scale_floor == "normal")
            + SCALE_DIVIDE * int(scale_mode == "divide"))


def block_of(name: str) -> int:
    """Block size of a block format, 0 for element formats."""
    f = pf.get(name)
    return f.block if f.kind == "block" else 0


@triton.jit
def exponent_f32(ax):
    """Unbiased exponent field of |x| (float32, sign clear): subnormals give -127."""
    return (ax.to(tl.int32, bitcast=True) >> 23) - 127


@triton.jit
def pow2_f32(e):
    """2**e as float32 from bits, e int32 (clamped to 127; subnormal powers down to 2**-149)."""
    e = tl.minimum(e, 127)
    normal = tl.maximum(e + 127, 1) << 23
    sub = tl.full(e.shape, 1, tl.int32) << tl.minimum(tl.maximum(e + 149, 0), 22)
    return tl.where(e >= -126, normal, sub).to(tl.float32, bitcast=True)


@triton.jit
def pow2n_f32(e):
    """2**e as float32 for e in [-126, 127] (normal powers only: two integer ops)."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def rint_pos(y):
    """Round half to even of y >= 0 (NaN/Inf pass through)."""
    big = 8388608.0
    return tl.where(y < big, (y + big) - big, y)


@triton.jit
def round_pos(y, RND, SRB, k0, k1, base_lo, base_hi, off, SRC: tl.constexpr = 0):
    """A non-negative tile rounded to an integer: RNE, or SR with ``SRB`` random bits from
    source ``SRC`` — the last step of every element rounding."""
    if RND == 0:
        r = rint_pos(y)
    else:
        lo = tl.floor(y)
        # 2**SRB from its bits (an int tensor whether SRB is a constexpr or a runtime field)
        scale = ((tl.zeros([], tl.int32) + SRB + 127) << 23).to(tl.float32, bitcast=True)
        thr = tl.floor((y - lo) * scale)
        r = lo + sr_increment(thr, k0, k1, base_lo, base_hi, off, SRB, SRC)
    return r


@triton.jit
def copysign_f32(a, b):
    ab = a.to(tl.uint32, bitcast=True) & 0x7FFFFFFF
    sb = b.to(tl.uint32, bitcast=True) & 0x80000000
    return (ab | sb).to(tl.float32, bitcast=True)


@triton.jit
def round_float(x, MB, EMIN, MAXV, HAS_INF, IS_INT, RND, SRB, OVF, k0, k1, base_lo, base_hi,
                off, SRC: tl.constexpr = 0):
    """formats.core.round_float (IS_INT 0) or round_int (IS_INT 1: the integers -MAXV..MAXV)
    on float32 ``x``; ``off`` = element offsets (int32, x's shape).

    Every format parameter is a constexpr (one format compiled) or a runtime scalar (a kernel
    that takes its formats at run time, ``kernels.codes``): the ``if``s below are then resolved
    at compile time or branch on uniform scalars."""
    ax = tl.abs(x)
    if IS_INT:
        if OVF == 1:
            y = ax
        else:
            y = tl.minimum(ax, MAXV, propagate_nan=tl.PropagateNan.ALL)
        q = ax
    else:
        e = tl.maximum(exponent_f32(ax), EMIN)
        if EMIN - MB >= -126:  # q and 1/q are normal: ax * (1/q) == ax / q (correctly rounded)
            q = pow2n_f32(e - MB)
            y = ax * pow2n_f32(MB - tl.minimum(e, 127))  # e = 128 (Inf/NaN): y stays Inf/NaN
        else:  # bf16: q may be subnormal and 1/q beyond float32
            q = pow2_f32(e - MB)
            y = tl.math.div_rn(ax, q)
    r = round_pos(y, RND, SRB, k0, k1, base_lo, base_hi, off, SRC)
    if IS_INT:
        if OVF == 1:
            r = tl.where(r > MAXV, float("nan"), r)
        out = r
    else:
        out = r * q
        over = out > MAXV
        if OVF == 1:
            if HAS_INF:
                out = tl.where(over, float("inf"), out)
            else:
                out = tl.where(over, float("nan"), out)
        else:
            out = tl.where(over, MAXV, out)
    return copysign_f32(out, x)


@triton.jit
def elem_params(F):
    """Element format id F's constants for :func:`round_float`: mantissa bits, emin, largest
    value, Inf or not, integer or not (``formats.ids``; id 0: fp32's largest value, nothing else
    used). A constexpr F keeps the one branch of its id; a runtime F selects among all."""
    z = F * 0  # (each constant in F's kind: a constexpr chain, or scalars chosen at run time)
    zf = z * 0.0
    MB, EMIN, MAXV, HINF, ISI = z, z, zf + FP32_MAX, z, z
    for k in tl.static_range(1, N_IDS):
        if (id_class(k) == 1) | (id_class(k) == 2):  # ids.FLOAT, ids.INT
            if F == k:
                MB, EMIN, MAXV = z + limit(k, 0), z + limit(k, 1), zf + limit(k, 2)
                HINF, ISI = z + limit(k, 3), z + limit(k, 4)
    return MB, EMIN, MAXV, HINF, ISI


@triton.jit
def round_elem(x, F, RND, SRB, OVF, k0, k1, base_lo, base_hi, off, SRC: tl.constexpr = 0):
    """Round to element format id F (``formats.ids``; 0 = fp32 as is). F a constexpr compiles
    one format; a runtime F one body for all of them."""
    if F == 0:
        out = x
    else:
        MB, EMIN, MAXV, HINF, ISI = elem_params(F)
        out = round_float(x, MB, EMIN, MAXV, HINF, ISI, RND, SRB, OVF, k0, k1, base_lo, base_hi,
                          off, SRC)
    return out


@triton.jit
def quantize(x, F, RND, SRB, OVF, SFLOOR: tl.constexpr, SCOPE: tl.constexpr, k0, k1, base_lo,
             base_hi, off, SRC: tl.constexpr = 0):
    """Fake-quantise a float32 tile ``[R, NB, BLK]`` to format id F (0: unchanged):
    element formats through :func:`round_elem`, block formats (``formats.ids``: two-level,
    MX, ROW_SCALED + element id: row-scaled) as formats.core.quantize_block.

    Two-level (NVFP4): s_t = amax(tile)/tensor_max (2688; SCOPE 0, "matrix") or none (SCOPE
    1); block scale (bmax/element_max)/s_t clamped to the scale's max (448; and to its smallest
    normal, 2^-6, if SFLOOR bit 0), RNE to the scale format (E4M3); the elements are multiplied
    by (1/s_t)/bs (reciprocal) or divided by s_t*bs (SFLOOR bit 1, "divide"). MX:
    2^(floor(log2 bmax) - emax(element)) clamped to [-127, 127]. Row-scaled: one float32 scale
    bmax / element max, elements divided by it. One element rounding serves both kinds, so a
    runtime F compiles it once. The constants are the format table's (``block_param``).
    """
    z = F * 0
    zf = z * 0.0
    BLOCKY = F >= ROW  # a block format: two-level, MX or row-scaled
    TWO = F < 0  # a two-level format
    for k in tl.static_range(1, N_IDS):
        if (id_class(k) == 3) | (id_class(k) == 4):  # ids.TWO_LEVEL, ids.MX
            BLOCKY = BLOCKY | (F == k)
        if id_class(k) == 3:
            TWO = TWO | (F == k)
    if BLOCKY:
        # max of |x| as int32 bit patterns: same order for x >= 0, and NaN (> Inf) propagates
        # as in torch's amax (a float max reduction may drop NaN)
        bmax_i = tl.max(tl.abs(x).to(tl.int32, bitcast=True), axis=2)
        bmax = bmax_i.to(tl.float32, bitcast=True)  # [R, NB]
        if TWO:
            EL, SID, EMX, TMX, SMN = z, z, zf, zf, zf
            for k in tl.static_range(1, N_IDS):
                if id_class(k) == 3:
                    if F == k:
                        EL, SID = z + block_param(k, "element"), z + block_param(k, "scale")
                        EMX = zf + block_param(k, "element_max")
                        TMX = zf + block_param(k, "tensor_max")
                        SMN = zf + block_param(k, "scale_min_normal")
            SMB, SEMIN, SMAX, SHINF, _ = elem_params(SID)
            zeros = tl.zeros(bmax.shape, tl.float32)
            bs = tl.math.div_rn(bmax, zeros + EMX)
            if SCOPE == 0:
                tmax = tl.max(tl.max(bmax_i, axis=1), axis=0).to(tl.float32, bitcast=True)
                s_t = tl.math.div_rn(tl.full(bmax.shape, 1.0, tl.float32) * tmax, zeros + TMX)
                s_t = tl.where(s_t == 0, 1.0, s_t)
                bs = tl.math.div_rn(bs, s_t)
            bs = tl.minimum(bs, SMAX, propagate_nan=tl.PropagateNan.ALL)
            if SFLOOR % 2 == 1:
                bs = tl.maximum(bs, SMN, propagate_nan=tl.PropagateNan.ALL)
            bs = round_float(bs, SMB, SEMIN, SMAX, False, False, 0, 0, 0, 0, 0, 0, 0, bmax_i)
            one = tl.full(bmax.shape, 1.0, tl.float32)
            bs1 = tl.where(bs > 0, bs, 1.0)
            if SCOPE == 0:
                total = s_t * bs
                inv = tl.math.div_rn(tl.math.div_rn(one, s_t), bs1)
            else:
                total = bs
                inv = tl.math.div_rn(one, bs1)
        elif F >= ROW:
            EL = F - ROW
            total = bmax
            inv = bmax
        else:
            EL, EMAXE = z, z
            for k in tl.static_range(1, N_IDS):
                if id_class(k) == 4:
                    if F == k:
                        EL, EMAXE = z + block_param(k, "element"), z + block_param(k, "emax")
            e = tl.minimum(tl.maximum(exponent_f32(bmax) - EMAXE, -127), 127)
            total = pow2_f32(e)
            inv = pow2_f32(-e)  # exact reciprocal of a power of two
        # largest finite value of the element format (the clamp before rounding)
        _, _, MAXE, _, _ = elem_params(EL)
        if F >= ROW:  # row-scaled: one float32 scale bmax / element max
            total = tl.math.div_rn(bmax, bmax * 0.0 + MAXE)
        total = tl.where((bmax - bmax) == 0, total, float("nan"))
        t3 = total[:, :, None]
        safe = tl.where(t3 > 0, t3, 1.0)
        if TWO & (SFLOOR // 2 == 0):  # two-level, reciprocal: x * ((1/s_t)/bs)
            xs = x * inv[:, :, None]
        elif TWO | (F >= ROW):
            xs = tl.math.div_rn(x, tl.broadcast_to(safe, x.shape))
        else:  # MX: x / 2^e == x * 2^-e exactly
            xs = x * inv[:, :, None]
        # a NaN element makes its block's scale NaN (bmax_i), so plain min/max suffice here
        xs = tl.minimum(tl.maximum(xs, -MAXE), MAXE)
        OV = z
    else:
        EL = F
        xs = x
        t3 = tl.zeros([x.shape[0], x.shape[1], 1], tl.float32)
        OV = OVF
    qe = round_elem(xs, EL, RND, SRB, OV, k0, k1, base_lo, base_hi, off, SRC)
    if BLOCKY:
        out = tl.where(t3 > 0, qe * t3, x * 0.0)
        out = tl.where(t3 == t3, out, float("nan"))
    else:
        out = qe
    return out


@triton.jit
def write_state(x, E, EF, F, RND, SRB, OVF, SFLOOR: tl.constexpr, SCOPE: tl.constexpr, k0, k1,
                base_lo, base_hi, off):
    """The master's rounding after an update or a fold (``precsim.schemes.write_state``):
    ``(Q(x), E)`` without error feedback (``EF == 0``), else ``X = x + E``,
    ``(Q(X), Q_e,RNE(X - Q(X)))`` with the residual's format id ``EF - 1``."""
    if EF != 0:
        x = x + E
    Q = quantize(x, F, RND, SRB, OVF, SFLOOR, SCOPE, k0, k1, base_lo, base_hi, off)
    if EF != 0:
        E = quantize(x - Q, EF - 1, 0, 0, OVF, SFLOOR, SCOPE, k0, k1, base_lo, base_hi, off)
    return Q, E


@triton.jit
def write_and_read(W, E, KIND, EF, F, RF, RND, SRB, OVF, SFLOOR: tl.constexpr,
                   SCOPE: tl.constexpr, k0, k1, base_lo, base_hi, off):
    """A scheme's write at a flush or step (:func:`write_state`) and the read copy it leaves:
    ``(S, E, R)``, ``R`` the master rounded to the read format ``RF`` for a split scheme
    (``KIND == 2``), else the master itself."""
    S, E = write_state(W, E, EF, F, RND, SRB, OVF, SFLOOR, SCOPE, k0, k1, base_lo, base_hi, off)
    if KIND == 2:
        R = quantize(S, RF, 0, 0, OVF, SFLOOR, SCOPE, k0, k1, base_lo, base_hi, off)
    else:
        R = S
    return S, E, R


@triton.jit
def _quantize_kernel(x_ptr, out_ptr, k0, k1, R: tl.constexpr, NB: tl.constexpr,
                     BLK: tl.constexpr, F: tl.constexpr, RND: tl.constexpr, SRB: tl.constexpr,
                     OVF: tl.constexpr, SFLOOR: tl.constexpr, SCOPE: tl.constexpr):
    m = tl.program_id(0)
    r = tl.arange(0, R)[:, None, None]
    b = tl.arange(0, NB)[None, :, None]
    k = tl.arange(0, BLK)[None, None, :]
    off = r * (NB * BLK) + b * BLK + k
    base = m.to(tl.int64) * (R * NB * BLK)
    base_lo = (base & 0xFFFFFFFF).to(tl.uint32)
    base_hi = (base >> 32).to(tl.uint32)
    x = tl.load(x_ptr + base + off)
    y = quantize(x, F, RND, SRB % 64, OVF, SFLOOR, SCOPE, k0.to(tl.uint32), k1.to(tl.uint32),
                 base_lo, base_hi, off, SRB // 64)
    tl.store(out_ptr + base + off, y)


def quantize_tiles(x: torch.Tensor, fmt: str, rounding: str = "rne", *, seed: int = 0,
                   stream: int = 0, sr_bits: int | None = None, overflow: str = "satfinite",
                   scale_floor: str = "subnormal", tensor_scope: str = "matrix",
                   scale_mode: str = "reciprocal", sr_source: str = "hash") -> torch.Tensor:
    """Quantise a float32 tensor ``(M, R, C)`` with the in-kernel code, one matrix a program.

    The result equals ``precsim.formats.quantize(x, fmt, rounding, seed=seed, stream=stream,
    ...)`` bit for bit (R and C powers of two; C a multiple of the block). For tests.
    """
    M, R, C = x.shape
    blk = block_of(fmt) or min(C, 16)
    k0, k1 = pf.stream_keys(seed, stream)
    out = torch.empty_like(x)
    x = x.contiguous()
    _quantize_kernel[(M,)](x, out, as_int32(k0), as_int32(k1), R=R, NB=C // blk, BLK=blk,
                           F=fmt_id(fmt), RND=SR if rounding == "sr" else RNE,
                           SRB=pf.sr_bits_used(fmt, sr_bits) + 64 * SRC_IDS[sr_source],
                           OVF=IEEE if overflow == "ieee" else 0,
                           SFLOOR=scale_flags(scale_floor, scale_mode),
                           SCOPE=SCOPE_NONE if tensor_scope == "none" else SCOPE_MATRIX)
    return out


def as_int32(v: int) -> int:
    """A uint32 key as the int32 with the same bits (kernel scalars are signed)."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= (1 << 31) else v
