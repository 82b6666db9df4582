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
    import inspect

    from .parallel import run_parallel

    phases = {} if phases is None else phases
    K, P = ids.shape
    tail: dict = {}
    backend = "triton" if backend == "triton" and P % cfg.replay.buffer_len == 0 else "torch"
    out = run_parallel(model, ids, groups, cfg, compute, backend, bar, phases=phases, tail=tail)
    t0 = time.perf_counter()
    if backend == "triton":
        to_torch(tail["chunks"], groups, K, cfg, compute, P)
        tail["handler"].backend = "torch"
    base, head = base_and_head(model)
    kw, attr = cache_io(base)
    pos_kw = "position_ids" in inspect.signature(base.forward).parameters
    dev = input_device(model)
    n = len(groups)
    toks = np.zeros((n * K, new_tokens), dtype=np.int64)
    margin = np.zeros((n * K, new_tokens))
    cache, h, chunks = tail["cache"], tail["h"], tail["chunks"]
    tail["handler"].bar = None  # (the bar counts written tokens from here)
    with torch.no_grad(), Hook(model, tail["handler"]):
        for t in range(new_tokens):
            top2 = torch.topk(head(h[:, -1]).double(), 2, dim=-1)
            nxt = top2.indices[:, 0]
            toks[:, t] = nxt.cpu().numpy()
            margin[:, t] = (top2.values[:, 0] - top2.values[:, 1]).cpu().numpy()
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
    chunks.settle()  # the steps' non-finite checks (each step's top-2 read-back waited already)
    phases["generate_s"] = round(time.perf_counter() - t0, 3)
    gen = {g.name: {"tokens": toks[i * K:(i + 1) * K], "margin": margin[i * K:(i + 1) * K]}
           for i, g in enumerate(groups)}
    return out, gen


def to_torch(chunks, groups, K: int, cfg, compute, pos: int) -> None:
    """Every layer's Triton states in ``chunks`` (at a flush, after ``pos`` tokens) as the torch
    backend's schemes, in place: the float64 truth slot becomes the reference's state, each
    scheme slot its group's master (``st``), read copy (``rd``, split) and error-feedback
    residual (``ef``, zero for a group without it); the event counts (tokens for conventional
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
                s.resid = torch.zeros_like(s.state)
            else:
                i = gi - 1
                s.state = k["st"][i].view(shape).to(compute).clone()
                s.read = k["rd"][i].view(shape).to(compute).clone() if sc.kind == "split" \
                    else s.state
                s.resid = (torch.zeros_like(s.state) if k["ef"][i] is None
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
