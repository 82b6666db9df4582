"""Typed configuration (Hydra structured configs) and its validation.

The dataclasses are registered in Hydra's ConfigStore as the schema of ``conf/config.yaml``, so a
wrong key or type is named by Hydra itself; :func:`validate` checks values (ranges, names) and
raises :class:`~precsim.errors.PrecsimError` with one line naming the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .errors import PrecsimError, check, check_choice
from .formats.ids import SCHEME_KINDS

FAMILIES = ("mamba2", "gdn")
ENGINES = ("auto", "numpy", "torch", "triton", "numba")
DEVICES = ("auto", "cpu", "cuda")
DEVICE_MAPS = ("auto", "balanced")  # model.device_map, besides none and an explicit map
DEVICE_MAP_ALLOWED = ("none (one device: run.device)", "auto", "balanced",
                      "a map {module: device} (device: an integer GPU index, cuda:N or cpu)",
                      "a .yaml/.json file holding such a map")
WORKLOADS = ("synthetic", "seed_article", "trace")
BUFFER_DTYPES = ("fp32", "bf16", "fp16", "fp64")
COMPUTE_DTYPES = ("fp32", "fp64")
U_SOURCES = ("read", "master")
DECAY_EXPS = ("exact", "fast")  # model.decay_exp (precsim.families.decays)
MODEL_MODES = ("parallel", "decode", "generate")  # model.mode (whole-model mode)
BASELINES = ("fp32", "fp64")  # metrics.baseline (whole-model mode)


@dataclass
class ModelConfig:
    """Layer shape. ``head_dim`` is P (Mamba-2) or V (GDN); ``state_dim`` is N or K."""

    family: str = "mamba2"
    name: str = "mamba2"
    heads: int = 8
    head_dim: int = 64
    state_dim: int = 128
    groups: int = 1  # Mamba-2: heads of a group share B and C
    # float32 decays: "exact" = float32 of the float64 decay (the truth's); "fast" = the float32
    # exp of real kernels (tl.exp, ex2.approx on NVIDIA; emulated on the CPU)
    decay_exp: str = "exact"
    path: str | None = None  # a transformers checkpoint: whole-model mode (precsim.models)
    prompt: str | None = None  # whole-model mode: prompt text (default: precsim.models')
    text: str | None = None  # whole-model mode: documents, a .txt (one) or .jsonl (field text)
    ids: str | None = None  # whole-model mode: token ids, a .npy of shape (N,) or (K, N)
    # whole-model mode: parallel (one pass) | decode (token by token) | generate (each document
    # is a prompt; the baseline generates new_tokens greedily, every scheme runs free beside it)
    mode: str = "parallel"
    new_tokens: int = 64  # model.mode=generate: tokens generated after each prompt
    dtype: str | None = None  # whole-model mode: load the weights in this torch dtype
    # whole-model parallel mode: positions per forward pass (rounded up to whole metric windows
    # of whole ReplaySSM segments; 0 = the whole document at once; auto: 32,768, or in model_kl
    # and generate runs on a GPU the largest of 32,768 .. 2,048 at which every document fits
    # one pass, docs/real-models.md); checkpoints fall between
    chunk: Any = "auto"
    # whole-model mode: documents per batch of groups x documents rows (0: every document in one
    # batch; auto: on a GPU as many as an estimate fits in half its free memory, on the CPU all,
    # in decode mode 1; docs/real-models.md, "Documents in batches")
    doc_batch: Any = "auto"
    # whole-model mode across devices: null (one device, run.device), auto, balanced, or a map
    # {module: device} / a .yaml/.json file of one (docs/real-models.md, "Across several GPUs")
    device_map: Any = None


@dataclass
class SchemeConfig:
    """One precision scheme (docs/design.md, "Schemes").

    conventional(fmt, rounding) | shared(fmt, rounding) | split(fmt=update format,
    rounding=update rounding, read_fmt=read-copy format, always RNE). ``error_feedback``: the
    format of a per-element residual carried from each rounding of the state (every step, or
    each flush) into the next one (``none``: off; docs/schemes.md, "Error feedback").
    """

    kind: str = "conventional"
    fmt: str = "fp32"
    rounding: str = "rne"
    read_fmt: str | None = None
    sr_bits: int | None = None
    overflow: str = "satfinite"
    error_feedback: str = "none"
    label: str | None = None
    # per-layer formats (whole-model mode, or a record directory's layers): layer index ->
    # format of the scheme's stored slot (fmt; split: read_fmt), "default" for every other layer
    # (else the scheme's own), e.g. {0: fp16, 5: fp16, default: nvfp4} (docs/real-models.md)
    layers: Any = None


@dataclass
class ReplayConfig:
    buffer_len: int = 16
    buffer_dtype: str = "fp32"  # activations in the replay buffer (bf16 in real kernels)
    drafts: int = 0  # speculative decoding: T drafted tokens per verification (0 = off)
    # a draft's acceptance probability: one for every position (i.i.d.), or a per-position
    # profile [p1, p2, ...] (draft i accepted with p_i once drafts 1..i-1 were; MTP heads report
    # these; the last entry repeats for later positions)
    acceptance: Any = 0.7
    accept_seq: list[int] | None = None  # or a given sequence of accepted counts (cycled)
    gdn_u_source: str = "read"  # GDN: S_{t-1}k_t reads the read copy (fast kernel) or master


@dataclass
class FormatOptionsConfig:
    """Options passed to every quantize call (see precsim.formats.quantize)."""

    scale_floor: str = "subnormal"
    tensor_scope: str = "matrix"
    nvfp4_scale: str = "reciprocal"  # NVFP4 scale application: reciprocal (production) | divide
    sr_source: str = "hash"  # SR random bits: hash | philox5 | philox7 | philox10
    rotate: bool = False  # randomized Hadamard rotation of the last axis around each quantize


@dataclass
class WorkloadConfig:
    kind: str = "synthetic"
    path: str | None = None  # trace .npz, or a precsim.record directory (with layer)
    layer: int | None = None  # record directory: replay layer_{layer:02d}.npz
    long_memory_frac: float = 0.5  # seed_article: share of very long-memory heads
    dt_noise: float = 0.5  # synthetic: std of the raw dt projection around dt_bias


@dataclass
class RunConfig:
    steps: int = 4096
    seed: int = 0
    seqs: int = 1  # independent sequences simulated together (percentile bands)
    device: str = "auto"
    engine: str = "auto"
    compute_dtype: str = "fp32"
    # CPU threads: "auto" = the numba engine on all cores for a single run, shared out among
    # the jobs of a joblib sweep (1 each at n_jobs = cores), torch ops on one thread (its
    # OpenMP workers spin: 3-20x slower with 2 on a shared machine); 0 = all cores (torch's
    # default); n = n threads for both. Results do not depend on it.
    threads: Any = "auto"
    progress: bool = True
    out_dir: str | None = None  # default: Hydra's run directory (cwd when no Hydra)
    # the engine's state saved beside the results at most every checkpoint_s seconds (0: only
    # when interrupted; docs/resume.md); a rerun into the directory resumes from it unless
    # resume=false
    checkpoint_s: float = 120.0
    resume: bool = True
    # whole-model mode: each stochastic-rounding scheme runs under this many SR seeds (its rows
    # and intervals pool the seeds with the documents)
    sr_seeds: int = 1


@dataclass
class MetricsConfig:
    window: int = 256
    vocab: int = 1024  # readout head vocabulary for KL
    logit_scale: float = 3.0  # logits = logit_scale * W @ rms_normalise(y)
    kl: bool = True
    lengths: list[int] = field(default_factory=lambda: [256, 1024, 4096, 32768, 131072])
    # error_vs_length.png: null = a single run's yes and a sweep job's no (the sweep's plots,
    # sweep_error_vs_length.png and sweep_pareto.png, show every job; a PNG per job cost more
    # than its engine on a GPU)
    plot: bool | None = None
    # The run ends with the cheapest scheme within this budget at its last step. Default: the
    # layer output's relative RMS error vs the float64 truth <= 1/16 (an output SNR of >= 24 dB).
    # rel_err is scale-free; the KL's size depends on logit_scale and vocab (KL ~ logit_scale^2 *
    # rel_err^2 / 2), so a KL budget only means something for a readout you have calibrated.
    budget_metric: str = "rel_err"
    budget: float = 0.0625
    # whole-model mode: what each scheme's KL / top-1 is measured against: fp32 (the FP32 state
    # deployments ship today: the default) or fp64 (the float64-state truth); both are run
    # (docs/metrics.md, "The floor")
    baseline: str = "fp32"


@dataclass
class PerLayerConfig:
    """``experiment=per_layer`` (precsim.models.per_layer): the cheapest per-layer assignment of
    ``formats`` to the SSM layers of ``model.path`` within ``metrics.budget`` (of
    ``metrics.budget_metric``), verified by a whole-model run."""

    formats: list[str] | None = None  # candidate formats of the template's slot (None: off)
    scheme: str | None = None  # the template scheme (default: the config's only scheme)
    rounds: int = 3  # verifications at most (each miss tightens the target and re-solves)
    groups_per_pass: int = 32  # sensitivity groups per forward pass (memory)


@dataclass
class TaskConfig:
    """``experiment=task_eval`` (precsim.models.task, docs/tasks.md): task accuracy under each
    state format. A local ``path`` (.jsonl: multiple choice or generative items) or a built-in
    ``name`` (passkey | mqar: items generated from ``seed``, ``items`` per length)."""

    path: str | None = None  # a local .jsonl task file
    name: str | None = None  # a built-in task: passkey | mqar
    metric: str = "acc"  # multiple choice: acc (summed log-likelihood) | acc_token | acc_byte
    limit: int | None = None  # the file's first N items (None: all)
    lengths: list[int] = field(default_factory=lambda: [1024])  # built-in: prompt tokens
    items: int = 50  # built-in: items per length
    depth: float = 0.5  # built-in: where the key sits in the filler (0 start .. 1 end)
    seed: int = 0  # built-in: the items' seed
    key_len: int = 4  # passkey: key tokens; mqar: pairs planted
    # rows x positions x groups per forward pass (memory); auto: on a CUDA device as many
    # rows as fit half its free memory (as model.doc_batch=auto), elsewhere 65,536
    batch_tokens: Any = "auto"
    alpha: float = 0.05  # the paired tests' level
    power: float = 0.8  # the minimum detectable difference's power


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    schemes: dict[str, SchemeConfig] = field(default_factory=dict)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    formats: FormatOptionsConfig = field(default_factory=FormatOptionsConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    run: RunConfig = field(default_factory=RunConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    per_layer: PerLayerConfig = field(default_factory=PerLayerConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    experiment: Any = None
    name: str = "run"


GROUPS = ("model", "workload", "schemes", "experiment")  # conf/<group>/*.yaml
# the presets that run a real checkpoint (experiment=NAME): model.path is required with them (a
# preset's ``path: ???`` does not override the schema's null, so it cannot say so itself)
WHOLE_MODEL = ("model_kl", "per_layer", "task_eval")


def check_preset(experiment: str | None, model_path) -> None:
    """One-line PrecsimError when the chosen ``experiment`` preset needs the model.path it
    lacks (before the rest of the config is checked: its errors would be about what follows
    from the missing path)."""
    if experiment in WHOLE_MODEL and model_path is None:
        raise PrecsimError(f"experiment={experiment} needs model.path (it runs a real "
                           "checkpoint); allowed: model.path=DIR, a local save_pretrained "
                           "directory (docs/real-models.md)")


def schema_keys() -> list[str]:
    """Every settable dotted key of the schema (``schemes.NAME.*`` written with ``NAME``)."""
    import dataclasses

    def walk(cls, prefix: str) -> list[str]:
        out = []
        for f in dataclasses.fields(cls):
            key = prefix + f.name
            if dataclasses.is_dataclass(f.default_factory):  # MISSING is not a dataclass
                out += walk(f.default_factory, key + ".")
            else:
                out.append(key)
        return out

    keys = [k for k in walk(Config, "") if k != "schemes"]
    return keys + [f"schemes.NAME.{f.name}" for f in dataclasses.fields(SchemeConfig)]


def check_key(key: str) -> None:
    """Raise a one-line PrecsimError unless ``key`` (an override's dotted key) is in the schema:
    "unknown key run.stepz; did you mean run.steps?". A scheme name is not checked here (the
    schemes come from a preset); its fields are."""
    import difflib

    parts = key.split(".")
    if parts[0] == "schemes":
        if len(parts) == 2:
            return
        if len(parts) == 3:
            fields = [k.rsplit(".", 1)[1] for k in schema_keys() if k.startswith("schemes.")]
            if parts[2] in fields:
                return
            near = difflib.get_close_matches(parts[2], fields, n=1, cutoff=0.5)
            hint = (f"did you mean schemes.{parts[1]}.{near[0]}?" if near else
                    f"a scheme has: {', '.join(fields)}")
            raise PrecsimError(f"unknown key {key}; {hint}")
    keys = schema_keys()
    if key in keys or key in GROUPS or key == "name":
        return
    if any(k.startswith(key + ".") for k in keys):  # a whole section, e.g. run={...}
        return
    plain = [k for k in keys if not k.startswith("schemes.")]
    near = difflib.get_close_matches(key, plain, n=1, cutoff=0.6)
    if not near:
        section = [k for k in plain if k.startswith(parts[0] + ".")]
        tops = ", ".join(sorted({k.split(".")[0] for k in keys}))
        hint = (f"{parts[0]} has: {', '.join(k.split('.', 1)[1] for k in section)}" if section
                else f"the top-level keys are: {tops}")
        raise PrecsimError(f"unknown key {key}; {hint}")
    raise PrecsimError(f"unknown key {key}; did you mean {near[0]}?")


def to_config(cfg) -> Config:
    """An OmegaConf/dict/Config → a validated :class:`Config` instance."""
    if isinstance(cfg, Config):
        out = cfg
    else:
        from omegaconf import OmegaConf
        from omegaconf.errors import ConfigKeyError

        try:
            if not OmegaConf.is_config(cfg):
                cfg = OmegaConf.create(cfg)
            merged = OmegaConf.merge(OmegaConf.structured(Config), cfg)
        except ConfigKeyError as e:  # an unknown key: name it, suggest the nearest
            key = getattr(e, "full_key", None) or str(e).splitlines()[0]
            check_key(key)
            raise PrecsimError(str(e).splitlines()[0]) from None
        out = OmegaConf.to_object(merged)
    validate(out)
    return out


def validate(cfg: Config) -> None:
    """Check every value a user can get wrong; one-line PrecsimError naming the key."""
    from precsim import formats as pf

    m = cfg.model
    check_choice("model.family", m.family, FAMILIES)
    for key in ("heads", "head_dim", "state_dim", "groups"):
        v = getattr(m, key)
        check(isinstance(v, int) and v > 0, f"model.{key}", v, "a positive integer")
    check(m.heads % m.groups == 0, "model.groups", m.groups, f"a divisor of model.heads={m.heads}")
    check_choice("model.decay_exp", m.decay_exp, DECAY_EXPS)
    check_choice("model.mode", m.mode, MODEL_MODES)
    check(isinstance(m.new_tokens, int) and not isinstance(m.new_tokens, bool)
          and m.new_tokens > 0, "model.new_tokens", m.new_tokens,
          "an integer >= 1 (tokens generated after each prompt, model.mode=generate)")
    check(m.chunk == "auto" or (isinstance(m.chunk, int) and not isinstance(m.chunk, bool)
                                and m.chunk >= 0), "model.chunk", m.chunk,
          "auto, or an integer >= 0 (positions per forward pass; 0 = the whole document)")
    check(m.doc_batch == "auto" or (isinstance(m.doc_batch, int) and not isinstance(
        m.doc_batch, bool) and m.doc_batch >= 0), "model.doc_batch", m.doc_batch,
        "auto, or an integer >= 0 (documents per batch; 0 = every document in one batch)")
    check(m.dtype in (None, "float32", "float64", "bfloat16", "float16"), "model.dtype", m.dtype,
          "null (the checkpoint's), float32, float64, bfloat16, float16")
    m.device_map = parse_device_map(m.device_map)
    check(m.device_map is None or m.path is not None, "model.device_map", m.device_map,
          "none without model.path (a layer-level run runs on run.device)")
    r = cfg.replay
    check(isinstance(r.buffer_len, int) and r.buffer_len > 0, "replay.buffer_len", r.buffer_len,
          "an integer >= 1")
    check_choice("replay.buffer_dtype", r.buffer_dtype, BUFFER_DTYPES)
    check_choice("replay.gdn_u_source", r.gdn_u_source, U_SOURCES)
    check(isinstance(r.drafts, int) and 0 <= r.drafts <= r.buffer_len, "replay.drafts", r.drafts,
          f"an integer 0..replay.buffer_len={r.buffer_len} (drafts must fit in the buffer)")
    _check_acceptance(r)
    if r.accept_seq is not None:
        seq = list(r.accept_seq)
        check(len(seq) > 0 and all(0 <= int(a) <= max(r.drafts, 1) for a in seq)
              and any(int(a) > 0 for a in seq), "replay.accept_seq", seq,
              f"a non-empty list of accepted counts 0..drafts={r.drafts}, not all zero")
    w = cfg.workload
    check_choice("workload.kind", w.kind, WORKLOADS)
    if w.kind == "trace":
        check(bool(w.path), "workload.path", w.path, "a .npz trace file (workload=trace)")
    else:  # (the synthetic inputs ran in its place, the trace unread, saying nothing)
        check(w.path is None, "workload.path", w.path, f"null with workload.kind={w.kind} (its "
              "inputs are generated); a trace needs workload=trace as well")
    if w.layer is not None:
        check(isinstance(w.layer, int) and w.layer >= 0, "workload.layer", w.layer,
              "a layer index >= 0 (a layer_XX.npz of a record directory)")
        check(w.kind == "trace", "workload.layer", w.layer, "null unless workload=trace (a "
              "layer of the precsim.record directory workload.path)")
    if m.path is not None:
        check(isinstance(m.path, str) and m.path != "", "model.path", m.path,
              "a local transformers checkpoint directory")
    else:  # whole-model settings: a layer-level run ran without them, saying nothing
        for key, v in (("model.text", m.text), ("model.ids", m.ids), ("model.prompt", m.prompt),
                       ("model.dtype", m.dtype), ("task.path", cfg.task.path),
                       ("task.name", cfg.task.name)):
            check(v is None, key, v, "null without model.path (a whole-model setting; add "
                  "model.path=DIR, a local save_pretrained directory)")
        check(m.mode == "parallel", "model.mode", m.mode, "parallel without model.path (a "
              "whole-model setting; add model.path=DIR, a local save_pretrained directory)")
    check(0.0 <= w.long_memory_frac <= 1.0, "workload.long_memory_frac", w.long_memory_frac,
          "a fraction in [0, 1]")
    check(math.isfinite(w.dt_noise) and w.dt_noise >= 0, "workload.dt_noise", w.dt_noise,
          "a number >= 0 (the standard deviation of the raw dt around its bias)")
    run = cfg.run
    check(isinstance(run.steps, int) and run.steps > 0, "run.steps", run.steps, "an integer >= 1")
    check(isinstance(run.seqs, int) and run.seqs > 0, "run.seqs", run.seqs, "an integer >= 1")
    check(isinstance(run.seed, int) and run.seed >= 0, "run.seed", run.seed, "an integer >= 0")
    check_choice("run.device", run.device, DEVICES)
    check_choice("run.engine", run.engine, ENGINES)
    check_choice("run.compute_dtype", run.compute_dtype, COMPUTE_DTYPES)
    check(isinstance(run.checkpoint_s, (int, float)) and not isinstance(run.checkpoint_s, bool)
          and run.checkpoint_s >= 0, "run.checkpoint_s", run.checkpoint_s,
          "seconds >= 0 (0: no checkpoints)")
    check(run.threads == "auto" or (isinstance(run.threads, int) and not isinstance(
        run.threads, bool) and run.threads >= 0), "run.threads", run.threads,
          "auto or an integer >= 0 (0 = all cores)")
    check(isinstance(run.sr_seeds, int) and not isinstance(run.sr_seeds, bool)
          and run.sr_seeds > 0, "run.sr_seeds", run.sr_seeds,
          "an integer >= 1 (stochastic-rounding seeds per SR scheme)")
    mc = cfg.metrics
    check_choice("metrics.baseline", mc.baseline, BASELINES)
    check(isinstance(mc.window, int) and mc.window > 0, "metrics.window", mc.window,
          "an integer >= 1")
    check(mc.window <= run.steps, "metrics.window", mc.window,
          f"an integer 1..run.steps={run.steps} (a window longer than the run never ends: no "
          "drift sample, no figures)")
    check(isinstance(mc.vocab, int) and mc.vocab >= 2, "metrics.vocab", mc.vocab,
          "an integer >= 2")
    check(mc.logit_scale > 0 and math.isfinite(mc.logit_scale), "metrics.logit_scale",
          mc.logit_scale, "a positive number")
    lengths = list(mc.lengths)
    check(len(lengths) > 0 and all(isinstance(v, int) and v > 0 for v in lengths),
          "metrics.lengths", lengths, "a non-empty list of positive integers (decode steps)")
    check_choice("metrics.budget_metric", mc.budget_metric,
                 ("kl", "rel_err", "state_drift", "accuracy"))
    if mc.budget_metric == "accuracy" and not (cfg.task.path or cfg.task.name):
        raise PrecsimError("metrics.budget_metric=accuracy needs a task; allowed: task.path="
                           "FILE.jsonl or task.name=passkey|mqar (experiment=per_layer over a "
                           "task), or metrics.budget_metric=kl|rel_err")
    if mc.budget_metric == "kl":
        check(mc.kl, "metrics.kl", mc.kl, "true while metrics.budget_metric=kl (the budget "
              "needs the KL)")
    check(mc.budget > 0 and math.isfinite(mc.budget), "metrics.budget", mc.budget,
          "a positive number")
    _check_per_layer(cfg)
    check_choice("formats.scale_floor", cfg.formats.scale_floor, pf.SCALE_FLOORS)
    check_choice("formats.tensor_scope", cfg.formats.tensor_scope, pf.TENSOR_SCOPES)
    check_choice("formats.nvfp4_scale", cfg.formats.nvfp4_scale, pf.SCALE_MODES)
    check_choice("formats.sr_source", cfg.formats.sr_source, pf.SR_SOURCES)
    check(isinstance(cfg.formats.rotate, bool), "formats.rotate", cfg.formats.rotate,
          "true or false")
    n = m.state_dim
    check(not cfg.formats.rotate or n & (n - 1) == 0, "model.state_dim", n,
          "a power of two (formats.rotate=true rotates the state's last axis)")
    if not cfg.schemes:
        raise PrecsimError("schemes is empty; choose a preset, e.g. experiment=split_nvfp4 "
                           "or schemes=seed_table")
    for name, s in cfg.schemes.items():
        key = f"schemes.{name}"
        check_choice(f"{key}.kind", s.kind, SCHEME_KINDS)
        _check_fmt(f"{key}.fmt", s.fmt)
        check_choice(f"{key}.rounding", s.rounding, pf.ROUNDINGS)
        check_choice(f"{key}.overflow", s.overflow, pf.OVERFLOWS)
        if s.kind == "split":
            check(s.read_fmt is not None, f"{key}.read_fmt", s.read_fmt,
                  "a format name (split needs a read-copy format)")
            _check_fmt(f"{key}.read_fmt", s.read_fmt)
        elif s.read_fmt is not None:
            raise PrecsimError(f"{key}.read_fmt={s.read_fmt!r} is only valid for kind=split "
                               f"(this scheme is kind={s.kind})")
        _check_ef(key, s, cfg.run.compute_dtype)
        if s.sr_bits is not None:
            check(1 <= s.sr_bits <= 32, f"{key}.sr_bits", s.sr_bits, "an integer 1..32")
        if s.layers is not None:
            _check_layers(key, s, m.path, w)
    if m.path is None:
        check_blocks(cfg, m.state_dim, f"the state dim of the trace {w.path}"
                     if w.kind == "trace" else None)


def check_blocks(cfg: Config, dim: int, source: str | None = None) -> None:
    """Every block format of every scheme divides the state's last axis (``dim``): the
    config's ``model.state_dim``, or (``source``) a checkpoint's, where the format is to blame."""
    from precsim import formats as pf

    for name, s in cfg.schemes.items():
        for key, f in (("fmt", s.fmt), ("read_fmt", s.read_fmt), ("error_feedback", ef_fmt(s)),
                       *((f"layers.{k}", v) for k, v in (s.layers or {}).items())):
            fo = pf.get(f) if f else None
            if fo is None or fo.kind != "block" or dim % fo.block == 0:
                continue
            if source is None:
                check(False, "model.state_dim", dim,
                      f"a multiple of {fo.block} (the {fo.name} block, scheme {name})")
            hint = (f"a block size dividing {dim} (e.g. {fo.name.rsplit('_b', 1)[0]}_b{dim})"
                    if "_b" in fo.name else f"a format whose block divides {dim}")
            raise PrecsimError(f"schemes.{name}.{key}={f!r}: its block of {fo.block} does not "
                               f"divide the state's last axis, {dim} ({source}); allowed: {hint}")


def _check_per_layer(cfg: Config) -> None:
    pl = cfg.per_layer
    if pl.formats is None:
        return
    check(cfg.model.path is not None, "per_layer.formats", pl.formats,
          "null without model.path (the assignment runs the whole model)")
    fmts = list(pl.formats)
    check(len(fmts) >= 2 and len(set(fmts)) == len(fmts), "per_layer.formats", fmts,
          "two or more distinct formats")
    for f in fmts:
        _check_fmt("per_layer.formats", f)
    names = list(cfg.schemes)
    if pl.scheme is None:
        check(len(names) == 1, "per_layer.scheme", None,
              f"the template scheme's name (this config has {', '.join(names)})")
    else:
        check_choice("per_layer.scheme", pl.scheme, names)
    check(cfg.metrics.budget_metric in ("kl", "rel_err", "accuracy"), "metrics.budget_metric",
          cfg.metrics.budget_metric, "kl, rel_err or accuracy in experiment=per_layer (the "
          "figures whose per-layer sensitivities it adds up; not state_drift)")
    if (cfg.task.path or cfg.task.name) and cfg.metrics.budget_metric != "accuracy":
        raise PrecsimError(f"metrics.budget_metric={cfg.metrics.budget_metric} with a task "
                           "(task.path or task.name) in experiment=per_layer; allowed: "
                           "metrics.budget_metric=accuracy (an accuracy drop as metrics.budget)")
    check(isinstance(pl.rounds, int) and pl.rounds >= 1, "per_layer.rounds", pl.rounds,
          "an integer >= 1")
    check(isinstance(pl.groups_per_pass, int) and pl.groups_per_pass >= 1,
          "per_layer.groups_per_pass", pl.groups_per_pass, "an integer >= 1")


def _check_layers(key: str, s: SchemeConfig, path, w: WorkloadConfig) -> None:
    """A per-layer map's keys and formats (the layer indices are checked against the model when
    it is loaded, or the record directory's layers)."""
    check(isinstance(s.layers, dict) and len(s.layers) > 0, f"{key}.layers", s.layers,
          "a map {LAYER: FORMAT, ..., default: FORMAT}")
    for k, v in s.layers.items():
        check(k == "default" or layer_index(k) is not None, f"{key}.layers", k,
              "layer indices >= 0 and default")
        _check_fmt(f"{key}.layers.{k}", v)
    check(path is not None or w.kind == "trace", f"{key}.layers", dict(s.layers),
          "per-layer formats with model.path (whole-model mode) or workload=trace of a "
          "precsim.record directory; a layer-level run has no layers")


def layer_index(k) -> int | None:
    """A per-layer map's key as a layer index (an int, or its digits as written to JSON)."""
    if isinstance(k, bool):
        return None
    if isinstance(k, int):
        return k if k >= 0 else None
    return int(k) if isinstance(k, str) and k.isdigit() else None


def slot(s: SchemeConfig) -> str:
    """The field a per-layer map sets: the read copy of a split scheme, else the state's."""
    return "read_fmt" if s.kind == "split" else "fmt"


def scheme_at(s: SchemeConfig, layer: int | None) -> SchemeConfig:
    """The uniform scheme ``s`` is at ``layer`` (``s`` itself when it has no per-layer map;
    ``layer`` None: its default)."""
    if s.layers is None:
        return s
    import dataclasses

    lm = {layer_index(k): v for k, v in s.layers.items() if k != "default"}
    fmt = lm.get(layer, s.layers.get("default", getattr(s, slot(s))))
    return dataclasses.replace(s, layers=None, **{slot(s): fmt})


def check_layers_exist(cfg: Config, ssm: list[int], n_layers: int | None, kinds=None,
                       where: str = "the model") -> None:
    """Every per-layer map's indices are SSM layers of the model (``ssm``; ``n_layers`` layers
    in all, ``kinds``: index -> what a non-SSM layer is) or a record directory's layers."""
    allowed = ", ".join(map(str, ssm))
    for name, s in cfg.schemes.items():
        for k in (s.layers or {}):
            i = layer_index(k)
            if i is None or i in ssm:
                continue
            key = f"schemes.{name}.layers"
            if n_layers is not None and i < n_layers:
                what = (kinds or {}).get(i, "not an SSM layer")
                raise PrecsimError(f"{key}: layer {i} of {where} is {what}; allowed: the SSM "
                                   f"layers {allowed}")
            have = f"layers 0..{n_layers - 1}" if n_layers else f"layers {allowed}"
            raise PrecsimError(f"{key}: layer {i} is not in {where} (it has {have}); allowed: "
                               f"the SSM layers {allowed}")


def _check_acceptance(r: ReplayConfig) -> None:
    """replay.acceptance: a probability in (0, 1] or a non-empty list of them (stored as floats)."""
    acc = r.acceptance
    if not isinstance(acc, (str, bytes)) and hasattr(acc, "__iter__"):
        acc = list(acc)
    items = acc if isinstance(acc, list) else [acc]

    def prob(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 < v <= 1.0

    check(len(items) > 0 and all(prob(v) for v in items), "replay.acceptance", acc,
          "a probability in (0, 1] or a per-position list of them, e.g. [0.9,0.8,0.7,0.6]")
    r.acceptance = [float(v) for v in items] if isinstance(acc, list) else float(acc)


def ef_fmt(s: SchemeConfig) -> str | None:
    """The residual's format of a scheme with error feedback, else None."""
    return None if s.error_feedback in (None, "none") else s.error_feedback


def _check_ef(key: str, s: SchemeConfig, compute_dtype: str) -> None:
    """``error_feedback``: none, or a format for the residual of a state that is rounded."""
    ef = ef_fmt(s)
    if ef is None:
        return
    _check_fmt(f"{key}.error_feedback", ef, "none, ")
    if s.fmt == "fp64" or (s.fmt == "fp32" and compute_dtype == "fp32"):
        raise PrecsimError(f"{key}.error_feedback={ef!r} with fmt={s.fmt!r}: the state is not "
                           f"rounded at run.compute_dtype={compute_dtype}, so there is no "
                           "residual; allowed: none, or a narrower fmt")


def _check_fmt(key: str, name, also: str = "") -> None:
    from precsim import formats as pf

    try:
        f = pf.get(name)
    except pf.FormatError as e:
        why = str(e).split(": ", 1)[-1]
        if "cannot carry a row scale" in why or "block size" in why:  # a row-scaled name's own
            raise PrecsimError(f"{key}={name!r}: {why}") from None  # reason, not "unknown"
        raise PrecsimError(f"{key}={name!r} is an unknown format; allowed: {also}"
                           f"{', '.join(pf.names())}, or <element>_b<block size> (row-scaled, "
                           "e.g. int8_b128)") from None
    if f.name == "e8m0":
        raise PrecsimError(f"{key}={name!r} cannot hold a state (no sign, no zero); allowed: "
                           f"{', '.join(n for n in pf.names() if n != 'e8m0')}")


# ---------------------------------------------------------------------------------------------
# model.device_map (precsim.models.placement decides what it means)


def parse_device_map(value, key: str = "model.device_map"):
    """``model.device_map`` / ``--device-map``: None (one device), ``auto``, ``balanced`` or a
    dict ``{module name: device}`` (from YAML/JSON when given a file); one-line error else."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
        return None
    if isinstance(value, str):
        v = value.strip()
        if v in DEVICE_MAPS:
            return v
        if v.endswith((".yaml", ".yml", ".json")):
            return parse_device_map(_read_map(v, key), key)
        if v.startswith("{"):  # --device-map '{"backbone.embeddings": 0, ...}'
            import yaml

            try:
                return parse_device_map(yaml.safe_load(v), key)
            except yaml.YAMLError:
                pass
        raise PrecsimError(f"{key}={value!r} is unknown; allowed: {_allowed_maps(key)}")
    if not isinstance(value, dict) or not value:
        raise PrecsimError(f"{key}={value!r} is invalid; allowed: {_allowed_maps(key)}")
    out = {}
    for mod, dev in value.items():
        out[str(mod)] = device_name(dev, f"{key}.{mod}")
    return out


def _allowed_maps(key: str) -> str:
    """What a device map may be, as ``key`` says it (precsim.record's ``--device-map``: its one
    device is ``--device``, not ``run.device``)."""
    text = "; ".join(DEVICE_MAP_ALLOWED)
    return text.replace("run.device", "--device") if key.startswith("--") else text


def _read_map(path: str, key: str) -> dict:
    import json
    from pathlib import Path

    import yaml

    p = Path(path)
    if not p.is_file():
        raise PrecsimError(f"{key}={path!r} does not exist; allowed: {_allowed_maps(key)}")
    try:
        d = json.loads(p.read_text()) if p.suffix == ".json" else yaml.safe_load(p.read_text())
    except (ValueError, yaml.YAMLError) as e:
        raise PrecsimError(f"{key}={path!r} is not readable {p.suffix[1:].upper()} "
                           f"({type(e).__name__}); allowed: a map {{module: device}}") from None
    if not isinstance(d, dict):
        raise PrecsimError(f"{key}={path!r} holds {type(d).__name__}, not a map; allowed: "
                           "{module: device}")
    return d


def device_name(dev, key: str) -> str:
    """``0`` / ``"cuda:0"`` -> ``"cuda:0"``; ``"cpu"``; one-line error else (``disk``
    included: precsim does not offload to disk)."""
    if isinstance(dev, bool):
        dev = str(dev)
    if isinstance(dev, int) and dev >= 0:
        return f"cuda:{dev}"
    s = str(dev).strip()
    if s == "cpu" or (s.startswith("cuda:") and s[5:].isdigit()):
        return s
    if s.isdigit():
        return f"cuda:{s}"
    raise PrecsimError(f"{key}={dev!r} is not a device; allowed: an integer GPU index, cuda:N "
                       "or cpu")
