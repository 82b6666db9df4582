"""Number formats: the registry, fake quantization (RNE and stochastic rounding), bit codecs.

A format is one small frozen dataclass in ``REGISTRY``; every generic test runs over all entries.
Element formats (``FloatFormat``) round each value on its own; block formats (``BlockFormat``)
share a scale over ``block`` contiguous elements of the last axis (NVFP4 adds an FP32 scale per
tensor).
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field

import numpy as np

from precsim.errors import PrecsimError

from ._ops import TORCH, ops_for
from .e2m1_table import e2m1_sr_table, e2m1_table_ok
from .rng import SR_SOURCES

ROUNDINGS = ("rne", "sr")
OVERFLOWS = ("satfinite", "ieee")
SCALE_FLOORS = ("subnormal", "normal")
TENSOR_SCOPES = ("matrix", "tensor", "none")
# NVFP4 scale application: multiply by (1/s_tensor)/bs (production quantizers) or divide by
# s_tensor*bs (the textbook formula); see quantize_block
SCALE_MODES = ("reciprocal", "divide")


class FormatError(PrecsimError):
    """Bad format name, rounding mode or option. The message names the key, value and choices."""


class _Format:
    """What every format shares: ``fmt.quantize(x, ...)`` is ``formats.quantize(x, fmt, ...)``."""

    def quantize(self, x, rounding: str = "rne", *, seed: int | None = None, **options):
        return quantize(x, self, rounding, seed=seed, **options)


class _BlockFormat(_Format):
    """A format whose elements share scales: elements of ``element`` (no Inf: a scaled element
    saturates), SR bits as the element's, one ``scale`` per ``block`` elements (and with
    ``two_level`` an FP32 scale per tensor, which replaces the block scale's range)."""

    kind = "block"
    has_inf = False

    @property
    def bits(self) -> int:
        return self.element.bits

    @property
    def bits_per_element(self) -> float:
        return self.element.bits + self.scale.bits / self.block

    @property
    def tensor_overhead_bits(self) -> int:
        return 32 if self.two_level else 0

    @property
    def max_value(self) -> float:
        return self.element.max_value * (1.0 if self.two_level else self.scale.max_value)

    @property
    def default_sr_bits(self) -> int:
        return self.element.default_sr_bits


class _ElementFormat(_Format):
    """An element format: no scales, so its storage is its own bits."""

    @property
    def bits_per_element(self) -> float:
        """Storage cost in bits per element, scales included (none for element formats)."""
        return float(self.bits)

    @property
    def tensor_overhead_bits(self) -> int:
        return 0


