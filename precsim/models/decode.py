"""Whole-model mode, token by token (``model.mode=decode``): the reference that the
sequence-parallel mode is tested against.

Every group (the reference, each scheme) runs the model one token at a time with its own cache,
teacher-forced on the same documents; each SSM layer's decode step goes to a
:class:`LayerScheme`. Conventional schemes take a one-token segment per token. Replay schemes
keep the inputs since the last flush and at each token evaluate the segment so far (``flush``
once it holds ``replay.buffer_len`` tokens), returning its last output: the segment evaluation is
causal, so that is the output the layer-level engine computes for that position.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .hook import Hook
from .metrics import TOKEN_KEYS, own_metrics, token_metrics
from .scan import drift_due


def forward_token(model, token, cache, pos: int):
    """One token per row at position ``pos`` through the model with its cache: ``(logits
    (b, vocab), cache)``. The position is given, not inferred from the cache (a hybrid cache
    whose first layer is an SSM layer reports no length: attention would see position 0)."""
    import inspect

    from .load import cache_io, first_cache, input_device

    ids = torch.as_tensor(token, device=input_device(model)).reshape(-1, 1)
    kw, attr = cache_io(model)
    cache = first_cache(model) if cache is None else cache
    extra = {kw: cache} if cache is not None else {}
    if "position_ids" in inspect.signature(model.forward).parameters:
        extra["position_ids"] = torch.full_like(ids, pos)
    out = model(input_ids=ids, use_cache=True, **extra)
    return out.logits[:, -1], getattr(out, attr)


class LayerScheme:
    """One SSM layer's state under one group's scheme, stepped token by token."""

    def __init__(self, group, layer: int, family: str, cfg, compute):
        from ..engines.base import buffer_rounder
        from ..families import get_family
        from ..schemes import SCHEMES, format_options

        self.g, self.cfg = group, cfg
        self.fam = get_family(family)
        sc = group.at(layer)
        self.s = SCHEMES[sc.kind](name=f"{group.name}@layer{layer}", cfg=sc,
                                         seed=cfg.run.seed, fmt_options=format_options(cfg),
                                         tensor_scope=cfg.formats.tensor_scope)
        self.dtype = torch.float64 if group.reference else compute
        self.br = (lambda x: x) if group.reference else buffer_rounder(  # noqa: E731
            cfg.replay.buffer_dtype, 64 if self.dtype == torch.float64 else 32)
        self.layer, self.L = layer, cfg.replay.buffer_len
        self.buf: list[dict] = []
        self.pos = 0

    def step(self, st) -> torch.Tensor:
        from ..families import decays, family_params
        from ..workload import expand_groups

        H = st.inp[self.fam.DECAY_INPUT].shape[2]
        inp64 = expand_groups({k: v.double() for k, v in st.inp.items()}, H)  # (1, 1, H, ...)
        dev = inp64[self.fam.VALUE].device
        inp = {k: v.to(self.dtype) for k, v in inp64.items()}
        p64 = family_params(self.fam.name, st.const, dev, torch.float64)
        inp.update(decays(self.fam.name, inp64, p64, self.dtype, self.cfg.model.decay_exp))
        val, key = inp[self.fam.VALUE], inp[self.fam.KEY]
        if self.s.state is None:
            self.s.init((1, H, val.shape[3], key.shape[3]), dev, self.dtype)
        params = family_params(self.fam.name, st.const, dev, self.dtype)
        self.pos += 1
        if self.s.dead_at is not None:
            return torch.full(val.shape, math.nan, dtype=self.dtype, device=dev)
        if not self.s.replay:
            y = self.s.run_segment(self.fam, inp, params, True)
        else:
            self.buf.append(inp)
            seg = {k: torch.cat([b[k] for b in self.buf]) for k in inp}
            flush = len(self.buf) == self.L
            y = self.s.run_segment(self.fam, seg, params, flush, out_from_fold=flush,
                                   buffer_round=self.br,
                                   u_from_master=self.cfg.replay.gdn_u_source == "master")[-1:]
            if flush:
                self.buf.clear()
        if "D" in st.const:
            y = y + st.const["D"].to(self.dtype)[:, None] * inp["x"]
        if not bool(torch.isfinite(y).all()):
            self.s.dead_at = self.pos
            self.g.dead_at = min(self.g.dead_at or self.pos, self.pos)
        return y


class DecodeHandler:
    """Hook handler: every SSM layer's decode step under one group (a LayerScheme per layer)."""

    def __init__(self, group, cfg, compute, ref_layers: dict | None):
        self.g, self.cfg, self.compute = group, cfg, compute
        self.layers: dict[int, LayerScheme] = {}
        self.ref_layers = ref_layers  # the reference's LayerSchemes (drift), None for it

    def __call__(self, step, run_own):
        ls = self.layers.get(step.layer)
        if ls is None:
            ls = self.layers[step.layer] = LayerScheme(self.g, step.layer, step.family,
                                                       self.cfg, self.compute)
        y = ls.step(step)
        if self.g.dither:
            from .scan import dither

            y = dither(y, [self.g], y.shape[1], self.cfg.run.seed, step.layer, ls.pos)
        L, W = self.cfg.replay.buffer_len, self.cfg.metrics.window
        if self.ref_layers is not None and ls.pos % L == 0 and drift_due(ls.pos - L, L, L, W):
            from .scan import rel_rows

            ref = self.ref_layers[step.layer].s.state
            held = ls.s.held()
            self.g.drift.setdefault(step.layer, []).append(
                (ls.pos, rel_rows(held["state"], ref),
                 rel_rows(held["read"], ref) if "read" in held else None))
        return y, ls.s.state


def run_decode(model, ids: np.ndarray, groups, cfg, compute, bar=None) -> dict:
    """Per-token metrics like :func:`precsim.models.parallel.run_parallel`, token by token."""
    K, N = ids.shape
    ref_h = DecodeHandler(groups[0], cfg, compute, None)
    handlers = [ref_h] + [DecodeHandler(g, cfg, compute, ref_h.layers) for g in groups[1:]]
    caches = [None] * len(groups)
    out = {g.name: {k: np.full((K, N), np.nan) for k in TOKEN_KEYS} for g in groups}
    nxt_all = np.full((K, N), -1, dtype=np.int64)
    nxt_all[:, :-1] = ids[:, 1:]
    if K != 1:
        from ..errors import PrecsimError

        raise PrecsimError(f"model.doc_batch={cfg.model.doc_batch!r} with model.mode=decode "
                           f"({K} documents a batch); allowed: 1 or auto (one document a "
                           "batch), or model.mode=parallel")
    with torch.no_grad(), Hook(model) as hook:
        for t in range(N):
            logits = []
            for gi, h in enumerate(handlers):
                hook.handler = h
                lg, caches[gi] = forward_token(model, ids[:, t], caches[gi], t)
                logits.append(lg.double())
            nxt = torch.as_tensor(nxt_all[:, t], device=logits[0].device)
            for gi, g in enumerate(groups):
                mets = own_metrics(logits[0], nxt) if gi == 0 else token_metrics(
                    logits[g.vs], logits[gi], nxt)
                for k, v in mets.items():
                    out[g.name][k][:, t] = v
            if bar is not None:
                bar.update(1)
    return out
