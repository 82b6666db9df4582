"""The plain NumPy engine (``run.engine=numpy``): one step at a time, one buffer list per scheme.

The truth and the conventional schemes take the family's naive step (:mod:`precsim.families`).

This is how the article runs the experiment, written to be read, not to be fast: for every token
each scheme appends to its buffer, evaluates its output from the checkpoint plus the buffer
(output-only), and flushes when the flush schedule says so. It shares nothing with the vectorised
torch engine but the formats and the metrics, so the two cross-check each other, and it is the
baseline of ``experiments/bench/bench_cpu.py``.
"""

from __future__ import annotations

import numpy as np
import torch

from ..checkpoint import Checkpoint
from ..config import Config
from ..families import decays, get_family
from ..metrics import Accumulator, Readout
from ..result import Result
from ..schemes import format_options, quantize_state, write_state
from ..workload import expand_groups
from .base import Engine, buffer_rounder, flush_schedule, skip_to

NAME = "numpy"

NP_DTYPES = {"fp32": np.float32, "fp64": np.float64}


class _Q:
    """Quantizer bound to one scheme (same SR streams as the torch engine)."""

    def __init__(self, name, cfg, sc):
        self.kw = dict(name=name, seed=cfg.run.seed, sc=sc, fmt_options=format_options(cfg),
                       layer_scope=cfg.formats.tensor_scope == "tensor")

    def __call__(self, S, fmt, rounding, event, purpose):
        return quantize_state(S, fmt, rounding, event=event, purpose=purpose, **self.kw)

    def write(self, S, resid, sc, event):
        """The master's rounding (error feedback: with the residual): ``(state, residual)``."""
        return write_state(S, resid, sc, lambda x, f, r, p: self(x, f, r, event, p))


def _out(S, c):
    return np.einsum("shvk,shk->shv", S, c)


def supports(cfg: Config, device: str) -> str | None:
    return None if device == "cpu" else f"run.device={device} (the NumPy engine runs on the CPU)"


def run(cfg: Config, device: str = "cpu", progress: bool = True,
        record_outputs: bool = False, ckpt: Checkpoint | None = None) -> Result:
    return NumpyEngine(cfg, "cpu", progress, record_outputs, ckpt).run()


class NumpyEngine(Engine):
    NAME = "numpy"
    where = workload_device = "cpu"

    def prepare(self, wl) -> None:
        cfg = self.cfg
        self.wl = wl
        self.fam = fam = cfg.model.family
        self.family = get_family(fam)
        self.p64 = {k: torch.as_tensor(v, dtype=torch.float64) for k, v in wl.params.items()}
        self.dt_ = dt_ = NP_DTYPES[cfg.run.compute_dtype]
        Sq, H = cfg.run.seqs, cfg.model.heads
        P, N = cfg.model.head_dim, cfg.model.state_dim
        shape = (Sq, H, P, N)
        self.names = names = list(cfg.schemes)
        self.qs = {n: _Q(n, cfg, sc) for n, sc in cfg.schemes.items()}
        self.state = {n: np.zeros(shape, dt_) for n in names}
        self.read = {n: np.zeros(shape, dt_) for n in names}
        self.resid = {n: np.zeros(shape, dt_) for n in names}  # error feedback's residuals
        self.events = dict.fromkeys(names, 0)
        self.buf: dict[str, list] = {n: [] for n in names}
        self.dead = dict.fromkeys(names)
        self.D = wl.params.get("D")
        self.S_ref = np.zeros(shape)
        self.u_master = cfg.replay.gdn_u_source == "master"
        self.spec = cfg.replay.drafts > 0
        self.bround = buffer_rounder(cfg.replay.buffer_dtype, 32 if dt_ == np.float32 else 64)
        readout = Readout(H * P, cfg.metrics.vocab, cfg.metrics.logit_scale, "cpu") \
            if cfg.metrics.kl else None
        self.acc = Accumulator(names, cfg.metrics.window, readout)
        self.tdt = torch.float32 if dt_ == np.float32 else torch.float64

    def load(self, saved: dict) -> int:
        self.S_ref, self.state, self.read, self.events, self.dead = (saved[k] for k in (
            "S_ref", "state", "read", "events", "dead_at"))
        self.resid = saved.get("resid", self.resid)
        return saved["pos"]

    def save(self) -> dict:  # the state at a flush (every buffer empty)
        return {"pos": self.pos, "S_ref": self.S_ref, "state": self.state, "read": self.read,
                "events": self.events, "resid": self.resid, "dead_at": self.dead,
                "acc": self.acc}

    def spans(self, pos: int):
        for m in skip_to(flush_schedule(self.cfg), pos):
            yield pos, pos + m
            pos += m

    def advance(self, pos: int, end: int) -> None:
        cfg, fam, family, dt_ = self.cfg, self.fam, self.family, self.dt_
        names, state, read, resid, events, buf, dead, qs, D = (
            self.names, self.state, self.read, self.resid, self.events, self.buf, self.dead,
            self.qs, self.D)
        m = end - pos
        Sq, H, P = cfg.run.seqs, cfg.model.heads, cfg.model.head_dim
        t64 = expand_groups(self.wl.chunk(pos, pos + m), H)
        inp64 = {k: v.numpy() for k, v in t64.items()}
        inp64.update({k: v.numpy() for k, v in decays(fam, t64, self.p64, torch.float64).items()})
        inp = {k: v.astype(dt_) for k, v in inp64.items()}
        inp.update({k: v.numpy() for k, v in decays(fam, t64, self.p64, self.tdt,
                                                       cfg.model.decay_exp).items()})
        y_ref = np.empty((m, Sq, H, P))
        ys = {n: np.empty((m, Sq, H, P), dt_) for n in names}
        for i in range(m):
            last = i == m - 1
            self.S_ref, y_ref[i] = family.step(self.S_ref, _at(inp64, i))
            for n in names:
                sc = cfg.schemes[n]
                if dead[n] is not None:
                    ys[n][i] = np.nan
                    continue
                if sc.kind == "conventional":
                    S_new, ys[n][i] = family.step(state[n], _at(inp, i))
                    state[n], resid[n] = qs[n].write(S_new, resid[n], sc, events[n])
                    events[n] += 1
                else:
                    R = state[n] if sc.kind == "shared" else read[n]
                    ys[n][i] = _replay_step(fam, buf[n], R, state[n], inp, i, self.bround,
                                            self.u_master)
                    if last:  # flush: fold the buffer into the master, write back once
                        fold = _fold(buf[n], state[n], dt_)
                        if not self.spec:
                            c = inp[family.QUERY][i]
                            ys[n][i] = _out(fold, c)
                        state[n], resid[n] = qs[n].write(fold, resid[n], sc, events[n])
                        if sc.kind == "split":
                            read[n] = qs[n](state[n], sc.read_fmt, "rne", events[n], 1)
                        events[n] += 1
                        buf[n] = []
                if D is not None:
                    ys[n][i] += (D[:, None] * inp["x"][i]).astype(dt_)
                if dead[n] is None and not np.isfinite(ys[n][i]).all():
                    dead[n] = pos + i + 1
            if D is not None:
                y_ref[i] += D[:, None] * inp64["x"][i]
        self.pos = end
        self.push(end, torch.from_numpy(y_ref), {n: torch.from_numpy(ys[n]) for n in names})

    def held(self) -> tuple:  # what each live scheme holds: its state (and split's read copy)
        held = {n: {"state": self.state[n], "read": self.read[n]}
                if self.cfg.schemes[n].kind == "split" else {"state": self.state[n]}
                for n in self.names}
        return torch.from_numpy(self.S_ref), {
            n: None if self.dead[n] is not None else {k: torch.from_numpy(v)
                                                      for k, v in h.items()}
            for n, h in held.items()}


