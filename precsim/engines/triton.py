"""The Triton engine (``run.engine=triton``): host driver of the kernels in ``precsim.kernels``.

The horizon is cut into *launch windows* (:func:`precsim.engines.base.launch_ends`). Per launch
the workload draws the window's inputs on the device, one kernel launch advances the float64
truth and every scheme, and the outputs go through ``precsim.metrics.DeviceAccumulator``. States
stay in device memory between launches: a launch reads and writes each state copy once.

Memory is bounded by one window: outputs ``(n, S, H, P)`` per scheme (float32) and the truth
(float64), plus the window's inputs.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import time

import numpy as np
import torch

from ..checkpoint import Checkpoint
from ..config import Config, ef_fmt
from ..families import decays, fast_exp32, get_family
from ..metrics import DeviceAccumulator, Readout, kl_rows
from ..result import Result
from ..schemes import build_schemes
from ..workload import expand_groups
from .base import (
    Engine,
    flush_events,
    launch_ends,
    segment_ends,
    segment_phase,
    slow_notice,
)
from .triton_codes import (
    BUF_IDS,
    LAUNCH_INPUTS,
    ef_code,
    launch_groups,
    scheme_block,
    scheme_code,
    unsupported_reason,
)
from .triton_options import Diagnosis, Options, settings  # noqa: F401 - run()'s arguments

NAME = "triton"
log = logging.getLogger("precsim.engines.triton")
# Per-configuration kernels (not runtime codes): the truth and each scheme in a launch of its
# own, the launches of a window on streams of their own (on CUDA) so that they run side by side
# as the slots of one launch did. Triton compiles a kernel's code as a whole, and a launch of k
# schemes is one kernel of k schemes' code: split, the kernels compile at the same time
# (engines.triton._compile_together) and a run's first compile takes about its costliest
# scheme's time instead of their sum (experiments/bench/gpu_sweep.md). Diagnosis.lanes=False:
# one launch per block size, as before (``PRECSIM_KERNEL_LANES=0`` too: diagnosis).
LANES = os.environ.get("PRECSIM_KERNEL_LANES", "1").strip() != "0"


def runtime_codes_default(sweep: bool = False) -> bool:
    """:attr:`Options.runtime_codes` left None: ``PRECSIM_KERNEL_CODES=runtime|constexpr``, else
    runtime codes for a sweep over schemes and per-configuration kernels otherwise."""
    env = os.environ.get("PRECSIM_KERNEL_CODES", "").strip().lower()
    return env == "runtime" if env in ("runtime", "constexpr") else sweep


def supports(cfg: Config, device: str) -> str | None:
    """Why the Triton engine cannot run ``cfg`` on ``device`` (None if it can)."""
    from precsim.kernels import why_unavailable

    return why_unavailable(device) or unsupported_reason(cfg)




def run(cfg: Config, device: str = "cuda", progress: bool = True, options: Options | None = None,
        ckpt: Checkpoint | None = None, diagnosis: Diagnosis | None = None, **kw) -> Result:
    """Run ``cfg`` with the fused kernels (``kw``: fields of :class:`Options`; ``diagnosis``:
    :class:`Diagnosis`, benchmarks). Settings the kernels do not cover fall back to the torch
    engine with a logged note (``Result.info["triton_fallback"]``). ``ckpt`` saves and restores
    its state at batch boundaries (:mod:`precsim.checkpoint`)."""
    return TritonEngine(cfg, device, progress, options or Options(**kw), ckpt, diagnosis).run()


class TritonEngine(Engine):
    """The horizon in batches of launch windows: per batch the inputs on the device, one kernel
    launch per window and launch group, the batch's metrics queued behind them (a side stream
    or thread on CUDA); a save or a stop waits for every queued batch (:meth:`settle`)."""

    NAME, LABEL, log = NAME, "Triton", log
    overlaps = True  # batches queued ahead of their metrics: a save waits for them (settle)

    def __init__(self, cfg: Config, device: str, progress: bool, options: Options,
                 ckpt: Checkpoint | None, diagnosis: Diagnosis | None = None):
        super().__init__(cfg, device, progress, options.record_outputs, ckpt)
        self.opt, self.diag = options, diagnosis or Diagnosis()

    def unsupported(self) -> str | None:
        return unsupported_reason(self.cfg)

    def fallback_engine(self) -> type:
        from .torch import TorchEngine

        return TorchEngine

    def fallback_records(self):
        return False

    def prepare(self, wl) -> None:
        self.phases = phases = {"start": self.t_start}
        fns = self._build(wl, self.cfg, self.device, self.opt, self.diag, phases)
        (self._advance, self.settle, self.session, self.save, self._load, self.close,
         self.info, self.spans) = fns

    def advance(self, a: int, b: int) -> None:
        self._advance(a, b)

    def load(self, saved: dict) -> int:
        return self._load(saved)

    def _build(self, wl, cfg: Config, device: str, opt: Options, diag: Diagnosis,
               phases: dict) -> tuple:
        """The run's state on the device and the closures that advance, settle, save and load
        it (they share the run's streams, threads and queues)."""
        (num_warps, overlap, skip_metrics, poison, kl_tf32, fused_metrics, lpt, maxnreg,
         kl_fused, prefetch, metrics_batch, priority, inflight, metrics_lag, metrics_thread,
         lanes) = (diag.num_warps, diag.overlap, diag.skip_metrics, diag.poison, diag.kl_tf32,
                   diag.fused_metrics, diag.lpt, diag.maxnreg, diag.kl_fused, diag.prefetch,
                   diag.metrics_batch, diag.priority, max(1, diag.inflight),
                   max(1, diag.metrics_lag), diag.metrics_thread, diag.lanes)  # by name
        record_outputs, runtime_codes = opt.record_outputs, opt.runtime_codes
        sweep_blocks = opt.sweep_blocks or ()
        if runtime_codes is None:
            runtime_codes = runtime_codes_default(opt.sweep_blocks is not None)
        if lanes is None:  # runtime codes: one kernel's code serves every scheme anyway
            lanes = LANES and not runtime_codes
        from precsim.kernels.codes import dispatch_order, slot_cost
        from precsim.kernels.inputs import exp_f32
        from precsim.kernels.metrics import NO_STEP, drift_from_partials, drift_partials, row_stats
        from precsim.kernels.quant import SCOPE_MATRIX, SCOPE_NONE, as_int32, scale_flags
        from precsim.kernels.rng import event_keys

        dev = torch.device(device)
        family = get_family(cfg.model.family)
        m = cfg.model
        Sq, H = cfg.run.seqs, m.heads
        P, N = family.state_dims(m)
        schemes = build_schemes(cfg)
        ns = len(schemes)
        L, steps = cfg.replay.buffer_len, cfg.run.steps
        codes = [scheme_code(s.cfg) for s in schemes]
        groups = launch_groups(codes, [scheme_block(s.cfg) for s in schemes], lanes)
        # storage slot of each scheme: groups contiguous
        order = [i for _, idx in groups for i in idx]
        slot = {i: order.index(i) for i in range(ns)}
        SH = Sq * H
        S64 = torch.zeros((SH, P, N), dtype=torch.float64, device=dev)
        st = torch.zeros((max(ns, 1), SH, P, N), dtype=torch.float32, device=dev)
        rd = torch.zeros_like(st)
        # error feedback's residuals; per launch group the slots' codes (kernels' EFS)
        ef = torch.zeros_like(st) if any(ef_fmt(s.cfg) for s in schemes) else None
        efs = [sum(ef_code(schemes[i].cfg) << (6 * k) for k, i in enumerate(idx))
               for _, idx in groups]
        keys = np.zeros((max(ns, 1), steps), dtype=np.uint32)
        ev = np.arange(steps, dtype=np.int64)
        seg_ends = segment_ends(cfg)  # the flushes (speculative decoding: irregular segments)
        flush_ev = flush_events(seg_ends, steps)
        k0 = 0
        for i, s in enumerate(schemes):
            if s.cfg.rounding == "sr":
                k0, keys[slot[i]] = event_keys(cfg.run.seed, s.name,
                                               ev if not s.replay else flush_ev,
                                               0)
        k1 = torch.from_numpy(keys.view(np.int32)).to(dev)
        ph = torch.from_numpy(segment_phase(seg_ends, steps, cfg.replay.drafts == 0)).to(dev)
        # the readout head is drawn when the first window's metrics need it, after the first
        # launches are queued (not before them)
        want_kl = bool(cfg.metrics.kl)
        readout = None
        acc = DeviceAccumulator([s.name for s in schemes], cfg.metrics.window, None)
        acc.tf32 = kl_tf32
        params = {k: torch.as_tensor(v, dtype=torch.float64, device=dev)
                  for k, v in wl.params.items()}
        D = params.get(family.SKIP) if family.SKIP else None
        nw = num_warps or (4 if P * N <= 8192 else 8)
        LB = max(16, 1 << (L - 1).bit_length())
        cuda = dev.type == "cuda"
        overlap = cuda if overlap is None else (overlap and cuda)
        side = torch.cuda.Stream(device=dev) if overlap else None
        names = ["truth", *(s.name for s in schemes)]
        want = set(names) if record_outputs is True else set(record_outputs or ())
        recorded: dict[str, list] = {n: [] for n in names if n in want}
        shape4 = (Sq, H, P, N)
        # dead schemes, tracked on the device in storage order (no host sync per window): with
        # the fused metrics row_stats keeps first_bad, else dead / dead_at below
        dead = torch.zeros(max(ns, 1), dtype=torch.bool, device=dev)
        dead_at = torch.full((max(ns, 1),), -1, dtype=torch.int64, device=dev)
        by_slot = sorted(range(ns), key=lambda i: slot[i])
        split = [schemes[i].kind == "split" for i in by_slot]
        # fused window metrics (kernels.metrics.row_stats) unless per-step outputs are recorded
        fused = ns > 0 and not recorded and fused_metrics
        perm = [slot[i] for i in range(ns)]  # storage slot of each scheme, in order
        first_bad = torch.full((max(ns, 1),), NO_STEP, dtype=torch.int32, device=dev)  # fused

        def draw_readout() -> Readout:
            return _readout(H * P, cfg.metrics.vocab, cfg.metrics.logit_scale, dev)

        def process(item) -> None:
            """Window metrics (rel_err, KL, drift) and dead-scheme checks, as run_torch does; all
            schemes at once (few device ops per window: the host must stay ahead of the GPU)."""
            nonlocal dead, dead_at, readout
            t0, t1, inp, y64, y32, states, done = item
            n = t1 - t0
            ctx = torch.cuda.stream(side) if side is not None else contextlib.nullcontext()
            with ctx:
                if side is not None:  # kernel done; main-stream memory is in use on side too
                    side.wait_event(done)
                    for t in (y64, y32, *inp.values(), *(states or ())):
                        t.record_stream(side)
                if want_kl and readout is None:  # drawn on the stream that uses it
                    readout = acc.readout = draw_readout()
                if fused:  # one Triton pass per window: rel_err, first non-finite step, KL inputs
                    err, dd, yh = row_stats(y32[:ns], y64, inp.get("x"), D, first_bad, t0, Sq,
                                            n * Sq, P, want_kl and not skip_metrics)
                    if not skip_metrics:
                        kl = (None, None) if dd is None else kl_rows(readout, yh, dd, kl_tf32,
                                                                     kl_fused)  # KL, top-1
                        acc.push_stats(err, *kl, order=perm, seqs=Sq)
                    if side is not None:
                        side_done.append(side.record_event())
                    return
                y_ref = y64.view(n, Sq, H, P)
                y_all = y32.view(-1, n, Sq, H, P)
                if D is not None:
                    y_ref = y_ref + D[:, None] * inp["x"].view(n, Sq, H, P)
                    y_all = y_all + D.to(torch.float32)[:, None] * inp["x"].to(torch.float32).view(
                        n, Sq, H, P)
                y_all = torch.where(dead.view(-1, 1, 1, 1, 1), torch.nan, y_all)  # dead before
                bad = ~torch.isfinite(y_all).reshape(y_all.shape[0], n, -1).all(dim=2)
                anyb = bad.any(dim=1)
                first = t0 + 1 + torch.argmax(bad.to(torch.int8), dim=1)
                dead_at = torch.where(anyb & ~dead, first, dead_at)
                dead = dead | anyb
                ys = {s.name: y_all[slot[i]] for i, s in enumerate(schemes)}
                if not skip_metrics:
                    acc.push(y_ref, ys)
                    if states is not None:
                        acc.record_drift_stacked(t1, states[0].view(shape4), states[1][:ns],
                                                 states[2][:ns],
                                                 [schemes[i].name for i in by_slot], split)
                for name in recorded:
                    y = y_ref if name == "truth" else ys[name]
                    recorded[name].append(y.cpu().numpy())
                if side is not None:
                    side_done.append(side.record_event())

        def warm_metrics(nB: int) -> None:
            """The metrics' one-off work, in the metrics thread while the host draws the first
            batch's inputs and launches it: the readout head, and each metrics kernel's first call
            on zeros of a batch's shapes. CUDA loads a kernel lazily on its first launch and the
            load waits for the device to drain, so a first call behind many queued step kernels
            stalls them (0.12-0.19 s of a first run on the H200 machine, when the first batch's
            metrics were reduced by torch ops on the host thread; waiting for this before the
            first launch measured 0.02 s slower than overlapping it)."""
            nonlocal readout
            with torch.cuda.stream(side):
                side.wait_stream(torch.cuda.default_stream(dev))  # the states were zeroed there
                drift_partials(S64, st, rd, ns, Sq)
                if want_kl and readout is None:
                    readout = acc.readout = draw_readout()
                y64 = torch.zeros((nB, SH, P), dtype=torch.float64, device=dev)
                y32 = torch.zeros((ns, nB, SH, P), dtype=torch.float32, device=dev)
                x = torch.zeros((nB, SH, P), dtype=torch.float64, device=dev) if D is not None \
                    else None
                err, dd, yh = row_stats(y32, y64, x, D, first_bad.clone(), 0, Sq, nB * Sq, P,
                                        want_kl)
                kl = (None, None) if dd is None else kl_rows(readout, yh, dd, kl_tf32, kl_fused)
                DeviceAccumulator([s.name for s in schemes], cfg.metrics.window,
                                  readout).push_stats(err, *kl, order=perm, seqs=Sq)

        phases["setup"] = time.perf_counter()
        t_loop = time.perf_counter()
        pending: list = []  # batches whose metrics wait (overlap: metrics_lag batches behind)
        timed, kern, side_done, host_wait, compile_s = [], {}, [], 0.0, 0.0
        ends = launch_ends(seg_ends, cfg.metrics.window)
        # launch windows per metrics batch: the inputs and window metrics of G launches are drawn
        # and reduced together (a few dozen small device ops per batch: the host stays ahead of
        # the GPU); the torch-ops path keeps one launch per batch
        per_win = (ends[0] * SH * P) * (8 * max(ns, 1) + 8 * 4)  # outputs, d, yh, x, inputs
        G = max(1, min(metrics_batch, (1 << 31) // per_win)) if fused else 1
        batches = [ends[k:k + G] for k in range(0, len(ends), G)]
        batch_index = {b[-1]: i for i, b in enumerate(batches)}
        next_drift = cfg.metrics.window  # fused drift samples, as Accumulator.want_drift
        drift_parts: list[tuple[int, torch.Tensor]] = []
        T0 = 0
        nxt = pre = main = e_loop = None
        def dead_map() -> dict:
            firsts = [-1 if v == NO_STEP else v for v in first_bad.tolist()] if fused else \
                dead_at.tolist()
            return {s.name: firsts[slot[i]] if firsts[slot[i]] >= 0 else None
                    for i, s in enumerate(schemes)}

        def close_metrics(dead_by_name: dict) -> None:
            """Every window's statistics on the host (the device synchronised)."""
            if drift_parts:  # every fused drift sample finished at once, one copy to the host
                d_st, d_rd = drift_from_partials(torch.stack([p for _, p in drift_parts]))
                d_st, d_rd = d_st.cpu().numpy(), d_rd.cpu().numpy()
                names_slot = [schemes[i].name for i in by_slot]
                for j, (pos, _) in enumerate(drift_parts):
                    acc.record_drift_norms(pos, d_st[j], d_rd[j], names_slot, split)
            acc.finish()
            acc.to_host(dead_by_name)

        def whole() -> dict:  # after drain(): every launch and window metric before T0 done
            return {"pos": T0, "S64": S64, "st": st, "rd": rd, "ef": ef, "first_bad": first_bad,
                    "dead": dead,
                    "dead_at_dev": dead_at, "drift_parts": list(drift_parts),
                    "next_drift": next_drift, "acc": acc, "dead_at": dead_map(),
                    "finish": lambda: close_metrics(dead_map())}

        def drain() -> None:
            while pending:
                p = pending.pop(0)
                p.result() if worker is not None else process(p)
            if cuda:
                torch.cuda.synchronize(dev)

        fast = cfg.model.decay_exp == "fast"
        launch_kw = dict(lpt=lpt, buf=BUF_IDS[cfg.replay.buffer_dtype],
                         sfloor=scale_flags(cfg.formats.scale_floor, cfg.formats.nvfp4_scale),
                         scope=SCOPE_NONE if cfg.formats.tensor_scope == "none" else SCOPE_MATRIX,
                         u_master=cfg.replay.gdn_u_source == "master",
                         kernels=kernel_sets(), order=dispatch_order,
                         runtime=runtime_codes)
        # lanes: each launch group on a stream of its own, the costliest first (slot_cost)
        lane_streams = [torch.cuda.Stream(device=dev, priority=-5 if priority else 0)
                        for _ in groups] if cuda and lanes and len(groups) > 1 else None
        lane_seq = sorted(range(len(groups)), key=lambda gi: -max(
            ([slot_cost(None)] if gi == 0 else []) + [slot_cost(codes[i]) for i in groups[gi][1]]))

        def prepare(a: int, b: int) -> dict:
            """Inputs of steps [a, b) on the device, with the decays the kernels read:
            ``_a64`` float64 (the truth), ``_a32`` float32 and ``_dA32`` the float32 log-decay
            (``families.decays``; with ``decay_exp=fast`` ``_a32`` is the kernels' ``tl.exp``)."""
            inp = wl.chunk(a, b)
            # GDN's kernel reads q/k per head (a trace keeps key heads)
            if not family.KERNEL_GROUPS:
                inp = expand_groups(inp, H)
            n = b - a
            d64 = decays(family.name, inp, params, torch.float64)  # the float32 ones round these
            la32 = d64["la"].to(torch.float32)
            if fast:
                a32 = exp_f32(la32) if cuda else fast_exp32(la32)
            else:
                a32 = d64["a"].to(torch.float32)
            inp.update({"_a64": d64["a"].reshape(n, SH), "_a32": a32.reshape(n, SH),
                        "_dA32": la32.reshape(n, SH)})
            return inp

        # launches on a high-priority stream: when a launch's programs and the metrics (side
        # stream) or the next inputs (prefetch stream) both wait for SMs, the launch goes first and
        # the others fill the SMs its last programs leave idle
        hi = torch.cuda.Stream(device=dev, priority=-5) if cuda and priority else None
        if hi is not None:
            hi.wait_stream(torch.cuda.current_stream(dev))  # the states were zeroed there
        # with overlap, a thread of its own reduces the metrics (mostly device ops queued behind
        # each batch's kernels): the first batch's one-off host work (CUDA's lazy loading of the
        # metrics' kernels, Triton's first calls) then overlaps the launches instead of stalling
        # them
        worker = warm = None
        if overlap and metrics_thread:
            from concurrent.futures import ThreadPoolExecutor

            worker = ThreadPoolExecutor(1, thread_name_prefix="precsim-metrics")
            if fused and not skip_metrics:
                warm = worker.submit(warm_metrics, batches[0][-1])
            # batches it may hold (their outputs stay allocated): up to a quarter of the free memory
            free = torch.cuda.mem_get_info(dev)[0]
            backlog = max(metrics_lag, min(16, int(0.25 * free) // max(G * per_win, 1)))
        def load(saved: dict) -> int:
            """The saved state back (the same batches as the uninterrupted run, from the saved
            one on)."""
            nonlocal T0, next_drift, drift_parts
            T0, next_drift, drift_parts = saved["pos"], saved["next_drift"], saved["drift_parts"]
            for t in ("S64", "st", "rd", "first_bad", "dead", "dead_at_dev", "ef"):
                if t in saved and saved[t] is not None:
                    {"S64": S64, "st": st, "rd": rd, "first_bad": first_bad, "dead": dead,
                     "dead_at_dev": dead_at, "ef": ef}[t].copy_(saved[t])

            return T0

        @contextlib.contextmanager
        def session():
            nonlocal nxt, pre, main, e_loop
            with contextlib.ExitStack() as stack, \
                    torch.cuda.stream(hi) if hi is not None else contextlib.nullcontext():
                if worker is not None:
                    stack.callback(worker.shutdown, wait=True, cancel_futures=True)
                # device inputs of batch k+1 are drawn on their own stream while batch k's first
                # kernel runs (they fill the SMs its last programs leave idle, not a launch gap)
                pre = torch.cuda.Stream(device=dev) if cuda and prefetch and \
                    cfg.workload.kind != "trace" else None
                main = torch.cuda.current_stream(dev) if cuda else None
                if pre is not None:
                    # the inputs' parameters were copied on the default stream
                    pre.wait_stream(main)
                nxt = None
                if cuda:  # the GPU's idle time between launches (info["gpu_idle_s"]), from here
                    e_loop = torch.cuda.Event(enable_timing=True)
                    e_loop.record()
                yield
                if warm is not None:
                    warm.result()  # long done; raises what it raised

        def advance(T0_: int, T1_: int) -> None:
            """One batch of launch windows ``[T0_, T1_)``: inputs, launches, metrics queued."""
            nonlocal T0, nxt, host_wait, compile_s, next_drift
            bi = batch_index[T1_]
            bends = batches[bi]
            T1 = bends[-1]
            nB = T1 - T0
            if len(side_done) > 2:  # bound the batches whose metrics are in flight
                w0 = time.perf_counter()
                side_done[-3].synchronize()
                host_wait += time.perf_counter() - w0
            if nxt is not None:
                inp, ready = nxt
                main.wait_event(ready)
                for t in inp.values():  # allocated on the prefetch stream, used on main
                    t.record_stream(main)
            else:
                inp = prepare(T0, T1)
            alloc = functools.partial(torch.full, fill_value=math.nan) if poison else torch.empty
            y64 = alloc((nB, SH, P), dtype=torch.float64, device=dev)
            y32 = alloc((max(ns, 1), nB, SH, P), dtype=torch.float32, device=dev)
            states = None
            t0 = T0
            for t1 in bends:
                n = t1 - t0
                if len(timed) >= inflight:  # the host runs ahead without syncs: bound it
                    w0 = time.perf_counter()
                    timed[-inflight][1].synchronize()
                    host_wait += time.perf_counter() - w0
                if cuda:
                    e0 = torch.cuda.Event(enable_timing=True)
                    e1 = torch.cuda.Event(enable_timing=True)
                    e0.record()
                a, b = t0 - T0, t1 - T0
                win = {k: v[a:b] for k, v in inp.items()} if G > 1 else inp
                c0 = time.perf_counter() if t0 == 0 else None  # first launches: compile/load
                with slow_notice("compiling the Triton kernels for this configuration (once: "
                                 "Triton caches them on disk)",
                                 c0 is not None and self.bar is not None):
                    call = functools.partial(launch_span, family.name, win, S64, st, rd, y64[a:b],
                                             y32[:, a:b], k1, ph, as_int32(k0))
                    calls = [functools.partial(
                        call, [slot[i] for i in idx], [codes[i] for i in idx], gi == 0, t0, n,
                        steps, H, blk, LB, nw, maxnreg, ef=ef, efs=efs[gi], **launch_kw)
                        for gi, (blk, idx) in enumerate(groups)]
                    if c0 is not None and cuda:  # the first launches: compile together
                        # a sweep over schemes (runtime codes): the kernels of the block sizes
                        # its other jobs need compile beside this job's (never launched here)
                        i0 = groups[0][1]
                        ahead = [functools.partial(
                            call, [slot[i] for i in i0], [codes[i] for i in i0], True, t0, n,
                            steps, H, bk, LB, nw, maxnreg, ef=ef, efs=efs[0], **launch_kw)
                            for bk in sorted(sweep_blocks)
                            if bk not in {g[0] for g in groups} and N % bk == 0
                        ] if launch_kw["runtime"] else []
                        if len(calls) + len(ahead) > 1:
                            _compile_together(calls, ahead)
                    if lane_streams is None:
                        for gi, call in enumerate(calls):
                            kern[gi] = call()
                    else:  # side by side; this stream's next work waits for every lane
                        go = main.record_event()
                        ends_ev = []
                        for gi in lane_seq:
                            lane = lane_streams[gi]
                            lane.wait_event(go)
                            with torch.cuda.stream(lane):
                                kern[gi] = calls[gi]()
                            ends_ev.append(lane.record_event())
                        for ev in ends_ev:
                            main.wait_event(ev)
                if c0 is not None:
                    compile_s = time.perf_counter() - c0
                if pre is not None and t0 == T0 and bi + 1 < len(batches):
                    with torch.cuda.stream(pre):
                        nxt = (prepare(T1, batches[bi + 1][-1]), pre.record_event())
                if fused and not skip_metrics and t1 >= next_drift:
                    # partial sums now on the main stream (one read of the states, no snapshot);
                    # finished for all samples at the end
                    drift_parts.append((t1, drift_partials(S64, st, rd, ns, Sq)))
                    while next_drift <= t1:
                        next_drift += cfg.metrics.window
                elif acc.want_drift(t1) and not skip_metrics and not fused:
                    # snapshot: the next launch overwrites the states
                    states = (S64.clone(), st.clone(), rd.clone()) if overlap else (S64, st, rd)
                if cuda:
                    e1.record()
                    timed.append((e0, e1))
                t0 = t1
            item = (T0, T1, inp, y64, y32, states, e1 if cuda else None)
            if worker is not None:  # the metrics thread takes it now; bound its backlog
                pending.append(worker.submit(process, item))
                while len(pending) > backlog:
                    pending.pop(0).result()
            elif overlap:
                pending.append(item)
                if len(pending) > metrics_lag:
                    process(pending.pop(0))
            else:
                process(item)
            T0 = T1

        def close() -> None:
            if cuda:
                torch.cuda.synchronize(dev)
            for s, d in zip(schemes, dead_map().values(), strict=True):
                s.dead_at = d
            phases["kernels"] = time.perf_counter()
            close_metrics({s.name: s.dead_at for s in schemes})
            phases["metrics"] = time.perf_counter()

        def info() -> dict:
            n_flush = len(seg_ends)
            return {
                "flushes": n_flush, "mean_segment": steps / n_flush,
                "launches": len(ends) * len(groups), "num_warps": nw, "overlap": overlap,
                "kernel_s": sum(a.elapsed_time(b) for a, b in timed) / 1e3 if cuda else None,
                "wall_loop_s": time.perf_counter() - t_loop,
                "host_wait_s": host_wait,  # host blocked on the in-flight bounds (ahead of the GPU)
                "gpu_idle_s": _gpu_idle(e_loop, timed) if cuda and timed else None,
                "phases_s": _phases(phases, compile_s),
                "registers": [getattr(k, "n_regs", None) for k in kern.values()],
                "spills": [getattr(k, "n_spills", None) for k in kern.values()],
                "interpreted": os.environ.get("TRITON_INTERPRET") == "1"}

        def spans(pos: int):
            for b in batches:
                if b[-1] > pos:
                    yield pos, b[-1]
                    pos = b[-1]

        self.acc, self.recorded, self.resume_device = acc, recorded, dev
        self.dead_at = lambda: {s.name: s.dead_at for s in schemes}
        return advance, drain, session, whole, load, close, info, spans



def _phases(marks: dict, compile_s: float) -> dict:
    """Seconds per phase from consecutive time marks; ``compile`` (the first launches' host
    time: Triton compiles, or loads from its cache, each kernel there) is taken out of
    ``kernels``."""
    ph = {k: marks[k] - marks[p] for p, k in zip(list(marks)[:-1], list(marks)[1:], strict=True)}
    ph = {"setup": ph["setup"], "compile": compile_s, "kernels": ph["kernels"] - compile_s,
          "metrics": ph["metrics"]}
    return {k: round(v, 4) for k, v in ph.items()}


def _gpu_idle(e_loop, timed) -> dict:
    """Where the GPU's stream waited for the host: before the first step launch (inputs,
    setup), between consecutive step launches (all, the first 8 and the largest), seconds."""
    gaps = [a[1].elapsed_time(b[0]) / 1e3 for a, b in zip(timed[:-1], timed[1:], strict=True)]
    return {"before_first": round(e_loop.elapsed_time(timed[0][0]) / 1e3, 4),
            "between": round(sum(gaps), 4), "first8": [round(g, 4) for g in gaps[:8]],
            "largest": sorted((round(g, 4) for g in gaps), reverse=True)[:5]}


_READOUTS: dict = {}


def _readout(width: int, vocab: int, scale: float, dev) -> Readout:
    """The readout head (deterministic per shape), built once per process and device: drawing
    its vocab x width float64 matrix on the host costs ~0.1 s at 1024 x 8192."""
    key = (width, vocab, float(scale), str(dev))
    if key not in _READOUTS:
        _READOUTS.clear()
        _READOUTS[key] = Readout(width, vocab, scale, dev)
    return _READOUTS[key]


def _compile_together(calls: list, ahead: list = ()) -> None:
    """Compile (or load) the kernels of a run's launch groups (``calls``: each group's first
    launch) in threads before the first launch: Triton's compiler and ``ptxas`` overlap (two
    kernels took 14.2 s together against 11.7 s for one on a 2-core machine), where the first
    launches compiled one after the other. ``ahead``: kernels a later job of the sweep will need
    (:attr:`Options.sweep_blocks`), compiled at the same time and kept in Triton's caches.
    Each thread then builds its kernel's launcher as well (:func:`build_launcher`).
    A failure here is left to the launch itself to report."""
    from concurrent.futures import ThreadPoolExecutor

    def one(call) -> None:
        build_launcher(call(warmup=True))

    with ThreadPoolExecutor(max_workers=len(calls) + len(ahead)) as pool:
        for f in [pool.submit(one, call) for call in [*calls, *ahead]]:
            try:
                f.result()
            except Exception as e:  # noqa: BLE001 - a launch raises it again, with context
                log.debug("precsim: compiling ahead failed: %r", e)


def build_launcher(kernel) -> None:
    """Build a compiled kernel's launcher without loading the kernel on a device. Triton 3.6
    builds each kernel signature's C launcher with the C compiler at the kernel's first launch
    (0.2-0.5 s each on the H200 machine, then cached on disk), one after another on the
    launching thread: after the side-by-side compiles of a fresh run, 0.7 s before its first
    launch. Built here, the launch finds it in Triton's cache (a later Triton's launcher
    compiles nothing)."""
    try:
        from triton.runtime import driver

        driver.active.launcher_cls(kernel.src, kernel.metadata)
    except Exception as e:  # noqa: BLE001 - another Triton: the first launch builds it
        log.debug("precsim: building a launcher ahead failed: %r", e)


def launch_span(fam, inp, S64, st, rd, y64, y32, k1, ph, k0, idx, codes, truth, t0, n, steps, H,
                blk, LB, nw, maxnreg, *, lpt, buf, sfloor, scope, u_master, kernels, order,
                ef=None, efs=0, runtime=False, warmup=False):
    """One kernel launch over steps [t0, t0+n): the schemes in storage slots ``idx``
    (contiguous, kernel codes ``codes``) and the truth if ``truth``."""
    N = S64.shape[2]
    common = dict(S64=S64, st=st, rd=rd, y64=y64, y32=y32, k1=k1, ph=ph, k0=k0, t0=t0, n=n,
                  total=steps, slots=idx, codes=list(codes), truth=truth, blk=blk or min(16, N),
                  LB=LB, buf=buf, sfloor=sfloor, scope=scope, order=order(truth, list(codes), lpt),
                  num_warps=nw, maxnreg=maxnreg, ef=ef, efs=efs, runtime=runtime, warmup=warmup)
    kern = get_family(fam).KERNEL
    return kernels[kern].launch(**LAUNCH_INPUTS[kern](inp, H, u_master), **common)


def kernel_sets() -> dict:
    """The Triton kernel modules by a family's ``KERNEL`` (:mod:`precsim.families`): what
    :func:`launch_span`'s ``kernels`` takes."""
    from precsim.kernels import gdn, mamba2

    return {"mamba2": mamba2, "gdn": gdn}
