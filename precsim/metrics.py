"""Metrics (definitions: docs/metrics.md, docs/design.md): per-step layer-wide ``rel_err``,
``kl`` and top-1 agreement through a fixed random readout head, and ``state_drift``; window means
per sequence, then the mean and 10/50/90th percentiles across sequences. The simulated logits are
``logits_ref + W (yhat_sim - yhat_ref)`` so tiny errors are not lost to rounding. ``flip`` per
window and sequence: the first step (1-based, as ``step``) with ``top1 = 0`` (NaN: none);
:meth:`Accumulator.rows` turns it into ``first_flip`` / ``flipped``.

``Accumulator`` serves the CPU engines. ``DeviceAccumulator`` (the Triton engine) computes the same
statistics the same way, except that every scheme of a window is reduced in one batch (fused by
``precsim.kernels.metrics``) and the results stay on the device until ``to_host()`` (one copy
after ``finish()``): per-scheme ``.cpu()`` calls cost a synchronisation each, which at 128
windows x 5 schemes took longer than the kernels. Its KL difference matmul runs in TF32 on CUDA
(~1e-3 relative on the KL, see :func:`_kl`).
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch

READOUT_SEED = 0x5EED
READOUT_TAG = 0x5EED  # the readout's input tag in the counter-based generator


_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch._C._nn, "mkldnn_linear")


class Readout:
    """Fixed readout head for the KL metric: ``W (vocab, width)``, entries N(0, 1/width) from the
    counter-based generator (``precsim.workload.normals``) keyed by the shape, drawn on the
    device that uses it (the same matrix on every device, up to the last ulp of log/cos)."""

    def __init__(self, width: int, vocab: int, logit_scale: float, device):
        from .workload import normals

        W = normals(READOUT_SEED + width * 7919 + vocab, READOUT_TAG, (width,), 0, vocab,
                    device) / math.sqrt(width)
        self.W64 = W
        self.W32 = W.to(torch.float32)
        self.scale = float(logit_scale)
        self._W32_dnn = None  # W32 in oneDNN's layout, made on the first CPU projection

    def project32(self, d: torch.Tensor) -> torch.Tensor:
        """``d (..., width) @ W32.T`` in float32. On the CPU through oneDNN where torch has it:
        the same IEEE float32 products (summed in another order), ~1.8x faster than torch's
        default BLAS (MKL) on an AMD Zen 5 core, where MKL takes a slower path (6.7 against
        12.3 ms for a 256-step window of 5 schemes, 1280 x 512 x 1024, conversions included)."""
        if d.device.type != "cpu" or not _ONEDNN:
            return d @ self.W32.T
        if self._W32_dnn is None:
            self._W32_dnn = self.W32.to_mkldnn()
        flat = d.reshape(-1, d.shape[-1]).contiguous()
        out = torch._C._nn.mkldnn_linear(flat.to_mkldnn(), self._W32_dnn, None).to_dense()
        return out.view(*d.shape[:-1], out.shape[-1])

    @staticmethod
    def normalise(y: torch.Tensor) -> torch.Tensor:
        rms = torch.sqrt(torch.mean(y * y, dim=-1, keepdim=True))
        return y / torch.where(rms > 0, rms, torch.ones_like(rms))

    def ref(self, y_ref: torch.Tensor):
        yh = self.normalise(y_ref)
        return yh, self.logp(yh)

    def logp(self, yh: torch.Tensor) -> torch.Tensor:
        """The reference's log-probabilities from its normalised outputs (float64)."""
        return torch.log_softmax(self.scale * (yh @ self.W64.T), dim=-1)

    def kl_top1(self, yh_ref, logp_ref, y_sim) -> tuple[torch.Tensor, torch.Tensor]:
        """KL per row and top-1 agreement per row (float64 1/0), see :func:`kl_top1`."""
        d = self.normalise(y_sim.to(torch.float64)) - yh_ref
        prod = self.project32(d.to(torch.float32)).to(torch.float64)
        return kl_top1(logp_ref, self.scale * prod)

    def kl_top1_many(self, yh_ref, logp_ref, ys) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`kl_top1` of every scheme stacked in ``ys (k, ..., width)`` float64, row for
        row the same values: one readout matmul for all schemes, the reference's
        :func:`ref_stats` once, the rest per scheme (arrays that stay in cache: the same ops on
        all schemes at once ran ~5x slower on a 2-core machine). Returns ``(k, ...)`` each."""
        return self.kl_many(logp_ref, (self.normalise(ys) - yh_ref).to(torch.float32))

    def kl_many(self, logp_ref, d) -> tuple[torch.Tensor, torch.Tensor]:
        """KL and top-1 of every scheme from its normalised difference ``d (k, ..., width)``
        float32 (``yh_sim - yh_ref``), as :meth:`kl_top1_many`."""
        prod = self.project32(d)
        ref = ref_stats(logp_ref)
        out = [kl_top1_of(logp_ref, prod[i].to(torch.float64).mul_(self.scale).add_(logp_ref),
                           ref) for i in range(d.shape[0])]
        if not out:
            empty = logp_ref.new_zeros((0, *logp_ref.shape[:-1]))
            return empty, empty
        return torch.stack([o[0] for o in out]), torch.stack([o[1] for o in out])


def ref_stats(logp_ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What :func:`kl_top1` needs of the reference alone: ``p_ref = exp(logp_ref)`` and its
    argmax (once per window instead of once per scheme)."""
    return torch.exp(logp_ref), torch.argmax(logp_ref, dim=-1)