@dataclass(frozen=True)
class FloatFormat(_ElementFormat):
    """A binary floating-point element format (sign, ``ebits`` exponent, ``mbits`` mantissa)."""

    name: str
    ebits: int
    mbits: int
    bias: int
    max_value: float
    has_inf: bool
    has_nan: bool
    signed: bool = True
    has_zero: bool = True
    default_sr_bits: int = 0  # 0 = exact SR (as many random bits as the input drops)
    nan_note: str = ""
    description: str = ""
    kind = "float"

    @property
    def bits(self) -> int:
        return int(self.signed) + self.ebits + self.mbits

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number (e8m0 has no subnormals: code 0 is 2^-127)."""
        return 1 - self.bias if self.has_zero else -self.bias

    @property
    def min_normal(self) -> float:
        return math.ldexp(1.0, self.emin)

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value (the smallest normal where the format has no subnormals)."""
        if self.mbits == 0:
            return self.min_normal
        return math.ldexp(1.0, self.emin - self.mbits)

    def sr_bits_for(self, x_dtype_bits: int) -> int:
        """Random bits used by SR: the default, or exact (bits the input mantissa drops)."""
        if self.default_sr_bits:
            return self.default_sr_bits
        return max(1, min(32, x_dtype_bits - self.mbits))

    # --- bit codecs (formats of at most 8 bits; used by exhaustive tests and docs) ---
    def decode(self, codes) -> np.ndarray:
        """Bit patterns (ints) → float64 values."""
        b = np.asarray(codes, dtype=np.int64)
        m_mask = (1 << self.mbits) - 1
        e_mask = (1 << self.ebits) - 1
        sign = ((b >> (self.ebits + self.mbits)) & 1) if self.signed else np.zeros_like(b)
        e = (b >> self.mbits) & e_mask
        m = (b & m_mask).astype(np.float64)
        if self.mbits == 0 and not self.has_zero:  # e8m0: pure power of two
            val = np.ldexp(1.0, (e - self.bias).astype(np.int32))
        else:
            sub = np.ldexp(m, (np.full_like(e, self.emin - self.mbits)).astype(np.int32))
            nrm = np.ldexp(1.0 + m / (1 << self.mbits), (e - self.bias).astype(np.int32))
            val = np.where(e == 0, sub, nrm)
        if self.has_inf:
            val = np.where((e == e_mask) & (m == 0), np.inf, val)
            val = np.where((e == e_mask) & (m != 0), np.nan, val)
        elif self.has_nan:
            nan_pat = (e == e_mask) & ((b & m_mask) == m_mask) if self.mbits else (e == e_mask)
            val = np.where(nan_pat, np.nan, val)
        return np.where(sign == 1, -val, val)

    def encode(self, values) -> np.ndarray:
        """Representable float values → bit patterns (NaN → the canonical NaN pattern)."""
        v = np.asarray(values, dtype=np.float64)
        sign = np.signbit(v).astype(np.int64) if self.signed else np.zeros(v.shape, np.int64)
        a = np.abs(v)
        e_mask = (1 << self.ebits) - 1
        fin = np.isfinite(a) & (a > 0)  # Inf/NaN/0 get their codes below; keep them out of log2
        E = np.floor(np.log2(np.where(fin, a, 1.0))).astype(np.int64)
        is_sub = (a < self.min_normal) & bool(self.has_zero)
        e_field = np.where(is_sub, 0, E + self.bias)
        af = np.where(fin, a, 0.0)
        frac = np.where(is_sub, af / math.ldexp(1.0, self.emin - self.mbits),
                        (af / np.ldexp(1.0, E.astype(np.int32)) - 1.0) * (1 << self.mbits))
        m_field = np.rint(np.nan_to_num(frac)).astype(np.int64)
        code = (e_field << self.mbits) | m_field
        if self.has_inf:
            code = np.where(np.isinf(a), e_mask << self.mbits, code)
        if self.has_nan:
            nan_code = (e_mask << self.mbits) | ((1 << self.mbits) - 1)
            code = np.where(np.isnan(a), nan_code, code)
        if self.signed:
            code = code | (sign << (self.ebits + self.mbits))
        return code


@dataclass(frozen=True)
class BlockFormat(_BlockFormat):
    """Elements of ``element`` sharing one ``scale`` per ``block`` contiguous elements (last axis).

    ``two_level`` adds one FP32 scale per tensor (NVFP4): ``amax / (element.max * scale.max)``.
    """

    name: str
    element: FloatFormat
    scale: FloatFormat
    block: int
    two_level: bool
    description: str = ""
    options: tuple = field(default=("scale_floor", "tensor_scope", "scale_mode"))

    @property
    def has_nan(self) -> bool:
        return self.element.has_nan


@dataclass(frozen=True)
class IntFormat(_ElementFormat):
    """A symmetric saturating integer element format: the integers ``-qmax .. qmax`` (step 1;
    ``int8`` has no -128, as serving engines' KV-cache quantizers). Beyond ±qmax: saturate, or
    NaN with ``overflow="ieee"`` (no Inf). SR draws ``min(32, carrier significand bits)`` random
    bits by default (24 for float32, 32 for float64)."""

    name: str
    qmax: int
    bits: int
    description: str = ""
    default_sr_bits: int = 0
    has_inf = False
    has_nan = False
    signed = True
    has_zero = True
    kind = "int"

    @property
    def max_value(self) -> float:
        return float(self.qmax)

    @property
    def min_subnormal(self) -> float:
        return 1.0

    def sr_bits_for(self, x_dtype_bits: int) -> int:
        if self.default_sr_bits:
            return self.default_sr_bits
        return min(32, x_dtype_bits)


