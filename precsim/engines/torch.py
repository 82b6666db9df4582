"""The vectorised torch engine (``run.engine=torch``; CPU or CUDA).

It walks the flush schedule: the positions between two ReplaySSM flushes form a segment
(``buffer_len`` steps, or irregular lengths under speculative decoding). Per segment it reads the
inputs once, advances the float64 truth (chunked, exact to rounding), steps every conventional
scheme token by token (the family's naive step), and evaluates every replay scheme's outputs for
the whole segment at once (output-only evaluation), then flushes. Memory stays flat.
"""

from __future__ import annotations

import torch

from ..checkpoint import Checkpoint
from ..config import Config
from ..families import decays, family_params, get_family
from ..metrics import Accumulator, Readout
from ..result import Result
from ..schemes import build_schemes
from ..workload import expand_groups
from .base import Engine, buffer_rounder, flush_schedule, skip_to

NAME = "torch"
DTYPES = {"fp32": torch.float32, "fp64": torch.float64}


def supports(cfg: Config, device: str) -> str | None:
    return None


def run(cfg: Config, device: str = "cpu", progress: bool = True,
        record_outputs: bool = False, ckpt: Checkpoint | None = None) -> Result:
    """Run ``cfg``; ``record_outputs`` keeps every output in ``info["outputs"]`` (tests);
    ``ckpt`` saves and restores its state (:mod:`precsim.checkpoint`)."""
    return TorchEngine(cfg, device, progress, record_outputs, ckpt).run()


class TorchEngine(Engine):
    NAME = "torch"

    def prepare(self, wl) -> None:
        cfg = self.cfg
        self.wl = wl
        self.family = family = get_family(cfg.model.family)
        self.cdt = cdt = DTYPES[cfg.run.compute_dtype]
        self.dev = dev = torch.device(self.device)
        self.p64 = family_params(family.name, wl.params, dev, torch.float64)
        self.pc = family_params(family.name, wl.params, dev, cdt)
        D = wl.params.get("D")
        self.D64 = D64 = torch.as_tensor(D, dtype=torch.float64, device=dev) \
            if D is not None else None
        self.Dc = D64.to(cdt) if D64 is not None else None  # the D*x skip, in the schemes'
        Sq, H = cfg.run.seqs, cfg.model.heads  # precision
        Dv, Dk = family.state_dims(cfg.model)
        shape = (Sq, H, Dv, Dk)
        self.schemes = build_schemes(cfg)
        for s in self.schemes:
            s.init(shape, dev, cdt)
        self.S_ref = torch.zeros(shape, dtype=torch.float64, device=dev)
        readout = Readout(H * Dv, cfg.metrics.vocab, cfg.metrics.logit_scale, dev) \
            if cfg.metrics.kl else None
        self.acc = Accumulator([s.name for s in self.schemes], cfg.metrics.window, readout)
        self.spec = cfg.replay.drafts > 0
        self.br = buffer_rounder(cfg.replay.buffer_dtype, 32 if cdt == torch.float32 else 64)
        self.u_master = cfg.replay.gdn_u_source == "master"
        self.pos = self.n_flush = 0

    def load(self, saved: dict) -> int:
        self.pos, self.n_flush = saved["pos"], saved["n_flush"]
        self.S_ref = saved["S_ref"].to(self.dev)
        for s, d in zip(self.schemes, saved["schemes"], strict=True):
            s.__dict__.update({k: v.to(self.dev) if torch.is_tensor(v) else v
                               for k, v in d.items()})
        return self.pos

    def save(self) -> dict:
        return {"pos": self.pos, "n_flush": self.n_flush, "S_ref": self.S_ref, "acc": self.acc,
                "schemes": [vars(s) for s in self.schemes], "dead_at": self.dead_at()}

    def spans(self, pos: int):
        for m in skip_to(flush_schedule(self.cfg), pos):
            yield pos, pos + m
            pos += m

    def advance(self, pos: int, end: int) -> None:
        family, p64, H, cdt = self.family, self.p64, self.cfg.model.heads, self.cdt
        m = end - pos
        inp64 = expand_groups(self.wl.chunk(pos, pos + m), H)
        inp64["la"] = family.log_decay(inp64, p64)
        y_ref, self.S_ref = family.segment(self.S_ref, self.S_ref, inp64, p64,
                                           out_from_fold=True, buffer_round=_identity)
        inp = {k: v.to(cdt) for k, v in inp64.items()}
        inp.update(decays(family.name, inp64, p64, cdt, self.cfg.model.decay_exp))
        if self.D64 is not None:
            y_ref = y_ref + self.D64[:, None] * inp64["x"]
        ys: dict[str, torch.Tensor | None] = {}
        for s in self.schemes:
            if s.dead_at is not None:
                ys[s.name] = None
                continue
            if s.replay:
                y = s.run_segment(family, inp, self.pc, True, out_from_fold=not self.spec,
                                  buffer_round=self.br, u_from_master=self.u_master)
            else:
                y = s.run_segment(family, inp, self.pc, True)
            if self.Dc is not None:
                y = y + self.Dc[:, None] * inp["x"]
            finite = torch.isfinite(y).reshape(m, -1).all(dim=1)
            if not bool(finite.all()):
                s.dead_at = pos + int((~finite).nonzero()[0, 0]) + 1
            ys[s.name] = y
        self.pos = end
        self.n_flush += 1
        self.push(end, y_ref, ys)

    def held(self) -> tuple:
        return self.S_ref, {s.name: (None if s.dead_at else s.held()) for s in self.schemes}

    def dead_at(self) -> dict:
        return {s.name: s.dead_at for s in self.schemes}

    def info(self) -> dict:
        return {"flushes": self.n_flush,
                "mean_segment": self.cfg.run.steps / max(self.n_flush, 1)}


def _identity(x):
    return x