def kl_top1(logp_ref: torch.Tensor, diff: torch.Tensor,
            ref: tuple[torch.Tensor, torch.Tensor] | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """``KL(p_ref || p_sim)`` and the top-1 agreement (float64 1.0 / 0.0) per row, for float64
    reference log-probabilities ``logp_ref (..., V)`` and scaled difference logits
    ``diff = logit_scale * W (yhat_sim - yhat_ref)`` (broadcast against ``logp_ref``);
    ``ref``: :func:`ref_stats` of ``logp_ref`` when already computed.

    The simulated logits are ``logp_ref + diff`` (a per-row constant away from ``logits_ref +
    diff``, so the same argmax); agreement: their argmax equals ``logp_ref``'s (first index on
    ties, as NumPy and torch) and they are all finite (a dead scheme disagrees)."""
    return kl_top1_of(logp_ref, logp_ref + diff, ref if ref is not None else ref_stats(logp_ref))


def kl_top1_of(logp_ref, b, ref) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`kl_top1` from the simulated logits ``b = logp_ref + diff`` (which may be a
    caller's temporary, computed in place) and ``ref = ref_stats(logp_ref)``."""
    p_ref, top_ref = ref
    t = torch.log_softmax(b, dim=-1)
    kl = torch.sub(logp_ref, t, out=t).mul_(p_ref).sum(dim=-1).clamp_(min=0.0)
    agree = (torch.argmax(b, dim=-1) == top_ref) & finite_rows(b)
    return kl, agree.to(torch.float64)


def finite_rows(b: torch.Tensor) -> torch.Tensor:
    """``torch.isfinite(b).all(dim=-1)``. On the CPU faster: a row whose sum is finite has only
    finite entries (one Inf or NaN makes the sum Inf or NaN), so only rows with a non-finite sum
    (a dead scheme, or a sum that overflowed) are checked entry by entry (elsewhere the test
    would cost a device synchronisation)."""
    if b.device.type != "cpu":
        return torch.isfinite(b).all(dim=-1)
    ok = torch.isfinite(torch.sum(b, dim=-1))
    if not bool(ok.all()):
        bad = ~ok
        ok = ok.clone()
        ok[bad] = torch.isfinite(b[bad]).all(dim=-1)
    return ok


def first_flips(top1: torch.Tensor, start: int) -> torch.Tensor:
    """First step with ``top1 = 0`` along dim -2 of ``top1 (..., n, S)`` (steps ``start + 1 ..
    start + n``), NaN where there is none: ``(..., S)`` float64."""
    bad = top1 < 0.5
    idx = torch.argmax(bad.to(torch.int8), dim=-2).to(torch.float64) + (start + 1)
    return torch.where(bad.any(dim=-2), idx, torch.full_like(idx, math.nan))


class Accumulator:
    """Collects outputs segment by segment and reduces them per window of ``window`` steps."""

    def __init__(self, names: list[str], window: int, readout: Readout | None):
        self.names = names
        self.window = window
        self.readout = readout
        self._ref: list[torch.Tensor] = []
        self._sim: dict[str, list] = {n: [] for n in names}
        self._pending = 0
        self.done = 0  # steps already reduced
        self.windows: list[dict] = []  # per window: {"step": int, name: {metric: value}}
        self.drift: dict[int, dict] = {}
        self.next_drift = window
        self.per_step_rel_err: dict[str, list[np.ndarray]] = {n: [] for n in names}

    def push(self, y_ref: torch.Tensor, ys: dict[str, torch.Tensor | None]) -> None:
        """y_ref (m, S, H, P) float64; ys[name] (m, S, H, P) or None for a dead scheme."""
        m = y_ref.shape[0]
        self._ref.append(y_ref)
        for n in self.names:
            y = ys.get(n)
            self._sim[n].append(y if y is not None else torch.full_like(y_ref, math.nan))
        self._pending += m
        while self._pending >= self.window:
            self._reduce(self.window)

    def push_rows(self, err: torch.Tensor, yh: torch.Tensor | None,
                  d: torch.Tensor | None) -> None:
        """Per-step rows already reduced over the width (the numba engine's ``_row_stats``):
        ``err (k, m, S)`` rel_err, ``yh (m, S, width)`` the truth RMS-normalised and
        ``d (k, m, S, width)`` float32 ``yh_sim - yh_ref`` (None without the readout); the
        windows as :meth:`push` reduces them."""
        if not hasattr(self, "_rows"):
            self._rows = ([], [], [])
        for part, t in zip(self._rows, (err.transpose(0, 1), yh, None if d is None else
                                        d.transpose(0, 1)), strict=True):
            if t is not None:
                part.append(t)
        self._pending += err.shape[1]
        while self._pending >= self.window:
            self._reduce(self.window)

    def finish(self) -> None:
        if self._pending:
            self._reduce(self._pending)

    def _take(self, parts: list, n: int) -> torch.Tensor:
        # (parts restored from a checkpoint may sit on another device than the new ones)
        cat = torch.cat([p.to(parts[-1].device) for p in parts]) if len(parts) > 1 else parts[0]
        head, tail = cat[:n], cat[n:]
        parts.clear()
        if tail.shape[0]:
            parts.append(tail)
        return head

    def _stacked(self, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The next ``n`` steps: the truth ``(n, S, width)``, every scheme stacked in float64
        ``(k, n, S, width)`` and their rel_err ``(k, n, S)``."""
        y_ref = self._take(self._ref, n)
        S = y_ref.shape[1]
        yr = y_ref.reshape(n, S, -1)
        if not self.names:  # no scheme: nothing to reduce
            ys = y_ref.new_zeros((0, *yr.shape))
        else:
            ys = torch.stack([self._take(self._sim[name], n).reshape(n, S, -1).to(
                torch.float64) for name in self.names])
        return yr, ys, torch.linalg.vector_norm(ys - yr, dim=-1) / torch.linalg.vector_norm(
            yr, dim=-1)

    def _reduce(self, n: int) -> None:
        """One window: every scheme at once (one stacked float64 copy, one readout matmul for
        all schemes, the reference's softmax and argmax once); row for row the values of a
        per-scheme reduction (tests/engines/test_core.py)."""
        if getattr(self, "_rows", None):  # rows from push_rows
            err = self._take(self._rows[0], n).transpose(0, 1)
            if self.readout is not None:
                yh_ref = self._take(self._rows[1], n)
                kls, top1s = self.readout.kl_many(self.readout.logp(yh_ref),
                                                  self._take(self._rows[2], n).transpose(0, 1))
        else:
            yr, ys, err = self._stacked(n)
            if self.readout is not None:
                yh_ref, logp_ref = self.readout.ref(yr)
                kls, top1s = self.readout.kl_top1_many(yh_ref, logp_ref, ys)
        errs = err.cpu().numpy()  # (k, n, S)
        if self.readout is not None:
            kl_mean = kls.cpu().numpy().mean(axis=1)  # (k, S)
            top1_mean = top1s.cpu().numpy().mean(axis=1)
            flips = first_flips(top1s, self.done).cpu().numpy()
        stats = []
        for i, e in enumerate(errs):
            st = {"rel_err": e.mean(axis=0), "rel_err_max": e.max(axis=0)}
            if self.readout is not None:
                st.update(kl=kl_mean[i], top1=top1_mean[i], flip=flips[i])
            stats.append(st)
        self._add_window(n, stats, [e.mean(axis=1) for e in errs])

    def _add_window(self, n: int, stats: list, per_step) -> None:
        """Append one window of ``n`` steps: ``stats[i]`` and ``per_step[i]`` of scheme i."""
        by_name = dict(zip(self.names, stats, strict=True))
        self.windows.append({"step": self.done + n, "len": n, **by_name})
        for name, ps in zip(self.names, per_step, strict=True):
            self.per_step_rel_err[name].append(ps)
        self.done += n
        self._pending -= n

    def want_drift(self, pos: int) -> bool:
        return pos >= self.next_drift

    def _keep(self, t: torch.Tensor):
        """Where per-window statistics live: host NumPy here; a device subclass keeps tensors."""
        return t.cpu().numpy()

    def record_drift(self, pos: int, ref_state: torch.Tensor, held: dict[str, dict]) -> None:
        """ref_state (S,H,Dv,Dk) float64; held[name] = {"state": ..., "read": ...} or None."""
        S, rf, rn = _ref_norms(ref_state)
        out = {}
        for name, h in held.items():
            d = {}
            for key in ("state", "read"):
                if h is None or key not in h:
                    continue
                diff = h[key].reshape(S, -1).to(torch.float64) - rf
                d[key] = self._keep(torch.linalg.vector_norm(diff, dim=-1) / rn)
            out[name] = d
        self._store_drift(pos, out)

    def _store_drift(self, pos: int, out: dict) -> None:
        """Assign a drift sample to every window that ended at or before ``pos``."""
        while self.next_drift <= pos:
            self.drift[self.next_drift] = out
            self.next_drift += self.window

    def rows(self) -> list[dict]:
        """Tidy rows: one per scheme and window end, each metric's mean and 10/50/90th
        percentiles across sequences (NaN where a value is not finite), and with the readout
        ``first_flip`` (censored at the row's step) and ``flipped`` (docs/metrics.md). All
        windows and schemes in a few vectorised NumPy calls (one set of reductions per window,
        scheme and metric took ~0.1 s of a 32,768-step GPU study's host time)."""
        cells = [(w, name) for w in self.windows for name in self.names]
        cols: dict[str, list] = {}
        for metric in ("rel_err", "kl", "top1"):
            have = [metric in w[name] for w, name in cells]
            if any(have):
                vals = [np.asarray(w[name][metric], dtype=np.float64).reshape(-1) if h else None
                        for (w, name), h in zip(cells, have, strict=True)]
                cols.update(percentile_bands(metric, vals))
        top = [float(np.max(w[name]["rel_err_max"])) for w, name in cells] if cells else []
        drift = []
        for w in self.windows:
            dr = self.drift.get(w["step"]) or self.drift.get(
                max([k for k in self.drift if k <= w["step"]], default=-1), {})
            drift += [dr.get(name, {}) if dr else {} for name in self.names]
        means = {key: _means([d.get(key) for d in drift]) for key in ("state", "read")}
        flips = _first_flips(cells)
        rows = []
        for c, (w, name) in enumerate(cells):
            row = {"scheme": name, "step": w["step"]}
            for key, col in cols.items():
                if col[c] is not None:
                    row[key] = col[c]
            row["rel_err_max"] = top[c]
            row["state_drift"] = means["state"][c]
            row["read_drift"] = means["read"][c]
            if flips[c] is not None:
                row["first_flip"], row["flipped"] = flips[c]
            rows.append(row)
        return rows


def _first_flips(cells: list) -> list[tuple[float, int] | None]:
    """``(first_flip, flipped)`` of every ``(window, scheme)`` cell (None without the readout),
    from the per-window ``flip`` arrays: the earliest flip of each sequence so far, censored at
    the cell's window end."""
    seen: dict[str, np.ndarray] = {}
    out: list[tuple[float, int] | None] = []
    for w, name in cells:
        f = w[name].get("flip")
        if f is None:
            out.append(None)
            continue
        f = np.asarray(f, dtype=np.float64).reshape(-1)
        first = seen.get(name)
        first = seen[name] = f if first is None else np.where(np.isnan(first), f, first)
        hit = ~np.isnan(first)
        out.append((float(np.where(hit, first, w["step"]).mean()), int(hit.sum())))
    return out


def _ref_norms(ref_state: torch.Tensor):
    """``(S, the reference flattened per sequence, its norms with 0 replaced by 1)``."""
    rf = ref_state.reshape(ref_state.shape[0], -1)
    rn = torch.linalg.vector_norm(rf, dim=-1)
    return rf.shape[0], rf, torch.where(rn > 0, rn, torch.ones_like(rn))


def _by_len(vals: list) -> list[list[int]]:
    """Indices of the arrays in ``vals`` (None skipped), grouped by size."""
    by_len: dict[int, list[int]] = {}
    for i, v in enumerate(vals):
        if v is not None:
            by_len.setdefault(np.size(v), []).append(i)
    return list(by_len.values())


def percentile_bands(metric: str, vals: list) -> dict[str, list]:
    """Mean and 10/50/90th percentiles of every array in ``vals`` (None: no value) at once:
    columns ``metric``, ``metric_p10/_p50/_p90`` (NaN where an array has a non-finite value).
    Arrays of one length go through one ``np.percentile`` over an axis (the same partition and
    interpolation as per array: the same values)."""
    out = {metric + suf: [None] * len(vals) for suf in ("", "_p10", "_p50", "_p90")}
    for idx in _by_len(vals):
        a = np.stack([vals[i] for i in idx])
        fin = np.isfinite(a).all(axis=1)
        a = np.where(fin[:, None], a, 0.0)
        stats = [a.mean(axis=1), *np.percentile(a, [10, 50, 90], axis=1)]
        for suf, col in zip(("", "_p10", "_p50", "_p90"), stats, strict=True):
            col = np.where(fin, col, np.nan)
            for j, i in enumerate(idx):
                out[metric + suf][i] = float(col[j])
    return out


def _means(vals: list) -> list[float]:
    """``float(np.mean(v))`` of every array in ``vals`` (None: NaN), arrays of one length at
    once."""
    out = [math.nan] * len(vals)
    for idx in _by_len(vals):
        m = np.stack([np.asarray(vals[i], dtype=np.float64).reshape(-1) for i in idx]).mean(axis=1)
        for j, i in enumerate(idx):
            out[i] = float(m[j])
    return out


@contextlib.contextmanager
def _tf32_matmul(on: bool):
    """TF32 for float32 CUDA matmuls inside the block (restored after)."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = bool(on)
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def _kl(readout, yh_ref, logp_ref, y_sim, tf32: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``Readout.kl_top1`` with the difference matmul ``(yh_sim - yh_ref) @ W^T`` in TF32 when
    ``tf32`` (CUDA only; the CPU ignores the flag). The product is a small correction to the
    float64 reference logits, so TF32's ~5e-4 relative input rounding moves the logit
    difference, and hence the KL (quadratic in it), by ~1e-3 relative, not the logits."""
    d = readout.normalise(y_sim.to(torch.float64)) - yh_ref
    with _tf32_matmul(tf32):
        prod = d.to(torch.float32) @ readout.W32.T
    return kl_top1(logp_ref, readout.scale * prod.to(torch.float64))


class DeviceAccumulator(Accumulator):
    """Accumulator for the device engines: statistics stay device tensors until ``to_host()``.

    ``push(y_ref (m,S,H,P) float64, ys[name] (m,S,H,P))`` as in the base class (no None: a dead
    scheme's outputs are NaN already); ``record_drift`` likewise. ``push_stats`` takes per-step
    statistics already reduced on the device and reduces them per window on the host at
    :meth:`finish`. ``tf32`` (default True): the KL difference matmul runs in TF32 on CUDA (see
    :func:`_kl`).
    """

    tf32 = True

    def push_stats(self, err: torch.Tensor, kl: torch.Tensor | None = None,
                   top1: torch.Tensor | None = None, order: list[int] | None = None,
                   seqs: int = 1) -> None:
        """Per-step statistics already reduced over the width (:func:`row_stats`,
        :func:`kl_rows`): ``err``/``kl``/``top1`` ``(k, m*seqs)`` (rows: step, sequence), row
        ``order[i]`` of scheme ``self.names[i]`` (None: in order). They are copied to the host
        now (on CUDA into pinned memory, asynchronously: no device kernel, so nothing for CUDA
        to load lazily while kernels run) and reduced per window by :meth:`finish`, which must
        follow a device synchronisation."""
        if not hasattr(self, "_host"):
            self._host = []
        self._host.append(([None if t is None else _host_copy(t) for t in (err, kl, top1)],
                           order, seqs))
        self._pending += err.shape[1] // seqs

    def finish(self) -> None:
        """Every window of the pushed statistics, on the host (the copies are complete)."""
        if getattr(self, "_host", None):
            self._err, self._kl, self._top1 = [], [], []
            for parts, order, seqs in self._host:
                for t, out in zip(parts, (self._err, self._kl, self._top1), strict=True):
                    if t is not None:
                        t = t if order is None else t[order]
                        out.append(t.view(t.shape[0], -1, seqs).transpose(0, 1))
            self._host = []
            if self._pending >= self.window:  # every whole window at once
                self._reduce_stats(self.window, self._pending // self.window)
        super().finish()

    def _reduce(self, n: int) -> None:
        if getattr(self, "_err", None):
            return self._reduce_stats(n)
        yr, ys, err = self._stacked(n)
        kl = None
        if self.readout is not None:
            yh_ref, logp_ref = self.readout.ref(yr)
            kl, top1 = _kl(self.readout, yh_ref, logp_ref, ys, self.tf32)  # (k, n, S) each
        mean, top = err.mean(dim=1), err.amax(dim=1)
        stats = []
        for i in range(len(self.names)):
            st = {"rel_err": mean[i], "rel_err_max": top[i]}
            if kl is not None:
                st.update(kl=kl[i].mean(dim=0), top1=top1[i].mean(dim=0),
                          flip=first_flips(top1[i], self.done))
            stats.append(st)
        self._add_window(n, stats, err.mean(dim=2))

    def _reduce_stats(self, n: int, m: int = 1) -> None:
        """``m`` windows of ``n`` steps from the pushed statistics (host copies since
        :meth:`push_stats`), in a few tensor ops; the windows' entries are filled in by
        :meth:`to_host` (no per-window, per-scheme ops)."""
        def take(parts):  # (k, m n, S) -> (k, m, n, S)
            t = self._take(parts, n * m).transpose(0, 1)
            return t.reshape(t.shape[0], m, n, t.shape[2])

        err = take(self._err)
        stats = {"rel_err": err.mean(dim=2), "rel_err_max": err.amax(dim=2)}  # (k, m, S)
        if self._kl:
            stats["kl"] = take(self._kl).mean(dim=2)
        if self._top1:
            top1 = take(self._top1)
            stats["top1"] = top1.mean(dim=2)
            at = torch.arange(m, device=top1.device, dtype=torch.float64) * n  # window starts
            stats["flip"] = first_flips(top1, self.done) + at[:, None]
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
        """The statistics of :meth:`_reduce_stats` as NumPy in one concatenation: fill in the
        windows' entries and per-step rel_err."""
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
        S, rf, rn = _ref_norms(ref_state)
        d_st, d_rd = (torch.linalg.vector_norm(t.reshape(len(names), S, -1).to(torch.float64)
                                               - rf, dim=-1) / rn for t in (states, reads))
        self.record_drift_norms(pos, d_st, d_rd, names, has_read)

    def record_drift_norms(self, pos: int, d_st: torch.Tensor, d_rd: torch.Tensor,
                           names: list[str], has_read: list[bool]) -> None:
        """record_drift from drifts already reduced (``kernels.metrics.drift_from_partials``):
        ``d_st``/``d_rd`` ``(k, S)``, row i of scheme ``names[i]``."""
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



def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the host: on CUDA an asynchronous copy into pinned memory (valid once the device
    is synchronised), on the CPU ``t`` itself."""
    if t.device.type != "cuda":
        return t
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return out.copy_(t, non_blocking=True)


def kl_rows(readout: Readout, yh_ref, d, tf32: bool,
            fused: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """KL and top-1 agreement (float64 1/0) per row, ``(k, rows)`` each, from ``row_stats``'
    ``d`` and ``yh_ref``, as ``Readout.kl_top1``: reference logits in float64, the difference
    matmul (all schemes in one) in TF32 on CUDA when ``tf32`` (see :func:`_kl`). ``fused``
    (default): everything after the two matmuls in one Triton pass
    (``precsim.kernels.metrics.kl_tail``); else torch ops."""
    k, rows, W = d.shape
    with _tf32_matmul(tf32):
        prod = (d.reshape(k * rows, W) @ readout.W32.T).view(k, rows, -1)
    ref = yh_ref @ readout.W64.T
    if fused:
        from precsim.kernels.metrics import kl_tail

        sc = getattr(readout, "_scale64", None)
        if sc is None:
            sc = readout._scale64 = torch.tensor([readout.scale], dtype=torch.float64,
                                                 device=d.device)
        return kl_tail(ref, prod, sc)
    logp_ref = torch.log_softmax(readout.scale * ref, dim=-1)
    return kl_top1(logp_ref, readout.scale * prod.to(torch.float64))
