"""The fused CPU engine's host driver (``run.engine=numba``; the engine and its compiled code:
:mod:`precsim.engines.numba`): per window the inputs, decays and buffer terms (torch, the torch
engine's float32 operations), the compiled tasks on ``run.threads`` threads, the metrics, the
drift samples and checkpoints. Kept apart from the compiled code so that changing it leaves
numba's cache of that code valid."""

from __future__ import annotations

import itertools
import math
import threading
import time

import numpy as np
import torch

from precsim import formats as pf

from ..checkpoint import Checkpoint
from ..config import Config
from ..families import decays, get_family
from ..families.base import step_dots
from ..metrics import Accumulator, Readout
from ..schemes import build_schemes
from ..workload import expand_groups
from .base import (
    Engine,
    cpu_threads,
    flush_events,
    launch_ends,
    segment_ends,
    segment_phase,
)
from .numba import (
    C_EF,
    NAME,
    NCODE,
    available,  # noqa: F401 (the engine registry's interface: precsim.engines.engine_module)
    event_keys,
    limits,
    numba,
    row_stats,
    row_stats_signature,
    scheme_codes,
    scheme_consts,
    supports,
    task_function,
    task_order,
)

HELPER_START = 1.5  # a helper process's start before it compiles, in compile_cost's units


def compile_cost(gdn: bool | None, consts: tuple[int, ...] | None) -> float:
    """A rough compile time of a :func:`precsim.engines.numba.task_function` (~seconds on the
    2-core machine): the truth's, the row statistics', or a scheme's from its quantisers
    (:func:`precsim.engines.numba.scheme_consts`)."""
    if consts is None:
        return 1.0
    kind, fmt, lane, read, ef = consts
    return 1.5 + 1.5 * (fmt > 0) + 1.5 * (read > 0) + (ef >= 0) + 0.5 * (lane > 0)


def _cached(fn, sig) -> bool:
    """Whether ``fn`` has ``sig`` compiled in this process or in numba's cache on disk (True
    when that cannot be told: the first call then compiles or loads it as usual)."""
    if tuple(sig) in fn.overloads:
        return True
    try:  # numba's index of the function's cached signatures, without loading the code
        cache = fn._cache
        return cache._index_key(sig, fn.targetctx.codegen()) in cache._cache_file._load_index()
    except Exception:  # noqa: BLE001 - no cache (NullCache) or another numba: not ahead
        return True


