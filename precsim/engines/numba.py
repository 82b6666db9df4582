"""The fused CPU engine (``run.engine=numba``): the Triton engine's structure, compiled by numba.

The horizon is cut into *windows* that end at the first flush at or after each metrics window end
(the ReplaySSM buffers start empty in every window; state drift is sampled where the torch engine
samples it). Per window the host draws the inputs (``make_workload(cfg).chunk``) and computes, with
the torch engine's own float32 operations, everything that depends on the inputs only: the decays
``exp(dt A)``, the ReplaySSM decay matrices of each segment, the buffer's part of every output
(``sum_j w_j(t) (C_t . B_j) x_j``) and of every fold (``sum_j w_j x_j B_j^T``). Compiled tasks,
one per (head, slot) — slot 0 the float64 truth, then one per scheme — keep their state copies in
cache for the whole window and, per step, apply the update, the quantisation (RNE and SR,
bit-equal to :func:`precsim.formats.quantize`, same counter-based random bits) and the output in
one pass. Gated DeltaNet: a ReplaySSM output depends on the checkpoint through ``u_t``, so the
host draws only the segments' input-only matrices (``numba_host._gdn_terms``) and each task
evaluates ``u_t``, the output and the fold itself (:mod:`.numba_jit.gdn`), its reductions in the
torch engine's fixed order, so its states and outputs are the torch engine's bit for bit. The
metrics are the torch engine's (:class:`precsim.metrics.Accumulator`), fed once per window with
rows a compiled pass reduced (rel_err, the readout's normalised inputs).

Threads (``run.threads``, docs/performance.md): with n > 1, n - 1 worker threads
take the window's tasks (nogil calls) while the host prepares the next window and reduces the
last one's metrics, then takes tasks too; results are the same bit for bit at any n.
:func:`supports` names what is not covered (the torch engine runs it then).

Compilation: a scheme's kind and formats are constants of its compiled task
(:func:`task_function`, one per :func:`scheme_consts`), so a run compiles the branches and
quantisers of its own schemes only, and numba caches each on disk for the next run. The compiled
code is the package :mod:`precsim.engines.numba_jit` (rounding, quantisers, the Mamba-2 and GDN
tasks, the row statistics), cached under a key of all its files (:mod:`.numba_jit.cache`: numba
alone keys a function on its own file only). This module is its interface (plain Python: what
the engine covers, the tasks by scheme, the quantiser) and :mod:`precsim.engines.numba_host` the
host driver (windows, inputs, threads, metrics, checkpoints: ``run``); a change to either, or a
new release that leaves the compiled code as it is, keeps the compiled code.
"""

from __future__ import annotations

import numpy as np

from precsim import formats as pf
from precsim.formats import ids
from precsim.formats.rng import event_keys  # noqa: F401 - re-exported (the host, tests)

from ..config import Config
from ..families import FAMILIES
from .numba_jit.codes import (  # noqa: F401 - re-exported (the host, tests)
    C_EF,
    C_FMT,
    C_KIND,
    C_RND,
    KINDS,
    NCODE,
    fmt_code,
    limits,
    scheme_codes,
    scheme_consts,
    sr_lane,
    table_key,
)

NAME = "numba"

try:  # numba is optional (extra ``cpu``)
    import numba
except ImportError:  # exercised where numba is missing (tests/engines/test_engine_numba.py)
    numba = None
    row_stats = None  # the host module imports it; available() says the engine cannot run
    JIT: dict = {}

if numba is not None:
    from .numba_jit import gdn as jit_gdn
    from .numba_jit import mamba2 as jit_mamba2
    from .numba_jit.quant import qin, quantize_many
    from .numba_jit.stats import row_stats

    _qin = qin  # its former name here (experiments/bench/diagnose/numba_quant_loop.py)
    JIT = {"mamba2": jit_mamba2, "gdn": jit_gdn}  # the compiled tasks by a family's KERNEL


def available() -> bool:
    """True when numba is importable."""
    return numba is not None