@dataclass(frozen=True)
class ScaledFormat(_BlockFormat):
    """``<element>_b<B>``: one FP32 scale per ``block`` contiguous elements of the last axis.

    Scale arithmetic (float32, deterministic, in this order): ``bmax = float32(max |x| over the
    block)``; ``scale = bmax / element.max_value`` (one correctly rounded float32 division, stored
    as FP32); elements ``q = round(clamp(x / scale, ±element.max_value))`` (the division in x's
    dtype, the scale widened exactly); output ``q · scale``, so the block's largest value comes
    back as ``element_max · scale`` (within an ulp of float32). An all-zero block (also a scale
    that underflows to 0) comes out as signed zeros; a block holding NaN or Inf is NaN.
    """

    name: str
    element: object
    block: int
    description: str = ""
    two_level = False
    options = ()
    has_nan = True

    @property
    def scale(self) -> FloatFormat:
        return FP32


@dataclass(frozen=True)
class IdentityFormat(_Format):
    """fp64: the carrier itself (no rounding)."""

    name: str = "fp64"
    description: str = "IEEE binary64; identity (the ground truth's precision)"

    kind = "identity"
    bits = 64
    bits_per_element = 64.0
    tensor_overhead_bits = 0
    max_value = float(np.finfo(np.float64).max)
    has_inf = True
    has_nan = True
    default_sr_bits = 0


def _ff(name, e, m, bias, maxv, inf, nan, **kw) -> FloatFormat:
    return FloatFormat(name, e, m, bias, float(maxv), inf, nan, **kw)


FP32 = _ff("fp32", 8, 23, 127, np.finfo(np.float32).max, True, True,
           description="IEEE binary32")
FP16 = _ff("fp16", 5, 10, 15, 65504.0, True, True, description="IEEE binary16")
BF16 = _ff("bf16", 8, 7, 127, float(np.float32(3.3895313892515355e38)), True, True,
           description="bfloat16 (binary32 with a 7-bit mantissa)")
FP8_E4M3 = _ff("fp8_e4m3", 4, 3, 7, 448.0, False, True,
               description="OCP E4M3FN: no Inf, NaN = S.1111.111")
FP8_E5M2 = _ff("fp8_e5m2", 5, 2, 15, 57344.0, True, True, description="OCP E5M2")
FP4_E2M1 = _ff("fp4_e2m1", 2, 1, 1, 6.0, False, False, default_sr_bits=8,
               nan_note="no NaN encoding: NaN passes through the float carrier",
               description="OCP E2M1: ±{0, .5, 1, 1.5, 2, 3, 4, 6}")
E8M0 = FloatFormat("e8m0", 8, 0, 127, math.ldexp(1.0, 127), False, True, signed=False,
                   has_zero=False, description="MX scale: 2^(k-127), k=255 is NaN")

NVFP4 = BlockFormat("nvfp4", FP4_E2M1, FP8_E4M3, 16, True,
                    description="E2M1 elements, E4M3 scale per 16, FP32 scale per tensor")
MXFP4 = BlockFormat("mxfp4", FP4_E2M1, E8M0, 32, False, options=(),
                    description="OCP MX: E2M1 elements, E8M0 scale per 32")
MXFP8 = BlockFormat("mxfp8", FP8_E4M3, E8M0, 32, False, options=(),
                    description="OCP MX: E4M3 elements, E8M0 scale per 32")

INT8 = IntFormat("int8", 127, 8, description="symmetric int8: integers -127..127")
INT16 = IntFormat("int16", 32767, 16, description="symmetric int16: integers -32767..32767")