def compile_ahead(tasks: list, fns: list, args: tuple, threads: int) -> None:
    """Before the first window, every task the run calls (``fns``, of ``tasks`` ``(gdn,
    consts)``) compiled or loaded from numba's cache, so that no task compiles mid-window. The
    ones not in the cache yet are compiled after a one-line notice; with 2+ threads a helper
    process compiles part of them at the same time (numba compiles one function at a time per
    process), into the same cache, from which this process then loads them."""
    import pickle
    import subprocess
    import sys

    todo, seen = [], set()
    sigs = [tuple(fn.typeof_pyval(a) for a in (0, *args)) for fn in fns]
    for key, fn, sig in zip([*tasks, (None, None)], [*fns, row_stats],
                            [*sigs, row_stats_signature()], strict=True):
        if id(fn) not in seen and not _cached(fn, sig):
            todo.append((key, fn, sig))
        seen.add(id(fn))
    if not todo:
        return
    print(f"precsim: compiling the fused CPU engine for this run's schemes ({len(todo)} "
          "functions, once: numba caches them on disk) ...", file=sys.stderr, flush=True)
    mine, theirs, load = [], [], [0.0, HELPER_START]
    for item in sorted(todo, key=lambda it: -compile_cost(*it[0])):  # longest first, to the
        j = 0 if threads < 2 or load[0] <= load[1] else 1  # less loaded of the two
        (mine, theirs)[j].append(item)
        load[j] += compile_cost(*item[0])
    helper = None
    if theirs:
        try:
            helper = subprocess.Popen(
                [sys.executable, "-c",
                 "from precsim.engines.numba import compile_tasks; compile_tasks()"],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            with helper.stdin:
                helper.stdin.write(pickle.dumps([(*k, sig) for k, _, sig in theirs]))
        except OSError:  # no helper: this process compiles them at their first call
            helper = None
    for _, fn, sig in mine:
        fn.compile(sig)
    if helper is not None:
        helper.wait()


def _segment_decays(la32, lens, Sq: int, H: int):
    """A window's ReplaySSM segments (lengths ``lens`` from its start), grouped by length:
    yields ``(segs, idx, k, m, Lc, decay)`` for the ``k`` segments ``segs`` of ``m`` steps
    (their steps ``idx``, ``(k*m,)``), ``Lc (k, m, S, H)`` the cumulative float32 log-decays and
    ``decay (k, S, H, m, m)`` = exp(Lc_t - Lc_j) for j <= t, 0 above (families' decay_matrices,
    batched over the segments)."""
    lens = np.asarray(lens)
    starts = np.concatenate(([0], np.cumsum(lens)[:-1]))
    for m in np.unique(lens)[::-1].tolist():
        segs = np.flatnonzero(lens == m)
        k = len(segs)
        idx = torch.from_numpy((starts[segs][:, None] + np.arange(m)).reshape(-1))
        Lc = torch.cumsum(la32[idx].reshape(k, m, Sq, H), 1)
        Lh = Lc.permute(0, 2, 3, 1)  # (k, S, H, m)
        causal = torch.ones(m, m, dtype=torch.bool).tril()
        decay = torch.exp(torch.where(causal, Lh[..., :, None] - Lh[..., None, :],
                                      torch.tensor(float("-inf"))))
        yield torch.from_numpy(segs), idx, k, m, Lc, decay


def _buffer_terms(dt32, la32, x, B, C, lens, Sq: int, H: int):
    """Input-only ReplaySSM terms of a window (torch, float32, the torch engine's operations):
    ``gam (n, SH)`` = exp(Lc_t), ``Yb (n, SH, P)`` = the buffer's part of each output and
    ``Fb (nseg, SH, P, N)`` = the buffer's part of each fold. Segments of lengths ``lens`` from
    the window's start; ``la32`` the float32 log-decays (the torch engine's: float64 ``dt A``
    rounded once, not a float32 product)."""
    n = dt32.shape[0]
    SH = Sq * H
    P, N = x.shape[-1], B.shape[-1]
    gam = torch.empty((n, SH), dtype=torch.float32)
    Yb = torch.empty((n, SH, P), dtype=torch.float32)
    Fb = torch.empty((len(lens), SH, P, N), dtype=torch.float32)
    for segs, sl, k, m, Lc, decay in _segment_decays(la32, lens, Sq, H):
        W = decay * dt32[sl].reshape(k, m, Sq, H).permute(0, 2, 3, 1)[..., None, :]
        xs = x[sl].reshape(k, m, Sq, H, P)
        Bs = B[sl].reshape(k, m, Sq, H, N)
        Cs = C[sl].reshape(k, m, Sq, H, N)
        G = torch.einsum("ktshn,kjshn->kshtj", Cs, Bs)
        Y = torch.einsum("kshtj,kjshp->ktshp", W * G, xs)
        Yb[sl] = Y.reshape(k * m, SH, P)
        gam[sl] = torch.exp(Lc).reshape(k * m, SH)
        w_last = W[..., -1, :].permute(0, 3, 1, 2)  # (k, m, S, H)
        F = torch.einsum("kjshp,kjshn->kshpn", w_last[..., None] * xs, Bs)
        Fb[segs] = F.reshape(k, SH, P, N)
    return gam, Yb, Fb


def _gdn_terms(la32, q, k, lens, L: int, Sq: int, H: int):
    """Input-only ReplaySSM terms of a GDN window (torch, float32, families.gdn.segment's
    operations, its dot products by ``step_dots``: the same bits with the segments batched):
    ``gam (n, SH)`` = exp(Lc_t), per segment ``A (nseg, SH, L, L)`` the strictly lower
    ``decay * (k_t . k_j)``, ``M`` the lower ``decay * (q_t . k_j)`` and ``wl (nseg, SH, L)``
    the last row of ``decay``. Segments of lengths ``lens`` (at most L) from the window's
    start."""
    n = la32.shape[0]
    SH = Sq * H
    Kd = k.shape[-1]
    nseg = len(lens)
    gam = torch.empty((n, SH), dtype=torch.float32)
    A = torch.zeros((nseg, SH, L, L), dtype=torch.float32)
    M = torch.zeros_like(A)
    wl = torch.zeros((nseg, SH, L), dtype=torch.float32)
    for segs, sl, kk, m, Lc, decay in _segment_decays(la32, lens, Sq, H):
        ks = k[sl].reshape(kk, m, Sq, H, Kd)
        qs = q[sl].reshape(kk, m, Sq, H, Kd)
        KK = step_dots(ks, ks)  # (k, S, H, t, j): families.gdn.segment's, bit for bit
        QK = step_dots(qs, ks)
        A[segs, :, :m, :m] = (decay * KK).tril(-1).reshape(kk, SH, m, m)
        M[segs, :, :m, :m] = (decay * QK).reshape(kk, SH, m, m)
        wl[segs, :, :m] = decay[..., -1, :].reshape(kk, SH, m)
        gam[sl] = torch.exp(Lc).reshape(kk * m, SH)
    return gam, A, M, wl


def run(cfg: Config, device: str = "cpu", progress: bool = True, record_outputs: bool = False,
        ckpt: Checkpoint | None = None):
    """Run ``cfg`` on the fused CPU engine; the same ``Result`` as the torch engine's.

    ``record_outputs`` keeps every output in ``info["outputs"]`` (tests, small runs); ``ckpt``
    saves and restores its state (:mod:`precsim.checkpoint`).
    """
    return NumbaEngine(cfg, device, progress, record_outputs, ckpt).run()


class NumbaEngine(Engine):
    """Per launch window (:func:`launch_ends`): the inputs and buffer terms on the host, the
    compiled tasks, then the window's metrics. With more than one thread, threads - 1 workers
    take a window's tasks while the host draws the next window's inputs and reduces the last
    window's metrics (torch, one thread), then takes tasks too: the cores stay busy whichever
    side has more to do (a numba parallel kernel beside the host thread oversubscribed the
    cores). One thread: window after window."""

    NAME, LABEL = NAME, "numba"
    where = workload_device = "cpu"

    def unsupported(self) -> str | None:
        return supports(self.cfg, self.device)  # the torch engine runs it, with a note

    def fallback_engine(self) -> type:
        from .torch import TorchEngine

        return TorchEngine

    def prepare(self, wl) -> None:
        cfg = self.cfg
        threads = min(cpu_threads(cfg.run.threads), numba.config.NUMBA_NUM_THREADS)
        overlap = threads > 1
        m = cfg.model
        Sq, H, P, N = cfg.run.seqs, m.heads, m.head_dim, m.state_dim
        SH = Sq * H
        steps, L = cfg.run.steps, cfg.replay.buffer_len
        schemes = build_schemes(cfg)
        ns = len(schemes)
        codes = np.stack([scheme_codes(s.cfg) for s in schemes]) if ns else np.zeros((0, NCODE),
                                                                                       np.int64)
        S64 = np.zeros((SH, P, N))
        st = np.zeros((ns, SH, P, N), dtype=np.float32)
        rd = np.zeros_like(st)
        # error feedback's residuals (empty matrices when no scheme has it)
        ef = np.zeros((ns, SH, P, N) if (codes[:, C_EF] >= 0).any() else (ns, SH, 0, 0),
                      np.float32)
        k0 = pf.stream_keys(cfg.run.seed, 0)[0]
        ev = np.arange(steps, dtype=np.int64)
        seg_ends = segment_ends(cfg)  # the flushes (speculative decoding: irregular segments)
        flush_ev = flush_events(seg_ends, steps)
        phase = segment_phase(seg_ends, steps, cfg.replay.drafts == 0)
        keys = np.zeros((ns, steps), dtype=np.uint32)
        for i, s in enumerate(schemes):
            if s.cfg.rounding == "sr":
                keys[i] = event_keys(cfg.run.seed, s.name, ev if not s.replay else flush_ev, 0)[1]
        fam = get_family(cfg.model.family)
        gdn = fam.DELTA_RULE  # the host's delta-rule terms (prepare_gdn), no per-head A
        A64 = None if gdn else np.asarray(wl.params["A"], dtype=np.float64)
        D = wl.params.get("D")
        D64 = torch.as_tensor(D, dtype=torch.float64) if D is not None else None
        readout = Readout(H * P, cfg.metrics.vocab, cfg.metrics.logit_scale, "cpu") \
            if cfg.metrics.kl else None
        acc = Accumulator([s.name for s in schemes], cfg.metrics.window, readout)
        bufdt = cfg.replay.buffer_dtype
        floor, scope_none = cfg.formats.scale_floor == "normal", cfg.formats.tensor_scope == "none"
        recip = cfg.formats.nvfp4_scale == "reciprocal"
        dead_at: list[int | None] = [None] * ns
        t_kernel: list[float] = []

        el = limits()  # the formats' limits the compiled quantisers read (formats.ids)

        def lens(t0: int, t1: int) -> np.ndarray:
            """The lengths of the segments of steps [t0, t1) (t0 and t1 are flushes)."""
            e = seg_ends[(seg_ends > t0) & (seg_ends <= t1)]
            return np.diff(e, prepend=t0)

        def prepare(t0: int, t1: int) -> dict:
            """The window's inputs, decays and buffer terms (host, torch/NumPy)."""
            n = t1 - t0
            raw_t = expand_groups(wl.chunk(t0, t1), H)
            raw = {k: v.numpy() for k, v in raw_t.items()}
            if gdn:
                return prepare_gdn(t0, t1, raw_t, raw)
            dt_t = torch.from_numpy(raw["dt"]).to(torch.float32)  # (n, S, H)
            x_t = torch.from_numpy(raw["x"]).to(torch.float32)
            B_t = torch.from_numpy(raw["B"]).to(torch.float32)
            C_t = torch.from_numpy(raw["C"]).to(torch.float32)
            dec = decays(cfg.model.family, raw_t, {"A": torch.as_tensor(A64)}, torch.float32,
                         cfg.model.decay_exp)  # the torch engine's decays
            xb, Bb = x_t, B_t
            if bufdt not in ("fp32", "fp64"):
                xb, Bb = pf.quantize(x_t, bufdt, "rne"), pf.quantize(B_t, bufdt, "rne")
            gam, Yb, Fb = _buffer_terms(dt_t.reshape(n, Sq, H), dec["la"], xb, Bb, C_t,
                                        lens(t0, t1), Sq, H)
            y64 = np.empty((n, SH, P))
            y32 = np.empty((ns, n, SH, P), dtype=np.float32)
            args = (S64, st, rd, ef, codes, np.ascontiguousarray(keys[:, t0:t1]), k0,
                    np.exp(raw["dt"] * A64).reshape(n, SH),
                    np.ascontiguousarray(raw["dt"].reshape(n, SH)),
                    np.ascontiguousarray(raw["x"].reshape(n, SH, P)),
                    np.ascontiguousarray(raw["B"].reshape(n, SH, N)),
                    np.ascontiguousarray(raw["C"].reshape(n, SH, N)), y64,
                    dec["a"].reshape(n, SH).numpy(), dt_t.reshape(n, SH).numpy(),
                    x_t.reshape(n, SH, P).numpy(), B_t.reshape(n, SH, N).numpy(),
                    C_t.reshape(n, SH, N).numpy(), Yb.numpy(), gam.numpy(), Fb.numpy(), y32,
                    phase[t0:t1], floor, scope_none, recip, el)
            return {"t0": t0, "t1": t1, "x": raw["x"], "x_t": x_t, "y64": y64, "y32": y32,
                    "args": args, "next": itertools.count()}

        u_master = cfg.replay.gdn_u_source == "master"

        def prepare_gdn(t0: int, t1: int, raw_t: dict, raw: dict) -> dict:
            """:func:`prepare` for Gated DeltaNet: the inputs in float64 (the truth) and
            float32, the decays and the segments' input-only matrices (:func:`_gdn_terms`)."""
            n = t1 - t0
            f32 = {k: torch.from_numpy(raw[k]).to(torch.float32) for k in ("beta", "q", "k", "v")}
            dec = decays(cfg.model.family, raw_t, {}, torch.float32, cfg.model.decay_exp)
            gam, Am, Mm, wlast = _gdn_terms(dec["la"], f32["q"], f32["k"], lens(t0, t1), L, Sq, H)

            def flat(a, *tail):
                return np.ascontiguousarray(a.reshape(n, SH, *tail))

            y64 = np.empty((n, SH, P))
            y32 = np.empty((ns, n, SH, P), dtype=np.float32)
            args = (S64, st, rd, ef, codes, np.ascontiguousarray(keys[:, t0:t1]), k0,
                    flat(np.exp(raw["g"])), flat(raw["beta"]), flat(raw["q"], N), flat(raw["k"], N),
                    flat(raw["v"], P), y64, flat(dec["a"].numpy()), flat(f32["beta"].numpy()),
                    flat(f32["q"].numpy(), N), flat(f32["k"].numpy(), N), flat(f32["v"].numpy(), P),
                    gam.numpy(), Am.numpy(), Mm.numpy(), wlast.numpy(), y32, phase[t0:t1], floor,
                    scope_none, recip, el, u_master)
            return {"t0": t0, "t1": t1, "x": None, "x_t": None, "y64": y64, "y32": y32,
                    "args": args, "next": itertools.count()}

        # each task's compiled function: the truth's (slot 0), its scheme's kind and formats
        tasks = [(fam.KERNEL, None), *((fam.KERNEL, scheme_consts(c)) for c in codes)]
        fns = [task_function(*k) for k in tasks]
        calls = [(fns[t % (ns + 1)], t) for t in task_order(codes, SH).tolist()]
        ntask = len(calls)
        ahead = threading.Lock()
        ready: list[bool] = []

        def kernel(w: dict) -> None:
            """Take the window's tasks one at a time until none is left (any number of threads:
            the workers and, between its own work, the host)."""
            tk = time.perf_counter()
            args, cnt = w["args"], w["next"]
            with ahead:  # the first window's first caller: every task compiled or loaded first
                if not ready:
                    compile_ahead(tasks, fns, args, threads)
                    ready.append(True)
            while (j := next(cnt)) < ntask:  # itertools.count: one task per caller, atomic
                fn, t = calls[j]
                fn(t, *args)
            t_kernel.append(time.perf_counter() - tk)  # summed: the kernel's seconds, all threads

        def snapshot(w: dict) -> None:
            """The held states at the window's end, if a drift sample is due (before the next
            window's kernel overwrites them)."""
            if acc.want_drift(w["t1"]):
                w["states"] = (S64.copy(), st.copy(), rd.copy()) if overlap else (S64, st, rd)

        W = H * P
        D64n = np.asarray(D, dtype=np.float64) if D is not None else np.zeros(0)
        want_kl = readout is not None

        def finish(w: dict) -> None:
            """Dead schemes, the metrics (rows by ``row_stats``, the KL from them), the drift
            sample, the outputs kept, the bar."""
            t0, t1 = w["t0"], w["t1"]
            n = t1 - t0
            rows = n * Sq
            err, s_ss, yh = np.empty((ns, rows)), np.empty((ns, rows)), np.empty((rows, W))
            d = np.empty((ns, rows, W) if want_kl else (0, 0, 0), dtype=np.float32)
            no = np.zeros((0, 0))
            x64 = np.ascontiguousarray(w["x"]).reshape(rows, W) if D is not None else no
            row_stats(w["y32"].reshape(ns, rows, W), w["y64"].reshape(rows, W), x64,
                       x64.astype(np.float32), D64n, D64n.astype(np.float32), P, want_kl, err, s_ss,
                       d, yh)
            cuts = []
            for i in range(ns):
                if dead_at[i] is None:  # the first step with a non-finite output (any sequence)
                    bad = ~np.isfinite(s_ss[i]).reshape(n, Sq).all(axis=1)
                    if bad.any():
                        dead_at[i] = t0 + int(np.argmax(bad)) + 1
                cuts.append(_dead_cut(dead_at[i], t0, n, seg_ends))
                err[i, cuts[i] * Sq:] = math.nan  # after the dying segment: NaN outputs
                if want_kl:
                    d[i, cuts[i] * Sq:] = math.nan
            acc.push_rows(torch.from_numpy(err).view(ns, n, Sq),
                          torch.from_numpy(yh).view(n, Sq, W) if want_kl else None,
                          torch.from_numpy(d).view(ns, n, Sq, W) if want_kl else None)
            if self.record_outputs:
                y_ref = torch.from_numpy(w["y64"]).view(n, Sq, H, P)
                if D64 is not None:
                    y_ref = y_ref + D64[:, None] * torch.from_numpy(w["x"])
                self.record("truth", y_ref.numpy())
                for i, s in enumerate(schemes):
                    y = torch.from_numpy(w["y32"][i]).view(n, Sq, H, P)
                    if D64 is not None:
                        y = y + D64.to(torch.float32)[:, None] * w["x_t"]
                    y = y.clone()
                    y[cuts[i]:] = math.nan
                    self.record(s.name, y.numpy())
            if "states" in w:
                s64, s32, r32 = w["states"]
                def v4(a):
                    return torch.from_numpy(a).view(Sq, H, P, N)

                acc.record_drift(t1, v4(s64), {s.name: None if dead_at[i] is not None else {
                    "state": v4(s32[i]), **({"read": v4(r32[i])} if s.kind == "split" else {})}
                    for i, s in enumerate(schemes)})

        self.threads, self.overlap = threads, threads > 1
        self.overlaps = self.overlap
        self.seg_ends, self.schemes, self.acc = seg_ends, schemes, acc
        self.S64, self.st, self.rd, self.ef = S64, st, rd, ef
        self.dead_list, self.t_kernel = dead_at, t_kernel
        self._window, self._kernel, self._snapshot, self._finish = prepare, kernel, snapshot, finish
        self.prev, self.futs, self.pool = None, [], None

    def spans(self, pos: int):
        t0 = pos
        for t1 in launch_ends(self.seg_ends, self.cfg.metrics.window):
            if t1 > pos:
                yield t0, t1
                t0 = t1

    def load(self, saved: dict) -> int:  # the arrays in place: every window's arguments
        self.dead_list[:] = saved["dead"]  # refer to them
        for a, k in ((self.S64, "S64"), (self.st, "st"), (self.rd, "rd"), (self.ef, "ef")):
            a[...] = saved.get(k, a)
        return saved["pos"]

    def advance(self, t0: int, t1: int) -> None:
        w = self._window(t0, t1)
        if not self.overlap:
            self._kernel(w)
            self._snapshot(w)
            self._finish(w)
            self.pos = t1
            return
        prev = self.prev
        if prev is not None:
            self._wait(prev)  # the host's share of the running window
        self.futs = [self.pool.submit(self._kernel, w) for _ in range(self.threads - 1)]
        if prev is not None:
            self._finish(prev)
        self.prev = w

    def _wait(self, w: dict) -> None:
        from concurrent.futures import wait

        self._kernel(w)
        wait(self.futs)
        for f in self.futs:
            f.result()
        self._snapshot(w)

    def settle(self) -> None:
        """The window in flight finished (its kernel, metrics): the state whole at its end."""
        if self.prev is not None:
            self._wait(self.prev)
            self._finish(self.prev)
            self.pos, self.prev = self.prev["t1"], None

    def session(self):
        import contextlib
        from concurrent.futures import ThreadPoolExecutor

        if not self.overlap:
            return contextlib.nullcontext()
        self.pool = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="precsim-numba")
        return self.pool

    def save(self) -> dict:  # the state when window ``pos`` is finished and the next not started
        return {"pos": self.pos, "S64": self.S64, "st": self.st, "rd": self.rd, "ef": self.ef,
                "dead": self.dead_list, "acc": self.acc, "dead_at": self.dead_at()}

    def dead_at(self) -> dict:
        return {s.name: self.dead_list[i] for i, s in enumerate(self.schemes)}

    def close(self) -> None:
        self.acc.finish()
        for i, s in enumerate(self.schemes):
            s.dead_at = self.dead_list[i]

    def info(self) -> dict:
        n_flush = len(self.seg_ends)
        return {"flushes": n_flush, "workload": self.cfg.workload.kind,
                "mean_segment": self.cfg.run.steps / max(n_flush, 1),
                "kernel_s": sum(self.t_kernel), "threads": self.threads}


def _dead_cut(dead_at: int | None, t0: int, n: int, seg_ends: np.ndarray) -> int:
    """The torch engine's dead-scheme rule: a segment with a non-finite output marks the scheme
    dead at that step and its outputs read as NaN from the end of that segment on (it stops
    running). The first of the window's ``n`` steps (from ``t0``) that reads as NaN (``n``:
    none)."""
    if dead_at is None:
        return n
    end = int(seg_ends[np.searchsorted(seg_ends, dead_at - 1, side="right")]) \
        if dead_at - 1 < seg_ends[-1] else seg_ends[-1]
    return min(n, max(0, end - t0))
