"""Train the two small byte-level language models of issue 25: a Mamba-2 LM
(``transformers.Mamba2ForCausalLM``) and a hybrid Gated DeltaNet LM
(``transformers.Qwen3_5ForCausalLM``: three GDN layers then one full-attention layer, twice).

Corpus: the Python standard library's source on the machine that runs it
(``sysconfig.get_paths()['stdlib']``, every ``*.py`` outside test folders and site-packages, in
sorted path order), one byte a token, a document-start token before each file. A file goes to
validation when the SHA-256 of its relative path is 0 mod 20 (~5%), so the split does not depend
on the Python release's file contents. The stdlib differs between Python releases and distributions,
so the log records the corpus's size and hash.

Initialisation: transformers' own, except the GDN layers' ``dt_bias``, set as
flash-linear-attention's ``GatedDeltaNet`` does (the library the published GDN models were
trained with): softplus^-1 of dt log-uniform in [0.001, 0.1]. transformers' 1.0 gives every head
a half-life under one token, where the decay's gradient vanishes.

Deterministic from ``--seed`` with a fixed step count (no clock: the schedule is
``step / steps``): initialisation (made on the CPU), every batch's offsets (a NumPy generator
seeded from ``--seed`` and the model) and the validation windows. On the CPU (one thread,
``torch.use_deterministic_algorithms``) two runs with the same seed and steps write bit-identical
checkpoints (``tests/experiments/test_trained_train.py``); on a GPU the float sums of cuBLAS and
atomics may differ in the last bits from run to run.

Held-out text: the validation files minus near-duplicates of training files (``held_out``: a
file is dropped when >= 20% of its distinct lines of >= 20 characters, stripped, occur in
training files; e.g. ``encodings/cp737.py`` shares 70% of them with ``cp865.py``).

GPU (one H200, both models):       python experiments/trained/train.py --out OUT
CPU smoke run (2 cores, ~1 min):   python experiments/trained/train.py --cpu --tiny --out OUT
Writes OUT/mamba2/ and OUT/gdn/ (config.json, model.safetensors in bf16, train_log.json) and
OUT/train.png (loss curves; per-head decay half-lives, trained against initialisation).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

BOS, PAD, VOCAB = 256, 257, 258  # bytes 0-255, a document-start token, padding (never seen)
VAL_MOD = 20  # a file is validation when sha256(relative path) % VAL_MOD == 0
SKIP_PARTS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
# near-duplicate rule of the held-out split: a validation file is dropped when at least DUP_FRAC
# of its distinct stripped lines of at least DUP_MIN_CHARS characters occur in training files
DUP_FRAC, DUP_MIN_CHARS = 0.2, 20
LN2 = math.log(2.0)

# model shapes: head dims are powers of two >= 16 (precsim's GPU kernels); <= 8 MB in bf16
MAMBA2 = {"full": dict(hidden_size=256, num_hidden_layers=8, expand=2, num_heads=8, head_dim=64,
                       state_size=64, n_groups=1, conv_kernel=4, chunk_size=128),
          "tiny": dict(hidden_size=64, num_hidden_layers=2, expand=2, num_heads=4, head_dim=32,
                       state_size=32, n_groups=1, conv_kernel=4, chunk_size=64)}
GDN_LAYERS = ["linear_attention"] * 3 + ["full_attention"]
GDN = {"full": dict(hidden_size=256, num_hidden_layers=8, intermediate_size=256,
                    layer_types=GDN_LAYERS * 2, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=64, linear_num_key_heads=4, linear_key_head_dim=32,
                    linear_num_value_heads=8, linear_value_head_dim=32, linear_conv_kernel_dim=4),
       "tiny": dict(hidden_size=64, num_hidden_layers=4, intermediate_size=128,
                    layer_types=GDN_LAYERS, num_attention_heads=2, num_key_value_heads=1,
                    head_dim=32, linear_num_key_heads=2, linear_key_head_dim=32,
                    linear_num_value_heads=4, linear_value_head_dim=32, linear_conv_kernel_dim=4)}
# optimisation: per-model steps (each batch x ctx tokens), AdamW with linear warmup + cosine
TRAIN = {"full": dict(ctx=1024, batch=16, steps={"mamba2": 1800, "gdn": 1000}, lr=2e-3,
                      warmup=0.05, log_every=25, evals=5, val_windows=64, hl_windows=16),
         "tiny": dict(ctx=256, batch=8, steps={"mamba2": 120, "gdn": 100}, lr=3e-3,
                      warmup=0.1, log_every=10, evals=3, val_windows=8, hl_windows=4)}


# ---------------------------------------------------------------------------------------------
# corpus


def stdlib_root(root: Path | str | None = None) -> Path:
    """The corpus's root: ``root`` (``--stdlib``) or the running Python's stdlib."""
    return Path(root or sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The stdlib's ``*.py`` files outside test folders and site-packages, sorted by path."""
    root = stdlib_root(root)
    return sorted(f for f in root.rglob("*.py")
                  if not SKIP_PARTS & set(f.relative_to(root).parts[:-1]) and f.is_file())