REGISTRY: dict[str, object] = {
    f.name: f
    for f in (IdentityFormat(), FP32, BF16, FP16, FP8_E4M3, FP8_E5M2, FP4_E2M1, E8M0,
              NVFP4, MXFP4, MXFP8, INT8, INT16)
}
ALIASES = {"e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2", "e2m1": "fp4_e2m1", "fp8": "fp8_e4m3",
           "float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64"}


def names() -> list[str]:
    return list(REGISTRY)


def register(fmt):
    """Add a format object to :data:`REGISTRY` under its (new, lower-case) name and return it:
    what a new format takes (docs/design.md, "Adding a format"). Every generic test runs over
    the registry, and the kernels' ids and limits (``formats.ids``) are read off it."""
    if not isinstance(fmt, _Format):
        raise FormatError(f"register: expected a format object, got {fmt!r}")
    name = fmt.name
    if name != name.lower() or name in REGISTRY or name in ALIASES or _scaled(name, name):
        raise FormatError(f"register: format name {name!r} is taken or not a plain lower-case "
                          f"name; known: {', '.join(REGISTRY)}")
    REGISTRY[name] = fmt
    return fmt


_SCALED: dict[str, ScaledFormat] = {}


def _row_scalable(el) -> bool:
    """Whether ``el`` can be the element of a row-scaled format: an integer or float format
    whose largest value keeps the FP32 scale ``amax / max`` normal for any row above ~1e-30
    (not e8m0, a scale format itself; not bf16 or fp32, whose max is ~3.4e38)."""
    return el.kind in ("float", "int") and el.name != "e8m0" and el.max_value < 2.0**64


def _scaled(name: str, key: str):
    """``<element>_b<B>`` → a cached :class:`ScaledFormat`; None if ``key`` is not of that form."""
    head, sep, tail = key.rpartition("_b")
    if not sep or not tail.isdigit():
        return None
    el_key = ALIASES.get(head, head)
    el = REGISTRY.get(el_key)
    if el is None or not _row_scalable(el):
        allowed = [n for n, f in REGISTRY.items() if _row_scalable(f)]
        why = (f" (its row scale amax/{el.max_value:.4g} would be a subnormal FP32 for rows "
               f"below ~4 and 0 below ~2.4e-7: the element's own exponent covers the range)"
               if el is not None and el.kind == "float" and el.name != "e8m0" else "")
        raise FormatError(f"format={name!r}: element format {head!r} cannot carry a row "
                          f"scale{why}; allowed: {', '.join(allowed)} (then _b<block size>)")
    block = int(tail)
    if block < 1 or tail != str(block):
        raise FormatError(f"format={name!r}: block size {tail!r} is invalid; allowed: an "
                          f"integer >= 1 without leading zeros (e.g. int8_b128)")
    key = f"{el.name}_b{block}"
    if key not in _SCALED:
        _SCALED[key] = ScaledFormat(key, el, block, description=(
            f"{el.name} elements, one FP32 scale (amax/{el.max_value:g}) per {block}"))
    return _SCALED[key]


def get(name):
    """The format object registered under ``name`` (a format object passes through).

    Besides the registry, ``<element>_b<B>`` names a row-scaled format (:class:`ScaledFormat`):
    any element format of the registry (``int8``, ``int16``, ``fp8_e4m3``, ``fp16``, ...) with
    one FP32 scale per ``B`` contiguous elements of the last axis.
    """
    if not isinstance(name, str):
        if isinstance(name, _Format):
            return name
        raise FormatError(f"format: expected a name, got {name!r}; known: {', '.join(REGISTRY)}")
    key = ALIASES.get(name.lower(), name.lower())
    if key in REGISTRY:
        return REGISTRY[key]
    fmt = _scaled(name, key)
    if fmt is None:
        raise FormatError(f"format={name!r} is unknown; known formats: {', '.join(REGISTRY)}, "
                          f"or <element>_b<block> (e.g. int8_b128)")
    return fmt


# ----------------------------------------------------------------------------------------------
# rounding

