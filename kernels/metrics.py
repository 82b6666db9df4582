"""Window metrics for the Triton engine without a host round trip per window.

``DeviceAccumulator`` is ``precsim.metrics.Accumulator`` with the same statistics (rel_err mean
and max, KL through the readout head, state drift) computed the same way, except that every
scheme of a window is reduced in one batch (one readout matmul for all schemes) and the results
stay on the device until :meth:`DeviceAccumulator.to_host` (one copy after ``finish()``). The
base class's per-scheme ``.cpu()`` calls cost a host-device synchronisation each, which at 128
windows x 5 schemes took longer than the kernels themselves. The KL's difference matmul (all
schemes in one) runs in TF32 on CUDA: ~1e-3 relative on the KL (see :func:`_kl`).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import triton
import triton.language as tl

from precsim.metrics import Accumulator


@contextlib.contextmanager
def _tf32_matmul(on: bool):
    """TF32 for float32 CUDA matmuls inside the block (restored after)."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = bool(on)
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def _kl(readout, yh_ref, logp_ref, y_sim, tf32: bool) -> torch.Tensor:
    """``Readout.kl`` with the difference matmul ``(yh_sim - yh_ref) @ W^T`` in TF32 when
    ``tf32`` (CUDA only; the CPU ignores the flag). The product is a small correction to the
    float64 reference logits, so TF32's ~5e-4 relative input rounding moves the logit
    difference, and hence the KL (quadratic in it), by ~1e-3 relative, not the logits."""
    d = readout.normalise(y_sim.to(torch.float64)) - yh_ref
    with _tf32_matmul(tf32):
        prod = d.to(torch.float32) @ readout.W32.T
    logp_sim = torch.log_softmax(logp_ref + readout.scale * prod.to(torch.float64), dim=-1)
    return torch.sum(torch.exp(logp_ref) * (logp_ref - logp_sim), dim=-1).clamp(min=0.0)