def is_validation(rel: str) -> bool:
    return int(hashlib.sha256(rel.encode()).hexdigest(), 16) % VAL_MOD == 0


def documents(root: Path | None = None, split: str | None = None):
    """``(relative path, split, token ids)`` of each stdlib file in order (BOS, then its bytes);
    only ``split`` ("train" or "val") when given."""
    root = stdlib_root(root)
    for f in stdlib_files(root):
        rel = f.relative_to(root).as_posix()
        s = "val" if is_validation(rel) else "train"
        if split in (None, s):
            data = f.read_bytes()
            yield rel, s, np.concatenate([[BOS], np.frombuffer(data, np.uint8)]).astype(np.int64)


def long_lines(ids: np.ndarray) -> set[bytes]:
    """A document's distinct stripped lines of at least ``DUP_MIN_CHARS`` bytes (BOS dropped)."""
    text = ids[1:].astype(np.uint8).tobytes() if ids[0] == BOS else ids.astype(np.uint8).tobytes()
    return {ln.strip() for ln in text.split(b"\n") if len(ln.strip()) >= DUP_MIN_CHARS}


def held_out(root: Path | None = None) -> tuple[list[tuple[str, np.ndarray]], list[dict]]:
    """The deduplicated held-out split: ``([(relative path, ids)], [per validation file: path,
    tokens, shared fraction, kept])``. A validation file is dropped as a near-duplicate when at
    least ``DUP_FRAC`` of its distinct long lines (:func:`long_lines`) occur in training files."""
    train_lines: set[bytes] = set()
    val = []
    for rel, split, ids in documents(root):
        if split == "train":
            train_lines |= long_lines(ids)
        else:
            val.append((rel, ids))
    kept, table = [], []
    for rel, ids in val:
        ll = long_lines(ids)
        frac = len(ll & train_lines) / len(ll) if ll else 0.0
        keep = frac < DUP_FRAC
        table.append({"file": rel, "tokens": len(ids), "long_lines": len(ll),
                      "shared_with_train": round(frac, 4), "kept": keep})
        if keep:
            kept.append((rel, ids))
    return kept, table