_COMMON_OPTIONS = ("stream", "offset", "sr_bits", "overflow", "sr_source", "rotate")
_CHOICES = {"overflow": OVERFLOWS, "scale_floor": SCALE_FLOORS, "tensor_scope": TENSOR_SCOPES,
            "sr_source": SR_SOURCES, "scale_mode": SCALE_MODES}


def _check_options(fmt, rounding, options):
    if rounding not in ROUNDINGS:
        raise FormatError(f"rounding={rounding!r} is unknown; allowed: {', '.join(ROUNDINGS)}")
    allowed = set(_COMMON_OPTIONS) | set(getattr(fmt, "options", ()))
    for k in options:
        if k not in allowed:
            raise FormatError(
                f"option {k!r} is not accepted by format {fmt.name!r}; allowed: "
                f"{', '.join(sorted(allowed))}")
    for k, choices in _CHOICES.items():  # the defaults are valid: check what is given
        if k in options and options[k] not in choices:
            raise FormatError(f"{k}={options[k]!r} is unknown; allowed: {', '.join(choices)}")
    rot = options.get("rotate", False)
    if not isinstance(rot, (bool, np.bool_)):
        raise FormatError(f"rotate={rot!r} is invalid; allowed: true, false")
    sb = options.get("sr_bits")
    if sb is not None and not (isinstance(sb, (int, np.integer)) and 1 <= sb <= 32):
        raise FormatError(f"sr_bits={sb!r} is out of range; allowed: an integer 1..32")


def accepted_options(fmt) -> set:
    """Names of the options ``quantize`` accepts for ``fmt`` (common ones and the format's)."""
    return set(_COMMON_OPTIONS) | set(getattr(get(fmt), "options", ()))


def _dtype_bits(x) -> int:
    """Mantissa bits (with the hidden bit) of the input carrier: 24 for float32, 53 for float64."""
    name = str(x.dtype)
    if "float64" in name:
        return 53
    if "float32" in name:
        return 24
    raise FormatError(f"x.dtype={name} is not supported; allowed: float32, float64")


def _round_to_int(y, x, fmt, rounding, ops, seed, stream, offset, sr_bits, sr_source):
    """``y >= 0`` (x's shape) to an integer: RNE, or SR keyed by x's element counters that rounds
    up with probability floor(frac · 2^bits) / 2^bits (hardware SR with ``bits`` bits)."""
    if rounding == "rne":
        return ops.rint(y)
    lo = ops.floor(y)
    bits = int(sr_bits or fmt.sr_bits_for(_dtype_bits(x)))
    thr = ops.floor((y - lo) * float(2**bits))
    u = ops.random_u(tuple(x.shape), bits, seed, stream, offset, x, sr_source)
    return lo + (u < thr)


def round_float(x, fmt: FloatFormat, rounding: str, ops, *, seed, stream=0, offset=0,
                sr_bits=None, overflow="satfinite", sr_source="hash"):
    """Round every element of ``x`` to ``fmt`` (result in x's dtype). SR keyed by counters."""
    ax = ops.abs(x)
    e = ops.maximum(ops.exponent(ax), fmt.emin)  # below the normal range the quantum is fixed
    q = ops.pow2(e - fmt.mbits, ax)  # spacing of representable values around |x|
    y = ax / q  # exact: division by a power of two
    r = _round_to_int(y, x, fmt, rounding, ops, seed, stream, offset, sr_bits, sr_source)
    out = r * q
    if not fmt.has_zero:  # e8m0: no zero; below 2^-127 clamps up, 0 and negatives are NaN
        out = ops.maximum(out, fmt.min_normal)
        out = ops.where(x > 0, out, ops.full_like(out, math.nan))
    over = out > fmt.max_value
    if overflow == "ieee":
        out = ops.where(over, ops.full_like(out, math.inf if fmt.has_inf else math.nan), out)
    else:
        out = ops.where(over, ops.full_like(out, fmt.max_value), out)
    if fmt.signed:
        out = ops.copysign(out, x)
    return out


