"""The compiled quantiser of a matrix (:func:`qin`, in place; :func:`quantize_many` over a stack,
``engines.numba.quantize``'s loop) and of a scheme's state after a step (:func:`store`): element
formats through :mod:`.rounding`, row-scaled ``<element>_b<B>`` formats, block formats (NVFP4's
two-level scales, OCP MX's power-of-two ones), bit-equal to :func:`precsim.formats.quantize`.

A format's code (``codes.fmt_code``) and its SR lane width (``codes.sr_lane``) are constants of
the compiled code, so numba compiles each format's and rounding's branches only.
"""

from __future__ import annotations

import functools

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from precsim.formats import ids

from .cache import njit
from .codes import C_BITS, C_IEEE, table_key
from .rounding import (
    elem_consts,
    elements,
    f2i,
    i2f,
    ints,
    pow2,
    round_fin,
    round_v,
    shift,
    words,
)

_F0 = np.float32(0.0)
_F1 = np.float32(1.0)
_NAN = np.float32(np.nan)


@njit(cache=True, inline="always")
def _scaled(x, B, ef, isint, ub, ush, sr, bits, el):
    """A row-scaled format ``<element>_b<B>`` over flat ``x``, in place, as
    ``formats.ScaledFormat``: per block of ``B`` elements the FP32 scale ``max|x| / emax``
    (one float32 division; NaN if the block holds NaN or Inf), the elements divided by it
    (1 for a zero scale) and clipped to +-emax, rounded (element format ``ef``, satfinite;
    lanes as :func:`elements`) and multiplied back. Three passes that each vectorise (one
    pass with the rounding inside the block loop ran 4-10x slower). ``isint``: the element
    is an integer format."""
    emax = np.float32(el[ef, 2])
    nb = x.shape[0] // B
    tot = np.empty(nb, dtype=np.float32)
    for g in range(nb):
        b0 = g * B
        bm = np.int32(0)
        if B % 16 == 0:
            for k in range(B // 16):
                bm = np.int32(max(bm, _absmax16(x, b0 + 16 * k)))
        else:
            for j in range(B):
                bm = np.int32(max(bm, f2i(x[b0 + j]) & np.int32(0x7FFFFFFF)))
        tot[g] = i2f(bm) / emax if bm < 0x7F800000 else _NAN
    x2 = x.reshape(nb, B)
    for g in range(nb):
        safe = tot[g] if tot[g] > 0 else _F1
        for j in range(B):
            x2[g, j] = min(max(x2[g, j] / safe, -emax), emax)
    mb, emin, maxv, ovf, sc = elem_consts(ef, bits, False, el)
    if isint:
        ints(x, ub, ush, sr, emax, False, sc)
    else:
        elements(x, ub, ush, sr, mb, emin, maxv, ovf, sc, emin - mb < -126)
    for g in range(nb):
        t = tot[g]
        for j in range(B):
            x2[g, j] = x2[g, j] * t


@njit(cache=True, inline="always")
def _blk_el(v, fg, tg, mul, sr, u, pmin, imb, tmb, maxv, maxe, sc):
    """One block element: ``v * fg`` (``mul``) or ``v / fg``, clipped, rounded, ``* tg``."""
    xs = min(max(v * fg if mul else v / fg, -maxe), maxe)
    return round_fin(xs, pmin, imb, tmb, maxv, sr, sc, u) * tg


def _blocks(x, fac, tot, mul, ub, blk, sr, pmin, imb, tmb, maxv, maxe, sc):
    """Block formats over flat ``x``, in place (see :func:`elements`; lane ``ub[i]`` is
    element ``i``'s SR integer, already shifted): block ``g`` (``blk`` elements) is
    ``x * fac[g]`` (``mul``) or ``x / fac[g]``, rounded, times ``tot[g]``. Compiled code
    only, ``blk`` and ``sr`` constants: :func:`_blocks_impl`."""
    raise NotImplementedError("precsim.engines.numba_jit.quant._blocks runs compiled only")


@overload(_blocks, prefer_literal=True)
def _blocks_typed(x, fac, tot, mul, ub, blk, sr, pmin, imb, tmb, maxv, maxe, sc):
    if isinstance(blk, types.IntegerLiteral) and isinstance(sr, types.BooleanLiteral):
        return _blocks_impl(blk.literal_value, sr.literal_value)
    return None


@functools.cache
def _blocks_impl(BLK, SR):
    """:func:`_blocks` for blocks of ``BLK`` (16 or 32) elements, SR or RNE: a constant
    inner trip count (vectorised whole; the branch on ``mul`` is loop-invariant), and one
    loop nest compiled instead of four."""

    def blocks(x, fac, tot, mul, ub, blk, sr, pmin, imb, tmb, maxv, maxe, sc):
        nb = fac.shape[0]
        x2 = x.reshape(nb, BLK)
        if SR:
            u2 = ub[:nb * BLK].reshape(nb, BLK)
            for g in range(nb):
                fg, tg = fac[g], tot[g]
                for j in range(BLK):
                    u = np.float32(u2[g, j])
                    x2[g, j] = _blk_el(x2[g, j], fg, tg, mul, True, u, pmin, imb, tmb, maxv,
                                       maxe, sc)
        else:
            for g in range(nb):
                fg, tg = fac[g], tot[g]
                for j in range(BLK):
                    x2[g, j] = _blk_el(x2[g, j], fg, tg, mul, False, _F0, pmin, imb, tmb,
                                       maxv, maxe, sc)

    return blocks


def _vec_absmax(width):
    """An intrinsic ``f(x, b0)``: the largest ``|x|`` bit pattern (as int32) of the
    ``width`` float32 elements from ``x[b0]``, by one vector load and LLVM's unsigned max
    reduction. (The scalar loop compiled to compare-and-branch chains whose branches
    mispredicted on state data: 5-6 us of NVFP4's 11 us per 64 x 128 state.)"""

    @intrinsic
    def absmax(typingctx, x, b0):
        sig = types.int32(x, b0)

        def codegen(context, builder, signature, args):
            i32 = ir.IntType(32)
            vty = ir.VectorType(i32, 16)
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            ptr = builder.gep(ary.data, [args[1]])
            mask = ir.Constant(vty, [0x7FFFFFFF] * 16)
            red = ir.FunctionType(i32, [vty])
            fn = cgutils.get_or_insert_function(builder.module, red,
                                                "llvm.vector.reduce.umax.v16i32")
            best = None
            for k in range(width // 16):
                p = builder.gep(ptr, [ir.Constant(ir.IntType(64), 16 * k)]) if k else ptr
                v = builder.and_(builder.load(p, typ=vty, align=4) if ptr.type.is_opaque
                                 else builder.load(builder.bitcast(p, vty.as_pointer()),
                                                   align=4), mask)
                m = builder.call(fn, [v])
                best = m if best is None else builder.select(
                    builder.icmp_unsigned(">", m, best), m, best)
            return best

        return sig, codegen

    return absmax


_absmax16, _absmax32 = _vec_absmax(16), _vec_absmax(32)


@njit(cache=True, inline="always")
def _quant(M, out, f, lane, bits, ieee, floor, scope_none, recip, base, k0, k1, el):
    """Fake-quantise one C-contiguous float32 matrix ``M (P, N)`` into ``out`` (may alias M):
    a copy, then :func:`qin` on ``out``."""
    if not (out.ctypes.data == M.ctypes.data):
        o, m = out.reshape(out.size), M.reshape(M.size)
        for i in range(o.size):  # (``out[:, :] = M``: its broadcasting compiled for ~7 s)
            o[i] = m[i]
    qin(out, f, lane, bits, ieee, floor, scope_none, recip, base, k0, k1, el)


def qin(X, f, lane, bits, ieee, floor, scope_none, recip, base, k0, k1, el):
    """Fake-quantise one C-contiguous float32 matrix ``X (P, N)`` in place to the format of
    code ``f`` (:func:`fmt_code`; 0 or below: unchanged), stochastically with ``bits``
    random bits read from ``lane``-bit lanes (:func:`sr_lane`), or RNE if ``lane`` is 0.
    Compiled code only, ``f`` and ``lane`` constants (literal ints): numba compiles
    :func:`_qin_impl` of that format and rounding, nothing of the others."""
    raise NotImplementedError("precsim.engines.numba_jit.quant.qin runs compiled only")


@overload(qin, prefer_literal=True)
def _qin_typed(X, f, lane, bits, ieee, floor, scope_none, recip, base, k0, k1, el):
    if isinstance(f, types.IntegerLiteral) and isinstance(lane, types.IntegerLiteral):
        return _qin_impl(f.literal_value, lane.literal_value)
    return None


@functools.cache
def _qin_impl(F, LANE):
    """:func:`qin` for format code ``F`` and SR lanes of ``LANE`` bits (0: RNE). Element
    formats per element, block formats along the last axis (NVFP4's FP32 scale over the matrix
    unless ``scope_none``; its scales applied as reciprocals if ``recip``, else divided).
    Elements are numbered ``base + p*N + n`` for SR; the random words come in one pass and
    are read back as lanes (little-endian: lane ``j`` of a word is its ``j``-th 8/16-bit
    slot in memory). One array argument: with a second one that may alias it (the former
    ``_quant(M, out)`` body) NVFP4-SR on a 64 x 128 state took 9.5 us, here 5.3 us.
    ``F`` and ``LANE`` are constants of the closure, so numba prunes every other format's
    branches before typing: a run compiles the paths of the formats it uses (one quantiser
    with the format a runtime argument compiled all of them at each lane width, ~45 s of
    the first process of ``experiment=split_nvfp4`` on 2 cores)."""
    # the format's constants, read off formats.ids: its class, a row-scaled format's block
    # (BLK) and element (EF, EFI: an integer), a block format's block (BLKF), element (ef),
    # element max, MX exponent offset (emaxe) and two-level scale (SID: its id; TMX: the
    # per-matrix scale's divisor; SMN: the smallest normal scale)
    FID, BLK = ids.split_code(F)
    CLS = ids.id_class(FID) if F > 0 else ids.NONE
    TWO, ELEM, ROWF = CLS == ids.TWO_LEVEL, CLS in (ids.FLOAT, ids.INT), CLS == ids.ROW
    EF = ids.element_id(FID) if CLS != ids.NONE else 0
    EFI = CLS != ids.NONE and ids.id_class(EF) == ids.INT
    bp = ids.block_params(FID) if CLS in (ids.TWO_LEVEL, ids.MX) else {}
    BLKF, EMX = bp.get("block", 32), bp.get("element_max", 1.0)
    EMAXE, SID = bp.get("emax", 0), bp.get("scale", 0)
    TMX, SMN = bp.get("tensor_max", 1.0), bp.get("scale_min_normal", 0.0)
    SR, LN = LANE > 0, LANE or 8
    UT = {8: np.uint8, 16: np.uint16, 32: np.uint32}[LN]

    def qin(X, f, lane, bits, ieee, floor, scope_none, recip, base, k0, k1, el):
        P, N = X.shape
        if F <= 0:
            return
        x = X.reshape(P * N)
        lanes = 32 // LN
        uoff = base % lanes
        W = np.empty((uoff + P * N + lanes - 1) // lanes if SR else 1, dtype=np.uint32)
        if SR:
            words(W, base // lanes, k0, k1)
        ush = LN - bits
        if ROWF:  # <element>_b<B>: one FP32 scale per B elements
            _scaled(x, BLK, EF, EFI, W.view(UT)[uoff:], ush, SR, bits, el)
            return
        if ELEM and EFI:  # the integers -qmax..qmax
            qmax, sc = np.float32(el[F, 2]), np.float32(2.0 ** bits)
            ints(x, W.view(UT)[uoff:], ush, SR, qmax, ieee, sc)
            return
        if ELEM:
            mb, emin, maxv, ovf, sc = elem_consts(F, bits, ieee, el)
            div = emin - mb < -126
            elements(x, W.view(UT)[uoff:], ush, SR, mb, emin, maxv, ovf, sc, div)
            return
        nb = P * N // BLKF
        ef = EF
        emaxe = EMAXE
        maxe = np.float32(el[ef, 2])
        mb, emin, maxv, ovf, sc = elem_consts(ef, bits, False, el)
        bmx = np.empty(nb, dtype=np.int32)
        if BLKF == 16:
            for g in range(nb):
                bmx[g] = _absmax16(x, g * 16)
        else:
            for g in range(nb):
                bmx[g] = _absmax32(x, g * 32)
        tot = np.empty(nb, dtype=np.float32)
        fac = np.empty(nb, dtype=np.float32)
        if TWO:
            s_t = _F1
            if not scope_none:
                m = bmx[0]
                for g in range(1, nb):  # (bmx.max() compiled for ~1 s)
                    m = np.int32(max(m, bmx[g]))
                s_t = i2f(m) / np.float32(TMX)
                if s_t == 0:
                    s_t = _F1
            r_t = _F1 / s_t
            lo = np.float32(SMN) if floor else _F0
            m4, e4, x4 = np.int64(el[SID, 0]), np.int64(el[SID, 1]), np.float32(el[SID, 2])
            # scope none == a tensor scale of 1: bs / 1, 1 * bs and (1 / 1) / bs are exact
            for g in range(nb):  # branch-free (vectorises); a NaN/Inf block max selects NaN
                bm = bmx[g]
                bs = (i2f(bm) / np.float32(EMX)) / s_t
                bs = x4 if bs > x4 else bs
                bs = lo if bs < lo else bs
                bs = round_v(bs, m4, e4, x4, x4, False, _F0, _F0, False)
                total = s_t * bs
                tot[g] = total if bm < 0x7F800000 else _NAN
                rf = r_t / (bs if bs > 0 else _F1)
                fac[g] = rf if recip else (total if total > 0 else _F1)
        else:
            for g in range(nb):
                bm = bmx[g]
                e = min(max(((bm >> 23) & 0xFF) - 127 - emaxe, -127), 127)
                tot[g] = pow2(e) if bm < 0x7F800000 else _NAN
                fac[g] = _F1 / pow2(e)  # exact: x * 2**-e == x / 2**e, subnormals included
        mul = recip or not TWO
        pmin, imb, tmb = pow2(emin), pow2(-mb), pow2(mb)
        if SR and ush:  # each lane's top ``bits`` bits, the SR integer, before the loop
            shift(W.view(UT), ush)
        for g in range(nb):  # a NaN block: finite factors, the NaN comes from its total
            if not tot[g] == tot[g]:
                fac[g] = _F1
        _blocks(x, fac, tot, mul, W.view(UT)[uoff:], BLKF, SR, pmin, imb, tmb, maxv, maxe,
                sc)

    return qin


@functools.cache
def quantize_many(F, LANE):
    """:func:`quantize`'s compiled loop for format code ``F`` and SR lanes of ``LANE``
    bits: every matrix of ``X (M, P, N)`` float32 (matrix m's elements start at
    ``m*P*N``) quantised into a new array, on one thread (a parallel loop took ~2 s longer
    to compile per format)."""
    TK = table_key()

    @njit(cache=True)
    def many(X, bits, ieee, floor, scope_none, recip, k0, k1, el):
        TK  # noqa: B018 - the format table's fingerprint, in the cache key (mamba2.scheme_task)
        out = np.empty_like(X)
        MP = X.shape[1] * X.shape[2]
        for m in range(X.shape[0]):
            _quant(X[m], out[m], F, LANE, bits, ieee, floor, scope_none, recip, m * MP, k0,
                   k1, el)
        return out

    return many


@njit(cache=True, inline="always")
def store(st, rd, ef, code, key, k0, base, floor, scope_none, recip, el, kind, qfmt, qlane,
          qread, qef):
    """Round a scheme's state after an update or a fold: the master in its format and
    rounding (SR event key ``key``), then a split scheme's read copy from it (RNE). With
    error feedback (``ef`` the residual) first ``X = st + ef``, then ``ef = Q_e(X - Q(X))``
    (RNE), as ``schemes.write_state``. ``kind, qfmt, qlane, qread, qef``: the scheme's
    :func:`.codes.scheme_consts` (constants: only its own branches and formats compile)."""
    if qef >= 0:
        X = st.reshape(st.size)
        E = ef.reshape(ef.size)
        for c in range(X.size):
            X[c] = X[c] + E[c]
            E[c] = X[c]
    qin(st, qfmt, qlane, code[C_BITS], code[C_IEEE] != 0, floor, scope_none, recip, base, k0,
        np.int64(key), el)
    if qef >= 0:
        for c in range(X.size):
            E[c] = E[c] - X[c]
        qin(ef, qef, 0, 0, code[C_IEEE] != 0, floor, scope_none, recip, base, 0, 0, el)
    if kind == 2:
        _quant(st, rd, qread, 0, 0, False, floor, scope_none, recip, base, 0, 0, el)
