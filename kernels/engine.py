"""The Triton engine: host driver of the fused kernels, returning a ``precsim.engine.Result``.

The horizon is cut into *launch windows* that end at the first flush at or after each metrics
window end (so the ReplaySSM buffers start empty in every launch and state drift is sampled
where the torch engine samples it). Per launch: the inputs of the window are put on the device
(``inputs="host"``: the run's workload, the same stream as the CPU engine; ``"device"``: the
counter-based generator of :mod:`precsim.kernels.inputs`), one kernel launch advances the float64
truth and every scheme, and the per-step outputs go through ``precsim.metrics.Accumulator`` on
the device (rel_err, KL through the readout head), exactly as in ``run_torch``. States stay in
device memory between launches: a launch reads and writes each state copy once.

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

from precsim import formats as pf
from precsim.config import Config
from precsim.engine import Result, _progress
from precsim.errors import PrecsimError
from precsim.metrics import Readout
from precsim.schemes import build_schemes
from precsim.ssm import get_family
from precsim.workload import make_workload

from .metrics import DeviceAccumulator, drift_from_partials, drift_partials, kl_rows, row_stats
from .quant import (
    IEEE,
    SCALED_BASE,
    SCOPE_MATRIX,
    SCOPE_NONE,
    SR,
    _i32,
    block_of,
    fmt_id,
    scale_flags,
    sr_bits_of,
)
from .rng import event_keys

log = logging.getLogger("precsim.kernels")
KINDS = {"conventional": 0, "shared": 1, "split": 2}
BUF_IDS = {"fp32": 0, "fp64": 0, "bf16": 1, "fp16": 2}
MAX_SCHEMES = 8


def scheme_code(s) -> int:
    """Pack a SchemeConfig into the kernels' constexpr code (see ``mamba2._scheme``)."""
    rnd = SR if s.rounding == "sr" else 0
    srb = sr_bits_of(s.fmt, s.sr_bits) if rnd else 0
    rf = fmt_id(s.read_fmt) if s.kind == "split" else 0
    return (KINDS[s.kind] + 4 * fmt_id(s.fmt) + 64 * rf + 1024 * rnd
            + 2048 * (IEEE if s.overflow == "ieee" else 0) + 4096 * srb)


def scheme_block(s) -> int:
    """Block size a scheme's tiles need (0: any); raises PrecsimError on two different blocks."""
    blocks = {block_of(f) for f in (s.fmt, s.read_fmt) if f} - {0}
    if len(blocks) > 1:
        raise PrecsimError(f"scheme {s.kind}({s.fmt}, read {s.read_fmt}) mixes block sizes "
                           f"{sorted(blocks)}")
    return blocks.pop() if blocks else 0