def supports(cfg: Config, device: str = "cpu") -> str | None:
    """None if the numba engine runs ``cfg``, else a one-line reason (run the torch engine)."""
    if numba is None:
        return "numba is not installed (pip install 'precsim[cpu]')"
    fam = FAMILIES.get(cfg.model.family)
    if fam is None or fam.KERNEL not in JIT:
        return (f"model.family={cfg.model.family} (the numba engine covers "
                f"{' and '.join(JIT)})")
    if fam.DELTA_RULE and cfg.replay.buffer_dtype not in ("fp32", "fp64"):
        return (f"replay.buffer_dtype={cfg.replay.buffer_dtype} with {cfg.model.family} (the "
                "numba engine keeps a delta-rule buffer in fp32)")
    if cfg.formats.sr_source != "hash":
        return f"formats.sr_source={cfg.formats.sr_source} (the numba engine draws hash bits)"
    if cfg.formats.rotate:
        return "formats.rotate=true (Hadamard rotation)"
    if cfg.run.compute_dtype != "fp32":
        return f"run.compute_dtype={cfg.run.compute_dtype} (the numba engine computes in fp32)"
    for name, s in cfg.schemes.items():
        for fo in (pf.get(f) for f in (s.fmt, s.read_fmt) if f is not None):
            base = fo.element if isinstance(fo, pf.ScaledFormat) else fo
            if not ids.covered(base.name):
                return f"schemes.{name}: format {fo.name} is not covered by the numba engine"
            if fo.kind == "block":
                if fo.two_level and cfg.formats.tensor_scope == "tensor":
                    return ("formats.tensor_scope=tensor (an NVFP4 scale over the whole layer "
                            "couples heads)")
                if cfg.model.state_dim % fo.block:
                    return f"state_dim={cfg.model.state_dim} is not a multiple of {fo.block}"
    return None


def task_function(kernel: str | None, consts: tuple[int, ...] | None):
    """The compiled task of the float64 truth (``consts`` None) or of a scheme of
    :func:`scheme_consts` ``consts``, of the family whose ``KERNEL`` is ``kernel`` (:data:`JIT`);
    ``kernel`` None: the window's row statistics (``row_stats``)."""
    if kernel is None:
        return row_stats
    if consts is None:
        return JIT[kernel].truth_task
    return JIT[kernel].scheme_task(tuple(consts))


def row_stats_signature() -> tuple:
    """The argument types the host calls ``row_stats`` with (C-contiguous arrays, an int, a
    bool)."""
    f32, f64 = np.float32, np.float64
    return tuple(numba.typeof(np.zeros((0,) * nd, dt) if nd else dt) for nd, dt in (
        (3, f32), (2, f64), (2, f64), (2, f32), (1, f64), (1, f32), (0, 0), (0, True), (2, f64),
        (2, f64), (3, f32), (2, f64)))


def compile_tasks() -> None:
    """A helper process's work (:func:`precsim.engines.numba_host.compile_ahead`): compile the
    functions read from stdin (a pickled list of :func:`task_function`'s ``(kernel, consts)``
    and a signature) into numba's cache."""
    import pickle
    import sys

    for kernel, consts, sig in pickle.load(sys.stdin.buffer):
        task_function(kernel, consts).compile(sig)


def task_order(codes: np.ndarray, heads: int) -> np.ndarray:
    """The windows' tasks (head, slot) costliest first (a thread that takes the last task then
    waits the least): slots by a static estimate (block formats, then SR, then quantising every
    step), heads in order within a slot."""
    cost = [0] + [2 * ids.is_block(ids.split_code(c[C_FMT])[0])
                  + (c[C_RND] != 0) + (c[C_KIND] == KINDS["conventional"]) for c in codes]
    nt = len(cost)
    slots = sorted(range(nt), key=lambda s: -cost[s])
    return np.array([sh * nt + s for s in slots for sh in range(heads)], dtype=np.int64)


def quantize(x: np.ndarray, fmt: str, rounding: str = "rne", *, seed: int = 0, stream: int = 0,
             sr_bits: int | None = None, overflow: str = "satfinite",
             scale_floor: str = "subnormal", tensor_scope: str = "matrix",
             scale_mode: str = "reciprocal") -> np.ndarray:
    """The compiled quantiser on a float32 array ``(..., R, C)`` (matrices = last two axes).

    Equals ``precsim.formats.quantize(x, fmt, rounding, seed=seed, stream=stream, ...)`` bit for
    bit (tests check); tensor_scope ``tensor`` is not covered.
    """
    if tensor_scope == "tensor":
        raise ValueError("tensor_scope='tensor' is not covered by the numba quantiser")
    x = np.ascontiguousarray(x, dtype=np.float32)
    X = x.reshape(-1, *x.shape[-2:]) if x.ndim >= 2 else x.reshape(1, 1, -1)
    sr = rounding == "sr"
    k0, k1 = pf.stream_keys(seed, stream)
    bits = pf.sr_bits_used(fmt, sr_bits) if sr else 0
    out = quantize_many(fmt_code(fmt), sr_lane(bits) if sr else 0)(
        X, bits, overflow == "ieee", scale_floor == "normal", tensor_scope == "none",
        scale_mode == "reciprocal", k0, k1, limits())
    return out.reshape(x.shape)

