"""Where a whole-model run goes (``model.device_map``; docs/real-models.md, "Across several
GPUs").

The decision (:func:`decide`) is pure: it takes the bytes the run needs (:class:`Need`: the
checkpoint's weights, and per batch group, the reference's or a scheme's ``K`` documents, the
states, caches and one forward pass's activations; :func:`estimate`) and each device's free bytes
(numbers, so the tests fake GPUs), and returns a :class:`Plan`:

* ``single``: everything fits the device with the most free memory: today's one-device path;
* ``split``: the weights fit one GPU but not beside every group: each GPU holds a full copy and
  runs the reference and a contiguous share of the schemes (results concatenated in scheme
  order);
* ``device_map``: the weights do not fit one GPU: ``transformers``/``accelerate`` place the
  layers across the GPUs (``device_map='auto'``), with ``max_memory`` leaving each GPU room for
  the run's states and activations of the layers it holds.

``model.device_map=balanced`` always spreads the layers (accelerate's ``balanced``), an explicit
map ``{module: device}`` is the user's (checked against the checkpoint's modules, not sized).
What the run needs beyond the weights is an estimate (:func:`estimate` lists its terms);
``tests/gpu/gpu_multi_model.py`` prints it beside the measured peak.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..config import DEVICE_MAP_ALLOWED as ALLOWED
from ..config import DEVICE_MAPS as NAMED
from ..config import parse_device_map as parse  # noqa: F401 - the option, parsed where checked
from ..errors import PrecsimError

KEY = "model.device_map"
HELD_GPU = "PRECSIM_JOB_GPU"  # set by the sweep callback while a joblib job holds one GPU
USABLE = 0.9  # of a device's free bytes: the rest for the CUDA context, fragmentation, misses
GiB = 2**30


def gib(b: float) -> str:
    """Bytes in GiB (MiB, KiB below one)."""
    for unit, n in (("GiB", GiB), ("MiB", 2**20)):
        if b >= n:
            return f"{b / n:,.1f} {unit}"
    return f"{b / 1024:,.1f} KiB"


# ---------------------------------------------------------------------------------------------
# an explicit map


def check_map(dmap: dict, modules: set[str], params: list[str], what: str, gpus: int) -> None:
    """Every key names a module of the checkpoint, every parameter falls under a key, and every
    device is there (``gpus`` visible)."""
    for mod, dev in dmap.items():
        if dev.startswith("cuda") and int(dev[5:]) >= gpus:
            raise PrecsimError(f"{KEY}.{mod}={dev!r} but {gpus} GPU(s) are visible; allowed: "
                               + (f"cuda:0..cuda:{gpus - 1} or cpu" if gpus else "cpu"))
    bad = [k for k in dmap if k != "" and k not in modules]
    if bad:
        near = sorted(m for m in modules if m and m.count(".") <= 2)[:8]
        raise PrecsimError(f"{KEY} names {bad[0]!r}, not a module of {what}; allowed: module "
                           f"names such as {', '.join(near)}")
    keys = sorted(dmap, key=len, reverse=True)
    for p in params:
        if not any(k == "" or p == k or p.startswith(k + ".") for k in keys):
            raise PrecsimError(f"{KEY} places no module holding {p!r} of {what}; allowed: a "
                               "map covering every parameter (a parent module, or '' for all)")


# ---------------------------------------------------------------------------------------------
# what a run needs


@dataclass
class Shape:
    """The numbers of a checkpoint that size a run (:func:`shape_of` reads them)."""

    weights: int  # bytes of parameters and buffers in the loaded dtype
    dtype_bytes: int  # of activations (the loaded dtype)
    hidden: int
    width: int  # the widest projection inside a layer (in_proj, MLP)
    vocab: int
    ssm_layers: int
    heads: int  # H
    dv: int  # P (Mamba-2) or V (GDN)
    dk: int  # N or K
    bc: int  # B/C (Mamba-2) or q/k (GDN) features per token: groups x dk
    kv: int  # key + value features per token, summed over the attention layers
    conv: int  # conv-state elements per row, summed over the SSM layers
    eager_heads: int = 0  # query heads x attention layers when attention is eager (scores held)


@dataclass
class Need:
    """Bytes of a run: the weights, per batch group (``K`` documents of the reference or one
    scheme) the part that lives with the layers (states and caches, spread as the layers are)
    and one forward pass's activations (one layer at a time, on each device), and once the
    output head's logits."""

    weights: int
    group_layers: int
    group_pass: int
    head: int
    groups: int
    docs: int
    tokens: int
    chunk: int

    def run(self, groups: int | None = None) -> int:
        g = self.groups if groups is None else groups
        return g * (self.group_layers + self.group_pass) + self.head

    def total(self, groups: int | None = None) -> int:
        return self.weights + self.run(groups)