@triton.jit
def _row_chunk(ys_row, yr_row, x_row, D_ptr, c, m, dead, P: tl.constexpr, HAS_D: tl.constexpr):
    """Columns ``c`` of one output row: the scheme's (float64, NaN if ``dead``) and the truth's,
    each with its skip term ``D x`` (float32 for the scheme, float64 for the truth)."""
    ys = tl.load(ys_row + c, mask=m, other=0.0)
    yr = tl.load(yr_row + c, mask=m, other=0.0)
    if HAS_D:
        Dh = tl.load(D_ptr + c // P, mask=m, other=0.0)
        xv = tl.load(x_row + c, mask=m, other=0.0)
        yr = yr + Dh * xv
        ys = ys + Dh.to(tl.float32) * xv.to(tl.float32)
    return tl.where(dead, float("nan"), ys).to(tl.float64), yr


@triton.jit(do_not_specialize=["ROWS", "W"])
def _row_stats_kernel(y32_ptr, y64_ptr, x_ptr, D_ptr, dead_ptr, err_ptr, bad_ptr, d_ptr, yh_ptr,
                      ROWS, W, P: tl.constexpr, HAS_D: tl.constexpr, KL: tl.constexpr,
                      BW: tl.constexpr):
    """One output row (a step of one sequence, width W = H*P) of one scheme slot: rel_err, the
    non-finite flag and, for the KL, the normalised difference ``yh_sim - yh_ref`` (float32) and
    ``yh_ref`` (float64, slot 0 only). The skip term ``D x`` is added as the torch path does
    (float64 for the truth, float32 for the schemes); a dead slot's outputs read as NaN."""
    r = tl.program_id(0)
    k = tl.program_id(1)
    ys_row = y32_ptr + (k * ROWS + r).to(tl.int64) * W
    yr_row = y64_ptr + r.to(tl.int64) * W
    x_row = x_ptr + r.to(tl.int64) * W
    dead = tl.load(dead_ptr + k) != 0
    ss = tl.zeros([BW], tl.float64)
    rr = tl.zeros([BW], tl.float64)
    ee = tl.zeros([BW], tl.float64)
    for c0 in range(0, W, BW):
        c = c0 + tl.arange(0, BW)
        m = c < W
        y, yr = _row_chunk(ys_row, yr_row, x_row, D_ptr, c, m, dead, P, HAS_D)
        ss += tl.where(m, y * y, 0.0)
        rr += yr * yr
        ee += tl.where(m, (y - yr) * (y - yr), 0.0)
    s_ss = tl.sum(ss, axis=0)
    s_rr = tl.sum(rr, axis=0)
    tl.store(err_ptr + k * ROWS + r, tl.sqrt(tl.sum(ee, axis=0)) / tl.sqrt(s_rr))
    tl.store(bad_ptr + k * ROWS + r, (s_ss - s_ss != 0).to(tl.int8))
    if KL:  # Readout.normalise: y / rms (1 where rms == 0)
        rms_s = tl.sqrt(s_ss / W)
        rms_r = tl.sqrt(s_rr / W)
        rms_s = tl.where(rms_s > 0, rms_s, 1.0)
        rms_r = tl.where(rms_r > 0, rms_r, 1.0)
        d_row = d_ptr + (k * ROWS + r).to(tl.int64) * W
        for c0 in range(0, W, BW):
            c = c0 + tl.arange(0, BW)
            m = c < W
            y, yr = _row_chunk(ys_row, yr_row, x_row, D_ptr, c, m, dead, P, HAS_D)
            yh = yr / rms_r
            tl.store(d_row + c, (y / rms_s - yh).to(tl.float32), mask=m)
            if k == 0:
                tl.store(yh_ptr + r.to(tl.int64) * W + c, yh, mask=m)


def row_stats(y32, y64, x, D, dead, rows: int, P: int, kl: bool):
    """Fused per-row statistics of one launch window (all scheme slots at once).

    ``y32 (k, n, S*H, P)`` float32 scheme outputs (storage slots), ``y64 (n, S*H, P)`` the truth
    (``rows = n*S`` rows of width ``W = H*P``), ``x`` the inputs for the skip term ``D x``
    (Mamba-2; None without D), ``dead (k,)`` bool. Returns ``err (k, rows)`` float64 rel_err,
    ``bad (k, rows)`` bool (a non-finite output), and for the KL ``d (k, rows, W)`` float32 and
    ``yh_ref (rows, W)`` float64 (else None). One pass over the outputs instead of ~20 torch
    kernels over float64 copies.
    """
    k = y32.shape[0]
    ROWS = rows
    W = y64.numel() // ROWS
    dev = y32.device
    err = torch.empty((k, ROWS), dtype=torch.float64, device=dev)
    bad = torch.empty((k, ROWS), dtype=torch.int8, device=dev)
    d = torch.empty((k, ROWS, W), dtype=torch.float32, device=dev) if kl else err
    yh = torch.empty((ROWS, W), dtype=torch.float64, device=dev) if kl else err
    has_d = D is not None
    xx = x.to(torch.float64).contiguous() if has_d else y64
    _row_stats_kernel[(ROWS, k)](y32, y64, xx, D if has_d else y64, dead, err, bad, d, yh, ROWS,
                                 W, P=P, HAS_D=has_d, KL=kl,
                                 BW=min(1024, triton.next_power_of_2(W)), num_warps=4)
    return err, bad.bool(), (d if kl else None), (yh if kl else None)


@triton.jit(do_not_specialize=["E", "NCH"])
def _drift_kernel(ref_ptr, st_ptr, rd_ptr, out_ptr, E, NCH, CH: tl.constexpr, BW: tl.constexpr):
    """Partial sums over one chunk of a sequence's layer state: ``|st - ref|^2``,
    ``|rd - ref|^2`` (float32 copies against the float64 truth) and ``|ref|^2``."""
    c = tl.program_id(0)
    s = tl.program_id(1)
    k = tl.program_id(2)
    S = tl.num_programs(1)
    ref_row = ref_ptr + s.to(tl.int64) * E
    off = (k * S + s).to(tl.int64) * E
    a_s = tl.zeros([BW], tl.float64)
    a_r = tl.zeros([BW], tl.float64)
    a_n = tl.zeros([BW], tl.float64)
    for c0 in range(0, CH, BW):
        e = c * CH + c0 + tl.arange(0, BW)
        m = e < E
        rf = tl.load(ref_row + e, mask=m, other=0.0)
        da = tl.load(st_ptr + off + e, mask=m, other=0.0).to(tl.float64) - rf
        db = tl.load(rd_ptr + off + e, mask=m, other=0.0).to(tl.float64) - rf
        a_s += da * da
        a_r += db * db
        a_n += rf * rf
    o = out_ptr + ((k * S + s) * 3) * NCH + c
    tl.store(o, tl.sum(a_s, axis=0))
    tl.store(o + NCH, tl.sum(a_r, axis=0))
    tl.store(o + 2 * NCH, tl.sum(a_n, axis=0))


def drift_partials(ref, st, rd, k: int, S: int) -> torch.Tensor:
    """Partial sums of the state drift of ``k`` scheme slots, ``(k, S, 3, chunks)`` float64
    (``|st_i - ref|^2``, ``|rd_i - ref|^2``, ``|ref|^2`` per chunk of a sequence's state), for
    ``ref (S, ...)`` float64 and ``st``/``rd`` ``(>=k, S, ...)`` float32: one read of the states,
    one launch; :func:`drift_from_partials` finishes them (later, many samples at once)."""
    E = ref.numel() // S
    CH = 16384
    NCH = triton.cdiv(E, CH)
    out = torch.empty((k, S, 3, NCH), dtype=torch.float64, device=ref.device)
    _drift_kernel[(NCH, S, k)](ref, st, rd, out, E, NCH, CH=CH, BW=min(1024, CH), num_warps=4)
    return out


def drift_from_partials(parts: torch.Tensor):
    """``|st_i - ref| / |ref|`` and ``|rd_i - ref| / |ref|`` ``(..., k, S)`` from
    :func:`drift_partials` outputs ``(..., k, S, 3, chunks)`` (stacked samples welcome)."""
    tot = parts.sum(dim=-1)
    rn = torch.sqrt(tot[..., :1, :, 2])
    rn = torch.where(rn > 0, rn, torch.ones_like(rn))
    return torch.sqrt(tot[..., 0]) / rn, torch.sqrt(tot[..., 1]) / rn


def drift_norms(ref, st, rd, k: int, S: int):
    """State drift of ``k`` scheme slots: ``|st_i - ref| / |ref|`` and ``|rd_i - ref| / |ref|``
    per sequence (``(k, S)`` each, float64) for ``ref (S, ...)`` float64 and ``st``/``rd``
    ``(>=k, S, ...)`` float32, as ``DeviceAccumulator.record_drift_stacked`` computes them but
    in one read of the states (no float64 copies, no snapshot of the states)."""
    return drift_from_partials(drift_partials(ref, st, rd, k, S))


@triton.jit(do_not_specialize=["ROWS"])
def _kl_kernel(ref_ptr, prod_ptr, scale_ptr, out_ptr, ROWS, V, BV: tl.constexpr):
    """KL of one row of one scheme slot, ``Readout.kl`` operation for operation in float64:
    reference logits ``scale * ref[row]`` (``ref = yh_ref W64^T``), ``logp_ref = log_softmax``,
    ``logp_sim = log_softmax(logp_ref + scale * prod)`` (prod the float32 difference product),
    ``sum exp(logp_ref) (logp_ref - logp_sim)`` clamped at 0."""
    r = tl.program_id(0)
    k = tl.program_id(1)
    v = tl.arange(0, BV)
    m = v < V
    scale = tl.load(scale_ptr)  # float64 (a scalar argument would be float32)
    a = tl.load(ref_ptr + r.to(tl.int64) * V + v, mask=m, other=0.0)
    a = tl.where(m, scale * a, float("-inf"))
    sa = a - tl.max(tl.where(a == a, a, float("-inf")), axis=0)
    lp = sa - tl.log(tl.sum(tl.exp(sa), axis=0))
    p = tl.load(prod_ptr + (k * ROWS + r).to(tl.int64) * V + v, mask=m, other=0.0)
    b = lp + scale * p.to(tl.float64)
    # a NaN (dead scheme) must reach the result, as in torch: the max skips it, the sum not
    sb = b - tl.max(tl.where(b == b, b, float("-inf")), axis=0)
    ls = sb - tl.log(tl.sum(tl.exp(sb), axis=0))
    kl = tl.sum(tl.where(m, tl.exp(lp) * (lp - ls), 0.0), axis=0)
    tl.store(out_ptr + k * ROWS + r, tl.maximum(kl, 0.0, propagate_nan=tl.PropagateNan.ALL))


def kl_rows(readout, yh_ref, d, tf32: bool, fused: bool = True) -> torch.Tensor:
    """KL per row (k, rows) from :func:`row_stats`' ``d`` and ``yh_ref``, as ``Readout.kl``:
    reference logits in float64, the difference matmul (all schemes in one) in TF32 on CUDA
    when ``tf32`` (see :func:`_kl`). ``fused`` (default): everything after the two matmuls in
    one Triton pass (:func:`_kl_kernel`); else torch ops."""
    k, rows, W = d.shape
    with _tf32_matmul(tf32):
        prod = (d.reshape(k * rows, W) @ readout.W32.T).view(k, rows, -1)
    ref = yh_ref @ readout.W64.T
    if fused:
        V = ref.shape[-1]
        out = torch.empty((k, rows), dtype=torch.float64, device=d.device)
        sc = getattr(readout, "_scale64", None)
        if sc is None:
            sc = readout._scale64 = torch.tensor([readout.scale], dtype=torch.float64,
                                                 device=d.device)
        _kl_kernel[(rows, k)](ref, prod, sc, out, rows, V, BV=triton.next_power_of_2(V),
                              num_warps=4)
        return out
    logp_ref = torch.log_softmax(readout.scale * ref, dim=-1)
    logp_sim = torch.log_softmax(logp_ref + readout.scale * prod.to(torch.float64), dim=-1)
    return torch.sum(torch.exp(logp_ref) * (logp_ref - logp_sim), dim=-1).clamp(min=0.0)


class DeviceAccumulator(Accumulator):
    """Accumulator whose statistics are device tensors until ``to_host()``.

    ``push(y_ref (m,S,H,P) float64, ys[name] (m,S,H,P))`` as in the base class (no None: a dead
    scheme's outputs are NaN already); ``record_drift`` likewise. ``tf32`` (default True): the KL
    difference matmul runs in TF32 on CUDA (see :func:`_kl`).
    """

    tf32 = True

    def push_stats(self, err: torch.Tensor, kl: torch.Tensor | None) -> None:
        """Per-step statistics already reduced over the width (:func:`row_stats`):
        ``err``/``kl`` ``(k, m, S)`` in ``self.names`` order; windows as :meth:`push`."""
        if not hasattr(self, "_err"):
            self._err, self._kl = [], []
        self._err.append(err.transpose(0, 1))  # (m, k, S): windows are cut along dim 0
        if kl is not None:
            self._kl.append(kl.transpose(0, 1))
        self._pending += err.shape[1]
        if self._pending >= self.window:  # every whole window at once
            self._reduce_stats(self.window, self._pending // self.window)

    def _reduce(self, n: int) -> None:
        if getattr(self, "_err", None):
            return self._reduce_stats(n)
        y_ref = self._take(self._ref, n)
        S = y_ref.shape[1]
        yr = y_ref.reshape(n, S, -1)
        ref_norm = torch.linalg.vector_norm(yr, dim=-1)
        ys = torch.stack([self._take(self._sim[name], n).reshape(n, S, -1)
                          for name in self.names]).to(torch.float64)  # (k, n, S, width)
        err = torch.linalg.vector_norm(ys - yr, dim=-1) / ref_norm  # (k, n, S)
        kl = None
        if self.readout is not None:
            yh_ref, logp_ref = self.readout.ref(yr)
            kl = _kl(self.readout, yh_ref, logp_ref, ys, self.tf32).mean(dim=1)  # (k, S)
        mean, top, per_step = err.mean(dim=1), err.amax(dim=1), err.mean(dim=2)
        entry = {"step": self.done + n, "len": n}
        for i, name in enumerate(self.names):
            self.per_step_rel_err[name].append(per_step[i])
            stats = {"rel_err": mean[i], "rel_err_max": top[i]}
            if kl is not None:
                stats["kl"] = kl[i]
            entry[name] = stats
        self.windows.append(entry)
        self.done += n
        self._pending -= n

    def _reduce_stats(self, n: int, m: int = 1) -> None:
        """``m`` windows of ``n`` steps from the pushed statistics, in a few device ops; the
        windows' entries are filled in by :meth:`to_host` (no per-window, per-scheme ops)."""
        err = self._take(self._err, n * m).transpose(0, 1)  # (k, m n, S)
        k, _, S = err.shape
        err = err.reshape(k, m, n, S)
        stats = {"rel_err": err.mean(dim=2), "rel_err_max": err.amax(dim=2)}  # (k, m, S)
        if self._kl:
            stats["kl"] = self._take(self._kl, n * m).transpose(0, 1).reshape(
                k, m, n, S).mean(dim=2)
        if not hasattr(self, "_batches"):
            self._batches = []
        self._batches.append((len(self.windows), len(self.per_step_rel_err[self.names[0]]),
                              stats, err.mean(dim=3)))  # per-step rel_err (k, m, n)
        for w in range(m):
            self.windows.append({"step": self.done + (w + 1) * n, "len": n,
                                 **{name: {} for name in self.names}})
        for name in self.names:
            self.per_step_rel_err[name] += [None] * m
        self.done += n * m
        self._pending -= n * m

    def _fill_batches(self) -> None:
        """Copy the statistics of :meth:`_reduce_stats` to the host in one transfer and fill
        in the windows' entries and per-step rel_err."""
        batches = getattr(self, "_batches", [])
        if not batches:
            return
        parts = [t for _, _, stats, ps in batches for t in (*stats.values(), ps)]
        flat = torch.cat([t.reshape(-1).to(torch.float64) for t in parts]).cpu().numpy()
        at = 0
        for w0, p0, stats, ps in batches:
            vals = {}
            for key, t in (*stats.items(), ("per_step", ps)):
                vals[key] = flat[at:at + t.numel()].reshape(tuple(t.shape))
                at += t.numel()
            for i, name in enumerate(self.names):
                for w in range(vals["per_step"].shape[1]):
                    self.windows[w0 + w][name] = {key: v[i, w] for key, v in vals.items()
                                                  if key != "per_step"}
                    self.per_step_rel_err[name][p0 + w] = vals["per_step"][i, w]
        self._batches = []

    def _keep(self, t: torch.Tensor) -> torch.Tensor:
        return t  # stays on the device until to_host()

    def record_drift_stacked(self, pos: int, ref_state: torch.Tensor, states: torch.Tensor,
                             reads: torch.Tensor, names: list[str], has_read: list[bool]) -> None:
        """record_drift for states stacked by scheme: ``states``/``reads`` (k, S, ...) float32,
        ``names[i]`` the scheme of row i, ``has_read[i]`` whether it keeps a read copy."""
        S = ref_state.shape[0]
        rf = ref_state.reshape(S, -1)
        rn = torch.linalg.vector_norm(rf, dim=-1)
        rn = torch.where(rn > 0, rn, torch.ones_like(rn))
        k = len(names)
        d_st = torch.linalg.vector_norm(states.reshape(k, S, -1).to(torch.float64) - rf,
                                        dim=-1) / rn
        d_rd = torch.linalg.vector_norm(reads.reshape(k, S, -1).to(torch.float64) - rf,
                                        dim=-1) / rn
        self.record_drift_norms(pos, d_st, d_rd, names, has_read)

    def record_drift_norms(self, pos: int, d_st: torch.Tensor, d_rd: torch.Tensor,
                           names: list[str], has_read: list[bool]) -> None:
        """record_drift from drifts already reduced (:func:`drift_norms`): ``d_st``/``d_rd``
        ``(k, S)``, row i of scheme ``names[i]``."""
        out = {name: {"state": d_st[i], **({"read": d_rd[i]} if has_read[i] else {})}
               for i, name in enumerate(names)}
        self._store_drift(pos, out)

    def to_host(self, dead_at: dict[str, int | None]) -> None:
        """Copy every statistic to NumPy at once; drop the drift of schemes dead by then."""
        self._fill_batches()
        slots: list[tuple[dict, object, torch.Tensor]] = []
        for w in self.windows:
            for name in self.names:
                slots += [(w[name], k, v) for k, v in w[name].items()]
        for parts in self.per_step_rel_err.values():
            slots += [(parts, i, v) for i, v in enumerate(parts)]
        seen: set[int] = set()
        for out in self.drift.values():
            if id(out) not in seen:
                seen.add(id(out))
                slots += [(d, k, v) for d in out.values() for k, v in d.items()]
        slots = [s for s in slots if isinstance(s[2], torch.Tensor)]
        if slots:
            flat = torch.cat([v.reshape(-1).to(torch.float64) for _, _, v in slots]).cpu()
            flat = flat.numpy()
            at = 0
            for box, key, v in slots:
                box[key] = flat[at:at + v.numel()].reshape(tuple(v.shape))
                at += v.numel()
        for pos in list(self.drift):
            out = self.drift[pos]
            gone = [n for n, d in dead_at.items() if d is not None and d <= pos and n in out]
            if gone:  # run_torch records no drift for a scheme dead at that flush
                self.drift[pos] = {**out, **{n: {} for n in gone}}
        for name, parts in self.per_step_rel_err.items():
            self.per_step_rel_err[name] = [np.asarray(p) for p in parts]

