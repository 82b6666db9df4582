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

import csv
import dataclasses
import io
import math
import time
from pathlib import Path

import numpy as np
import torch

from ..errors import PrecsimError
from ..rundir import ITEMS_CSV, SUMMARY_FILE, TASK_DELTA_PLOT, TASK_LENGTH_PLOT
from ..tasks import METRICS, Item, builtin_items, check_builtin, read_items
from ..taskstats import compare


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
    from .parallel import AUTO_CHUNKS, with_chunk

    if cfg.model.chunk != "auto":
        return cfg
    if budget != "auto" or not str(ld.device).startswith("cuda") or ld.plan is not None:
        return with_chunk(cfg, AUTO_CHUNKS[0])
    for c in AUTO_CHUNKS:
        if pass_rows(ld, budget, groups, n, with_chunk(cfg, c)) >= count:
            return with_chunk(cfg, c)
    return with_chunk(cfg, AUTO_CHUNKS[-1])


def batches(ld, cfg, budget, groups: list, lengths: np.ndarray, used: set | None = None):
    """Each forward pass's row indices and config: longest first, as many rows of similar length
    as :func:`pass_rows` holds at the chunk :func:`task_chunk` picks for the rows left (whose
    positions a pass go to ``used``)."""
    from .parallel import chunk_len

    order = np.argsort(-lengths, kind="stable")
    i = 0
    while i < order.size:
        n = int(lengths[order[i]])
        c = task_chunk(ld, cfg, budget, groups, n, order.size - i)
        if used is not None:
            used.add(chunk_len(c, n, ld.backend))
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
               used: set | None = None) -> dict:
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
    ``used``)."""
    from .parallel import chunk_len, run_parallel
    from .run import batch_cfg

    lengths = np.asarray([r.size for r in rows.ids])
    gs = groups_fn()
    R = lengths.size
    out: dict = {}
    V = int(ld.model.get_output_embeddings().weight.shape[0])
    L = cfg.replay.buffer_len
    shared, rest = shared_contexts(rows, L)
    b = 0
    for same in shared:  # contexts of one length P, read to P0
        P = int(rows.start[same[0][0]])
        P0 = (P - 1) // L * L
        c = task_chunk(ld, cfg, budget, gs, P0, len(same))
        if used is not None:
            used.add(chunk_len(c, P0, ld.backend))
        k = pass_rows(ld, budget, gs, P0, c)
        for c0 in range(0, len(same), k):
            _score_shared(ld, batch_cfg(c, b), rows, same[c0:c0 + k], P0, groups_fn(), V,
                          out, phases)
            b += 1
            if bar is not None:
                bar.update(sum(len(c) for c in same[c0:c0 + k]))
    for idx, c in batches(ld, cfg, budget, gs, lengths[rest], used):
        idx = rest[idx]
        K, N = idx.size, int(lengths[idx].max())
        ids = np.zeros((K, N), dtype=np.int64)
        for j, r in enumerate(idx):
            ids[j, :lengths[r]] = rows.ids[r]
        # the output head's logits: ~4 float64 copies of (K, positions, V) per group at once
        head = int(max(1, min(1024, (1 << 28) // max(1, K * V * 8))))
        groups = groups_fn()
        st, nn = rows.start[idx], rows.n[idx]
        tok = run_parallel(ld.model, ids, groups, batch_cfg(c, b), ld.compute, ld.backend,
                           head_chunk=head, phases=phases, at=_at((K, N), idx, st, nn))
        _gather(out, groups, tok, ids, idx, st, nn, R)
        b += 1
        if bar is not None:
            bar.update(K)
    return out


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
    from .placement import estimate, shape_of, state_bytes

    # (a row's part that lives with the layers, every group: states, caches)
    shape = shape_of(ld.model, next(ld.model.parameters()).dtype)
    row = estimate(shape, 1, len(groups), 1, 1,
                   state_bytes=state_bytes(groups, ld.compute)).group_layers * len(groups)
    free = torch.cuda.mem_get_info(torch.device(ld.device))[0]
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
          phases: dict | None = None, used: set | None = None):
    """Every group of ``cfg``'s run (:func:`precsim.models.run.build_groups` of its schemes)
    on ``items``: the groups, each group's :func:`correctness` by name, and the model's
    seconds (the forward passes' and the output head's go to ``phases``, the positions a pass
    used to ``used``). A run out of device memory is a one-line PrecsimError."""
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
                        bar, phases, used)
    except torch.OutOfMemoryError:
        raise PrecsimError(f"the task ran out of {ld.device} memory; allowed: a smaller "
                           f"task.batch_tokens (now {cfg.task.batch_tokens:,}), model.chunk or "
                           "fewer schemes") from None
    finally:
        if bar is not None:
            bar.close()
    per = {g.name: correctness(items, first, sc[g.name], rows) for g in groups}
    return groups, per, time.perf_counter() - t1


def evaluate(cfg, device: str = "cpu", progress: bool = True, ld=None, tok=None) -> dict:
    """Run ``cfg``'s task under every group; the summary (``scores`` per item and group under
    ``_items``)."""
    t0 = time.perf_counter()
    if ld is None:
        ld, tok = load(cfg, device)
    vocab = int(ld.model.get_output_embeddings().weight.shape[0])
    items, source = load_task(cfg, tok, vocab)
    phases: dict = {}
    used: set = set()
    groups, per, run_s = score(cfg, ld, items, progress, phases=phases, used=used)
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


def summarize(cfg, items, groups, per: dict, source: str, ld, timing: dict) -> dict:
    """The summary of a task run: per row of the table (the reference, the baseline, the noise
    floor, each scheme with its SR seeds pooled) the paired figures against the baseline, for
    the whole task and (built-in tasks) per length."""
    from .run import baseline_index, seed_names

    t = cfg.task
    b = baseline_index(cfg)
    base = groups[b]
    names = seed_names(cfg)
    table = [(g.name, [g.name], "fp32" if g.role == "baseline" else g.role)
             for g in groups if g.reference or g.role in ("baseline", "noise")]
    table[0] = (groups[0].name, [groups[0].name], "reference")
    table += [(n, runs, "scheme") for n, runs in names.items()]
    table = [(n, r, "baseline" if n == base.name else role) for n, r, role in table]
    metric = t.metric
    lengths = sorted({it.length for it in items if it.length is not None})
    by_len = {L: np.asarray([it.length == L for it in items]) for L in lengths}
    mc = any(it.kind == "mc" for it in items)
    bvec = per[base.name][metric]
    rows = {}
    for name, runs, role in table:
        s = np.stack([per[r][metric] for r in runs])
        keep = np.isfinite(bvec) & np.isfinite(s).all(axis=0)
        row = {"role": role, **compare(s[:, keep], bvec[keep], t.alpha, t.power, seed=t.seed)}
        for m in METRICS:
            v = np.stack([per[r][m] for r in runs])
            row[m] = float(np.nanmean(v)) if np.isfinite(v).any() else math.nan
        if lengths:
            row["by_length"] = {str(L): compare(s[:, m_], bvec[m_], t.alpha, t.power,
                                                seed=t.seed) for L, m_ in by_len.items()}
        rows[name] = row
    kinds = sorted({it.kind for it in items})
    return {
        "experiment": "task_eval", "complete": True,
        "task": {"source": source, "path": t.path, "name": t.name, "items": len(items),
                 "kinds": kinds, "metric": metric if mc else "exact_match (greedy)",
                 "lengths": lengths or None, "alpha": t.alpha, "power": t.power},
        "baseline": {"setting": cfg.metrics.baseline, "name": base.name},
        "model": {"path": str(cfg.model.path), "class": type(ld.model).__name__,
                  "dtype": str(next(ld.model.parameters()).dtype).replace("torch.", ""),
                  "device": ld.device, "scan_backend": ld.backend, "ssm_layers": ld.layers},
        "schemes": rows, "timing_s": timing,
        "sr_seeds": cfg.run.sr_seeds,
        "config": _config_dict(cfg),
        "_items": items, "_per": per, "_groups": [g.name for g in groups],
    }


def _config_dict(cfg) -> dict:
    from ..rundir import json_safe

    return json_safe(dataclasses.asdict(cfg))


# -- outputs ----------------------------------------------------------------------------------
def items_csv(summary: dict) -> str:
    """One line per item: where it came from, its gold, and each group's prediction and
    correctness (under ``task.metric``)."""
    items, per, names = summary["_items"], summary["_per"], summary["_groups"]
    metric = summary["config"]["task"]["metric"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["item", "line", "length", "kind", "gold", "choices",
                *[f"{n}:{c}" for n in names for c in ("pred", "correct", "lp_gold")]])
    for i, it in enumerate(items):
        cells = []
        for n in names:
            p = per[n]
            ok = p[metric][i]
            cells += [int(p[metric + ":pred"][i]), "" if math.isnan(ok) else int(ok),
                      f"{p['acc:lp_gold'][i]:.6g}"]
        w.writerow([i, it.line if it.length is None else "", it.length or "", it.kind,
                    it.gold, len(it.choices), *cells])
    return buf.getvalue()


def format_table(summary: dict) -> str:
    """The task's table: per row, accuracy [95% Wilson], the change against the baseline
    [95% paired bootstrap], items lost/gained, exact McNemar p, minimum detectable change."""
    t, base = summary["task"], summary["baseline"]["name"]
    lines = [f"task {t['source']}: {t['items']} items ({', '.join(t['kinds'])}), "
             f"{t['metric']}; baseline {base}; {summary['model']['class']}"
             + (f" ({summary['model']['dtype']} weights)" if summary["model"].get("dtype")
                else "")]
    hdr = (f"{'scheme':<22} {'acc':>6} {'95% CI':>15} {'change':>8} {'95% CI':>17} "
           f"{'lost':>6} {'gained':>6} {'p':>9} {'MDD':>6}")
    lines += [hdr, "-" * len(hdr)]
    for name, r in summary["schemes"].items():
        ci = f"[{r['acc_lo']:.3f},{r['acc_hi']:.3f}]"
        label = name + (f" x{r['seeds']}" if r["seeds"] > 1 else "")
        if r["role"] == "baseline":
            lines.append(f"{label:<22} {r['acc']:>6.3f} {ci:>15} {'(baseline)':>8}")
            continue
        dci = f"[{r['delta_lo']:+.3f},{r['delta_hi']:+.3f}]"
        lost, gained = (f"{r['lost']:g}", f"{r['gained']:g}")
        lines.append(f"{label:<22} {r['acc']:>6.3f} {ci:>15} {r['delta']:>+8.3f} {dci:>17} "
                     f"{lost:>6} {gained:>6} {r['p_mcnemar']:>9.3g} {r['mdd']:>6.3f}")
    if t.get("lengths"):
        lines.append("")
        lines.append("accuracy by length: " + "  ".join(
            f"{name}: " + " ".join(f"{L}={r['by_length'][str(L)]['acc']:.2f}"
                                   for L in t["lengths"])
            for name, r in summary["schemes"].items()))
    return "\n".join(lines)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def plot(summary: dict) -> tuple[str, bytes] | None:
    """Accuracy against length (built-in tasks: one line per row, Wilson intervals), else each
    scheme's change against the baseline with its interval and minimum detectable change."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = summary["task"]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    if t.get("lengths"):
        Ls = t["lengths"]
        rows = list(summary["schemes"].items())
        markers = "osD^vP*Xh<>p"
        seen: dict[tuple, str] = {}
        for i, (name, r) in enumerate(rows):
            bl = [r["by_length"][str(L)] for L in Ls]
            acc = [b["acc"] for b in bl]
            # each row a little aside (in log2 length) and its own marker, so that rows with
            # the same accuracies stay visible; a row equal to an earlier one says so
            x = [L * 2 ** (0.04 * (i - (len(rows) - 1) / 2)) for L in Ls]
            same = seen.setdefault(tuple(acc), name)
            label = name if same == name else f"{name} (= {same})"
            line, = ax.plot(x, acc, marker=markers[i % len(markers)], label=label,
                            ls="--" if r["role"] in ("reference", "noise") else "-",
                            mfc="none" if same != name else None)
            ax.fill_between(x, [b["acc_lo"] for b in bl], [b["acc_hi"] for b in bl],
                            color=line.get_color(), alpha=0.08)
        ax.set_xscale("log", base=2)
        ax.set_xticks(Ls, [f"{L:,}" for L in Ls])
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel("accuracy (95% Wilson)")
        ax.set_ylim(-0.02, 1.02)
        per = t["items"] // max(1, len(Ls))
        ax.set_title(f"{t['source']}: {per} items a length")
        ax.legend(fontsize=8)
        name = TASK_LENGTH_PLOT
    else:
        rs = [(n, r) for n, r in summary["schemes"].items() if r["role"] != "baseline"]
        if not rs:
            plt.close(fig)
            return None
        y = np.arange(len(rs))
        d = np.asarray([r["delta"] for _, r in rs])
        lo = np.asarray([r["delta_lo"] for _, r in rs])
        hi = np.asarray([r["delta_hi"] for _, r in rs])
        ax.errorbar(d, y, xerr=[np.nan_to_num(d - lo), np.nan_to_num(hi - d)], fmt="o",
                    capsize=3)
        mdd = min((r["mdd"] for _, r in rs if math.isfinite(r["mdd"])), default=None)
        if mdd is not None:
            ax.axvspan(-mdd, mdd, color="0.85", label=f"smallest detectable change ({mdd:.3f})")
            ax.legend(fontsize=8)
        ax.axvline(0, color="k", lw=0.8)
        ax.set_yticks(y, [n for n, _ in rs])
        ax.set_xlabel(f"accuracy change vs {summary['baseline']['name']} (95% paired bootstrap)")
        ax.set_title(f"{t['source']}: {t['items']} items, {t['metric']}")
        name = TASK_DELTA_PLOT
    data = _png(fig)
    plt.close(fig)
    return name, data


def write(summary: dict, out: Path, plot_it: bool = True) -> dict:
    """Write the run directory: ``items.csv``, the plot, then ``summary.json`` (last: it marks
    the run complete); each atomically. Returns the summary as written."""
    from ..rundir import atomic_write_bytes, atomic_write_text, write_json

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / ITEMS_CSV, items_csv(summary))
    public = {k: v for k, v in summary.items() if not k.startswith("_")}
    if plot_it:
        p = plot(summary)
        if p is not None:
            atomic_write_bytes(out / p[0], p[1])
            public["plot"] = p[0]
    write_json(out / SUMMARY_FILE, public)
    return public


def run_task_cli(c, out: Path, say, progress: bool = True) -> dict:
    """``experiment=task_eval`` from the command line: evaluate, write, print the table."""
    from .. import engines

    summary = evaluate(c, engines.resolve_device(c.run.device), progress=progress)
    public = write(summary, out, c.metrics.plot is not False)
    say(format_table(public))
    plot = ", " + public["plot"] if "plot" in public else ""
    say(f"\n-> {out} ({ITEMS_CSV}, {SUMMARY_FILE}{plot})")
    return public