def estimate(s: Shape, docs: int, groups: int, tokens: int, chunk: int,
             head_chunk: int = 1024, state_bytes: float = 12) -> Need:
    """The bytes of a whole-model run of ``groups`` groups (the reference and each scheme) of
    ``docs`` documents over ``tokens`` tokens in forward passes of ``chunk`` positions.

    Per group and SSM layer: the scheme's state, read copy and error-feedback residual at
    ``state_bytes`` an element (the groups' mean, :func:`state_bytes`; 12 when they are not
    known: three float32 copies at most, or the reference's float64 state), the model's own
    cached state (float32) and conv state. Per group and attention layer: the key/value cache
    over every token (only when the run goes in several passes). Per group and pass: six hidden
    vectors and two of the widest projection per position in the model's dtype, the scan's
    inputs (float32) and its outputs (float64 and float32), and attention scores over the
    positions so far when the model's attention is eager. Once: the output head's logits of
    ``head_chunk`` positions of the reference and a scheme in float64 (four arrays)."""
    state = s.heads * s.dv * s.dk
    several = chunk < tokens
    layers = int(s.ssm_layers * state * (state_bytes + 4)) + s.conv * s.dtype_bytes \
        + (s.kv * tokens * s.dtype_bytes if several else 0)
    scan_io = s.heads * s.dv * (4 + 8 + 4) + s.heads * 4 + s.bc * 2 * 4
    per_pos = (6 * s.hidden + 2 * s.width) * s.dtype_bytes + scan_io \
        + s.eager_heads * tokens * 4 // max(1, s.ssm_layers + 1)
    head = docs * min(head_chunk, chunk) * s.vocab * 8 * 4
    return Need(s.weights, docs * layers, docs * chunk * per_pos, head, groups, docs, tokens,
                chunk)


def state_bytes(groups, compute) -> float:
    """The mean bytes a state element takes over ``groups`` (:class:`.scan.Group`) in the
    scans: the reference's float64 state; a scheme's state in the ``compute`` dtype (a torch
    dtype), and as much again for a split scheme's read copy and for an error-feedback residual
    (none is held without them)."""
    from ..config import ef_fmt

    per = [8 if g.reference else
           compute.itemsize * (1 + (g.cfg.kind == "split") + bool(ef_fmt(g.cfg)))
           for g in groups]
    return sum(per) / max(1, len(per))


# ---------------------------------------------------------------------------------------------
# the decision


@dataclass
class Plan:
    """Where the run goes: ``kind`` single | split | device_map, on ``devices``."""

    kind: str
    request: object
    devices: list[str]
    need: Need
    free: dict[str, int]
    device_map: object = None  # what from_pretrained gets (device_map)
    max_memory: dict | None = None  # and its max_memory, {index or "cpu": bytes}
    shards: list[list[str]] = field(default_factory=list)  # split: schemes per device
    why: str = ""

    def line(self) -> str:
        """The decision in one line (the run's log)."""
        req = self.request if isinstance(self.request, str) else "{map}"
        if self.kind == "single":
            where = f"one device, {self.devices[0]}"
        elif self.kind == "split":
            where = "the schemes split across " + ", ".join(
                f"{d} ({', '.join(s)})" for d, s in zip(self.devices, self.shards, strict=True)
            ) + ", a full model copy on each"
        else:
            dm = self.device_map if isinstance(self.device_map, str) else "explicit"
            where = f"the layers across {', '.join(self.devices)} (device_map={dm})"
        return f"placement: {KEY}={req} -> {where}; {self.why}"

    def info(self) -> dict:
        """The decision for ``summary.json`` (``info.placement``)."""
        n = self.need
        return {"kind": self.kind, "request": self.request, "devices": self.devices,
                "device_map": self.device_map, "line": self.line(),
                "max_memory": {str(k): v for k, v in (self.max_memory or {}).items()} or None,
                "shards": self.shards or None,
                "bytes": {"weights": n.weights, "run": n.run(), "per_group_layers":
                          n.group_layers, "per_group_pass": n.group_pass, "head": n.head,
                          "free": dict(self.free), "usable_fraction": USABLE},
                "estimate_of": {"groups": n.groups, "documents": n.docs, "tokens": n.tokens,
                                "chunk": n.chunk}}


def _rows(need: Need) -> str:
    return (f"{need.groups} groups (the reference and each scheme) x {need.docs} document(s) x "
            f"{need.tokens:,} tokens, passes of {need.chunk:,}")