def corpus(root: Path | None = None) -> dict:
    """Train and validation token streams (``np.int64``) and a summary of the corpus."""
    root = stdlib_root(root)
    parts: dict[str, list] = {"train": [], "val": []}
    digest = hashlib.sha256()
    for rel, split, ids in documents(root):
        digest.update(rel.encode() + b"\0" + ids[1:].astype(np.uint8).tobytes())
        parts[split].append(ids)
    kept, table = held_out(root)
    dropped = [t["file"] for t in table if not t["kept"]]
    if not parts["train"] or not parts["val"]:
        sys.exit(f"train.py: error: the stdlib at {root} has too few *.py files for a split")
    nbytes = {k: sum(len(d) - 1 for d in v) for k, v in parts.items()}
    info = {"root": str(root), "python": platform.python_version(),
            "files": {k: len(v) for k, v in parts.items()}, "bytes": nbytes,
            "total_bytes": sum(nbytes.values()), "sha256": digest.hexdigest()[:16],
            "split": f"validation when sha256(relative path) % {VAL_MOD} == 0",
            "held_out": {"rule": f"validation files minus near-duplicates: dropped when >= "
                                 f"{DUP_FRAC:.0%} of the file's distinct stripped lines of >= "
                                 f"{DUP_MIN_CHARS} characters occur in training files",
                         "files": len(kept), "bytes": sum(len(i) - 1 for _, i in kept),
                         "dropped": dropped},
            "skipped_folders": sorted(SKIP_PARTS)}
    return {**{k: np.concatenate(v) for k, v in parts.items()},
            "held_out": np.concatenate([i for _, i in kept]), "info": info}


def unigram_baseline(train: np.ndarray, val: np.ndarray) -> float:
    """Cross-entropy (nats/token) of validation targets under the train stream's token
    frequencies (add-one smoothing over the vocabulary)."""
    p = (np.bincount(train, minlength=VOCAB) + 1.0) / (len(train) + VOCAB)
    return float(-np.log(p[val[1:]]).mean())


