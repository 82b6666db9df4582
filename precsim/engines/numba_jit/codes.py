"""A scheme as the compiled code knows it: its code row (:func:`scheme_codes`), the constants its
task is compiled for (:func:`scheme_consts`) and the format table's limits and fingerprint.

Plain Python (no numba): the engine's interface (:mod:`precsim.engines.numba`) reads it with or
without numba installed; the compiled code reads the columns (``C_BITS``, ``C_IEEE``) as
compile-time constants, so this file is part of the compiled code's cache key (:mod:`.cache`).
"""

from __future__ import annotations

import numpy as np

from precsim import formats as pf
from precsim.formats import ids

from ...config import ef_fmt

# formats and scheme kinds as the compiled code knows them: precsim.formats.ids (a format's code,
# ids.fmt_code, is a compile-time constant of a scheme's task, scheme_consts; its limits come in
# as the array limits() at run time)
KINDS = ids.KIND_IDS


def table_key() -> int:
    """``formats.ids.table_key`` as a 48-bit int: a closure constant of every compiled task, so
    numba's on-disk cache (keyed on the compiled code's files and a closure's constants) never
    serves code compiled for another format table."""
    return int(ids.table_key()[:12], 16)


def limits() -> np.ndarray:
    """The element limits the compiled quantisers read (``formats.ids.limits_table``: per format
    id mantissa bits, emin, largest value, Inf, integer)."""
    return ids.limits_table()


# scheme code columns (C_EF: the error-feedback residual's format, -1 without)
C_KIND, C_FMT, C_RND, C_BITS, C_IEEE, C_RFMT, C_EF = range(7)
NCODE = 7


def fmt_code(name: str) -> int:
    """The compiled code's constant for a format: ``formats.ids.fmt_code`` (its id, plus
    ``SCALED_STRIDE`` x the block of a row-scaled ``<element>_b<B>``)."""
    return ids.fmt_code(name)


def scheme_codes(sc) -> np.ndarray:
    """A SchemeConfig as the kernel's int row (kind, fmt, rounding, SR bits, ieee, read fmt,
    error-feedback fmt or -1)."""
    sr = sc.rounding == "sr"
    ef = ef_fmt(sc)
    return np.array([KINDS[sc.kind], fmt_code(sc.fmt), int(sr),
                     pf.sr_bits_used(sc.fmt, sc.sr_bits) if sr else 0,
                     int(sc.overflow == "ieee"),
                     fmt_code(sc.read_fmt) if sc.kind == "split" else 0,
                     fmt_code(ef) if ef else -1], dtype=np.int64)


def sr_lane(bits: int) -> int:
    """The width of the lanes an SR integer of ``bits`` bits is read from (8, 16 or 32)."""
    return 8 if bits <= 8 else (16 if bits <= 16 else 32)


def scheme_consts(code) -> tuple[int, int, int, int, int]:
    """What the compiled task of a scheme takes as constants (a :func:`scheme_codes` row): its
    kind, its format code and SR lane width (:func:`sr_lane`; 0: RNE), its read copy's format
    code (0: none) and its error-feedback residual's (-1: none)."""
    return (int(code[C_KIND]), int(code[C_FMT]),
            sr_lane(int(code[C_BITS])) if code[C_RND] else 0,
            int(code[C_RFMT]) if code[C_KIND] == KINDS["split"] else 0, int(code[C_EF]))