def decide(request, need: Need, free: dict[str, int], schemes: list[str],
           split_ok: bool = True) -> Plan:
    """The plan for ``request`` (``auto``, ``balanced`` or an explicit map) given the run's
    ``need`` and each device's free bytes ``free`` (in order; GPUs, or the CPU alone). One-line
    PrecsimError when nothing fits."""
    use = {d: int(f * USABLE) for d, f in free.items()}
    if isinstance(request, dict):
        devs = list(dict.fromkeys(request.values()))
        return Plan("device_map", request, devs, need, free, device_map=request,
                    why="the map as given (not sized)")
    if request not in NAMED:
        raise PrecsimError(f"{KEY}={request!r} is unknown; allowed: {'; '.join(ALLOWED)}")
    total = need.total()
    best = max(use, key=lambda d: use[d]) if use else None
    head = f"{gib(need.weights)} weights + {gib(need.run())} run"
    if request == "auto" and best is not None and total <= use[best]:
        return Plan("single", request, [best], need, free,
                    why=f"needs {head} ({_rows(need)}), {best} has {gib(use[best])} usable")
    gpus = [d for d in use if d.startswith("cuda")]
    if request == "auto" and split_ok and len(gpus) > 1 and len(schemes) > 1:
        shards = split_schemes(need, {d: use[d] for d in gpus}, schemes)
        if shards is not None:
            devs = [d for d in gpus if shards.get(d)]
            return Plan("split", request, devs, need, free, shards=[shards[d] for d in devs],
                        why=f"{head} exceed one GPU ({gib(use[best])} usable); each GPU holds "
                            f"the weights, the reference and its schemes")
    if not gpus and request == "balanced" and best is not None and total <= use[best]:
        return Plan("device_map", request, [best], need, free, device_map=request,
                    why=f"no GPU; needs {head} ({_rows(need)}), {best} has {gib(use[best])} "
                        "usable")
    if not gpus:
        raise PrecsimError(f"{KEY}={request}: the run needs {gib(total)} ({head}; "
                           f"{_rows(need)}) and {best or 'the CPU'} has "
                           f"{gib(use.get(best, 0))} usable ({USABLE:.0%} of "
                           f"{gib(free.get(best, 0))} free); allowed: fewer schemes or run.seqs, "
                           "a smaller model.chunk or model.dtype, or GPUs")
    # the layers across the GPUs: each keeps room for one pass and the head, and for the
    # states and caches of the layers it gets (a share proportional to its weights)
    fixed = need.groups * need.group_pass + need.head
    room = {d: max(0, use[d] - fixed) for d in gpus}
    prop = need.groups * need.group_layers
    if sum(room.values()) < need.weights + prop:
        have = sum(use[d] for d in gpus)
        raise PrecsimError(
            f"{KEY}={request}: the run needs {gib(need.weights + prop + fixed * len(gpus))} "
            f"({head}, the pass and head on each of {len(gpus)} GPUs; {_rows(need)}) and "
            f"{', '.join(gpus)} have {gib(have)} usable ({USABLE:.0%} of "
            f"{gib(sum(free[d] for d in gpus))} free); allowed: more GPUs, fewer schemes or "
            "run.seqs, a smaller model.chunk or model.dtype")
    frac = need.weights / (need.weights + prop) if need.weights + prop else 1.0
    mm = {int(d.split(":")[1]): int(room[d] * frac) for d in gpus}
    return Plan("device_map", request, gpus, need, free, device_map=request, max_memory=mm,
                why=f"needs {head} ({_rows(need)}); weights capped per GPU at "
                    f"{', '.join(gib(v) for v in mm.values())} to leave room for the run")


