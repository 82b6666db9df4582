"""``experiment=model_kl``: the whole-model study on a real checkpoint (docs/real-models.md).

The reference (a float64 state in every SSM layer: the layer-level simulator's truth) and every
scheme of the config run the checkpoint teacher-forced on the same documents; per token, the KL
of the scheme's next-token distribution from the reference's, the top-1 agreement, the logits'
relative error, and per layer the state drift. ``model.mode=parallel`` (default) runs one
forward pass over the documents; ``model.mode=decode`` runs them token by token (the reference
parallel mode is tested against).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..config import MODEL_MODES as MODES
from ..config import SchemeConfig
from ..errors import PrecsimError
from .load import devices_of, documents, layer_shape, load_model, ssm_layers
from .metrics import boot_ci, docs_to_separate, first_flips, result_rows
from .scan import REFERENCE, Group

FP32_STATE = SchemeConfig(kind="conventional", fmt="fp32")  # what deployments ship today
# one rounding of the model's own arithmetic (unit roundoff of its dtype): the floor's dither
UNIT_ROUNDOFF = {torch.float64: 2.0 ** -53, torch.float32: 2.0 ** -24,
                 torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def is_fp32_state(s: SchemeConfig) -> bool:
    """Whether scheme ``s`` is the FP32 state deployments ship (conventional, FP32, RNE)."""
    return (s.kind == "conventional" and s.fmt == "fp32" and s.rounding == "rne"
            and s.error_feedback == "none" and s.layers is None and s.sr_bits is None)


def seed_names(cfg) -> dict[str, list[str]]:
    """Each scheme's runs: its own name, then ``NAME~seedK`` (K = 1..run.sr_seeds-1) for a
    stochastic-rounding scheme (each name draws its own SR bits)."""
    S = cfg.run.sr_seeds
    return {n: [n] + ([f"{n}~seed{k}" for k in range(1, S)] if s.rounding == "sr" else [])
            for n, s in cfg.schemes.items()}


def baseline_index(cfg) -> int:
    """Where :func:`build_groups` puts the group the schemes are measured against: 1, the FP32
    state (``metrics.baseline=fp32``), or 0, the float64 reference."""
    return 1 if cfg.metrics.baseline == "fp32" else 0


def build_groups(cfg, mdtype) -> list:
    """The groups of a whole-model run, in the order the floor needs (a prefix run by every
    copy of a split run): the float64 reference; the FP32 state (a scheme of the config that is
    it, else a group of its own); the noise run (the FP32 state with its SSM outputs dithered at
    the model dtype's unit roundoff); then every scheme and its SR seeds. Each
    scheme is measured against ``metrics.baseline``; the FP32 state against the reference."""
    ref = Group("reference", REFERENCE, reference=True)
    fp32 = next((n for n, s in cfg.schemes.items() if is_fp32_state(s)), None)
    base = Group(fp32 or "fp32_state", FP32_STATE, vs=0, role="scheme" if fp32 else "baseline")
    b = baseline_index(cfg)
    groups = [ref, base]
    # the noise run keeps the FP32 state (the kernels run a float64 state only as the truth):
    # against the float64 baseline its figure includes the FP32 state's own distance
    noise = Group("noise_floor", FP32_STATE, vs=b, role="noise",
                  dither=UNIT_ROUNDOFF.get(mdtype, 2.0 ** -24))
    groups.append(noise)
    for n, names in seed_names(cfg).items():
        if n == fp32:
            continue
        for k, name in enumerate(names):
            groups.append(Group(name, cfg.schemes[n], vs=b, role="scheme" if k == 0 else "seed"))
    return groups


def backend_for(cfg, device: str, check_only: bool = False) -> str:
    """The scan backend ``run.engine`` means in whole-model mode: ``triton`` on CUDA when the
    kernels cover the config (``auto``), else ``torch``. ``check_only``: only the engine name's
    validity (before the model is loaded)."""
    eng = cfg.run.engine
    if eng in ("numpy", "numba"):
        raise PrecsimError(f"run.engine={eng!r} with model.path; allowed: auto, torch, triton")
    if check_only or eng == "torch" or (eng == "auto" and device != "cuda"):
        return "torch"
    from ..engines import triton as tri

    why = tri.supports(cfg, device) if device == "cuda" or cfg.run.engine == "triton" \
        else "no CUDA device"
    if why is None:
        return "triton"
    if eng == "triton":
        raise PrecsimError(f"run.engine='triton' with model.path: {why}; allowed: auto, torch")
    return "torch"


@dataclass
class Loaded:
    """A checkpoint loaded with its documents, ready for :func:`measure` (any number of times)."""

    model: object
    ids: np.ndarray
    source: str
    device: str
    compute: torch.dtype
    backend: str
    layers: list[int]
    phases: dict
    t_start: float
    why: str | None = None  # why a CUDA run's scan is not the Triton one
    plan: object = None  # model.device_map's placement (placement.Plan), None without
    copies: list = field(default_factory=list)  # a split plan: the model on each device
    tokenizer: object = None  # the checkpoint's (None: token ids only)


def every_layer_scheme(cfg, layers: list[int], also: dict | None = None):
    """``cfg`` with each per-layer scheme replaced by the uniform schemes it runs in ``layers``,
    plus ``also`` (name -> SchemeConfig): what the scan backend must support."""
    import dataclasses

    from ..config import scheme_at

    sch = {f"{n}@{la}": scheme_at(s, la) for n, s in cfg.schemes.items() for la in layers}
    return dataclasses.replace(cfg, schemes={**sch, **(also or {})})


def place(cfg, device: str, split_ok: bool):
    """``model.device_map``'s plan (:func:`.placement.plan_run`) for the run of ``cfg`` on
    ``device``'s kind (``cpu``, or the visible GPUs), stated on one line of the log; None
    without a map. It is sized for one batch of ``model.doc_batch`` documents when that is an
    integer (each batch runs on the same placement), else for every document."""
    import logging

    from .parallel import chunk_setting
    from .placement import plan_run

    m = cfg.model
    if m.device_map is None:
        return None
    L = cfg.replay.buffer_len
    c = chunk_setting(m.chunk)
    chunk = min(cfg.run.steps, -(-c // L) * L) if c else cfg.run.steps
    schemes, pl = list(cfg.schemes), cfg.per_layer
    if pl.formats is not None:  # experiment=per_layer: its widest pass (no split)
        wide = max(pl.groups_per_pass, len(pl.formats) + 1)
        schemes = [f"group{i}" for i in range(wide)]
    # sized for one batch of documents (model.doc_batch=B), else for all of them (auto: one
    # batch under a plan, doc_batch)
    docs = min(m.doc_batch, cfg.run.seqs) if m.doc_batch not in ("auto", 0) else cfg.run.seqs
    # (generation's caches and attention keys grow by the written tokens too)
    tokens = cfg.run.steps + (m.new_tokens if m.mode == "generate" else 0)
    plan = plan_run(m.path, m.dtype, m.device_map, device, docs=docs,
                    schemes=schemes, tokens=tokens, chunk=chunk,
                    split_ok=split_ok and m.mode == "parallel")
    logging.getLogger("precsim").info(plan.line())
    return plan


def prepare(cfg, device: str = "cpu", also: dict | None = None, split_ok: bool = False
            ) -> Loaded:
    """Check ``cfg`` against its checkpoint, load it and its documents, pick the scan backend
    for its schemes and ``also`` (one-line PrecsimErrors: a mode, a per-layer map's layer the
    model lacks, ...). ``model.device_map``: placed by :func:`place` (``split_ok``: the scheme
    batch may be split across GPUs, one model copy each)."""
    from ..config import check_blocks, check_layers_exist

    t_start = time.perf_counter()
    m = cfg.model
    if m.mode not in MODES:
        raise PrecsimError(f"model.mode={m.mode!r} is unknown; allowed: {', '.join(MODES)}")
    if cfg.replay.drafts:
        raise PrecsimError(f"replay.drafts={cfg.replay.drafts} with model.path; allowed: 0 "
                           "(whole-model mode decodes one token per step)")
    dev = "cuda" if device == "auto" and torch.cuda.is_available() else device
    dev = "cpu" if dev == "auto" else dev
    if m.mode == "parallel":
        backend_for(cfg, dev if dev == "cuda" else "cpu", check_only=True)
    phases: dict = {}
    plan = place(cfg, dev, split_ok)
    copies = []
    if plan is None or plan.kind == "single":
        dev = dev if plan is None else plan.devices[0]
        model, tok = load_model(m.path, dev, m.dtype)
    elif plan.kind == "split":
        copies = [(load_model(m.path, d, m.dtype)[0], d) for d in plan.devices[1:]]
        model, tok = load_model(m.path, plan.devices[0], m.dtype)
        copies.insert(0, (model, plan.devices[0]))
        dev = ",".join(plan.devices)
    else:
        model, tok = load_model(m.path, dev, m.dtype, plan.device_map, plan.max_memory)
        dev = ",".join(dict.fromkeys(str(d) for d in devices_of(model)))
    phases["load_s"] = round(time.perf_counter() - t_start, 3)
    layers = [idx for idx, _, _ in ssm_layers(model)]
    n_layers = int(model.config.num_hidden_layers)
    kinds = dict(enumerate(getattr(model.config, "layer_types", None)
                           or getattr(model.config, "layers_block_type", None) or []))
    check_layers_exist(cfg, layers, n_layers, {i: f"not an SSM layer (type {k!r})"
                                                for i, k in kinds.items()},
                       f"{type(model).__name__} at {m.path}")
    mdtype = next(model.parameters()).dtype
    compute = torch.float64 if (cfg.run.compute_dtype == "fp64" or mdtype == torch.float64) \
        else torch.float32
    ctx = getattr(model.config, "max_position_embeddings", None)
    if m.mode == "generate" and ctx and cfg.run.steps + m.new_tokens > ctx:
        raise PrecsimError(f"model.new_tokens={m.new_tokens} after run.steps={cfg.run.steps} "
                           f"prompt tokens is beyond {type(model).__name__}'s context of "
                           f"{ctx:,} positions; allowed: model.new_tokens <= "
                           f"{max(0, ctx - cfg.run.steps):,} (or fewer run.steps)")
    ids, source = documents(model, tok, n_docs=cfg.run.seqs, n_tokens=cfg.run.steps,
                            text=m.text, ids=m.ids, prompt=m.prompt)
    m.family, m.heads, m.head_dim, m.state_dim = layer_shape(model)  # the cost model's bytes
    check_blocks(cfg, m.state_dim, f"state_dim of {type(model).__name__} at {m.path}")
    every = every_layer_scheme(cfg, layers, also)
    backend, why = "torch", None
    kind = "cuda" if dev.startswith("cuda") else "cpu"
    if m.mode in ("parallel", "generate") and compute == torch.float32:
        backend = backend_for(every, kind)
    if kind == "cuda" and backend == "torch":  # say why the kernels do not run it
        from ..engines import triton as tri

        why = "float64 compute" if compute != torch.float32 else (
            "model.mode=decode" if m.mode != "parallel" else tri.supports(every, kind))
    return Loaded(model, ids, source, dev, compute, backend, layers, phases, t_start, why,
                  plan, copies, tok)


DOC_BATCH_FREE = 0.5  # model.doc_batch=auto: of a GPU's free memory, what one batch may take


def batch_seed(seed: int, b: int) -> int:
    """The ``run.seed`` batch ``b`` of a run's documents (or of a task's rows) draws from:
    ``seed`` itself for the first batch (a run of one batch draws what it always drew), else a
    63-bit hash of ``(seed, b)``. Every batch must draw its own bits: with one seed, document
    ``j`` of every batch would get the same SR bits and dither (each draw is keyed by the seed,
    the scheme, the layer and the element's index within the batch), correlated noise that
    narrows the intervals over documents."""
    import hashlib

    if b == 0:
        return seed
    h = hashlib.blake2b(f"precsim batch {seed} {b}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") >> 1


def batch_cfg(cfg, b: int):
    """``cfg`` with batch ``b``'s ``run.seed`` (:func:`batch_seed`)."""
    import dataclasses

    if b == 0:
        return cfg
    return dataclasses.replace(cfg, run=dataclasses.replace(
        cfg.run, seed=batch_seed(cfg.run.seed, b)))


def doc_batch(cfg, ld: Loaded, groups: int, chunk: int, ckpt=None,
              state_bytes: float = 12) -> int:
    """Documents per batch of a whole-model run of ``groups`` groups over ``ld.ids`` (``K``
    documents; ``K``: one batch). ``model.doc_batch``: an integer ``B >= 1`` (at most ``K``),
    ``0`` (``K``), or ``auto``:

    * on a CUDA device, the largest ``B`` (at least 1) whose estimated bytes fit
      ``DOC_BATCH_FREE`` (half) of the device's free memory, read after the model is loaded
      (:func:`.placement.cuda_free`: the driver's free memory and the caching allocator's
      unused blocks). The estimate is :func:`.placement.estimate`'s, the one
      ``model.device_map`` sizes runs with, for one document times ``B``: per group and SSM
      layer the state at ``state_bytes`` an element (the groups' mean,
      :func:`.placement.state_bytes`: a scheme's float32 state, read copy if split and
      error-feedback residual if any, or the reference's float64 state; 12 when not given)
      plus the model's own float32 cache (4), the conv state and (a run of several passes)
      the attention cache of every token; per group and pass, ``chunk`` positions of hidden
      states, the widest projection and the scan's inputs and outputs; the output head's
      float64 logits of 1,024 positions. Generation counts its new tokens among the tokens;
      decode mode passes one position at a time. Half the free memory leaves room for what the
      estimate misses (the allocator's fragmentation, the scan's temporaries);
    * 1 in decode mode (it runs one document at a time);
    * ``K`` on the CPU (the whole batch: memory is rarely the limit there), with a
      ``model.device_map`` (its plan was sized for every document: an integer batches it), and
      when a checkpoint of this config is to be resumed (only a run of one batch saves one)."""
    m = cfg.model
    K, N = ld.ids.shape
    if m.doc_batch != "auto":
        return min(m.doc_batch or K, K)
    if m.mode == "decode":  # (decode mode runs one document at a time)
        return 1
    if not ld.device.startswith("cuda") or ld.plan is not None or (
            ckpt is not None and ckpt.saved()):
        return K
    tokens = N + (m.new_tokens if m.mode == "generate" else 0)
    return docs_that_fit(ld, groups, tokens, min(chunk, tokens), state_bytes)


def auto_chunk(cfg, ld: Loaded, groups: int, state_bytes: float = 12) -> int:
    """``model.chunk=auto`` in a whole-model run (``model_kl``, generation; each batch's passes):
    on one CUDA device with ``model.doc_batch=auto``, the largest of
    :data:`.parallel.AUTO_CHUNKS` (32,768 .. 2,048) at which every document fits one pass by
    :func:`docs_that_fit` (the estimate ``doc_batch=auto`` sizes batches with), else the smallest:
    more documents a pass at fewer positions each (measured on an H100, 2026-12-07: 4 documents
    of 32,768 tokens of the Mamba-2 2.7B shape, one a pass at 32,768, all four at 2,048, 13%
    less forward time; experiments/bench/bench_models.md). Elsewhere (the CPU, decode mode, a
    device_map plan, an integer doc_batch) 32,768, the fixed default before. A run resumed from a
    checkpoint chooses again (from the free memory then)."""
    from .parallel import AUTO_CHUNKS, chunk_len, largest_chunk, with_chunk

    m = cfg.model
    K, N = ld.ids.shape
    if (m.mode == "decode" or m.doc_batch != "auto" or not ld.device.startswith("cuda")
            or ld.plan is not None):
        return AUTO_CHUNKS[0]
    tokens = N + (m.new_tokens if m.mode == "generate" else 0)
    return largest_chunk(lambda c: docs_that_fit(
        ld, groups, tokens, min(chunk_len(with_chunk(cfg, c), N, ld.backend), tokens),
        state_bytes) >= K)


def step_docs(cfg, ld: Loaded, groups: int, state_bytes: float = 12) -> int:
    """Generation (``model.mode=generate``) in several document batches: how many documents
    write their tokens together (:func:`.generate.generate_batches`). A step holds every
    group's states and caches but only one position's activations, so more documents fit than
    in a prompt pass: on a CUDA device the most whose :func:`.placement.estimate` at one
    position a pass fits ``DOC_BATCH_FREE`` of the free memory read after the model is loaded
    (as :func:`doc_batch`), elsewhere every document."""
    K, N = ld.ids.shape
    if not ld.device.startswith("cuda"):
        return K
    return docs_that_fit(ld, groups, N + cfg.model.new_tokens, 1, state_bytes)


def docs_that_fit(ld: Loaded, groups: int, tokens: int, chunk: int,
                  state_bytes: float, most: int | None = None) -> int:
    """The most of ``ld``'s documents (``most`` of them: a task's rows; at least 1) whose
    :func:`.placement.estimate` (one document's, times the count) fits ``DOC_BATCH_FREE`` of
    the CUDA device's free memory."""
    from .placement import cuda_free, estimate, shape_of

    mdtype = next(ld.model.parameters()).dtype
    per_doc = estimate(shape_of(ld.model, mdtype), 1, groups, tokens, chunk,
                       state_bytes=state_bytes).run()
    free = cuda_free(torch.device(ld.device))
    most = ld.ids.shape[0] if most is None else most
    return int(min(most, max(1, DOC_BATCH_FREE * free // max(1, per_doc))))


def run_model_kl(cfg, device: str = "cpu", progress: bool = True, ckpt=None):
    """Run the whole-model study of ``cfg`` (``cfg.model.path`` set); returns a Result whose
    rows have the layer-level columns (of the model's own logits). ``ckpt``: parallel mode saves
    between its chunks and resumes (:mod:`precsim.checkpoint`)."""
    return measure(cfg, prepare(cfg, device, split_ok=True), cfg.schemes, progress, ckpt=ckpt)


def measure(cfg, ld: Loaded, schemes: dict, progress: bool = True, bar_desc: str = "SSM layers",
            ckpt=None):
    """One whole-model run of ``schemes`` (name -> SchemeConfig) beside the reference on the
    loaded model: the Result (of ``cfg`` with these schemes); ``ckpt`` as in
    :func:`run_model_kl`.

    The documents go through in batches of ``model.doc_batch`` (:func:`doc_batch`), each with
    fresh groups (a Group keeps its run's drift and first non-finite token); the batches' per-
    token metrics, drift samples and generations are concatenated in document order
    (:func:`merge_batches`), so a deterministic scheme's figures do not depend on the batch
    size. The random draws do (SR bits, the noise run's dither): batch ``b`` draws from
    :func:`batch_seed` ``(run.seed, b)``, so a run's draws depend on (``run.seed``,
    ``model.doc_batch``); ``summary.json``'s ``info.doc_batch`` is the batch size used. Only a
    run of one batch saves checkpoints between chunks (several: ``info.checkpoints_off``)."""
    import dataclasses
    import logging

    from ..checkpoint import Checkpoint, Interrupted
    from ..engines.base import progress_bar
    from ..result import make_result
    from .parallel import chunk_len, with_chunk

    cfg = dataclasses.replace(cfg, schemes=dict(schemes))
    m, model, phases = cfg.model, ld.model, dict(ld.phases)
    K, N = ld.ids.shape
    mdtype = next(model.parameters()).dtype
    groups = build_groups(cfg, mdtype)
    from .placement import state_bytes

    held = state_bytes(groups, ld.compute)  # (bytes a state element takes, the groups' mean)
    # the batches run at the chosen chunk (model.chunk=auto); the result keeps the config as
    # given, its info.chunk the positions a pass
    run_cfg = (cfg if m.chunk != "auto"
               else with_chunk(cfg, auto_chunk(cfg, ld, len(groups), held)))
    chunk = chunk_len(run_cfg, N, ld.backend) if m.mode != "decode" else 1
    B = doc_batch(run_cfg, ld, len(groups), chunk, ckpt, held)
    spans = [(s, min(K, s + B)) for s in range(0, K, B)]
    one = len(spans) == 1
    # generation in several batches: the batches' prompts one by one, their tokens written
    # together (up to S documents at once); not under a device_map plan (each batch alone)
    together = m.mode == "generate" and not one and ld.plan is None
    if together:
        from .generate import generate_batches, step_groups

        S = max(B, step_docs(cfg, ld, len(groups), held))
        writes = len(step_groups(spans, S))
    if not one:
        logging.getLogger("precsim").info(
            f"documents: {K} in {len(spans)} batches of {B} (model.doc_batch={m.doc_batch!r}; "
            f"{len(groups)} groups a document){'' if ckpt is None else '; no checkpoints'}")
    bar = progress_bar(cfg, progress)
    if bar is not None:  # (every batch's)
        per = {"parallel": len(ld.layers) * -(-N // chunk) * max(1, len(ld.copies)),
               "generate": len(ld.layers) * -(-N // chunk) + m.new_tokens, "decode": N}[m.mode]
        bar.reset(total=per * len(spans) - (m.new_tokens * (len(spans) - writes) if together
                                            else 0))
        if m.mode != "decode":
            bar.set_description(f"{bar_desc} x chunks"
                                + (", then tokens" if m.mode == "generate" else ""))
    if ckpt is not None and one and m.mode == "parallel" and not ld.copies:
        ckpt.start(f"model/{ld.backend}", ld.device, ld.t_start)
    t_run = time.perf_counter()
    parts = []

    def batch(b: int):  # batch b's config and groups (the first batch's: the run's)
        cb = batch_cfg(run_cfg, b)
        return cb, groups if b == 0 else build_groups(cb, mdtype)

    try:
        if together:
            parts = generate_batches(ld, spans, batch, m.new_tokens, S, bar, phases)
        for b, (s, e) in enumerate(spans if not together else ()):
            cb, gs = batch(b)
            ck = ckpt if one and ckpt is not None else Checkpoint(cb, None)  # (stops, no saves)
            if ck is not ckpt:
                ck.start(f"model/{ld.backend}", ld.device, ld.t_start)
            ph: dict = {}
            parts.append((run_batch(cb, ld, ld.ids[s:e], gs, bar, ph, ck), gs))
            for k, v in ph.items():
                phases[k] = round(phases.get(k, 0.0) + v, 3)
    except torch.OutOfMemoryError:
        rows = (f"{min(B, K)} document(s) x {len(groups)} rows (the reference, the floor's "
                "and each scheme's)")
        fix = (f"a smaller model.chunk (now {chunk:,} positions a pass; attention layers hold "
               "a chunk x everything before it), " if m.mode in ("parallel", "generate") else "")
        raise PrecsimError(f"the whole-model run ran out of {ld.device} memory ({rows}, "
                           f"{N:,} tokens each); allowed: {fix}a smaller model.doc_batch (now "
                           f"{m.doc_batch!r}: {min(B, K)} of {K} documents a batch), fewer "
                           "run.seqs or fewer schemes") from None
    except Interrupted as e:
        if one:
            raise
        # a partial result of one batch's documents is not the run's: nothing is kept
        raise Interrupted(e.signum) from None
    run_s = time.perf_counter() - t_run
    if bar is not None:
        bar.close()
    tok_all, gen, groups = merge_batches(parts)
    tok_m, rows_groups, seeds = merge_seeds(tok_all, groups, cfg)
    res = result_rows(tok_m, rows_groups, cfg.metrics.window, N, seeds)
    floor = floor_figures(tok_all, tok_m, groups, cfg, mdtype, rows_groups)
    extra = {}
    if m.mode == "generate":
        from .generate import generation_figures, generations_text

        base_name = groups[baseline_index(cfg)].name
        noise = next(g.name for g in groups if g.role == "noise")
        extra = {"generation": {"baseline": base_name, "new_tokens": m.new_tokens,
                                "schemes": generation_figures(gen, seed_names(cfg), base_name),
                                "noise": generation_figures(gen, {noise: [noise]},
                                                            base_name)[noise]},
                 "generations_text": generations_text(gen, ld.ids, rows_groups, base_name,
                                                      ld.tokenizer)}
    name = type(model).__name__
    info = {"workload": "model", "model_path": str(m.path), "model_class": name,
            "model_dtype": str(mdtype).replace("torch.", ""), "mode": m.mode,
            "scan_backend": ld.backend, **({"scan_backend_why": ld.why} if ld.why else {}),
            "phases_s": phases, "ssm_layers": ld.layers,
            **({"placement": ld.plan.info()} if ld.plan is not None else {}),
            **({"chunk": chunk} if m.mode == "parallel" else {}),
            "doc_batch": min(B, K),
            **({"write_docs": min(S, K)} if together else {}),
            **(ckpt.info() if ckpt is not None else {}),
            **({"checkpoints_off": f"{len(spans)} document batches (model.doc_batch): only "
                                   "a run of one batch saves"}
               if ckpt is not None and not one else {}),
            "layers": model.config.num_hidden_layers,
            "documents": K, "tokens": N, "source": ld.source, "model_s": round(run_s, 3),
            "first_flip": {g.name: first_flips(tok_m[g.name]["top1"]) for g in rows_groups[1:]},
            "floor": floor, "sr_seeds": cfg.run.sr_seeds, **extra,
            "title": f"{name} ({model.config.num_hidden_layers} layers, {len(ld.layers)} SSM), "
                     f"{N:,} tokens x {K} doc{'s' if K > 1 else ''}, {m.mode}, "
                     f"L={cfg.replay.buffer_len}"}
    return make_result(cfg, None, {g.name: g.dead_at for g in rows_groups[1:]},
                       engine=f"model/{ld.backend}", device=ld.device, t_start=ld.t_start,
                       info=info, **res, steps=N)


def run_batch(cfg, ld: Loaded, ids: np.ndarray, groups, bar, phases: dict, ckpt=None):
    """One batch of documents ``ids`` (``(K_b, N)``) under fresh ``groups``, in
    ``model.mode``: ``(per-token metrics, generation or None)``; ``ckpt``: saves between
    parallel mode's chunks (one device)."""
    m = cfg.model
    if m.mode == "parallel":
        from .parallel import run_parallel, run_split

        if ld.copies:  # the scheme batch split across devices (no checkpoints)
            return run_split(ld.copies, ld.plan.shards, ids, groups, cfg, ld.compute,
                             ld.backend, bar, phases), None
        return run_parallel(ld.model, ids, groups, cfg, ld.compute, ld.backend, bar,
                            phases=phases, ckpt=ckpt), None
    if m.mode == "generate":
        from .generate import run_generate

        return run_generate(ld.model, ids, groups, cfg, ld.compute, m.new_tokens, bar, phases,
                            ld.backend)
    from .decode import run_decode

    return run_decode(ld.model, ids, groups, cfg, ld.compute, bar), None


def merge_batches(parts: list) -> tuple[dict, dict | None, list]:
    """The batches of a run as one: ``parts`` is ``[((tok, gen), groups)]`` in document order;
    returns the per-token metrics and generations (each ``(K_b, ...)`` array concatenated along
    the documents) and the groups (the first batch's, with every batch's drift: the samples of
    each layer align by token, every batch having the same positions and chunks; and the
    earliest non-finite token of any batch)."""
    import dataclasses

    if len(parts) == 1:
        (tok, gen), groups = parts[0]
        return tok, gen, groups

    def cat(dicts: list[dict]) -> dict:
        return {n: {k: np.concatenate([d[n][k] for d in dicts]) for k in dicts[0][n]}
                for n in dicts[0]}

    tok = cat([t for (t, _), _ in parts])
    gen = cat([g for (_, g), _ in parts]) if parts[0][0][1] is not None else None
    groups = []
    for gi, g in enumerate(parts[0][1]):
        mine = [gs[gi] for _, gs in parts]
        drift = {}
        for layer in g.drift:
            per = [x.drift[layer] for x in mine]
            drift[layer] = []
            for samples in zip(*per, strict=True):
                assert len({s[0] for s in samples}) == 1, "drift samples out of step"
                drift[layer].append((samples[0][0], np.concatenate([s[1] for s in samples]),
                                     None if samples[0][2] is None
                                     else np.concatenate([s[2] for s in samples])))
        dead = [x.dead_at for x in mine if x.dead_at is not None]
        groups.append(dataclasses.replace(g, drift=drift, dead_at=min(dead) if dead else None))
    return tok, gen, groups


def merge_seeds(tok: dict, groups, cfg):
    """The scheme rows of a run: each scheme's per-token arrays with its SR seeds' documents
    stacked seed-major (``(S*K, N)``), the groups those rows belong to (the reference first)
    and each scheme's seed count. The FP32-state scheme that is the baseline
    (``metrics.baseline=fp32``) has, against itself, KL 0 and top-1 agreement 1."""
    import dataclasses

    names = seed_names(cfg)
    by = {g.name: g for g in groups}
    out, rows, seeds = {}, [groups[0]], {}
    b = baseline_index(cfg)
    for n, runs in names.items():
        t = {k: np.concatenate([tok[r][k] for r in runs]) for k in tok[runs[0]]}
        g = by[n]
        if g is groups[b]:  # the baseline's own row
            t = {**t, "kl": np.zeros_like(t["kl"]), "top1": np.ones_like(t["top1"]),
                 "rel": np.zeros_like(t["rel"])}
        dead = [by[r].dead_at for r in runs if by[r].dead_at is not None]
        out[n] = t
        rows.append(dataclasses.replace(g, dead_at=min(dead) if dead else None))
        seeds[n] = len(runs)
    return out, rows, seeds


def _final(t: dict, window: int, n: int, seeds: int = 1) -> dict:
    """A group's figures at the last window: KL and top-1 (means and 95% intervals over
    documents), the flip rate over every token, and the per-document KL of the window."""
    W = max(1, min(window, n))
    start = n - (n % W or W)
    kl = t["kl"][:, start:n].mean(axis=1)
    top1 = t["top1"][:, start:n].mean(axis=1)
    out = {"kl": float(kl.mean()), "top1": float(top1.mean()),
           "flip_rate": float(1 - t["top1"][:, :n].mean()),
           "per_doc_kl": [float(v) for v in kl]}
    out["kl_lo"], out["kl_hi"] = boot_ci(kl, seeds, seed=n)
    out["top1_lo"], out["top1_hi"] = boot_ci(top1, seeds, seed=n)
    return out


def floor_figures(tok: dict, rows_tok: dict, groups, cfg, mdtype, rows_groups) -> dict:
    """The floor of a whole-model run (``summary.json``'s ``info.floor``): the FP32 state
    against the float64 reference, the noise run against the baseline, each scheme's KL per
    document at the last window, and per scheme the documents a paired test would need to tell
    it from the noise floor."""
    W, N = cfg.metrics.window, next(iter(tok.values()))["kl"].shape[1]
    base = groups[1]
    noise = next(g for g in groups if g.role == "noise")
    out = {"baseline": cfg.metrics.baseline,
           "baseline_name": groups[baseline_index(cfg)].name,
           "model_dtype": str(mdtype).replace("torch.", ""), "dither": noise.dither,
           "fp32_vs_fp64": _final(tok[base.name], W, N), "noise": _final(tok[noise.name], W, N),
           "schemes": {}}
    nk = np.asarray(out["noise"]["per_doc_kl"])
    for g in rows_groups[1:]:
        f = _final(rows_tok[g.name], W, N)
        per = np.asarray(f["per_doc_kl"]).reshape(-1, nk.size).mean(axis=0)  # seed-averaged
        out["schemes"][g.name] = {"per_doc_kl": f["per_doc_kl"],
                                  "docs_vs_noise": docs_to_separate(per, nk)}
    return out
