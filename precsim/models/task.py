"""``experiment=task_eval``: task accuracy under each state format (docs/tasks.md).

The items (:mod:`precsim.tasks`) become token-id rows: one per choice of a multiple-choice item,
one per generative item. A context that several rows share (a multiple-choice item's) is read
once, and its rows continue from its states (:func:`score_rows`); the other rows go through
:func:`precsim.models.parallel.run_parallel` a few at a time, sorted longest first and grouped so
that each forward pass holds about ``task.batch_tokens`` rows x positions x groups (right
padding: the model is causal, so a row's positions before its padding are unchanged). Every
group of the run (the float64-state
reference, the FP32-state baseline, the noise floor, each scheme and its SR seeds:
:func:`precsim.models.run.build_groups`) sees the same rows; per row it gives the summed
log-likelihood of the scored tokens and whether the argmax at each of them is the next token.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path

import numpy as np
import torch

from ..errors import PrecsimError
from ..rundir import ITEMS_CSV, SUMMARY_FILE
from ..tasks import METRICS, Item, builtin_items, check_builtin, read_items
from .task_report import format_table, summarize, write


# -- rows -------------------------------------------------------------------------------------
@dataclasses.dataclass
class Rows:
    """Token-id rows to score: row ``r`` is ``ids[r]``; its scored tokens are positions
    ``[start[r], start[r] + n[r])``."""

    ids: list
    start: np.ndarray
    n: np.ndarray

    @classmethod
    def of(cls, items: list[Item]) -> tuple[Rows, np.ndarray]:
        """The rows of ``items`` (each choice after its context) and the first row of each."""
        ids, start, n, first = [], [], [], []
        for it in items:
            first.append(len(ids))
            for c in it.choices:
                ids.append(np.asarray([*it.context, *c], dtype=np.int64))
                start.append(len(it.context))
                n.append(len(c))
        return cls(ids, np.asarray(start), np.asarray(n)), np.asarray(first)


CPU_BATCH_TOKENS = 65536  # task.batch_tokens=auto off a CUDA device


def check_batch_tokens(v, key: str) -> None:
    """One-line error unless ``v`` is ``auto`` or an integer >= 1."""
    if not (v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v >= 1)):
        raise PrecsimError(f"{key}={v!r}; allowed: auto or an integer >= 1")


def pass_rows(ld, budget, groups: list, length: int, cfg) -> int:
    """Rows of ``length`` positions one forward pass holds (at least one): ``budget // (groups x
    length)`` for an integer ``budget`` (``task.batch_tokens``); for ``auto`` on a CUDA device
    the most whose whole-model estimate (every group's states and caches, a pass of the
    positions ``model.chunk`` gives: :func:`.parallel.chunk_len`; :func:`.run.docs_that_fit`)
    fits half its free memory, elsewhere as 65,536."""
    if budget == "auto":
        if str(ld.device).startswith("cuda") and ld.plan is None:
            from .parallel import chunk_len
            from .placement import state_bytes
            from .run import docs_that_fit

            return docs_that_fit(ld, len(groups), length, chunk_len(cfg, length, ld.backend),
                                 state_bytes(groups, ld.compute), most=1 << 30)
        budget = CPU_BATCH_TOKENS
    return max(1, budget // (len(groups) * length))


def task_chunk(ld, cfg, budget, groups: list, n: int, count: int):
    """``cfg`` with ``model.chunk=auto`` resolved for a pass over ``count`` rows of ``n``
    positions: with ``task.batch_tokens=auto`` on one CUDA device (no device_map plan) the
    largest of :data:`.parallel.AUTO_CHUNKS` (32,768 .. 2,048) at which all ``count`` rows fit
    one pass by :func:`pass_rows`' estimate, else the smallest, which holds the most rows a
    pass (passkey at 32,768 tokens, 4 items, one H100: 44.4 s of model time at 32,768
    positions a pass, 31.9 s at 2,048; experiments/bench/bench_tasks.md); elsewhere 32,768, as
    :func:`.run.auto_chunk`. Rows no longer than 2,048 positions pass whole at every choice. An
    integer ``model.chunk``: ``cfg`` as it is."""
    from .parallel import AUTO_CHUNKS, largest_chunk, with_chunk

    if cfg.model.chunk != "auto":
        return cfg
    if budget != "auto" or not str(ld.device).startswith("cuda") or ld.plan is not None:
        return with_chunk(cfg, AUTO_CHUNKS[0])
    return with_chunk(cfg, largest_chunk(
        lambda c: pass_rows(ld, budget, groups, n, with_chunk(cfg, c)) >= count))


def batches(ld, cfg, budget, groups: list, lengths: np.ndarray):
    """Each forward pass's row indices and config: longest first, as many rows of similar length
    as :func:`pass_rows` holds at the chunk :func:`task_chunk` picks for the rows left."""
    order = np.argsort(-lengths, kind="stable")
    i = 0
    while i < order.size:
        n = int(lengths[order[i]])
        c = task_chunk(ld, cfg, budget, groups, n, order.size - i)
        k = max(1, pass_rows(ld, budget, groups, n, c))
        yield order[i:i + k], c
        i += k


def shared_contexts(rows: Rows, L: int) -> tuple[list[list[list[int]]], np.ndarray]:
    """The rows whose context is read once (:func:`score_rows`): batches of contexts of one
    length ``P > L`` that two or more rows share (each context: its rows, in order), and the
    other rows' indices. A context is read to ``((P - 1) // L) * L`` positions, a whole number
    of ReplaySSM segments (the Triton kernels read it where the run uses them)."""
    by: dict = {}
    for r in range(len(rows.ids)):
        P = int(rows.start[r])
        if P > L:
            by.setdefault((P, rows.ids[r][:P].tobytes()), []).append(r)
    shared = [v for v in by.values() if len(v) > 1]
    taken = {r for v in shared for r in v}
    rest = np.asarray([r for r in range(len(rows.ids)) if r not in taken], dtype=np.int64)
    lengths: dict = {}
    for v in shared:
        lengths.setdefault(int(rows.start[v[0]]), []).append(v)
    return list(lengths.values()), rest


def _scored(owner: np.ndarray, st: np.ndarray, nn: np.ndarray):
    """``(pass row, position)`` of every scored prediction of a pass's rows (``owner``: the row
    of ``rows`` each pass row scores, -1 none; its scored tokens at pass positions ``[st, st +
    nn)``, each predicted from the position before)."""
    live = np.flatnonzero(owner >= 0)
    n = nn[live]
    rr = np.repeat(live, n)
    return rr, np.repeat(st[live] - 1, n) + (np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n))


def _at(shape, owner: np.ndarray, st: np.ndarray, nn: np.ndarray) -> np.ndarray:
    """Where the pass runs the output head: only where a token is scored."""
    at = np.zeros(shape, dtype=bool)
    at[_scored(owner, st, nn)] = True
    return at


def _gather(out: dict, groups, tok: dict, ids: np.ndarray, owner: np.ndarray, st: np.ndarray,
            nn: np.ndarray, R: int) -> None:
    """Into ``out``: each group's summed log-likelihood and greedy flag of the pass's rows
    (:func:`_scored`'s ``owner``, ``st``, ``nn``)."""
    live = np.flatnonzero(owner >= 0)
    rr, pos = _scored(owner, st, nn)
    nxt = ids[rr, pos + 1]
    K = ids.shape[0]
    for g in groups:
        t = tok[g.name]
        o = out.setdefault(g.name, {"lp": np.full(R, np.nan), "greedy": np.zeros(R)})
        lp = np.bincount(rr, weights=t["lp"][rr, pos], minlength=K)
        miss = np.bincount(rr, weights=(t["arg"][rr, pos] != nxt).astype(float), minlength=K)
        o["lp"][owner[live]] = lp[live]
        o["greedy"][owner[live]] = (miss[live] == 0).astype(float)


def score_rows(ld, cfg, rows: Rows, groups_fn, budget, bar=None, phases=None,
               used: set | None = None, ckpt=None) -> dict:
    """Every group's scores of ``rows``: ``{name: {"lp": summed log-likelihood of each row's
    scored tokens (R,), "greedy": 1.0 where the argmax at each of them is the next token (R,)}}``
    (NaN log-likelihood where a group's output is not finite). ``groups_fn()``: a fresh list of
    the run's groups (a Group keeps per-run state). Batch ``b`` draws its SR bits and dither
    from :func:`.run.batch_seed` ``(run.seed, b)`` (the first: ``run.seed``), so rows of
    different batches do not share random bits.

    A context that several rows share (a multiple-choice item's choices, lm-eval's requests of
    one context) is read once (:func:`shared_contexts`): its pass keeps every group's states
    and the model's cache, which are then repeated for each of its rows, and the rest of each
    row (the context's last partial ReplaySSM segment and the row's own tokens) continues from
    them in one more pass (:func:`.generate.merge_tails`, ``run_parallel(start=...)``).
    ``model.chunk=auto``: each pass's positions by :func:`task_chunk` (those used go to
    ``used``).

    ``ckpt`` (a :class:`precsim.checkpoint.Checkpoint`): after a pass, when due or asked to
    stop, the scores so far and the passes' plan are saved; a run resumed from them follows the
    saved plan (the same passes and batch seeds whatever memory is free now), so its scores
    equal an uninterrupted run's bit for bit."""
    from ..checkpoint import outer

    lengths = np.asarray([r.size for r in rows.ids])
    R = lengths.size
    V = int(ld.model.get_output_embeddings().weight.shape[0])
    plan, out, b0 = None, {}, 0
    key = _rows_key(rows)
    if ckpt is not None:
        ckpt.start("task", ld.device, time.perf_counter())
        saved = ckpt.load()
        if saved is not None and saved["engine"].get("rows_key") != key:
            raise PrecsimError(f"{ckpt.out} holds a checkpoint of this config made from other "
                               "task rows (the task's items changed since); allowed: the same "
                               "items, run.resume=false (start over), or another directory")
        st = ckpt.resume(unit="task row", total=R)
        if st is not None:
            plan, out, b0 = st["plan"], st["out"], st["batch"]
            if bar is not None:
                bar.update(st["pos"])
    if plan is None:  # (a resumed run follows its saved plan)
        plan = _plan(ld, cfg, rows, lengths, groups_fn(), budget)
    done = sum(_plan_rows(e) for e in plan[:b0])
    with outer() if ckpt is not None else contextlib.nullcontext():
        _run_plan(ld, cfg, rows, plan, b0, done, out, lengths, groups_fn, V, bar, phases, used,
                  ckpt, key)
    return out


def _run_plan(ld, cfg, rows, plan, b0, done, out, lengths, groups_fn, V, bar, phases, used,
              ckpt, key) -> None:
    """:func:`score_rows`' passes from ``b0`` on (``done`` rows scored before), into ``out``."""
    from .parallel import chunk_len, run_parallel, with_chunk
    from .run import batch_cfg

    R = lengths.size
    for b in range(b0, len(plan)):
        kind, part, P0, chunk = plan[b]
        c = with_chunk(cfg, chunk)
        if kind == "shared":
            if used is not None:
                used.add(chunk_len(c, P0, ld.backend))
            _score_shared(ld, batch_cfg(c, b), rows, part, P0, groups_fn(), V, out, phases)
        else:
            idx = part
            K, N = idx.size, int(lengths[idx].max())
            if used is not None:
                used.add(chunk_len(c, N, ld.backend))
            ids = np.zeros((K, N), dtype=np.int64)
            for j, r in enumerate(idx):
                ids[j, :lengths[r]] = rows.ids[r]
            # the output head's logits: ~4 float64 copies of (K, positions, V) per group at once
            head = int(max(1, min(1024, (1 << 28) // max(1, K * V * 8))))
            groups = groups_fn()
            st_, nn = rows.start[idx], rows.n[idx]
            tok = run_parallel(ld.model, ids, groups, batch_cfg(c, b), ld.compute, ld.backend,
                               head_chunk=head, phases=phases, at=_at((K, N), idx, st_, nn))
            _gather(out, groups, tok, ids, idx, st_, nn, R)
        done += _plan_rows(plan[b])
        if bar is not None:
            bar.update(_plan_rows(plan[b]))
        if ckpt is not None:
            ckpt.window(done, lambda b=b, d=done: {"pos": d, "batch": b + 1, "plan": plan,
                                                   "out": out, "rows_key": key, "dead_at": {}},
                        end=R, unit="task row", partial=False)


def _plan(ld, cfg, rows: Rows, lengths: np.ndarray, gs: list, budget) -> list[tuple]:
    """:func:`score_rows`' passes in order, each ``(kind, rows, P0, chunk)``: ``("shared",
    contexts (each its rows), P0, chunk)`` for contexts read once to ``P0``, ``("rows", row
    indices, None, chunk)`` for rows read whole; ``chunk``: the pass's ``model.chunk``."""
    shared, rest = shared_contexts(rows, cfg.replay.buffer_len)
    plan: list[tuple] = []
    for same in shared:  # contexts of one length P, read to P0
        P = int(rows.start[same[0][0]])
        P0 = (P - 1) // cfg.replay.buffer_len * cfg.replay.buffer_len
        c = task_chunk(ld, cfg, budget, gs, P0, len(same))
        k = pass_rows(ld, budget, gs, P0, c)
        plan += [("shared", same[c0:c0 + k], P0, c.model.chunk)
                 for c0 in range(0, len(same), k)]
    plan += [("rows", rest[idx], None, c.model.chunk)
             for idx, c in batches(ld, cfg, budget, gs, lengths[rest])]
    return plan


def _plan_rows(entry: tuple) -> int:
    """How many task rows a pass of :func:`_plan` scores."""
    kind, part = entry[0], entry[1]
    return sum(len(c) for c in part) if kind == "shared" else int(part.size)


def _rows_key(rows: Rows) -> str:
    """A digest of the rows' token ids and scored spans (a checkpoint's rows must be these)."""
    import hashlib

    h = hashlib.sha256()
    for r in rows.ids:
        h.update(np.asarray(r, dtype=np.int64).tobytes() + b"|")
    h.update(np.asarray(rows.start, dtype=np.int64).tobytes())
    h.update(np.asarray(rows.n, dtype=np.int64).tobytes())
    return h.hexdigest()


def _score_shared(ld, cfg, rows: Rows, ctxs: list[list[int]], P0: int, groups, V: int,
                  out: dict, phases) -> None:
    """:func:`score_rows` of the rows of contexts ``ctxs`` (each: its rows; the contexts of one
    length, read to ``P0`` positions once): the contexts' pass (no output head), then the rows
    from position ``P0`` in passes of :func:`rows_together` rows a context, each from a copy
    of the contexts' tail repeated that many times (pass row ``j * K + i``: context ``i``'s
    ``j``-th row of the pass). A pass after the first draws its SR bits and dither from
    another seed (its rows have the first pass's indices)."""
    import copy

    from .generate import merge_tails, read_prompts
    from .parallel import run_parallel
    from .run import batch_cfg

    K, most = len(ctxs), max(len(c) for c in ctxs)
    ctx = np.stack([rows.ids[c[0]][:P0] for c in ctxs])
    _, tail = read_prompts(ld.model, ctx, groups, cfg, ld.compute, None, phases, ld.backend,
                           at=np.zeros(ctx.shape, dtype=bool))
    per = rows_together(ld, groups, K, most)
    keep = {id(groups): groups, **{id(g): g for g in groups}, id(cfg): cfg}
    for j0 in range(0, most, per):
        j1 = min(most, j0 + per)
        t = tail if j1 == most else copy.deepcopy(tail, dict(keep))
        if j0:  # (the same row indices as the first pass: other bits)
            t["handler"].cfg = batch_cfg(cfg, j0)
            for objs in t["chunks"].layers.values():
                for sch in objs:
                    sch.seed = t["handler"].cfg.run.seed
        if j1 - j0 > 1:
            t = merge_tails([t] * (j1 - j0), [K] * (j1 - j0), len(groups), groups)
        m = (j1 - j0) * K
        N = max(rows.ids[r].size for c in ctxs for r in c[j0:j1]) - P0
        ids = np.zeros((m, N), dtype=np.int64)
        owner = np.full(m, -1)
        for i, c in enumerate(ctxs):
            for j in range(j0, j1):
                seq = rows.ids[c[min(j, len(c) - 1)]][P0:]  # (a context with fewer rows: a copy)
                ids[(j - j0) * K + i, :min(N, seq.size)] = seq[:N]
                if j < len(c):
                    owner[(j - j0) * K + i] = c[j]
        live = owner >= 0
        st, nn = np.zeros(m, dtype=np.int64), np.zeros(m, dtype=np.int64)
        st[live], nn[live] = rows.start[owner[live]] - P0, rows.n[owner[live]]
        head = int(max(1, min(1024, (1 << 28) // max(1, m * V * 8))))
        tok = run_parallel(ld.model, ids, groups, t["handler"].cfg, ld.compute, "torch",
                           head_chunk=head, phases=phases, at=_at(ids.shape, owner, st, nn),
                           start=t)
        _gather(out, groups, tok, ids, owner, st, nn, len(rows.ids))
        del t, tok


def rows_together(ld, groups, K: int, most: int) -> int:
    """How many rows of each of ``K`` contexts continue in one pass: all ``most`` where their
    repeated states and caches (:func:`.placement.estimate`'s part with the layers) fit in half
    the device's free memory (always on the CPU), else fewer (at least one: then the states of
    the contexts' pass and of one copy)."""
    if not str(ld.device).startswith("cuda"):
        return most
    from .placement import cuda_free, estimate, shape_of, state_bytes

    # (a row's part that lives with the layers, every group: states, caches)
    shape = shape_of(ld.model, next(ld.model.parameters()).dtype)
    row = estimate(shape, 1, len(groups), 1, 1,
                   state_bytes=state_bytes(groups, ld.compute)).group_layers * len(groups)
    free = cuda_free(torch.device(ld.device))
    return int(max(1, min(most, (free // 2) // max(1.0, K * row))))


def last_argmax(ld, cfg, seqs: list, groups_fn, name: str, budget) -> np.ndarray:
    """The greedy next token (argmax at the last position) of each sequence in ``seqs`` under
    group ``name``, in batches (and batch seeds) as :func:`score_rows`."""
    from .parallel import run_parallel
    from .run import batch_cfg

    lengths = np.asarray([len(s) for s in seqs])
    gs = groups_fn()
    V = int(ld.model.get_output_embeddings().weight.shape[0])
    out = np.zeros(lengths.size, dtype=np.int64)
    for b, (idx, c) in enumerate(batches(ld, cfg, budget, gs, lengths)):
        K, N = idx.size, int(lengths[idx].max())
        ids = np.zeros((K, N), dtype=np.int64)
        for j, r in enumerate(idx):
            ids[j, :lengths[r]] = seqs[r]
        head = int(max(1, min(1024, (1 << 28) // max(1, K * V * 8))))
        tok = run_parallel(ld.model, ids, groups_fn(), batch_cfg(c, b), ld.compute, ld.backend,
                           head_chunk=head)
        out[idx] = tok[name]["arg"][np.arange(K), lengths[idx] - 1].astype(np.int64)
    return out


def greedy(ld, cfg, prompts: list, max_new: list[int], groups_fn, name: str, budget,
           stop=None) -> list[list[int]]:
    """Greedy decoding under group ``name`` by repeated teacher-forced passes (each new token
    reruns the whole sequence: quadratic in the generated length, slow but exact): the tokens
    generated after each prompt, at most ``max_new[i]``; ``stop(i, tokens)`` ends sequence
    ``i`` early. All sequences still running go through each pass together."""
    seqs = [list(map(int, p)) for p in prompts]
    gen: list[list[int]] = [[] for _ in prompts]
    active = [i for i in range(len(seqs)) if max_new[i] > 0]
    while active:
        nxt = last_argmax(ld, cfg, [seqs[i] for i in active], groups_fn, name, budget)
        still = []
        for i, t in zip(active, nxt, strict=True):
            seqs[i].append(int(t))
            gen[i].append(int(t))
            if len(gen[i]) < max_new[i] and not (stop is not None and stop(i, gen[i])):
                still.append(i)
        active = still
    return gen


def correctness(items: list[Item], first: np.ndarray, sc: dict, rows: Rows) -> dict:
    """Per item, under one group's scores ``sc``: the prediction (the chosen choice, -1 when
    every score is NaN; a generative item: 0 if greedy decoding gives the answer, else -1) and
    the correctness under each metric (``acc``, ``acc_token``, ``acc_byte``: NaN for items
    without text)."""
    I = len(items)
    nch = np.asarray([len(it.choices) for it in items])
    C = int(nch.max())
    cols = np.arange(C)[None]
    idx = np.where(cols < nch[:, None], first[:, None] + cols, -1)
    mc = np.asarray([it.kind == "mc" for it in items])
    gold = np.asarray([it.gold for it in items])
    nbytes = np.full(idx.shape, np.nan)
    for i, it in enumerate(items):
        if it.nbytes is not None:
            nbytes[i, :len(it.nbytes)] = it.nbytes
    lp = np.where(idx >= 0, sc["lp"][idx], np.nan)
    ntok = np.where(idx >= 0, rows.n[idx], 1)
    out = {}
    for m, s in (("acc", lp), ("acc_token", lp / ntok), ("acc_byte", lp / nbytes)):
        s = np.where(np.isfinite(s), s, -np.inf)
        pred = np.where(np.isfinite(s).any(axis=1), np.argmax(s, axis=1), -1)
        gen = sc["greedy"][first] == 1
        pred = np.where(mc, pred, np.where(gen, 0, -1))
        ok = (pred == gold).astype(float)
        if m == "acc_byte":
            ok = np.where(np.isnan(nbytes[:, 0]) & mc, np.nan, ok)
        out[m] = ok
        out[m + ":pred"] = pred
    out["acc:lp_gold"] = lp[np.arange(I), gold]
    return out


# -- the run ----------------------------------------------------------------------------------
def load_task(cfg, tok, vocab: int) -> tuple[list[Item], str]:
    """The items of ``cfg.task`` and where they came from (one-line errors)."""
    t = cfg.task
    if t.path is not None and t.name is not None:
        raise PrecsimError(f"task.path={t.path!r} and task.name={t.name!r} both given; allowed: "
                           "one of them")
    if t.path is None and t.name is None:
        raise PrecsimError("experiment=task_eval needs a task; allowed: task.path=FILE.jsonl "
                           "(a local file) or task.name=passkey|mqar (built in)")
    if t.metric not in METRICS:
        raise PrecsimError(f"task.metric={t.metric!r} is unknown; allowed: {', '.join(METRICS)}")
    check_batch_tokens(t.batch_tokens, "task.batch_tokens")
    if not (0 < t.alpha < 1 and 0 < t.power < 1):
        raise PrecsimError(f"task.alpha={t.alpha}, task.power={t.power}; allowed: both in (0, 1)")
    if t.limit is not None and not (isinstance(t.limit, int) and t.limit >= 1):
        raise PrecsimError(f"task.limit={t.limit!r}; allowed: an integer >= 1 or null")
    if t.name is not None:
        check_builtin(t)
        v = vocab if tok is None else min(vocab, int(getattr(tok, "vocab_size", 0) or vocab))
        return builtin_items(t, v), f"{t.name} (built in, seed {t.seed})"
    return read_items(t.path, tok, vocab, cfg.model.path, t.limit), Path(t.path).name


def task_cfg(cfg):
    """``cfg`` as :func:`precsim.models.run.prepare` needs it for a task: no document to load
    (a zero-token stand-in; the items are the documents)."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="precsim_task_"))
    np.save(d / "ids.npy", np.zeros(cfg.run.steps, dtype=np.int64))
    m = dataclasses.replace(cfg.model, ids=str(d / "ids.npy"), text=None)
    return dataclasses.replace(cfg, model=m, run=dataclasses.replace(cfg.run, seqs=1)), d


def load(cfg, device: str = "cpu", also: dict | None = None):
    """The checkpoint of ``cfg`` loaded for a task (:func:`task_cfg`, ``also`` as
    :func:`precsim.models.run.prepare`'s) and its tokenizer (None without one)."""
    import shutil

    from .run import prepare

    pcfg, tmp = task_cfg(cfg)
    try:
        ld = prepare(pcfg, device, also)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ld, load_tokenizer(cfg.model.path)


def score(cfg, ld, items: list[Item], progress: bool = True, desc: str = "task rows",
          phases: dict | None = None, used: set | None = None, ckpt=None):
    """Every group of ``cfg``'s run (:func:`precsim.models.run.build_groups` of its schemes)
    on ``items``: the groups, each group's :func:`correctness` by name, and the model's
    seconds (the forward passes' and the output head's go to ``phases``, the positions a pass
    used to ``used``; ``ckpt``: :func:`score_rows`'). A run out of device memory is a
    one-line PrecsimError."""
    from ..engines.base import progress_bar
    from .run import build_groups

    rows, first = Rows.of(items)
    mdtype = next(ld.model.parameters()).dtype
    groups = build_groups(cfg, mdtype)
    bar = progress_bar(cfg, progress)
    if bar is not None:
        bar.reset(total=len(rows.ids))
        bar.set_description(desc)
    phases = {} if phases is None else phases
    t1 = time.perf_counter()
    try:
        sc = score_rows(ld, cfg, rows, lambda: build_groups(cfg, mdtype), cfg.task.batch_tokens,
                        bar, phases, used, ckpt)
    except torch.OutOfMemoryError:
        raise PrecsimError(f"the task ran out of {ld.device} memory; allowed: a smaller "
                           f"task.batch_tokens (now {cfg.task.batch_tokens:,}), model.chunk or "
                           "fewer schemes") from None
    finally:
        if bar is not None:
            bar.close()
    per = {g.name: correctness(items, first, sc[g.name], rows) for g in groups}
    return groups, per, time.perf_counter() - t1


def evaluate(cfg, device: str = "cpu", progress: bool = True, ld=None, tok=None,
             ckpt=None) -> dict:
    """Run ``cfg``'s task under every group; the summary (``scores`` per item and group under
    ``_items``). ``ckpt``: checkpoints between passes, and resume (:func:`score_rows`)."""
    t0 = time.perf_counter()
    if ld is None:
        ld, tok = load(cfg, device)
    vocab = int(ld.model.get_output_embeddings().weight.shape[0])
    items, source = load_task(cfg, tok, vocab)
    phases: dict = {}
    used: set = set()
    groups, per, run_s = score(cfg, ld, items, progress, phases=phases, used=used, ckpt=ckpt)
    s = summarize(cfg, items, groups, per, source, ld,
                  {"model_s": round(run_s, 3), **phases,
                   "wall_s": round(time.perf_counter() - t0, 3)})
    s["model"]["chunk"] = sorted(used)  # positions a pass, model.chunk as resolved
    return s


def load_tokenizer(path):
    """The checkpoint's tokenizer as :func:`.load.load_model` finds it (None without one)."""
    p = Path(path)
    if not any((p / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json",
                                           "tokenizer.model")):
        return None
    try:
        import transformers as tf

        return tf.AutoTokenizer.from_pretrained(str(p))
    except Exception:  # noqa: BLE001 - a broken tokenizer: token-id items only
        return None


def run_task_cli(c, out: Path, say, progress: bool = True) -> dict:
    """``experiment=task_eval`` from the command line: evaluate, write, print the table. The
    scores are checkpointed between passes (``run.checkpoint_s``, and on SIGINT / SIGTERM /
    SIGUSR2) into ``out``; rerunning the command resumes (docs/resume.md)."""
    from .. import engines
    from ..checkpoint import Checkpoint, Interrupted, job_signals

    ck = Checkpoint(c, out)
    ck.load()  # another config's checkpoint: a one-line error before the model loads
    try:
        with ck, job_signals():
            summary = evaluate(c, engines.resolve_device(c.run.device), progress=progress,
                               ckpt=ck)
    except Interrupted as e:
        e.out = out
        raise
    public = write(summary, out, c.metrics.plot is not False)
    ck.done()
    say(format_table(public))
    plot = ", " + public["plot"] if "plot" in public else ""
    say(f"\n-> {out} ({ITEMS_CSV}, {SUMMARY_FILE}{plot})")
    return public