def split_schemes(need: Need, use: dict[str, int], schemes: list[str]
                  ) -> dict[str, list[str]] | None:
    """Contiguous shares of ``schemes`` per GPU, as even as each GPU's room allows (each GPU
    holds the weights, the head, the reference and its share), in device order; None when they
    do not fit."""
    per = need.group_layers + need.group_pass
    cap = {d: max(0, int((u - need.weights - need.head) // per) - 1) if per else len(schemes)
           for d, u in use.items()}
    if sum(cap.values()) < len(schemes):
        return None
    level = 0  # water-filling: no GPU takes more than `level` schemes
    while sum(min(c, level) for c in cap.values()) < len(schemes):
        level += 1
    counts = {d: min(c, level) for d, c in cap.items()}
    for d in reversed(list(counts)):  # the excess off the last devices at the level
        extra = sum(counts.values()) - len(schemes)
        if extra and counts[d] == level:
            counts[d] -= 1
    out, i = {}, 0
    for d, c in counts.items():
        if c:
            out[d], i = schemes[i:i + c], i + c
    return out


# ---------------------------------------------------------------------------------------------
# the numbers, from the checkpoint and the machine


def meta_model(path):
    """The checkpoint's model class built on the meta device (no memory, no weights read)."""
    import torch

    from .load import read_config

    tf, config, arch = read_config(path)
    with torch.device("meta"):
        return getattr(tf, arch)(config)


def shape_of(model, dtype) -> Shape:
    """The :class:`Shape` of a (meta) model whose weights load as ``dtype`` (a torch dtype)."""
    import torch

    from .load import layer_shape, ssm_layers, vocab_size

    def nbytes(t):
        return t.numel() * (dtype.itemsize if t.is_floating_point() else t.element_size())

    weights = sum(nbytes(t) for t in model.parameters()) \
        + sum(t.numel() * t.element_size() for t in model.buffers())  # (float32 rotary tables)
    ssm = ssm_layers(model)
    fam, H, dv, dk = layer_shape(model)
    mixer = ssm[0][1]
    groups = getattr(mixer, "n_groups", None) or getattr(mixer, "num_k_heads", 1)
    conv = sum(m.weight.shape[0] * m.weight.shape[-1] for _, mx, _ in ssm
               for m in mx.modules() if isinstance(m, torch.nn.Conv1d))
    head = model.get_output_embeddings()
    lin = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head]
    width = max([m.out_features for m in lin] + [getattr(model.config, "intermediate_size", 0)
                                                  or 0])
    attn = [m for m in model.modules() if type(m).__name__.endswith("Attention")
            and isinstance(getattr(m, "k_proj", None), torch.nn.Linear)]
    kv = sum(2 * m.k_proj.out_features for m in attn)
    eager = getattr(model.config, "_attn_implementation", "sdpa") == "eager"
    qh = int(getattr(model.config, "num_attention_heads", 0) or 0)
    return Shape(weights=int(weights), dtype_bytes=dtype.itemsize,
                 hidden=int(model.config.hidden_size), width=int(width),
                 vocab=vocab_size(model), ssm_layers=len(ssm), heads=int(H), dv=int(dv),
                 dk=int(dk), bc=int(groups) * int(dk), kv=int(kv), conv=int(conv),
                 eager_heads=qh * len(attn) if eager else 0)


def cuda_free(dev) -> int:
    """Bytes free to PyTorch on CUDA device ``dev`` (an index or a ``torch.device``): what the
    driver reports free plus what PyTorch's caching allocator holds unused (reserved, not
    allocated). A second run in one process (``precsim.api``, a Hydra sweep's jobs in one
    process, a profiler's repeated runs) would otherwise count the first run's freed blocks as
    taken: on an H100 (2026-12-07), the second of two in-process runs over 4 documents of 8,192
    tokens of the Mamba-2 2.7B shape went in 4 batches of one, where the estimate with a fresh
    process's free memory (~74 GB) holds all 4 in one batch at 4,096 positions a pass."""
    import torch

    free = int(torch.cuda.mem_get_info(dev)[0])
    return free + max(0, int(torch.cuda.memory_reserved(dev))
                      - int(torch.cuda.memory_allocated(dev)))


def free_memory(device: str) -> dict[str, int]:
    """Free bytes of every visible GPU (``device`` cuda or auto with one; in a sweep job that
    holds one GPU of several, that GPU alone: :data:`HELD_GPU`), else of the CPU
    (``MemAvailable``)."""
    import os

    import torch

    if device != "cpu" and torch.cuda.is_available():
        held = os.environ.get(HELD_GPU)
        gpus = [int(held)] if held is not None else range(torch.cuda.device_count())
        return {f"cuda:{i}": cuda_free(i) for i in gpus}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return {"cpu": int(line.split()[1]) * 1024}
    except OSError:
        pass
    return {"cpu": os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")}


def plan_run(path, dtype: str | None, request, device: str, *, docs: int, schemes: list[str],
             tokens: int, chunk: int, split_ok: bool) -> Plan:
    """The plan for a run of the checkpoint at ``path`` (loaded as ``dtype``, None: its own):
    the reference and ``schemes`` over ``docs`` documents of ``tokens`` tokens in passes of
    ``chunk``, on ``device``'s kind (``cpu``, or every visible GPU). An explicit map is checked
    against the checkpoint's modules."""
    import torch

    req = parse(request)
    meta = meta_model(path)
    if isinstance(req, dict):
        check_map(req, {n for n, _ in meta.named_modules()},
                  [n for n, _ in meta.named_parameters()], f"{type(meta).__name__} at {path}",
                  torch.cuda.device_count() if torch.cuda.is_available() else 0)
    own = getattr(meta.config, "dtype", None)
    dt = getattr(torch, dtype) if dtype else own if isinstance(own, torch.dtype) else \
        getattr(torch, str(own or "float32").replace("torch.", ""), torch.float32)
    need = estimate(shape_of(meta, dt), docs, 1 + len(schemes), tokens, chunk)
    return decide(req, need, free_memory(device), schemes, split_ok)
