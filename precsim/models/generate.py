"""Whole-model mode, free-running (``model.mode=generate``): does a state format change what the
model writes?

Each document's tokens are a prompt. Every group (the reference, the FP32-state baseline, the
noise run, each scheme) reads the prompt in one sequence-parallel pass (its teacher-forced
metrics are the run's rows, as in ``model.mode=parallel``), then writes ``model.new_tokens``
greedily, one token a step, each row feeding back its own argmax: the baseline's rows write the
baseline's continuation, each scheme's rows its own. Until a scheme's first divergence (its
first token other than the baseline's) its rows have read exactly the baseline's continuation,
so that position is the first argmax mismatch of the scheme teacher-forced along the
baseline's continuation (a test checks the two agree); from there it runs free.

In several document batches (``model.doc_batch``) only the prompts go batch by batch; the
batches' documents then write their tokens together (:func:`generate_batches`).

One-token steps end inside ReplaySSM segments: the scans keep the unfinished segment's inputs
and evaluate it again at the next step (:class:`precsim.models.scan.Chunks`), as decode mode
does. The steps run on the torch backend; the prompt too, unless the run's scans are the Triton
kernels and the prompt ends a ReplaySSM segment: then the kernels read the prompt and their
states (every group's, at a flush) become the torch schemes' (:func:`to_torch`).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from .hook import Hook
from .load import base_and_head, cache_io, input_device

SHOWN_DOCS = 4  # documents written to result.GENERATIONS_FILE


def run_generate(model, ids: np.ndarray, groups, cfg, compute, new_tokens: int, bar=None,
                 phases: dict | None = None, backend: str = "torch") -> tuple[dict, dict]:
    """``(per-token metrics over the prompts, as run_parallel's; generation)``: generation's
    ``tokens`` and ``margin`` (top-1 minus top-2 logit of each written token) per group name,
    arrays ``(K, new_tokens)``."""
    phases = {} if phases is None else phases
    out, tail = read_prompts(model, ids, groups, cfg, compute, bar, phases, backend)
    return out, write_tokens(model, tail, groups, ids.shape[0], new_tokens, bar, phases)


def read_prompts(model, ids: np.ndarray, groups, cfg, compute, bar=None,
                 phases: dict | None = None, backend: str = "torch",
                 at: np.ndarray | None = None) -> tuple[dict, dict]:
    """The prompts' pass: ``(per-token metrics, as run_parallel's; the tail)``, the tail being
    what :func:`write_tokens` continues from (run_parallel's ``tail``: the model's cache, every
    row's last hidden state, every layer's group states, on the torch backend). ``at``: the
    metrics only there (run_parallel's; all False: no output head at all)."""
    from .parallel import run_parallel

    phases = {} if phases is None else phases
    K, P = ids.shape
    tail: dict = {}
    backend = "triton" if backend == "triton" and P % cfg.replay.buffer_len == 0 else "torch"
    out = run_parallel(model, ids, groups, cfg, compute, backend, bar, phases=phases, tail=tail,
                       at=at)
    if backend == "triton":
        t0 = time.perf_counter()
        to_torch(tail["chunks"], groups, K, cfg, compute, P)
        tail["handler"].backend = "torch"
        phases["generate_s"] = round(phases.get("generate_s", 0.0) + time.perf_counter() - t0, 3)
    tail["prompt_len"] = P
    return out, tail


def write_tokens(model, tail: dict, groups, K: int, new_tokens: int, bar=None,
                 phases: dict | None = None) -> dict:
    """``new_tokens`` greedy tokens of every row from ``tail`` (:func:`read_prompts`'s, or
    :func:`merge_tails`'): per group name ``tokens`` and ``margin``, arrays ``(K, new_tokens)``;
    the seconds go to ``phases["generate_s"]``."""
    import inspect

    phases = {} if phases is None else phases
    t0 = time.perf_counter()
    P = tail["prompt_len"]
    base, head = base_and_head(model)
    kw, attr = cache_io(base)
    pos_kw = "position_ids" in inspect.signature(base.forward).parameters
    dev = input_device(model)
    n = len(groups)
    cache, h, chunks = tail["cache"], tail["h"], tail["chunks"]
    # the written tokens and margins stay on the device until the last step: a read-back at
    # every step would make the host wait for the device there, instead of queuing the next
    # step's work while the device runs this one's
    toks = torch.zeros((n * K, new_tokens), dtype=torch.int64, device=h.device)
    margin = torch.zeros((n * K, new_tokens), dtype=torch.float64, device=h.device)
    tail["handler"].bar = None  # (the bar counts written tokens from here)
    with torch.no_grad(), Hook(model, tail["handler"]):
        for t in range(new_tokens):
            top2 = torch.topk(head(h[:, -1]).double(), 2, dim=-1)
            nxt = top2.indices[:, 0]
            toks[:, t] = nxt
            margin[:, t] = top2.values[:, 0] - top2.values[:, 1]
            if bar is not None:
                bar.update(1)
            if t == new_tokens - 1:
                break
            chunks.offset = P + t
            extra = {kw: cache, "use_cache": True}
            if pos_kw:
                extra["position_ids"] = torch.full((n * K, 1), P + t, device=dev)
            o = base(input_ids=nxt[:, None].to(dev), **extra)
            cache, h = getattr(o, attr), o.last_hidden_state
    toks, margin = toks.cpu().numpy(), margin.cpu().numpy()
    chunks.settle()  # the steps' non-finite checks
    phases["generate_s"] = round(phases.get("generate_s", 0.0) + time.perf_counter() - t0, 3)
    return {g.name: {"tokens": toks[i * K:(i + 1) * K], "margin": margin[i * K:(i + 1) * K]}
            for i, g in enumerate(groups)}


def generate_batches(ld, spans: list[tuple[int, int]], batch, new_tokens: int, step_docs: int,
                     bar, phases: dict) -> list:
    """Generation over document batches (``spans``: each batch's documents ``[s, e)``;
    ``batch(b)``: batch ``b``'s config and fresh groups): each batch's prompts go through the
    model alone (the prompt pass is what needs the memory: a chunk of positions of every row),
    then consecutive batches of up to ``step_docs`` documents together write their tokens, one
    step for all of them (a step is mostly the host's dispatch of the scheme code, hardly
    growing with the rows: experiments/bench/bench_floor_gen.md), from their tails merged
    (:func:`merge_tails`). On a GPU the tails of a group's
    earlier batches wait in host memory while the later batches' prompts run. Returns
    ``[((per-token metrics, generation), groups)]`` per batch, as :func:`.run.merge_batches`
    takes them: the drift samples and first non-finite tokens of the steps are shared out to
    the batches' groups by document.

    The SR draws of the written tokens are the first batch's seed's, over all the group's
    documents (a draw is keyed by the element's index, so no two documents share bits)."""
    import dataclasses

    cuda, dev = ld.device.startswith("cuda"), input_device(ld.model)
    parts = []
    for i, j in step_groups(spans, step_docs):
        park = cuda and j - i > 1
        done = []
        for b in range(i, j):
            cb, gs = batch(b)
            s, e = spans[b]
            ph: dict = {}
            out, tail = read_prompts(ld.model, ld.ids[s:e], gs, cb, ld.compute, bar, ph,
                                     ld.backend)
            for k, v in ph.items():
                phases[k] = round(phases.get(k, 0.0) + v, 3)
            if park:  # (host memory until the group's last prompt is read)
                map_tensors([tail], lambda ts: ts[0].to("cpu"))
            done.append((out, tail, gs, e - s))
        sizes = [d[3] for d in done]
        if len(done) == 1:
            writers, tail = done[0][2], done[0][1]
        else:
            writers = [dataclasses.replace(g, drift={}, dead_at=None) for g in done[0][2]]
            # (parked: each merged tensor is filled on the device from the host's parts, not
            # joined in host memory first; what the merge does not join follows it there)
            tail = merge_tails([d[1] for d in done], sizes, len(writers), writers,
                               dev if park else None)
            if park:
                map_tensors([tail], lambda ts: ts[0].to(dev))
        done = [(out, gs, k) for out, _, gs, k in done]  # (the batches' own tails go)
        ph = {}
        gen = write_tokens(ld.model, tail, writers, sum(sizes), new_tokens, bar, ph)
        phases["generate_s"] = round(phases.get("generate_s", 0.0) + ph["generate_s"], 3)
        del tail
        lo = 0
        for out, gs, k in done:
            mine = {nm: {key: v[lo:lo + k] for key, v in d.items()} for nm, d in gen.items()}
            if len(done) > 1:
                _share_out(writers, gs, lo, k)
            parts.append(((out, mine), gs))
            lo += k
    return parts


def step_groups(spans: list[tuple[int, int]], step_docs: int) -> list[tuple[int, int]]:
    """The batches ``[i, j)`` whose documents write their tokens together: consecutive
    batches of at most ``step_docs`` documents in all (at least one batch)."""
    out, i = [], 0
    while i < len(spans):
        j, docs = i + 1, spans[i][1] - spans[i][0]
        while j < len(spans) and docs + spans[j][1] - spans[j][0] <= step_docs:
            docs += spans[j][1] - spans[j][0]
            j += 1
        out.append((i, j))
        i = j
    return out


def merge_tails(tails: list[dict], sizes: list[int], n: int, groups, device=None) -> dict:
    """One tail (:func:`read_prompts`') of the batches' documents in order, from each batch's
    (``sizes``: its documents; ``n`` groups, whose rows are group-major: group ``i`` holds rows
    ``[i*K, (i+1)*K)``): the model's cache and last hidden states row by row (every tensor whose
    first axis is a batch's rows; the others, such as a cache's token count, are the same in
    every batch), an unfinished ReplaySSM segment's inputs (rows on the second axis) likewise,
    each layer's scheme states by document (``dead_at`` the earliest); the first batch's handler
    and chunks carry them, with ``groups`` as the groups. ``device``: the joined tensors are
    built there (each filled part by part: no joined copy where the parts are, such as host
    memory, and no parts and whole together on the device)."""
    from ..schemes import Scheme

    def join(parts: list, axis: int):
        if device is None:
            return torch.cat(parts, dim=axis)
        shape = list(parts[0].shape)
        shape[axis] = sum(p.shape[axis] for p in parts)
        out = torch.empty(shape, dtype=parts[0].dtype, device=device)
        at = 0
        for p in parts:
            out.narrow(axis, at, p.shape[axis]).copy_(p)
            at += p.shape[axis]
        return out

    def rows(ts: list, axis: int = 0):
        if any(t.dim() <= axis or t.shape[axis] != n * k for t, k in zip(ts, sizes,
                                                                          strict=True)):
            if any(t.shape != ts[0].shape or not torch.equal(t, ts[0]) for t in ts[1:]):
                raise RuntimeError(f"generation's merged batches: a cache tensor of shape "
                                   f"{tuple(ts[0].shape)} has no axis of the batch's "
                                   f"{n} x {sizes[0]} rows and differs between batches")
            return ts[0]
        return join([t.narrow(axis, i * k, k) for i in range(n)
                     for t, k in zip(ts, sizes, strict=True)], axis)

    first = tails[0]
    chunks = first["chunks"]
    cache = map_tensors([t["cache"] for t in tails], rows)
    h = rows([t["h"] for t in tails])
    for layer in chunks.partial:
        chunks.partial[layer] = map_tensors([t["chunks"].partial[layer] for t in tails],
                                         lambda ts: rows(ts, 1))
    for layer, objs in chunks.layers.items():
        for gi, s in enumerate(objs):
            mine: list[Scheme] = [t["chunks"].layers[layer][gi] for t in tails]
            same_read = s.read is s.state
            for attr in ("state", "resid") if same_read else ("state", "read", "resid"):
                if getattr(s, attr) is not None:
                    setattr(s, attr, join([getattr(x, attr) for x in mine], 0))
            if same_read:
                s.read = s.state
            dead = [x.dead_at for x in mine if x.dead_at is not None]
            s.dead_at = min(dead) if dead else None
    handler = first["handler"]
    handler.groups, handler.K = groups, sum(sizes)
    return {**first, "cache": cache, "h": h, "chunks": chunks, "handler": handler}


def _share_out(merged, groups, lo: int, k: int) -> None:
    """The steps' drift samples and first non-finite tokens of the merged groups, as batch
    groups ``groups``' (its documents: ``[lo, lo + k)`` of the merged rows), after their own."""
    for m, g in zip(merged, groups, strict=True):
        for layer, samples in m.drift.items():
            g.drift.setdefault(layer, []).extend(
                (tok, st[lo:lo + k], None if rd is None else rd[lo:lo + k])
                for tok, st, rd in samples)
        if m.dead_at is not None:
            g.dead_at = min(g.dead_at or m.dead_at, m.dead_at)


def map_tensors(objs: list, fn, memo: dict | None = None):
    """``objs[0]`` with each tensor ``t`` in it replaced by ``fn([t and the tensors at the same
    place in objs[1:]])``, in place where it can be (lists, dicts, the attributes of
    transformers' cache objects, of precsim's schemes and of :class:`.scan.Chunks`); a tensor
    met twice is replaced once (a scheme whose read copy is its state stays so)."""
    from ..schemes import Scheme
    from .scan import Chunks

    memo = {} if memo is None else memo
    o = objs[0]
    if isinstance(o, torch.Tensor):
        if id(o) not in memo:
            memo[id(o)] = fn(objs)
        return memo[id(o)]
    if isinstance(o, list):
        o[:] = [map_tensors([x[i] for x in objs], fn, memo) for i in range(len(o))]
        return o
    if isinstance(o, tuple):
        return type(o)(map_tensors([x[i] for x in objs], fn, memo) for i in range(len(o)))
    if isinstance(o, dict):
        for key in list(o):
            o[key] = map_tensors([x[key] for x in objs], fn, memo)
        return o
    if isinstance(o, Scheme | Chunks) or type(o).__module__.startswith("transformers"):
        for key in list(vars(o)):
            setattr(o, key, map_tensors([vars(x)[key] for x in objs], fn, memo))
    return o


def to_torch(chunks, groups, K: int, cfg, compute, pos: int) -> None:
    """Every layer's Triton states in ``chunks`` (at a flush, after ``pos`` tokens) as the torch
    backend's schemes, in place: the float64 truth slot becomes the reference's state, each
    scheme slot its group's master (``st``), read copy (``rd``, split) and error-feedback
    residual (``ef``, None for a group without it); the event counts (tokens for conventional
    schemes, flushes for replay ones) continue the SR streams where the kernels left them (the
    same keys)."""
    from ..schemes import SCHEMES, format_options

    L = cfg.replay.buffer_len
    for layer, k in list(chunks.layers.items()):
        SH, P, N = k["S64"].shape
        shape = (K, SH // K, P, N)
        objs = []
        for gi, g in enumerate(groups):
            sc = g.at(layer)
            s = SCHEMES[sc.kind](name=f"{g.name}@layer{layer}", cfg=sc, seed=cfg.run.seed,
                                 fmt_options=format_options(cfg),
                                 tensor_scope=cfg.formats.tensor_scope)
            if g.reference:
                s.state = s.read = k["S64"].view(shape).clone()
                s.resid = None
            else:
                i = gi - 1
                s.state = k["st"][i].view(shape).to(compute).clone()
                s.read = k["rd"][i].view(shape).to(compute).clone() if sc.kind == "split" \
                    else s.state
                s.resid = (None if k["ef"][i] is None
                           else k["ef"][i].view(shape).to(compute).clone())
            s.events = pos if sc.kind == "conventional" else pos // L
            s.dead_at = g.dead_at
            objs.append(s)
        chunks.layers[layer] = objs


def first_divergence(mine: np.ndarray, base: np.ndarray) -> list[int | None]:
    """Per document: the first written token (1-based) that differs from the baseline's
    (None: the continuation is identical)."""
    out = []
    for a, b in zip(mine, base, strict=True):
        d = np.flatnonzero(a != b)
        out.append(int(d[0]) + 1 if d.size else None)
    return out


def teacher_forced_divergence(arg: np.ndarray, prompt_len: int,
                              cont: np.ndarray) -> list[int | None]:
    """Per document, from a teacher-forced pass over prompt + the baseline's continuation
    ``cont (K, G)``: the first position of the continuation whose argmax (``arg``, the pass's
    per-position argmax) is not the baseline's token (None: none)."""
    G = cont.shape[1]
    pred = arg[:, prompt_len - 1:prompt_len - 1 + G]
    return first_divergence(pred.astype(np.int64), cont)


def generation_figures(gen: dict, runs: dict[str, list[str]], base_name: str) -> dict:
    """Per row (``runs``: its name -> the groups it pools, e.g. a scheme's SR seeds): the share
    of documents (and SR seeds) whose continuation is identical to the baseline's, each first
    divergence (1-based; None: identical), and at each divergence the baseline's and the row's
    margins (top-1 minus top-2 logit)."""
    base = gen[base_name]
    out = {}
    for row, names in runs.items():
        first, m_base, m_own = [], [], []
        for nm in names:
            d = first_divergence(gen[nm]["tokens"], base["tokens"])
            first += d
            for k, f in enumerate(d):
                if f is not None:
                    m_base.append(float(base["margin"][k, f - 1]))
                    m_own.append(float(gen[nm]["margin"][k, f - 1]))
        same = [f is None for f in first]
        div = [f for f in first if f is not None]
        out[row] = {
            "identical_rate": float(np.mean(same)), "first_divergence": first,
            "first_divergence_median": float(np.median(div)) if div else None,
            "margin_at_divergence_baseline": m_base, "margin_at_divergence_scheme": m_own}
    return out


def generations_text(gen: dict, ids: np.ndarray, rows_groups, base_name: str,
                     tokenizer=None, docs: int = SHOWN_DOCS) -> str:
    """``generations.txt``: for the first ``docs`` documents, the prompt's end, the baseline's
    continuation and each scheme's (tokenizer-decoded; token ids without a tokenizer), with the
    first divergence marked."""
    def text(t) -> str:
        t = [int(x) for x in t]
        if tokenizer is not None:
            return repr(tokenizer.decode(t))
        return " ".join(map(str, t))

    lines = []
    for k in range(min(docs, ids.shape[0])):
        b = gen[base_name]["tokens"][k]
        lines += [f"=== document {k}", f"prompt (last 32 tokens): {text(ids[k, -32:])}",
                  f"baseline [{base_name}]: {text(b)}"]
        for g in rows_groups[1:]:
            s = gen[g.name]["tokens"][k]
            d = first_divergence(s[None], b[None])[0]
            where = "identical" if d is None else f"diverges at token {d}"
            lines.append(f"{g.name} ({where}): {text(s)}")
        lines.append("")
    return "\n".join(lines)
