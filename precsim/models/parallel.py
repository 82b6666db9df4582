"""Whole-model mode, sequence-parallel (``model.mode=parallel``, the default).

Under teacher forcing everything in the model but the SSM recurrences is parallel over positions.
So a forward pass over the documents runs the reference and every scheme as batch elements
(group ``g`` holds rows ``[g*K, (g+1)*K)``), and each SSM mixer's scan is replaced by
:func:`precsim.models.scan.scan`, which advances every group's state over the pass's positions.
The documents go through in chunks of ``model.chunk`` positions (the model's cache and every
layer's group states carried from one pass to the next; a checkpoint can fall between two), and
the output head runs on each chunk's last hidden state, so neither the hidden states nor the
logits of the whole run are held at once.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from .hook import Hook
from .load import base_and_head, vocab_size
from .metrics import TOKEN_KEYS, own_metrics, result_rows, token_metrics
from .scan import Chunks, scan

HEAD_ELEMS = 2 ** 27  # logits per group and head pass (1 GiB in float64)


class ScanHandler:
    """Hook handler: every SSM layer's scan under every group (see :mod:`.scan`); the states
    continue from chunk to chunk in ``chunks``."""

    def __init__(self, groups, K: int, cfg, compute, backend: str, chunks: Chunks | None = None,
                 bar=None):
        self.groups, self.K, self.cfg, self.compute = groups, K, cfg, compute
        self.backend, self.chunks, self.bar = backend, chunks, bar

    def __call__(self, step, run_own):
        y = scan(step, self.groups, self.K, self.cfg, self.compute, self.backend,
                 chunks=self.chunks)
        if self.bar is not None:
            self.bar.update(1)
        return y, None


# model.chunk=auto: the chunks a whole-model run chooses from, largest first
# (:func:`.run.auto_chunk`); the first is the chunk wherever nothing chooses (the CPU, tasks)
AUTO_CHUNKS = (32768, 16384, 8192, 4096, 2048)


def chunk_setting(v) -> int:
    """``model.chunk``'s positions a pass as set: an integer as given, ``auto`` the largest of
    :data:`AUTO_CHUNKS` (a whole-model run on a GPU replaces it first: :func:`.run.auto_chunk`)."""
    return AUTO_CHUNKS[0] if v == "auto" else v


def largest_chunk(fits) -> int:
    """``model.chunk=auto``'s choice: the largest of :data:`AUTO_CHUNKS` for which ``fits(c)``
    holds, else the smallest (the most rows or documents a pass)."""
    return next((c for c in AUTO_CHUNKS if fits(c)), AUTO_CHUNKS[-1])


def with_chunk(cfg, chunk: int):
    """``cfg`` with ``model.chunk=chunk``."""
    import dataclasses

    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, chunk=chunk))


def chunk_len(cfg, N: int, backend: str) -> int:
    """Positions per forward pass: ``model.chunk`` rounded up to whole ReplaySSM segments (on the
    Triton backend to whole launch windows, so chunking moves no drift sample and no flush), or
    ``N`` (``model.chunk=0``, or a chunk longer than the documents)."""
    from .scan_triton import DRIFT_EVERY

    L = cfg.replay.buffer_len
    unit = math.ceil(max(cfg.metrics.window, DRIFT_EVERY) / L) * L if backend == "triton" else L
    c = math.ceil(chunk_setting(cfg.model.chunk) / unit) * unit
    return N if c == 0 or c >= N else c


def run_parallel(model, ids: np.ndarray, groups, cfg, compute, backend: str,
                 bar=None, head_chunk: int = 1024, phases: dict | None = None,
                 ckpt=None, tail: dict | None = None, at: np.ndarray | None = None,
                 start: dict | None = None) -> dict:
    """Per-token metrics ``{scheme: {"kl"|"top1"|"rel": (K, N)}}`` of every scheme group against
    the reference group (``groups[0]``) over the documents ``ids (K, N)``, in forward passes of
    :func:`chunk_len` positions (the model's cache and every layer's group states carried from
    one to the next); the forward passes' and the output head's seconds go to ``phases``.
    ``ckpt`` (:mod:`precsim.checkpoint`) saves between chunks and resumes from its save.
    ``tail`` (a dict; generation): the model's cache is kept throughout, and ``tail`` gets what
    a continuation needs: ``cache``, ``h`` (every row's last hidden state), ``chunks`` and
    ``handler`` (every layer's group states). ``at`` (bool, ``(K, N)``; task scoring): the
    output head and the metrics only at those positions (NaN elsewhere): the same values there,
    without the head's cost at every position. ``start`` (a ``tail`` of an earlier call, e.g.
    :func:`.generate.merge_tails`' rows of a shared context; the torch backend): ``ids`` continue
    it, their first column at position ``start["prompt_len"]``, from its cache and states."""
    import inspect

    from ..checkpoint import Checkpoint
    from .load import cache_io, devices_of, first_cache, input_device

    phases = {} if phases is None else phases
    ck = ckpt or Checkpoint(cfg, None)
    dev = input_device(model)
    devs = devices_of(model)
    K, N = ids.shape
    C = chunk_len(cfg, N, backend)
    base, head = base_and_head(model)
    # positions per head pass: at most HEAD_ELEMS logits per group (three groups' float64
    # logits are held at once: the reference, the baseline and the scheme)
    head_chunk = max(16, min(head_chunk, HEAD_ELEMS // max(1, K * vocab_size(model))))
    kw, attr = cache_io(base)
    pos_kw = "position_ids" in inspect.signature(base.forward).parameters
    p0 = 0 if start is None else start["prompt_len"]  # (ids' first position)
    if start is None:
        chunks = Chunks(horizon=N)
        handler = ScanHandler(groups, K, cfg, compute, backend, chunks, bar)
    else:
        chunks, handler = start["chunks"], start["handler"]
    out = {g.name: {k: np.full((K, N), np.nan) for k in TOKEN_KEYS} for g in groups}
    nxt_all = np.full((K, N), -1, dtype=np.int64)  # each position's next document token
    nxt_all[:, :-1] = ids[:, 1:]
    bases = {0} | {g.vs for g in groups}  # the groups others are measured against
    cache, pos = None if start is None else start["cache"], 0
    for k in ("forward_s", "head_s"):  # (added to: a task's forward passes share one dict)
        phases.setdefault(k, 0.0)
    saved = None if start is not None else ck.resume(device=dev if len(devs) == 1 else "saved")
    if saved is not None:
        pos, cache, out = saved["pos"], saved["cache"], saved["out"]
        chunks.layers = saved["layers"]
        for g, d in zip(groups, saved["groups"], strict=True):
            g.__dict__.update(d)
        if bar is not None:
            bar.update(len(chunks.layers) * (pos // C))

    def state() -> dict:  # what the next chunk needs, and the metrics so far
        return {"pos": pos, "cache": cache, "out": out, "layers": chunks.layers,
                "groups": [vars(g) for g in groups],
                "dead_at": {g.name: g.dead_at for g in groups[1:]},
                **result_rows(out, groups, cfg.metrics.window, pos)}

    def sync():
        for d in devs:
            if d.type == "cuda":
                torch.cuda.synchronize(d)

    with torch.no_grad(), Hook(model, handler):
        while pos < N:
            c1 = min(N, pos + C)
            t0 = time.perf_counter()
            chunks.offset = p0 + pos
            batch = torch.as_tensor(ids[:, pos:c1], device=dev).repeat(len(groups), 1)
            keep = C < N or tail is not None or start is not None
            extra = {"use_cache": keep}
            if keep and cache is None:
                cache = first_cache(base)  # (None: the model makes its own)
            if keep and cache is not None:
                extra[kw] = cache
            if keep and pos_kw:
                extra["position_ids"] = torch.arange(p0 + pos, p0 + c1, device=dev)[
                    None].expand(batch.shape[0], -1)
            o = base(input_ids=batch, **extra)
            cache = getattr(o, attr, None) if keep else None
            h = o.last_hidden_state
            if tail is not None and c1 == N:
                tail.update(cache=cache, h=h[:, -1:], chunks=chunks, handler=handler)
            sync()
            chunks.settle()  # the layers' drift samples and non-finite checks
            t1 = time.perf_counter()
            if at is not None:
                head_at(h, head, groups, K, bases, at[:, pos:c1], nxt_all[:, pos:c1], out, pos,
                        head_chunk * K)
            for a0 in range(0, c1 - pos, head_chunk) if at is None else ():
                a1 = min(c1 - pos, a0 + head_chunk)
                nxt = torch.as_tensor(nxt_all[:, pos + a0:pos + a1], device=h.device)
                kept = {}
                for gi, g in enumerate(groups):
                    ls = head(h[gi * K:(gi + 1) * K, a0:a1]).double()
                    mets = own_metrics(ls, nxt) if gi == 0 else token_metrics(kept[g.vs], ls,
                                                                              nxt)
                    if gi in bases:
                        kept[gi] = ls
                    for k, v in mets.items():
                        out[g.name][k][:, pos + a0:pos + a1] = v
            del h, o
            phases["forward_s"] += t1 - t0
            phases["head_s"] += time.perf_counter() - t1
            pos = c1
            ck.window(pos, state)
    phases["forward_s"], phases["head_s"] = (round(phases[k], 3) for k in ("forward_s", "head_s"))
    return out


def head_at(h, head, groups, K: int, bases: set, at: np.ndarray, nxt: np.ndarray, out: dict,
            pos: int, most: int) -> None:
    """:func:`run_parallel`'s output head and metrics at the positions ``at`` (``(K, C)``, bool)
    of a chunk starting at ``pos`` only, ``most`` positions a head pass."""
    rr, pp = np.nonzero(at)
    for s0 in range(0, rr.size, most):
        r, p = rr[s0:s0 + most], pp[s0:s0 + most]
        ri = torch.as_tensor(r, device=h.device)
        pi = torch.as_tensor(p, device=h.device)
        nx = torch.as_tensor(nxt[r, p], device=h.device)[None]
        kept = {}
        for gi, g in enumerate(groups):
            ls = head(h[gi * K + ri, pi][None]).double()  # (1, positions, vocabulary)
            mets = own_metrics(ls, nx) if gi == 0 else token_metrics(kept[g.vs], ls, nx)
            if gi in bases:
                kept[gi] = ls
            for k, v in mets.items():
                out[g.name][k][r, pos + p] = v[0]


def floor_group(g, groups) -> bool:
    """Whether group ``g`` belongs to the floor: the baseline others compare with, or the
    noise run."""
    return g.role != "scheme" or any(groups[o.vs] is g for o in groups[1:])


def run_split(copies, shards: list[list[str]], ids: np.ndarray, groups, cfg, compute,
              backend: str, bar=None, phases: dict | None = None) -> dict:
    """:func:`run_parallel` with the scheme groups split across model copies (``copies``:
    ``(model, device)``; ``shards``: the scheme names each copy runs, contiguous in scheme
    order), one thread per copy; each copy runs the reference beside its schemes. The metrics
    of every scheme, in scheme order (the scheme groups collect their drift as in one run);
    ``phases`` gets the slowest copy's seconds. No checkpoints between chunks: an interrupt
    stops every copy at its next chunk and keeps nothing."""
    import dataclasses
    from concurrent.futures import ThreadPoolExecutor

    from ..checkpoint import Checkpoint, Interrupted, request_stop
    from .scan import Group

    by_name = {g.name: g for g in groups[1:]}
    ref = groups[0]
    # the floor's groups (the baseline, the noise run: a prefix of ``groups`` after the
    # reference, so that every group's ``vs`` index holds in each copy) run in every copy;
    # the first copy's are kept
    nf = 1 + max((i for i, g in enumerate(groups[1:], 1) if floor_group(g, groups)),
                 default=0)
    floor = groups[1:nf]
    stopped: list[int] = []

    def one(i: int):
        (model, dev), names = copies[i], shards[i]
        mine = floor if i == 0 else [dataclasses.replace(g, drift={}, dead_at=None)
                                     for g in floor]
        gs = [Group(ref.name, ref.cfg, reference=True), *mine,
              *(by_name[n] for n in names if not any(by_name[n] is f for f in floor))]
        ph: dict = {}
        ck = Checkpoint(cfg, None)
        ck.start(f"model/{backend}", dev, time.perf_counter())
        try:
            return run_parallel(model, ids, gs, cfg, compute, backend, bar, phases=ph,
                                ckpt=ck), ph
        except Interrupted as e:
            stopped.append(e.signum)
            request_stop(e.signum)  # the other copies stop at their next chunk too
            return {}, {}

    with ThreadPoolExecutor(len(copies)) as ex:
        done = list(ex.map(one, range(len(copies))))
    if stopped:
        request_stop(None)
        raise Interrupted(stopped[0])
    out = {}
    for i, (res, _) in enumerate(done):
        out.update({k: v for k, v in res.items() if i == 0 or k not in out})
    if phases is not None:
        for k in ("forward_s", "head_s"):
            phases[k] = max(ph[k] for _, ph in done)
    return {g.name: out[g.name] for g in groups}
