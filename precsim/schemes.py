"""Precision schemes (registry): how the state is stored, read and written.

* conventional(F, R): state in F; output from the unrounded updated state; Q_F,R every step.
* shared(F, R): checkpoint in F; output from checkpoint + buffer; Q_F,R(fold) at each flush.
* split(F_upd, R_upd; F_read): master in F_upd and a read copy in F_read; output from the read
  copy + buffer; at a flush master <- Q_upd(fold of the master), read <- Q_read,RNE(master).
* error feedback (any kind, ``error_feedback: F_e``): each rounding of the master adds the
  residual E carried from the previous one and keeps the new one, ``X = x + E``,
  ``master <- Q(X)``, ``E <- Q_e,RNE(X - Q(X))`` (:func:`write_state`); outputs are unchanged.

A scheme advances over a *segment* (the positions between two flushes) and returns its outputs.
Random bits for SR are keyed by (run seed, scheme name, event index, purpose), so a scheme's
numbers do not depend on which other schemes run beside it.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import torch

from precsim import formats as pf

from .config import Config, SchemeConfig, ef_fmt

UPDATE, READ, RESID = 0, 1, 2


@dataclass
class Scheme:
    name: str
    cfg: SchemeConfig
    seed: int
    fmt_options: dict
    tensor_scope: str
    state: torch.Tensor | None = None
    read: torch.Tensor | None = None
    # error feedback: the residual carried to the next write (None without error feedback: a
    # state-sized tensor nothing reads, a third of a float32 scheme's memory in a whole model)
    resid: torch.Tensor | None = None
    dead_at: int | None = None  # first step whose output was not finite
    events: int = 0
    extra: dict = field(default_factory=dict)

    kind = "base"
    replay = False

    @property
    def label(self) -> str:
        return self.cfg.label or describe(self.cfg)

    def _q(self, x: torch.Tensor, fmt: str, rounding: str, purpose: int) -> torch.Tensor:
        return quantize_state(x, fmt, rounding, name=self.name, event=self.events,
                              purpose=purpose, seed=self.seed, sc=self.cfg,
                              fmt_options=self.fmt_options,
                              layer_scope=self.tensor_scope == "tensor")

    def init(self, shape, device, dtype) -> None:
        self.state = torch.zeros(shape, device=device, dtype=dtype)
        self.read = self.state
        self.resid = torch.zeros_like(self.state) if ef_fmt(self.cfg) else None

    def write(self, x: torch.Tensor) -> None:
        """The master's rounding after an update or a fold (with error feedback if set)."""
        self.state, self.resid = write_state(x, self.resid, self.cfg, self._q)

    def held(self) -> dict[str, torch.Tensor]:
        return {"state": self.state}


class Conventional(Scheme):
    kind = "conventional"

    def run_segment(self, family, inp, params, flush: bool) -> torch.Tensor:
        m = next(iter(inp.values())).shape[0]
        ys = []
        for i in range(m):
            step = {k: v[i] for k, v in inp.items()}
            S_new, y = family.step(self.state, step)
            self.write(S_new)
            self.events += 1
            ys.append(y)
        self.read = self.state  # (nothing reads it: not the initial zeros kept alive beside it)
        return torch.stack(ys)


class Shared(Scheme):
    """Outputs from the read copy (for shared, the checkpoint itself) plus the buffer; at a flush
    the folded master is rounded and the read copy renewed (:meth:`new_read`)."""

    kind = "shared"
    replay = True

    def run_segment(self, family, inp, params, flush: bool, *, out_from_fold=True,
                    buffer_round=None, u_from_master=False) -> torch.Tensor:
        Y, fold = family.segment(self.read, self.state, inp, params, out_from_fold=out_from_fold,
                                 buffer_round=buffer_round, u_from_master=u_from_master,
                                 fold=flush)
        if flush:
            self.write(fold)
            self.read = self.new_read()
            self.events += 1
        return Y

    def new_read(self) -> torch.Tensor:
        return self.state


class Split(Shared):
    kind = "split"

    def init(self, shape, device, dtype) -> None:
        super().init(shape, device, dtype)
        self.read = torch.zeros(shape, device=device, dtype=dtype)

    def new_read(self) -> torch.Tensor:
        return self._q(self.state, self.cfg.read_fmt, "rne", READ)

    def held(self) -> dict[str, torch.Tensor]:
        return {"state": self.state, "read": self.read}