def slot_cost(code: int | None) -> int:
    """Rough relative cost of a kernel slot per step (None: the float64 truth), for the dispatch
    order: every-step block quantisation (measured ~3.5x the truth per step on the H200) >
    ReplaySSM (~1.6x) > every-step element rounding > truth, conventional FP32."""
    if code is None:
        return 1
    kind, fmt, rnd = code % 4, (code // 4) % 16, (code // 1024) % 2
    if kind != 0:
        return 4
    return 6 + rnd if fmt >= 6 else (3 + rnd if fmt > 0 else 1)


def dispatch_order(truth: bool, codes: list[int], lpt: bool = True) -> int:
    """The kernels' ``ORDER``: grid column k runs slot ``(ORDER >> 4k) & 15`` (slot 0 the truth
    when ``truth``). With ``lpt`` the costliest slots come first (longest-processing-time
    order: a launch's cheap programs fill the SMs behind the long ones instead of the long ones
    running alone at its end); else the identity."""
    costs = ([slot_cost(None)] if truth else []) + [slot_cost(c) for c in codes]
    order = sorted(range(len(costs)), key=lambda k: -costs[k]) if lpt else range(len(costs))
    return sum(k << (4 * pos) for pos, k in enumerate(order))


def _pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


def unsupported_reason(cfg: Config) -> str | None:
    """Why the Triton engine cannot run ``cfg`` (None if it can)."""
    r, m = cfg.replay, cfg.model
    if r.drafts > 0:
        return "speculative decoding (replay.drafts > 0)"
    if cfg.run.compute_dtype != "fp32":
        return f"run.compute_dtype={cfg.run.compute_dtype} (kernels compute in fp32)"
    if m.family == "gdn" and r.gdn_u_source not in ("read", "master"):
        return f"replay.gdn_u_source={r.gdn_u_source}"
    two_level = any(pf.get(f).kind == "block" and pf.get(f).two_level
                    for s in cfg.schemes.values() for f in (s.fmt, s.read_fmt) if f)
    if two_level and cfg.formats.tensor_scope == "tensor":
        return "formats.tensor_scope=tensor (an NVFP4 scale over the whole layer couples heads)"
    rowscaled = [f for s in cfg.schemes.values() for f in (s.fmt, s.read_fmt)
                 if f and fmt_id(f) >= SCALED_BASE]
    if rowscaled:  # the scheme code holds 4 bits per format
        return f"row-scaled format {rowscaled[0]} (not in the kernels' scheme code)"
    if cfg.formats.sr_source != "hash":
        return f"formats.sr_source={cfg.formats.sr_source} (the kernels' SR uses the hash)"
    if cfg.formats.rotate:
        return "formats.rotate=true (no Hadamard rotation in the kernels)"
    P, N = m.head_dim, m.state_dim
    if not (_pow2(P) and _pow2(N) and P >= 16 and N >= 16):
        return f"head_dim={P}, state_dim={N} (kernels need powers of two >= 16)"
    for name, s in cfg.schemes.items():
        try:
            scheme_block(s)
        except PrecsimError as e:
            return f"{name}: {e}"
    return None


def launch_ends(steps: int, window: int, L: int) -> list[int]:
    """Ends of the launch windows: the first flush at or after each metrics window end."""
    ends = []
    k = 1
    while not ends or ends[-1] < steps:
        e = min(steps, L * math.ceil(k * window / L))
        if not ends or e > ends[-1]:
            ends.append(e)
        k += 1
    return ends


def _groups(codes: list[int], blocks: list[int]) -> list[tuple[int, list[int]]]:
    """Schemes per launch: (block, indices), at most MAX_SCHEMES each, one block size each."""
    by_blk: dict[int, list[int]] = {}
    for i, b in enumerate(blocks):
        by_blk.setdefault(b, []).append(i)
    anyb = by_blk.pop(0, [])
    if not by_blk:
        by_blk[16] = []
    first = min(by_blk)
    by_blk[first] = anyb + by_blk[first]
    out = []
    for b, idx in sorted(by_blk.items()):
        for k in range(0, max(len(idx), 1), MAX_SCHEMES):
            out.append((b, idx[k:k + MAX_SCHEMES]))
    return out


def run_triton(cfg: Config, device: str, progress: bool = True, *, inputs: str = "host",
               num_warps: int | None = None, record_outputs=False, overlap: bool | None = None,
               skip_metrics: bool = False, poison: bool = False,
               kl_tf32: bool = True, fused_metrics: bool = True, lpt: bool = True,
               maxnreg: int | None = None, kl_fused: bool = True,
               prefetch: bool = True, metrics_batch: int = 8, priority: bool = True) -> Result:
    """Run ``cfg`` with the fused kernels; same Result as ``precsim.engine.run_torch``.

    ``inputs``: ``"host"`` streams the run's workload (the CPU engine's exact inputs) or
    ``"device"`` generates them on the device (:mod:`precsim.kernels.inputs`, same
    distributions, a different stream). ``overlap`` (default: on CUDA) reduces window k's
    metrics on a side stream while window k+1's kernel runs. ``record_outputs``: True or a list
    of names ("truth", scheme names) whose per-step outputs go to ``info["outputs"]``.
    ``skip_metrics`` (benchmarks) leaves the metrics stage out: no rows. ``kl_tf32``: the KL's
    difference matmul in TF32 on CUDA (~1e-3 relative on the KL; False: IEEE float32).
    ``poison`` fills the output buffers with NaN before each launch (checks that the kernels
    write every output). ``fused_metrics`` (default) reduces each window's outputs in one Triton
    pass (:func:`precsim.kernels.metrics.row_stats`); False: the torch ops of
    ``DeviceAccumulator.push`` (also used when outputs are recorded).
    ``lpt`` (default) dispatches the costliest slots' programs first (:func:`dispatch_order`);
    ``maxnreg`` caps the kernels' registers per thread (Triton's option; benchmarks).
    ``kl_fused`` (default, fused metrics only): the KL after its two matmuls in one Triton pass
    (:func:`metrics.kl_rows`).
    ``prefetch`` (default, CUDA): the next window's inputs are drawn on a side stream while the
    current kernel runs (device inputs only). ``metrics_batch``: launch windows whose inputs and
    fused window metrics are drawn and reduced together (fewer, larger device ops).
    ``priority`` (default, CUDA): the kernels run on a high-priority stream.
    Unsupported settings fall back to the torch engine with a logged note
    (``Result.info["triton_fallback"]``).
    """
    wl = make_workload(cfg)  # a trace may reset model.* from its own shape
    reason = unsupported_reason(cfg)
    if reason is not None:
        from precsim.engine import run_torch

        log.warning("precsim: the Triton engine does not support %s; running the torch engine",
                    reason)
        res = run_torch(cfg, device, progress=progress)
        res.info["triton_fallback"] = reason
        return res
    t_start = time.perf_counter()
    dev = torch.device(device)
    family = get_family(cfg.model.family)
    if inputs == "device":
        from .inputs import CounterInputs

        src = CounterInputs(cfg, wl.params, dev)
    elif inputs == "host":
        src = None
    else:
        raise PrecsimError(f"inputs={inputs!r} is unknown; allowed: host, device")
    m = cfg.model
    Sq, H = cfg.run.seqs, m.heads
    P, N = family.state_dims(m)
    schemes = build_schemes(cfg)
    ns = len(schemes)
    L, steps = cfg.replay.buffer_len, cfg.run.steps
    codes = [scheme_code(s.cfg) for s in schemes]
    groups = _groups(codes, [scheme_block(s.cfg) for s in schemes])
    order = [i for _, idx in groups for i in idx]  # storage slot of each scheme: groups contiguous
    slot = {i: order.index(i) for i in range(ns)}
    SH = Sq * H
    S64 = torch.zeros((SH, P, N), dtype=torch.float64, device=dev)
    st = torch.zeros((max(ns, 1), SH, P, N), dtype=torch.float32, device=dev)
    rd = torch.zeros_like(st)
    keys = np.zeros((max(ns, 1), steps), dtype=np.uint32)
    ev = np.arange(steps, dtype=np.int64)
    k0 = 0
    for i, s in enumerate(schemes):
        if s.cfg.rounding == "sr":
            k0, keys[slot[i]] = event_keys(cfg.run.seed, s.name, ev if not s.replay else ev // L, 0)
    k1 = torch.from_numpy(keys.view(np.int32)).to(dev)
    readout = _readout(H * P, cfg.metrics.vocab, cfg.metrics.logit_scale, dev) \
        if cfg.metrics.kl else None
    acc = DeviceAccumulator([s.name for s in schemes], cfg.metrics.window, readout)
    acc.tf32 = kl_tf32
    params = {k: torch.as_tensor(v, dtype=torch.float64, device=dev)
              for k, v in wl.params.items()}
    D = params.get("D") if family.name == "mamba2" else None
    nw = num_warps or (4 if P * N <= 8192 else 8)
    LB = max(16, 1 << (L - 1).bit_length())
    cuda = dev.type == "cuda"
    overlap = cuda if overlap is None else (overlap and cuda)
    side = torch.cuda.Stream(device=dev) if overlap else None
    names = ["truth", *(s.name for s in schemes)]
    want = set(names) if record_outputs is True else set(record_outputs or ())
    recorded: dict[str, list] = {n: [] for n in names if n in want}
    shape4 = (Sq, H, P, N)
    # dead schemes, tracked on the device in storage order (no host sync per window)
    dead = torch.zeros(max(ns, 1), dtype=torch.bool, device=dev)
    dead_at = torch.full((max(ns, 1),), -1, dtype=torch.int64, device=dev)
    by_slot = sorted(range(ns), key=lambda i: slot[i])
    split = [schemes[i].kind == "split" for i in by_slot]
    # fused window metrics (kernels.metrics.row_stats) unless per-step outputs are recorded
    fused = ns > 0 and not recorded and fused_metrics
    perm = torch.tensor([slot[i] for i in range(ns)], dtype=torch.int64, device=dev)

    def process(item) -> None:
        """Window metrics (rel_err, KL, drift) and dead-scheme checks, as run_torch does; all
        schemes at once (few device ops per window: the host must stay ahead of the GPU)."""
        nonlocal dead, dead_at
        t0, t1, inp, y64, y32, states, done = item
        n = t1 - t0
        ctx = torch.cuda.stream(side) if side is not None else contextlib.nullcontext()
        with ctx:
            if side is not None:  # kernel done; main-stream memory is in use on side too
                side.wait_event(done)
                for t in (y64, y32, *inp.values(), *(states or ())):
                    t.record_stream(side)
            if fused:  # one Triton pass per window: rel_err, non-finite flags, KL inputs
                err, bad, dd, yh = row_stats(y32[:ns], y64, inp.get("x"), D, dead, n * Sq, P,
                                             readout is not None and not skip_metrics)
                bad = bad.view(ns, n, Sq).any(dim=2)
                anyb = bad.any(dim=1)
                first = t0 + 1 + torch.argmax(bad.to(torch.int8), dim=1)
                dead_at = torch.where(anyb & ~dead, first, dead_at)
                dead = dead | anyb
                if not skip_metrics:
                    kl = None if dd is None else kl_rows(
                        readout, yh, dd, kl_tf32, kl_fused)[perm].view(ns, n, Sq)
                    acc.push_stats(err[perm].view(ns, n, Sq), kl)
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

    bar = _progress(cfg, progress)
    t_loop = time.perf_counter()
    pending, timed, kern, side_done, host_wait = None, [], {}, [], 0.0
    ends = launch_ends(steps, cfg.metrics.window, L)
    # launch windows per metrics batch: the inputs and window metrics of G launches are drawn
    # and reduced together (a few dozen small device ops per batch: the host stays ahead of
    # the GPU); the torch-ops path keeps one launch per batch
    per_win = (ends[0] * SH * P) * (8 * max(ns, 1) + 8 * 4)  # outputs, d, yh, x, inputs
    G = max(1, min(metrics_batch, (1 << 31) // per_win)) if fused else 1
    batches = [ends[k:k + G] for k in range(0, len(ends), G)]
    next_drift = cfg.metrics.window  # fused drift samples, as Accumulator.want_drift
    drift_parts: list[tuple[int, torch.Tensor]] = []

    def prepare(a: int, b: int) -> dict:
        """Inputs of steps [a, b) on the device, with the decays the kernels read."""
        inp = src.chunk(a, b) if src is not None else {
            k: torch.as_tensor(v, device=dev) for k, v in wl.chunk(a, b).items()}
        inp.update(_decays(family.name, inp, params, Sq, H, b - a))
        return inp

    # launches on a high-priority stream: when a launch's programs and the metrics (side
    # stream) or the next inputs (prefetch stream) both wait for SMs, the launch goes first and
    # the others fill the SMs its last programs leave idle
    hi = torch.cuda.Stream(device=dev, priority=-5) if cuda and priority else None
    if hi is not None:
        hi.wait_stream(torch.cuda.current_stream(dev))  # the states were zeroed there
    with torch.cuda.stream(hi) if hi is not None else contextlib.nullcontext():
        # device inputs of batch k+1 are drawn on their own stream while batch k's first
        # kernel runs (they fill the SMs its last programs leave idle, not a launch gap)
        pre = torch.cuda.Stream(device=dev) if cuda and prefetch and src is not None else None
        main = torch.cuda.current_stream(dev) if cuda else None
        if pre is not None:
            pre.wait_stream(main)  # the inputs' parameters were copied on the default stream
        nxt = None
        T0 = 0
        for bi, bends in enumerate(batches):
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
                if len(timed) > 4:  # the host runs ahead without syncs: bound the launches
                    w0 = time.perf_counter()
                    timed[-5][1].synchronize()
                    host_wait += time.perf_counter() - w0
                if cuda:
                    e0 = torch.cuda.Event(enable_timing=True)
                    e1 = torch.cuda.Event(enable_timing=True)
                    e0.record()
                a, b = t0 - T0, t1 - T0
                win = {k: v[a:b] for k, v in inp.items()} if G > 1 else inp
                for gi, (blk, idx) in enumerate(groups):
                    kern[gi] = _launch(family.name, win, params, S64, st, rd, y64[a:b], y32[:, a:b],
                            k1, k0, [slot[i] for i in idx], [codes[i] for i in idx], gi == 0,
                            t0, n, steps, L, Sq, H, P, N, blk, LB, cfg, nw, lpt, maxnreg)
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
                if bar is not None:
                    bar.update(n)
                t0 = t1
            item = (T0, T1, inp, y64, y32, states, e1 if cuda else None)
            if overlap:
                if pending is not None:
                    process(pending)
                pending = item
            else:
                process(item)
            T0 = T1
        if pending is not None:
            process(pending)
    if cuda:
        torch.cuda.synchronize(dev)
    if drift_parts:  # every fused drift sample finished at once, one copy to the host
        d_st, d_rd = drift_from_partials(torch.stack([p for _, p in drift_parts]))
        d_st, d_rd = d_st.cpu().numpy(), d_rd.cpu().numpy()
        names_slot = [schemes[i].name for i in by_slot]
        for j, (pos, _) in enumerate(drift_parts):
            acc.record_drift_norms(pos, d_st[j], d_rd[j], names_slot, split)
    first_bad = dead_at.tolist()
    for i, s in enumerate(schemes):
        s.dead_at = first_bad[slot[i]] if first_bad[slot[i]] >= 0 else None
    acc.finish()
    acc.to_host({s.name: s.dead_at for s in schemes})
    if bar is not None:
        bar.close()
    n_flush = math.ceil(steps / L)
    info = {"flushes": n_flush, "workload": cfg.workload.kind, "mean_segment": steps / n_flush,
            "launches": len(ends) * len(groups), "inputs": inputs, "num_warps": nw,
            "overlap": overlap,
            "kernel_s": sum(a.elapsed_time(b) for a, b in timed) / 1e3 if cuda else None,
            "wall_loop_s": time.perf_counter() - t_loop,
            "host_wait_s": host_wait,  # host blocked on the in-flight bounds (ahead of the GPU)
            "registers": [getattr(k, "n_regs", None) for k in kern.values()],
            "spills": [getattr(k, "n_spills", None) for k in kern.values()],
            "interpreted": os.environ.get("TRITON_INTERPRET") == "1"}
    if recorded:
        info["outputs"] = {k: np.concatenate(v) for k, v in recorded.items()}
    return Result(
        rows=acc.rows(),
        per_step_rel_err={k: np.concatenate(v) for k, v in acc.per_step_rel_err.items() if v},
        schemes={s.name: {"kind": s.kind, "label": s.label, "dead_at": s.dead_at,
                          "fmt": s.cfg.fmt, "rounding": s.cfg.rounding,
                          "read_fmt": s.cfg.read_fmt} for s in schemes},
        engine="triton", device=str(device), wall_s=time.perf_counter() - t_start,
        steps=steps, info=info)


_READOUTS: dict = {}


def _readout(width: int, vocab: int, scale: float, dev) -> Readout:
    """The readout head (deterministic per shape), built once per process and device: drawing
    its vocab x width float64 matrix on the host costs ~0.1 s at 1024 x 8192."""
    key = (width, vocab, float(scale), str(dev))
    if key not in _READOUTS:
        _READOUTS.clear()
        _READOUTS[key] = Readout(width, vocab, scale, dev)
    return _READOUTS[key]


def _decays(fam: str, inp: dict, params: dict, Sq: int, H: int, n: int) -> dict:
    """Per-step decays of a window, ``(n, S*H)`` each, computed as the torch engine does:
    ``_a64`` float64 (the truth), ``_a32`` float32 and ``_dA32`` the float32 log-decay
    (Mamba-2 ``dt A``, GDN ``g``)."""
    if fam == "mamba2":
        dt = inp["dt"].reshape(n, Sq, H)
        A = params["A"]
        a64 = torch.exp(dt * A).reshape(n, Sq * H)
        dA32 = (dt.to(torch.float32) * A.to(torch.float32)).reshape(n, Sq * H)
    else:
        g = inp["g"].reshape(n, Sq * H)
        a64 = torch.exp(g)
        dA32 = g.to(torch.float32)
    return {"_a64": a64, "_a32": torch.exp(dA32), "_dA32": dA32}


def _launch(fam, inp, params, S64, st, rd, y64, y32, k1, k0, idx, codes, truth, t0, n, steps,
            L, Sq, H, P, N, blk, LB, cfg, nw, lpt=True, maxnreg=None):
    """One kernel launch over steps [t0, t0+n): the schemes in storage slots ``idx``
    (contiguous, kernel codes ``codes``) and the truth if ``truth``."""
    SH = Sq * H
    blk = blk or min(16, N)
    cs = list(codes) + [0] * (MAX_SCHEMES - len(idx))
    i0 = idx[0] if idx else 0
    grid = (SH, int(truth) + len(idx))
    common = dict(P=P, NB=N // blk, BLK=blk, LB=LB, TRUTH=int(truth), NSCH=len(idx),
                  BUF=BUF_IDS[cfg.replay.buffer_dtype],
                  SFLOOR=scale_flags(cfg.formats.scale_floor, cfg.formats.nvfp4_scale),
                  SCOPE=SCOPE_NONE if cfg.formats.tensor_scope == "none" else SCOPE_MATRIX,
                  ORDER=dispatch_order(truth, list(codes), lpt),
                  **{f"C{k}": c for k, c in enumerate(cs)}, num_warps=nw,
                  enable_fp_fusion=False, **({"maxnreg": maxnreg} if maxnreg else {}))
    strides = (y32.stride(0), SH * P * N, steps)
    if fam == "mamba2":
        from .mamba2 import mamba2_window

        dt = inp["dt"].reshape(n, -1)
        a64, a32, dA32 = inp["_a64"], inp["_a32"], inp["_dA32"]
        B, C = inp["B"], inp["C"]
        G = B.shape[2]
        return mamba2_window[grid](dt, a64, a32, dA32, inp["x"], B, C, S64, st[i0:], rd[i0:], y64,
                            y32[i0:], k1[i0:, t0:], _i32(k0), t0, n, steps, L, H, H // G, G,
                            SH, Sq * G, *strides, **common)
    else:
        from .gdn import gdn_window

        a64, a32, g32 = inp["_a64"], inp["_a32"], inp["_dA32"]
        return gdn_window[grid](a64, a32, g32, inp["beta"].reshape(n, SH), inp["q"], inp["k"],
                                inp["v"], S64, st[i0:], rd[i0:], y64, y32[i0:], k1[i0:, t0:],
                                _i32(k0), t0, n, steps, L, SH, *strides,
                                U_MASTER=int(cfg.replay.gdn_u_source == "master"), **common)