def _at(inp: dict, i: int) -> dict:
    return {k: v[i] for k, v in inp.items()}


def _replay_step(fam, buf, R, M, inp, i, bround, u_master):
    """Append step i to the buffer and return its output by output-only evaluation.

    A buffer entry is ``(log-decay, weight, value, key)``: Mamba-2 ``(dt A, dt, x, B)``, GDN
    ``(g, None, u, k)`` (no weight: a delta-rule family's ``WEIGHT`` scales ``u`` itself).
    """
    f = get_family(fam)
    la = inp["la"][i]
    if not f.DELTA_RULE:
        buf.append((la, inp[f.WEIGHT][i], bround(inp[f.VALUE][i]), bround(inp[f.KEY][i])))
        return _read(R, inp[f.QUERY][i], np.stack([e[0] for e in buf]), buf)
    k = bround(inp[f.KEY][i])
    logs = np.stack([e[0] for e in buf] + [la])  # the buffer's log-decays, then this step's
    # alpha_t S_{t-1} k_t from the checkpoint and the buffer, without building the state
    Sk = _read(M if u_master else R, k, logs, buf)
    buf.append((la, None, bround(inp[f.WEIGHT][i][..., None] * (inp[f.VALUE][i] - Sk)), k))
    return _read(R, inp[f.QUERY][i], logs, buf)


def _weights(logs, buf):
    """Per buffer entry: its decay over the later steps of ``logs``, times its weight (if any)."""
    after = np.cumsum(logs[::-1], axis=0)[::-1] - logs  # log-decay after each entry
    return [np.exp(after[j]) if w is None else w * np.exp(after[j])
            for j, (_, w, _, _) in enumerate(buf)]


def _read(S0, c, logs, buf):
    """``S c`` of the state the buffer would build from ``S0``, without building it."""
    y = np.exp(logs.sum(0))[..., None] * _out(S0, c)
    for w, (_, _, val, key) in zip(_weights(logs, buf), buf, strict=True):
        y = y + (w * np.einsum("shk,shk->sh", key, c))[..., None] * val
    return y


def _fold(buf, M, dt_):
    """The master ``M`` with the buffer folded in (unrounded, then cast to the compute dtype)."""
    logs = np.stack([e[0] for e in buf])
    S = np.exp(logs.sum(0))[..., None, None] * M
    for w, (_, _, val, key) in zip(_weights(logs, buf), buf, strict=True):
        S = S + w[..., None, None] * (val[..., :, None] * key[..., None, :])
    return S.astype(dt_)