def val_windows(val: np.ndarray, n: int, ctx: int) -> torch.Tensor:
    """``n`` fixed windows of ``ctx + 1`` tokens spread evenly over the validation stream."""
    n = max(1, min(n, len(val) // (ctx + 1)))
    starts = np.linspace(0, len(val) - ctx - 1, n).astype(np.int64)
    return torch.from_numpy(np.stack([val[s:s + ctx + 1] for s in starts]))


# ---------------------------------------------------------------------------------------------
# models


def build(name: str, size: str, seed: int):
    import transformers as tf

    common = dict(vocab_size=VOCAB, bos_token_id=BOS, eos_token_id=BOS,
                  pad_token_id=PAD, tie_word_embeddings=True, initializer_range=0.02)
    if name == "mamba2":
        cfg = tf.Mamba2Config(**{**common, **MAMBA2[size]})
        cls = tf.Mamba2ForCausalLM
    else:
        cfg = tf.Qwen3_5TextConfig(**{**common, **GDN[size]}, max_position_embeddings=8192)
        cls = tf.Qwen3_5ForCausalLM
    cfg.architectures = [cls.__name__]
    torch.manual_seed(seed)
    model = cls(cfg)
    with torch.no_grad():  # GDN: dt_bias as flash-linear-attention's GatedDeltaNet initialises it
        for _, mixer, fam in decay_mixers(model):
            if fam == "gdn":  # (transformers sets 1.0: half-lives < 1 token, no gradient to grow)
                u = torch.rand(mixer.dt_bias.shape)
                dt = torch.exp(u * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
                dt = dt.clamp(min=1e-4)
                mixer.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
    return model


def ssd_scan(hidden_states, dt, A, B, C, chunk_size, D=None, dt_bias=None, initial_states=None,
             dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False, **_):
    """transformers' ``mamba2_chunk_scan`` (its PyTorch path, same arguments and result) with
    einsum contractions: transformers 5.17's broadcast-and-sum form materialises
    (batch, tokens, heads, head_dim, state) tensors, ~10x the memory traffic of a training step.
    Checked against the installed function by :func:`check_ssd_scan` before use."""
    b, T, H, P = hidden_states.shape
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = dt.float().clamp(min=dt_limit[0], max=dt_limit[1])
    x = hidden_states.float()
    pad = (-T) % chunk_size

    def chunks(t):  # (b, T, ...) -> (b, chunks, chunk_size, ...)
        return F.pad(t, (0, 0) * (t.ndim - 2) + (0, pad)).reshape(b, -1, chunk_size, *t.shape[2:])

    rep = H // B.shape[2]
    xc = chunks(x * dt[..., None])
    Bc = chunks(B.float()).repeat_interleave(rep, dim=3)
    Cc = chunks(C.float()).repeat_interleave(rep, dim=3)
    acs = chunks(A.float() * dt).cumsum(2)  # (b, c, l, H): log decay from the chunk's start
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=x.device).tril()
    seg = (acs[:, :, :, None] - acs[:, :, None]).masked_fill(~causal[:, :, None], -math.inf)
    scores = torch.einsum("bclhn,bcshn->bclsh", Cc, Bc) * seg.exp()
    y = torch.einsum("bclsh,bcshp->bclhp", scores, xc)
    to_end = (acs[:, :, -1:] - acs).exp()
    states = torch.einsum("bclhn,bclhp->bchpn", Bc * to_end[..., None], xc)
    s = (initial_states.float() if initial_states is not None
         else x.new_zeros(b, H, P, Bc.shape[-1]))
    starts = []
    for c in range(states.shape[1]):  # the state at each chunk's start
        starts.append(s)
        s = s * acs[:, c, -1, :, None, None].exp() + states[:, c]
    y = y + torch.einsum("bclhn,bchpn->bclhp", Cc, torch.stack(starts, 1)) * acs.exp()[..., None]
    y = y.reshape(b, -1, H, P)[:, :T]
    if D is not None:
        y = y + D[..., None] * x
    return (y, s) if return_final_states else y


def check_ssd_scan(module) -> float:
    """Largest relative difference between :func:`ssd_scan` and ``module.mamba2_chunk_scan`` on
    a random problem (ragged last chunk, groups, initial state); exits if over 1e-4."""
    g = torch.Generator().manual_seed(0)
    b, T, H, P, G, N = 2, 100, 4, 8, 2, 16
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    args = (r(b, T, H, P), r(b, T, H), -torch.rand(H, generator=g) - 0.1, r(b, T, G, N),
            r(b, T, G, N))
    kw = dict(chunk_size=32, D=r(H), dt_bias=r(H), initial_states=r(b, H, P, N),
              dt_softplus=True, return_final_states=True)
    ref, mine = module.mamba2_chunk_scan(*args, **kw), ssd_scan(*args, **kw)
    err = max(float((m - e).abs().max() / e.abs().max()) for m, e in zip(mine, ref, strict=True))
    if not err < 1e-4:
        sys.exit(f"train.py: error: the einsum Mamba-2 scan differs from transformers' by "
                 f"{err:.2e}")
    return err


def decay_mixers(model) -> list[tuple[int, torch.nn.Module, str]]:
    """``(layer, mixer, family)`` of every Mamba-2 / GDN mixer in model order."""
    out = []
    for mod in model.modules():
        fam = {"Mamba2Mixer": "mamba2", "Qwen3_5GatedDeltaNet": "gdn"}.get(type(mod).__name__)
        if fam:
            out.append((int(mod.layer_idx), mod, fam))
    return out


@torch.no_grad()
def half_lives(model, windows: torch.Tensor, device, amp, mask=None) -> dict:
    """Per head, the median over the windows' tokens (``mask`` ``(windows, length)``: only
    where it is true) of the decay half-life in tokens,
    ``ln 2 / -log(decay)``: Mamba-2 ``log decay = dt * A``, ``dt = softplus(dt_proj(x) + dt_bias)``
    clamped to the layer's ``time_step_limit``, ``A = -exp(A_log)``; GDN ``log decay = g =
    -exp(A_log) softplus(a_proj(x) + dt_bias)``. Computed from the projections' outputs (forward
    hooks), independently of precsim."""
    raw: dict[int, list] = {}
    hooks = []
    for layer, mixer, fam in decay_mixers(model):
        proj = mixer.in_proj if fam == "mamba2" else mixer.in_proj_a
        H = mixer.num_heads if fam == "mamba2" else mixer.num_v_heads

        def grab(_m, _i, out, layer=layer, H=H):
            raw.setdefault(layer, []).append(out[..., -H:].float().reshape(-1, H))

        hooks.append(proj.register_forward_hook(grab))
    try:
        for i in range(0, len(windows), 8):
            with amp:
                model(windows[i:i + 8, :-1].to(device), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    layers = {}
    keep = None if mask is None else torch.as_tensor(mask[:, :-1].reshape(-1))
    for layer, mixer, fam in decay_mixers(model):
        x = torch.cat(raw[layer])
        x = (x if keep is None else x[keep.to(x.device)]) + mixer.dt_bias.float()
        dt = F.softplus(x)
        if fam == "mamba2":
            lo, hi = mixer.time_step_limit
            dt = dt.clamp(min=lo, max=hi)
        rate = dt * mixer.A_log.float().exp()  # -log(decay) per token, > 0
        layers[str(layer)] = (LN2 / rate).median(dim=0).values.cpu().tolist()
    return {"per_layer": layers, "summary": summarise([v for hs in layers.values() for v in hs])}


def summarise(hl: list[float]) -> dict:
    a = np.asarray(hl, dtype=np.float64)
    q = np.quantile(a, [0.0, 0.1, 0.5, 0.9, 1.0])
    q = [float(v) for v in q]
    return {"heads": len(a), "min": q[0], "p10": q[1], "median": q[2], "p90": q[3], "max": q[4],
            "geomean": float(np.exp(np.log(a).mean())),
            "frac_over_10": float((a > 10).mean()), "frac_over_100": float((a > 100).mean()),
            "frac_over_1000": float((a > 1000).mean())}


# ---------------------------------------------------------------------------------------------
# training


def no_decay(name: str, p: torch.Tensor) -> bool:
    return p.ndim < 2 or any(k in name for k in ("A_log", "dt_bias", "embed", "norm"))


@torch.no_grad()
def evaluate(model, windows: torch.Tensor, device, amp) -> float:
    """Mean cross-entropy (nats/token) of the windows' next tokens."""
    was = model.training
    model.eval()
    tot, n = 0.0, 0
    for i in range(0, len(windows), 8):
        w = windows[i:i + 8].to(device)
        with amp:
            logits = model(w[:, :-1], use_cache=False).logits
        tot += F.cross_entropy(logits.float().reshape(-1, VOCAB), w[:, 1:].reshape(-1),
                               reduction="sum").item()
        n += w[:, 1:].numel()
    model.train(was)
    return tot / n


def lr_at(progress: float, warmup: float) -> float:
    """Multiplier of the peak rate: linear warmup, then cosine to 10% of the peak."""
    if progress < warmup:
        return progress / warmup
    t = min(1.0, (progress - warmup) / (1.0 - warmup))
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * t))


def train_one(name: str, args, data: dict, device, out: Path) -> dict:
    import transformers as tf

    tr = TRAIN[args.size]
    steps = args.steps or tr["steps"][name]
    ctx, batch = tr["ctx"], tr["batch"]
    amp = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda"
           else torch.autocast("cpu", enabled=False))
    model = build(name, args.size, args.seed).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    val = val_windows(data["held_out"], tr["val_windows"], ctx)
    hl_win = val[: tr["hl_windows"]]
    model.eval()
    init_hl = half_lives(model, hl_win, device, amp)
    init_loss = evaluate(model, val, device, amp)
    model.train()
    groups = [{"params": [p for n, p in model.named_parameters() if not no_decay(n, p)],
               "weight_decay": 0.1},
              {"params": [p for n, p in model.named_parameters() if no_decay(n, p)],
               "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=tr["lr"], betas=(0.9, 0.95), eps=1e-8,
                            fused=device.type == "cuda")
    stream = torch.from_numpy(data["train"]).to(device)
    gen = np.random.default_rng(args.seed + (0 if name == "mamba2" else 1))
    # every batch's window starts, drawn up front: no host-to-device copy (a sync) per step
    starts_all = torch.from_numpy(gen.integers(0, len(data["train"]) - ctx - 1,
                                               (steps, batch))).to(device)
    offs = torch.arange(ctx + 1, device=device)
    eval_at = {round(steps * k / tr["evals"]) for k in range(1, tr["evals"])}
    curve, vcurve = [], [{"step": 0, "tokens": 0, "val_loss": init_loss}]
    print(f"[{name}] {type(model).__name__}, {n_params:,} parameters; {steps} steps x {batch} "
          f"x {ctx} tokens; init val loss {init_loss:.4f} nats/token", flush=True)
    t0 = time.perf_counter()
    acc = torch.zeros((), device=device)
    acc_n, step = 0, 0
    while step < steps:  # a fixed step count: the schedule never reads the clock
        for g in opt.param_groups:
            g["lr"] = tr["lr"] * lr_at(step / steps, tr["warmup"])
        x = stream[starts_all[step, :, None] + offs]
        with amp:
            logits = model(x[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        acc += loss.detach()
        acc_n += 1
        step += 1
        if step % tr["log_every"] == 0 or step == steps:
            mean = (acc / acc_n).item()
            el = time.perf_counter() - t0
            curve.append({"step": step, "tokens": step * batch * ctx, "train_loss": mean,
                          "lr": opt.param_groups[0]["lr"], "wall_s": round(el, 2)})
            acc.zero_()
            acc_n = 0
            msg = (f"[{name}] step {step:5d}/{steps} train {mean:.4f} nats/token "
                   f"({mean / LN2:.3f} bits) lr {opt.param_groups[0]['lr']:.2e} {el:6.1f} s")
            if step == tr["log_every"]:
                msg += f" (projected {el / step * steps:.0f} s for {steps} steps)"
            print(msg, flush=True)
        if step in eval_at:
            v = evaluate(model, val, device, amp)
            vcurve.append({"step": step, "tokens": step * batch * ctx, "val_loss": v})
            print(f"[{name}] step {step:5d} validation {v:.4f} nats/token", flush=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    pre_round = evaluate(model, val, device, amp)
    # the statistics below are the checkpoint's: weights rounded to bf16 as saved
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    model.eval()
    final = evaluate(model, val, device, amp)
    vcurve.append({"step": step, "tokens": step * batch * ctx, "val_loss": final})
    hl = half_lives(model, hl_win, device, amp)
    folder = out / name
    model.to(torch.bfloat16).save_pretrained(folder)
    for extra in folder.iterdir():
        if extra.name not in ("config.json", "model.safetensors"):
            extra.unlink()
    uni = data["unigram"]
    if device.type == "cpu":
        log_sha = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()[:16]
    else:
        log_sha = None
    size = (folder / "model.safetensors").stat().st_size
    if size > 8_000_000:
        print(f"[{name}] warning: the checkpoint is {size:,} bytes, over the 8 MB to commit")
    log = {
        "model": name, "class": type(model).__name__, "size": args.size, "seed": args.seed,
        "parameters": n_params, "checkpoint_bytes": size, "checkpoint_sha256": log_sha,
        "dtype": "bfloat16", "config": {k: v for k, v in (MAMBA2 if name == "mamba2" else GDN)
                                        [args.size].items()},
        "init": "transformers' own; GDN dt_bias = softplus^-1(dt), dt log-uniform in "
                "[0.001, 0.1] (flash-linear-attention's GatedDeltaNet)",
        "corpus": data["info"], "tokenizer": f"bytes 0-255, BOS={BOS} before each file, "
                                             f"PAD={PAD}; vocab {VOCAB}",
        "train": {**{k: v for k, v in tr.items() if k != "steps"}, "steps_planned": steps,
                  "steps_done": step, "tokens_seen": step * batch * ctx,
                  "optimizer": "AdamW(betas=(0.9, 0.95), weight_decay=0.1 on matrices), "
                               "linear warmup then cosine to 10%; grad clip 1.0",
                  "autocast": "bf16" if device.type == "cuda" else "none (fp32)",
                  "schedule": "step / steps (fixed step count, no clock)",
                  "deterministic": device.type == "cpu"},
        "wall_s": round(wall, 2), "s_per_step": round(wall / max(1, step), 4),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else
        f"cpu ({torch.get_num_threads()} threads)",
        "mamba2_scan": f"train.py's einsum form of transformers' mamba2_chunk_scan (max rel. "
                       f"difference {args.scan_check:.1e} on a check problem)",
        "versions": {"torch": torch.__version__, "transformers": tf.__version__,
                     "python": platform.python_version()},
        "loss_unit": "nats per token; tokens are bytes (plus one BOS per file); bits = nats / ln 2",
        "unigram_baseline": {"nats": uni, "bits": uni / LN2},
        "val_loss": {"nats": final, "bits": final / LN2, "before_bf16_rounding": pre_round,
                     "init": init_loss, "windows": len(val), "tokens": int(val[:, 1:].numel())},
        "train_curve": curve, "val_curve": vcurve,
        "half_life": {"unit": "tokens; per head, the median over the measured tokens",
                      "tokens_measured": int(hl_win[:, 1:].numel()), "trained": hl,
                      "init": init_hl, "change": change(init_hl, hl)},
    }
    (folder / "train_log.json").write_text(json.dumps(log, indent=1, default=float) + "\n")
    s, si = hl["summary"], init_hl["summary"]
    print(f"[{name}] done: {step} steps, {step * batch * ctx:,} tokens, {wall:.1f} s; "
          f"validation {final:.4f} nats/token = {final / LN2:.3f} bits/byte "
          f"(unigram {uni:.4f} nats = {uni / LN2:.3f} bits; init {init_loss:.4f})", flush=True)
    print(f"[{name}] head half-life (tokens), median over {s['heads']} heads: trained "
          f"{s['median']:.3g} (p10 {s['p10']:.3g}, p90 {s['p90']:.3g}, max {s['max']:.3g}) "
          f"vs init {si['median']:.3g} (p10 {si['p10']:.3g}, p90 {si['p90']:.3g}, max "
          f"{si['max']:.3g}); heads over 100 tokens {s['frac_over_100']:.0%} vs "
          f"{si['frac_over_100']:.0%}", flush=True)
    c = log["half_life"]["change"]
    print(f"[{name}] trained vs init, per head: median log2 ratio {c['median_log2_ratio']:+.2f}; "
          f"{c['heads_2x_longer']:.0%} of heads remember 2x longer or more, "
          f"{c['heads_2x_shorter']:.0%} 2x shorter or more", flush=True)
    return log


def change(init: dict, trained: dict) -> dict:
    """How training moved each head's half-life: log2(trained / init) per head, summarised."""
    r = np.log2([t / i for k in trained["per_layer"]
                 for t, i in zip(trained["per_layer"][k], init["per_layer"][k], strict=True)])
    return {"median_log2_ratio": float(np.median(r)), "heads_2x_longer": float((r >= 1).mean()),
            "heads_2x_shorter": float((r <= -1).mean())}


def plot(logs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 1 + len(logs), figsize=(4.2 * (1 + len(logs)), 3.4))
    for lg, c in zip(logs, ("C0", "C1"), strict=False):
        tc, vc = lg["train_curve"], lg["val_curve"]
        ax[0].plot([r["tokens"] / 1e6 for r in tc], [r["train_loss"] / LN2 for r in tc], c=c,
                   lw=1, label=f"{lg['model']} train")
        ax[0].plot([r["tokens"] / 1e6 for r in vc], [r["val_loss"] / LN2 for r in vc], "o--",
                   c=c, ms=3, label=f"{lg['model']} validation")
    ax[0].axhline(logs[0]["unigram_baseline"]["bits"], c="gray", ls=":", label="unigram")
    ax[0].set(xlabel="tokens (M)", ylabel="bits/byte", title="loss", ylim=(0, 8.5))
    ax[0].legend(fontsize=7)
    for a, lg in zip(ax[1:], logs, strict=True):
        hl = lg["half_life"]
        vals = {k: np.log10([v for hs in hl[k]["per_layer"].values() for v in hs])
                for k in ("init", "trained")}
        lo, hi = min(v.min() for v in vals.values()), max(v.max() for v in vals.values())
        bins = np.linspace(math.floor(lo), math.ceil(hi), 25)
        for k, c in (("init", "gray"), ("trained", "C3")):
            a.hist(vals[k], bins=bins, alpha=0.6, color=c, label=k)
        a.set(xlabel="log10 half-life (tokens)", ylabel="heads",
              title=f"{lg['model']}: per-head decay half-life")
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder (mamba2/, gdn/, train.png)")
    ap.add_argument("--cpu", action="store_true", help="train on the CPU")
    ap.add_argument("--tiny", action="store_true", help="reduced sizes (a smoke run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=None, help="override each model's step count")
    ap.add_argument("--stdlib", default=None,
                    help="the corpus's root (default: the running Python's stdlib)")
    ap.add_argument("--models", default="mamba2,gdn", help="comma list of mamba2, gdn")
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU threads (--cpu; more spin against each other on a busy machine)")
    args = ap.parse_args(argv)
    args.size = "tiny" if args.tiny else "full"
    names = [m for m in args.models.split(",") if m]
    if not names or set(names) - {"mamba2", "gdn"}:
        ap.error(f"--models={args.models!r}; allowed: a comma list of mamba2, gdn")
    if not args.cpu and not torch.cuda.is_available():
        ap.error("no CUDA device is visible; allowed: --cpu (with --tiny for a smoke run)")
    out = Path(args.out)
    if any((out / n / "model.safetensors").exists() for n in names):
        ap.error(f"--out={str(out)!r} already holds a checkpoint; allowed: a new folder")
    out.mkdir(parents=True, exist_ok=True)
    if args.cpu:
        torch.set_num_threads(args.threads)
        torch.use_deterministic_algorithms(True)
        device = torch.device("cpu")
    else:
        device = torch.device("cuda")
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    t0 = time.perf_counter()
    import transformers.models.mamba2.modeling_mamba2 as mm

    args.scan_check = check_ssd_scan(mm)
    mm.mamba2_chunk_scan = ssd_scan  # training and measuring only: the checkpoint is unchanged
    data = corpus(args.stdlib)
    data["unigram"] = unigram_baseline(data["train"], data["held_out"])
    info = data["info"]
    print(f"corpus: {info['root']} (Python {info['python']}): {info['files']['train']} train / "
          f"{info['files']['val']} validation files, {info['bytes']['train']:,} / "
          f"{info['bytes']['val']:,} bytes; held out (near-duplicates dropped): "
          f"{info['held_out']['files']} files, {info['held_out']['bytes']:,} bytes; sha256 "
          f"{info['sha256']}; unigram baseline {data['unigram']:.4f} nats/byte = "
          f"{data['unigram'] / LN2:.3f} bits/byte ({time.perf_counter() - t0:.1f} s)", flush=True)
    logs = [train_one(n, args, data, device, out) for n in names]
    plot(logs, out / "train.png")
    print(f"wrote {out}/{{{','.join(names)}}}/ and {out}/train.png in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
