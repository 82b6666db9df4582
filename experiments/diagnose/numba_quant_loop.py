"""Diagnosis (not a user path): the numba engine's compiled quantiser alone, per format.

A compiled loop copies one of 16 random 64 x 128 float32 states into a work matrix and
quantises it in place (``precsim.engines.numba._qin``, compiled for that format and rounding, as
a scheme task does after each update); the copy is timed alone and subtracted. Prints
microseconds per 64 x 128 state.

    python experiments/diagnose/numba_quant_loop.py [--n 4096]
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np
from numba import njit

from precsim import formats as pf
from precsim.engines import numba as ne

FORMATS = [("nvfp4", "rne"), ("nvfp4", "sr"), ("mxfp4", "sr"), ("fp16", "sr"), ("bf16", "rne"),
           ("bf16", "sr"), ("fp8_e4m3", "rne"), ("int8", "rne"), ("int8_b128", "rne"),
           ("int8_b128", "sr"), ("fp8_e4m3_b128", "rne"), ("fp8_e4m3_b128", "sr")]


@functools.cache
def _loop(f, lane):
    """The loop for format code ``f`` and SR lanes of ``lane`` bits (0: RNE; constants)."""

    @njit
    def loop(pool, work, n, bits, keys, el, quantise):
        for i in range(n):
            work[:, :] = pool[i % pool.shape[0]]
            if quantise:
                ne._qin(work, f, lane, bits, False, False, False, True, 0, 77,
                        np.int64(keys[i]), el)

    return loop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096)
    n = ap.parse_args().n
    rng = np.random.default_rng(0)
    pool = rng.standard_normal((16, 64, 128)).astype(np.float32)
    work = np.empty((64, 128), np.float32)
    keys = rng.integers(0, 2**32, n).astype(np.uint32)

    def timed(f, lane, *a) -> float:
        _loop(f, lane)(pool, work, 1, *a)  # compile
        t = time.perf_counter()
        _loop(f, lane)(pool, work, n, *a)
        return (time.perf_counter() - t) / n * 1e6

    copy = timed(0, 0, 0, keys, ne.limits(), False)
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}  copy alone {copy:.2f} us (subtracted)")
    for fmt, rnd in FORMATS:
        bits = pf.sr_bits_used(fmt) if rnd == "sr" else 0
        us = timed(ne.fmt_code(fmt), ne.sr_lane(bits) if bits else 0, bits, keys, ne.limits(),
                   True) - copy
        print(f"{fmt:15s} {rnd:4s} {us:6.2f} us per 64 x 128")


if __name__ == "__main__":
    main()