_TORCH_FAST = {"fp16": "float16", "bf16": "bfloat16", "fp8_e4m3": "float8_e4m3fn",
               "fp8_e5m2": "float8_e5m2"}


def _torch_fast_rne(x, fmt):
    """RNE of a float32 tensor through torch's own cast (bit-identical; tests check)."""
    import torch

    dt = getattr(torch, _TORCH_FAST[fmt.name])
    return x.clamp(-fmt.max_value, fmt.max_value).to(dt).to(x.dtype)


def _fast_ok(x, fmt, rounding, ops, overflow) -> bool:
    return (ops is TORCH and rounding == "rne" and overflow == "satfinite"
            and fmt.name in _TORCH_FAST and str(x.dtype) == "torch.float32")


def _round_float_t32(x, fmt: FloatFormat, rounding: str, *, seed, stream=0, offset=0,
                     sr_bits=None, overflow="satfinite", sr_source="hash"):
    """:func:`round_float` for float32 torch tensors in fewer ops (exponent arithmetic on bits).

    Every step is exact, so results are bit-identical to the generic path (tests check).
    Needs quanta that are normal float32 numbers: ``emin - mbits >= -126`` (not bf16).
    """
    import torch

    ax = x.abs()
    e = (ax.view(torch.int32) >> 23).clamp_(min=fmt.emin + 127, max=254)  # biased exponent
    q = ((e - fmt.mbits) << 23).view(torch.float32)  # spacing of the grid around |x|
    y = ax / q
    if rounding == "rne":
        r = torch.round(y)
    else:
        bits = int(sr_bits or fmt.sr_bits_for(24))
        y = y.clamp_(max=float(2 ** (fmt.mbits + 2)))  # Inf -> a finite overflow (NaN stays)
        lo = y.floor()
        thr = ((y - lo) * float(2**bits)).floor_()
        u = TORCH.random_u(tuple(x.shape), bits, seed, stream, offset, x, sr_source)
        r = lo.add_((thr - u).clamp_(0.0, 1.0))  # +1 iff u < thr (integers: exact, no bools)
    out = r.mul_(q)
    if overflow == "ieee":
        out = torch.where(out > fmt.max_value, math.inf if fmt.has_inf else math.nan, out)
    else:
        out = out.clamp_(max=fmt.max_value)
    return torch.copysign(out, x)


def round_int(x, fmt: IntFormat, rounding: str, ops, *, seed, stream=0, offset=0, sr_bits=None,
              overflow="satfinite", sr_source="hash"):
    """Round every element of ``x`` to the integers ``-qmax..qmax`` (result in x's dtype).

    RNE: ties to even; SR with ``r`` bits: up iff ``u < floor(frac · 2^r)`` as in
    :func:`round_float`. Beyond ±qmax: saturate, or NaN with ``overflow="ieee"``.
    """
    ax = ops.abs(x)
    # satfinite clamps first (NaN stays NaN); "ieee" rounds |x| as is and flags results > qmax
    y = ops.minimum(ax, fmt.max_value) if overflow != "ieee" else ax
    r = _round_to_int(y, x, fmt, rounding, ops, seed, stream, offset, sr_bits, sr_source)
    if overflow == "ieee":
        r = ops.where(r > fmt.max_value, ops.full_like(r, math.nan), r)
    return ops.copysign(r, x)


def round_elements(x, fmt, rounding, ops, **kw):
    if fmt.kind == "int":
        return round_int(x, fmt, rounding, ops, **kw)
    if _fast_ok(x, fmt, rounding, ops, kw.get("overflow", "satfinite")):
        return _torch_fast_rne(x, fmt)
    if (ops is TORCH and str(x.dtype) == "torch.float32" and fmt.has_zero and fmt.signed
            and fmt.emin - fmt.mbits >= -126):
        return _round_float_t32(x, fmt, rounding, **kw)
    return round_float(x, fmt, rounding, ops, **kw)


def _f32(ops, a):
    return a.float() if ops is TORCH else a.astype(np.float32)