SCHEMES: dict[str, type[Scheme]] = {"conventional": Conventional, "shared": Shared,
                                    "split": Split}


def write_state(x, resid, sc: SchemeConfig, q):
    """Round a master ``x`` (NumPy or torch) after an update or a fold, with
    ``q(x, fmt, rounding, purpose)``: ``(Q(x), resid)``; with error feedback (``sc.error_feedback``
    a format F_e) ``X = x + resid`` in the compute dtype, ``(Q(X), Q_F_e,RNE(X - Q(X)))``: the
    rounding errors of successive writes telescope (their sum is minus the last residual)."""
    ef = ef_fmt(sc)
    if ef is None:
        return q(x, sc.fmt, sc.rounding, UPDATE), resid
    X = x + resid
    Q = q(X, sc.fmt, sc.rounding, UPDATE)
    return Q, q(X - Q, ef, "rne", RESID)


def describe(s: SchemeConfig) -> str:
    """Human label, e.g. ``split(fp16/sr + nvfp4 read)``, ``conventional(int8_b128 + ef fp16)``."""
    upd = f"{s.fmt}" + ("/sr" if s.rounding == "sr" else "")
    if s.layers is not None:  # the default, then the layers that differ from it
        from .config import layer_index, scheme_at, slot

        base = scheme_at(s, None)
        per: dict[str, list[int]] = {}
        for k, v in s.layers.items():
            if k != "default" and v != getattr(base, slot(s)):
                per.setdefault(v, []).append(layer_index(k))
        extra = "; ".join(f"layer{'s' if len(ls) > 1 else ''} {_span(ls)}: {f}"
                          for f, ls in per.items())
        return describe(base)[:-1] + (f"; {extra})" if extra else ")")
    if ef_fmt(s):
        upd += f" + ef {s.error_feedback}"
    if s.kind == "split":
        return f"split({upd} update + {s.read_fmt} read)"
    return f"{s.kind}({upd})"


def _span(layers: list[int]) -> str:
    """'0,5,7-9': sorted layer indices with runs collapsed."""
    out, ls = [], sorted(layers)
    i = 0
    while i < len(ls):
        j = i
        while j + 1 < len(ls) and ls[j + 1] == ls[j] + 1:
            j += 1
        out.append(str(ls[i]) if j == i else f"{ls[i]}-{ls[j]}")
        i = j + 1
    return ",".join(out)


def format_options(cfg: Config) -> dict:
    """quantize() options of block formats; ``tensor`` scope = a (S, H*P, N) view's matrix."""
    scope = cfg.formats.tensor_scope
    return {"scale_floor": cfg.formats.scale_floor,
            "tensor_scope": "matrix" if scope == "tensor" else scope,
            "scale_mode": cfg.formats.nvfp4_scale, "sr_source": cfg.formats.sr_source,
            "rotate": cfg.formats.rotate}


def quantize_state(x, fmt: str, rounding: str, *, name: str, event: int, purpose: int,
                   seed: int, sc: SchemeConfig, fmt_options: dict, layer_scope: bool):
    """Quantise a state ``(S, H, Dv, Dk)`` (NumPy or torch) for scheme ``name``.

    SR streams are keyed by (seed, scheme name, event index, purpose), the same in every engine.
    """
    f = pf.get(fmt)
    if f.kind == "identity" or (f.name == "fp32" and "float32" in str(x.dtype)):
        return x
    opts = {k: v for k, v in fmt_options.items() if k in pf.accepted_options(f)}
    shape = x.shape
    if layer_scope and f.kind == "block":
        x = x.reshape(shape[0], shape[1] * shape[2], shape[3])  # one layer per sequence
    stream = pf.stream_id(zlib.crc32(name.encode()), event, purpose)
    out = pf.quantize(x, f, rounding, seed=seed, stream=stream, sr_bits=sc.sr_bits,
                      overflow=sc.overflow, **opts)
    return out.reshape(shape)


def build_schemes(cfg: Config) -> list[Scheme]:
    fo = format_options(cfg)
    return [SCHEMES[s.kind](name=n, cfg=s, seed=cfg.run.seed, fmt_options=fo,
                            tensor_scope=cfg.formats.tensor_scope)
            for n, s in cfg.schemes.items()]
