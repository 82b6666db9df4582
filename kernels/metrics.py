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


class DeviceAccumulator(Accumulator):
    """Accumulator whose statistics are device tensors until ``to_host()``.

    ``push(y_ref (m,S,H,P) float64, ys[name] (m,S,H,P))`` as in the base class (no None: a dead
    scheme's outputs are NaN already); ``record_drift`` likewise. ``tf32`` (default True): the KL
    difference matmul runs in TF32 on CUDA (see :func:`_kl`).
    """

    tf32 = True

    def _reduce(self, n: int) -> None:
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

    def record_drift(self, pos: int, ref_state: torch.Tensor, held: dict[str, dict]) -> None:
        S = ref_state.shape[0]
        rf = ref_state.reshape(S, -1)
        rn = torch.linalg.vector_norm(rf, dim=-1)
        rn = torch.where(rn > 0, rn, torch.ones_like(rn))
        out = {}
        for name, h in held.items():
            d = {}
            for key in ("state", "read"):
                if h is not None and key in h:
                    diff = h[key].reshape(S, -1).to(torch.float64) - rf
                    d[key] = torch.linalg.vector_norm(diff, dim=-1) / rn
            out[name] = d
        while self.next_drift <= pos:
            self.drift[self.next_drift] = out
            self.next_drift += self.window

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
        out = {name: {"state": d_st[i], **({"read": d_rd[i]} if has_read[i] else {})}
               for i, name in enumerate(names)}
        while self.next_drift <= pos:
            self.drift[self.next_drift] = out
            self.next_drift += self.window

    def to_host(self, dead_at: dict[str, int | None]) -> None:
        """Copy every statistic to NumPy at once; drop the drift of schemes dead by then."""
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