def _like(ops, a, x):
    return a.to(x.dtype) if ops is TORCH else a.astype(x.dtype)


def quantize_block(x, fmt: BlockFormat, rounding, ops, *, seed, stream=0, offset=0,
                   sr_bits=None, overflow="satfinite", scale_floor="subnormal",
                   tensor_scope="matrix", scale_mode="reciprocal", sr_source="hash"):
    """Fake-quantize along the last axis in blocks of ``fmt.block``. Scales are deterministic.

    NVFP4's ``scale_mode`` (docs/formats.md): ``"reciprocal"`` (default) multiplies
    the elements by ``r = (1/s_tensor) / bs`` (float32, each step correctly rounded; ``1/bs``
    without a tensor scale) as production quantizers do; ``"divide"`` computes ``x / (s_tensor ·
    bs)``. The two differ by one E2M1 step near rounding midpoints.
    """
    shape = tuple(x.shape)
    if len(shape) == 0 or shape[-1] % fmt.block:
        raise FormatError(
            f"{fmt.name}: last axis (shape {shape}) must be a multiple of the block size "
            f"{fmt.block}")
    xb = x.reshape(*shape[:-1], shape[-1] // fmt.block, fmt.block)
    amax = ops.block_absmax(xb)  # (..., nblocks, 1), in x's dtype
    bmax = _f32(ops, amax)  # float32: NVFP4's scale arithmetic
    el, sc = fmt.element, fmt.scale
    rne = dict(seed=0, overflow="satfinite")
    inv = None  # NVFP4 reciprocal mode: the factor the elements are multiplied by
    if isinstance(fmt, ScaledFormat):  # one FP32 scale per block, not rounded further
        total = ops.div_const(bmax, el.max_value)
    elif fmt.two_level:
        if tensor_scope == "none":
            s_t = None
        else:
            axes = tuple(range(bmax.ndim)) if tensor_scope == "tensor" else (-3, -2)
            if bmax.ndim < 3:  # a 1-D input is one row: its matrix is itself
                axes = tuple(range(bmax.ndim))
            tmax = bmax
            for ax in sorted(axes, key=lambda a: a % bmax.ndim, reverse=True):
                tmax = ops.amax(tmax, ax)
            s_t = ops.div_const(tmax, el.max_value * sc.max_value)
            s_t = ops.where(s_t == 0, ops.full_like(s_t, 1.0), s_t)  # all-zero scope
        bs = ops.div_const(bmax, el.max_value)
        if s_t is not None:
            bs = bs / s_t
        bs = ops.minimum(bs, sc.max_value)
        if scale_floor == "normal":  # torchao's nvfp4_quantize clamps to the smallest normal
            bs = ops.maximum(bs, sc.min_normal)
        bs = round_elements(bs, sc, "rne", ops, **rne)
        total = bs if s_t is None else s_t * bs
        if scale_mode == "reciprocal":
            bs_safe = ops.where(bs > 0, bs, ops.full_like(bs, 1.0))
            inv = ops.recip(bs_safe) if s_t is None else ops.recip(s_t) / bs_safe
            inv = _like(ops, inv, x)
    else:
        # OCP MX: shared exponent floor(log2 amax) - emax(element); E8M0 keeps it exactly.
        # From x's own amax: a float32 copy of a float64 amax can round up to the next power
        # of two (doubling the scale) or overflow to inf (a finite block would come out NaN).
        bmax = amax
        e = ops.exponent(amax) - (int(el.max_value).bit_length() - 1)
        e = ops.minimum(ops.maximum(e, -127), 127)
        total = ops.pow2(e, amax)
    total = ops.where((bmax - bmax) == 0, total, ops.full_like(total, math.nan))
    total = _like(ops, total, x)
    safe = ops.where(total > 0, total, ops.full_like(total, 1.0))
    xs = xb / safe if inv is None else xb * inv
    if e2m1_table_ok(xb, el, rounding, ops, sr_bits):
        qe = e2m1_sr_table(xs, seed=seed, stream=stream, offset=offset, sr_source=sr_source)
    else:
        scaled = ops.clip(xs, el.max_value)
        qe = round_elements(scaled, el, rounding, ops, seed=seed, stream=stream, offset=offset,
                            sr_bits=sr_bits, overflow="satfinite", sr_source=sr_source)
    # a zero scale flushes its block to (signed) zero; a NaN scale (NaN/Inf anywhere in the
    # scale's scope) makes the block NaN: both fall out of the product
    out = qe * total
    return out.reshape(shape)


def sr_bits_used(fmt, sr_bits: int | None = None, carrier_bits: int = 24) -> int:
    """The random bits an SR rounding to ``fmt`` draws on a carrier of ``carrier_bits``
    significand bits (float32: 24): ``sr_bits`` when given, else the element format's default;
    0 where nothing is rounded (fp32 on a float32 carrier, the identity). What ``quantize`` uses
    and what the fused kernels are told."""
    f = get(fmt)
    if f.kind == "identity" or (f.kind == "float" and f.name == "fp32"):
        return 0
    el = f.element if f.kind == "block" else f
    return int(sr_bits or el.sr_bits_for(carrier_bits))


def quantize(x, fmt="fp32", rounding: str = "rne", *, seed: int | None = None, **options):
    """Fake-quantize ``x`` to ``fmt`` and return it in x's own type, shape and dtype.

    Args:
        x: ``numpy.ndarray`` or ``torch.Tensor`` (CPU or CUDA), float32 or float64, any shape.
            Block formats scale blocks along the last axis, which must divide by the block size.
        fmt: a format name (``precsim.formats.names()``) or a format object.
        rounding: ``"rne"`` (round to nearest, ties to even) or ``"sr"`` (stochastic).
        seed: SR key (64-bit). ``None`` draws a fresh one (not reproducible).
        **options: ``stream`` (SR stream id), ``offset`` (element index of x's first element, so
            chunked calls reproduce an unchunked one), ``sr_bits`` (1..32), ``overflow``
            (``"satfinite"`` or ``"ieee"``), ``sr_source`` (SR random bits: ``"hash"``, the
            default, or ``"philox5"`` / ``"philox7"`` / ``"philox10"``, see ``formats.rng``);
            NVFP4 also ``scale_floor`` (``"subnormal"`` or
            ``"normal"``), ``tensor_scope`` (``"matrix"``: last two axes, ``"tensor"``: all,
            ``"none"``: block scales only) and ``scale_mode`` (``"reciprocal"``, the default:
            multiply by ``(1/s_tensor)/bs`` as production quantizers do; ``"divide"``).
            ``rotate=True`` (any format): randomized Hadamard rotation of the last axis (a power
            of two) before quantising, inverted after (``formats.hadamard``).

    Example:
        >>> import numpy as np, precsim.formats as pf
        >>> pf.quantize(np.array([1.3, 7.0], np.float32), "fp4_e2m1").tolist()
        [1.5, 6.0]
    """
    fmt = get(fmt)
    _check_options(fmt, rounding, options)
    ops = ops_for(x)
    _dtype_bits(x)
    if options.pop("rotate", False):
        from .hadamard import RotateError, rotate

        try:
            xr = rotate(x)
        except RotateError as e:
            raise FormatError(f"format={fmt.name!r} with rotate=true: {e}") from None
        return rotate(quantize(xr, fmt, rounding, seed=seed, **options), inverse=True)
    if rounding == "sr" and seed is None:
        seed = secrets.randbits(63)
    seed = 0 if seed is None else int(seed)
    if fmt.kind == "identity" or (fmt.name == "fp32" and "float32" in str(x.dtype)):
        return x.copy() if ops is not TORCH else x.clone()
    with np.errstate(all="ignore"):  # NaN/Inf are handled explicitly, never warned about
        if fmt.kind in ("float", "int"):
            return round_elements(x, fmt, rounding, ops, seed=seed, **options)
        return quantize_block(x, fmt, rounding, ops, seed=seed, **options)
