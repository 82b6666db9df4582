"""Train small recurrent models that *need their memory* (issue 42): a Mamba-2
(``transformers.Mamba2ForCausalLM``) and a Gated DeltaNet model (``Qwen3_5ForCausalLM``, all
layers linear attention by default; ``--gdn-hybrid``: three GDN layers then one full-attention
layer) trained on tasks that can only be solved by carrying tokens through the recurrent state
over long distances:

* ``mqar`` (multi-query associative recall): ``k`` distinct key-value pairs planted at a random
  depth of a filler, then ``k`` queries at the end (query marker, a key; the answer is its value);
* ``passkey``: ``k`` key tokens planted at a random depth of the filler, the query marker at the
  end; the answer is the ``k`` key tokens.

The token layout is precsim's built-in tasks' (``precsim.tasks.alphabets``: past the first
eighth of the vocabulary two markers, then equal ranges of keys, values and filler), and the
filler is theirs (a random 16-token phrase repeated; a share ``filler_iid`` of sequences draws
every filler token independently instead), so ``python -m precsim experiment=task_eval
task.name=mqar|passkey`` asks the trained model exactly what it learned. Token ids only: no
tokenizer. The loss is on the answer tokens only (next-token cross-entropy at the positions
whose next token is an answer token).

Length curriculum: the training lengths unlock one by one over the run (stage ``i`` of ``m``
from step ``i * steps / m``); each step draws its length uniformly from those unlocked, with the
batch sized to a fixed token count. Deterministic from ``--seed``: the initialisation (made on
the CPU), every step's batch (``numpy.random.default_rng([seed, model, step])``) and the
evaluation items (``precsim.tasks.builtin_items``, seed ``--eval-seed``). On the CPU, with one
thread and ``torch.use_deterministic_algorithms``, two runs write bit-identical checkpoints; on a
GPU the float sums of cuBLAS may differ in the last bits from run to run. The step count is fixed
(no clock-based stopping).

At the end: accuracy at each evaluation length with the model's own forward in float32 (the
state float32; teacher-forced along the answer, an item is right iff the argmax at every answer
position is the answer's token, i.e. greedy decoding produces it: ``task_eval``'s rule), per
task, and the per-head decay half-lives (``experiments/trained/train.py``'s ``half_lives``).

GPU (one H200, both models, a few minutes):
    python experiments/recall/train_recall.py --gpu --out OUT
CPU (the small Mamba-2 on MQAR):
    python experiments/recall/train_recall.py --cpu --size small --models mamba2 --tasks mqar \
        --steps 4000 --eval-during --eval-every 500 --out OUT
Determinism check (seconds):
    python experiments/recall/train_recall.py --cpu --tiny --steps 4 --seed 3 --out OUT

Writes OUT/NAME/ (config.json, model.safetensors in float32, train_log.json) per model and
OUT/accuracy.json (accuracy per model, task and length).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from precsim.tasks import alphabets, builtin_items  # noqa: E402

PAD, BOS = 0, 1  # below the tasks' reserved ranges (the vocabulary's first eighth)
PHRASE = 16  # the filler phrase's tokens (precsim.tasks.builtin_items)
MAX_BYTES = 8_000_000
RESUME = "resume.pt"  # a paused model's training state (--pause-at / --pause-after)
EXIT_PAUSED = 75  # EX_TEMPFAIL: paused, the same command continues
T_START = time.monotonic()


class Paused(Exception):
    """A model's training paused (its state saved); the same command continues it."""

# model shapes: head dims powers of two >= 16 (precsim's GPU kernels); float32 checkpoints <= 8 MB
MAMBA2 = {
    "tiny": dict(hidden_size=32, num_hidden_layers=2, expand=2, num_heads=4, head_dim=16,
                 state_size=16, n_groups=1, conv_kernel=4, chunk_size=16),
    "small": dict(hidden_size=64, num_hidden_layers=2, expand=2, num_heads=4, head_dim=32,
                  state_size=32, n_groups=1, conv_kernel=4, chunk_size=64),
    "full": dict(hidden_size=128, num_hidden_layers=4, expand=2, num_heads=8, head_dim=32,
                 state_size=64, n_groups=1, conv_kernel=4, chunk_size=128),
}
_ATTN = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=32)
GDN = {
    "tiny": dict(hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                 linear_num_key_heads=2, linear_key_head_dim=16, linear_num_value_heads=2,
                 linear_value_head_dim=16, linear_conv_kernel_dim=4, **_ATTN),
    "small": dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                  linear_num_key_heads=2, linear_key_head_dim=32, linear_num_value_heads=4,
                  linear_value_head_dim=32, linear_conv_kernel_dim=4, **_ATTN),
    "full": dict(hidden_size=128, num_hidden_layers=4, intermediate_size=256,
                 linear_num_key_heads=4, linear_key_head_dim=32, linear_num_value_heads=8,
                 linear_value_head_dim=32, linear_conv_kernel_dim=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32),
}
# training: vocabulary, lengths unlocked in turn, tokens per step, steps per model, pairs / key
# tokens drawn in 1..max_k, the share of sequences with i.i.d. filler, evaluation
TRAIN = {
    "tiny": dict(vocab=64, lengths=[32, 48], tokens=256, steps={"mamba2": 8, "gdn": 8},
                 lr=3e-3, warmup=0.1, max_k=2, filler_iid=0.25, log_every=2,
                 eval_lengths=[32, 64], eval_items=4, hl_items=2),
    "small": dict(vocab=128, lengths=[64, 128, 256], tokens=2048,
                  steps={"mamba2": 4000, "gdn": 4000}, lr=3e-3, warmup=0.03, max_k=4,
                  filler_iid=0.0, log_every=100, eval_lengths=[256, 512, 1024], eval_items=50,
                  hl_items=8),
    "full": dict(vocab=256, lengths=[256, 512, 1024, 2048], tokens=32768,
                 steps={"mamba2": 3000, "gdn": 2000}, lr=3e-3, warmup=0.03, max_k=8,
                 filler_iid=0.25, log_every=100, eval_lengths=[512, 1024, 2048, 4096, 8192],
                 eval_items=100, hl_items=8),
}
EVAL_KEY_LEN = 4  # task_eval's default task.key_len
EVAL_DEPTH = 0.5  # task_eval's default task.depth


def recipe():
    """``experiments/trained/train.py`` as a module: its half-life measurement, Mamba-2 einsum
    scan, learning-rate schedule and weight-decay grouping are reused, not copied."""
    spec = importlib.util.spec_from_file_location("trained_recipe",
                                                  REPO / "experiments" / "trained" / "train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------------------------------
# data


def sequence(rng: np.random.Generator, task: str, n: int, k: int, alph: dict,
             iid: bool) -> tuple[np.ndarray, np.ndarray]:
    """One training sequence of ``n`` tokens and its answer mask (``mask[t]``: token ``t`` is an
    answer token, predicted at position ``t - 1``). ``mqar``: marker, ``k`` key-value pairs at a
    random depth, ``k`` queries (marker, key, value) at the end; ``passkey``: marker and ``k``
    key tokens at a random depth, the query marker and the key at the end."""
    mk, mq = int(alph["mark_key"][0]), int(alph["mark_query"][0])
    if task == "mqar":
        ks = rng.choice(alph["keys"], k, replace=False)
        vs = rng.choice(alph["values"], k)
        planted = [mk, *np.stack([ks, vs], 1).ravel()]
        order = rng.permutation(k)
        tail = [t for q in order for t in (mq, ks[q], vs[q])]
        ans = [False] * len(planted) + [False, False, True] * k
    elif task == "passkey":
        key = rng.choice(alph["keys"], k)
        planted, tail = [mk, *key], [mq, *key]
        ans = [False] * len(planted) + [False] + [True] * k
    else:
        raise ValueError(f"task {task!r}; allowed: mqar, passkey")
    fill_len = n - len(planted) - len(tail)
    if fill_len < 0:
        raise ValueError(f"{n} tokens cannot hold a {task} sequence with k={k}")
    if iid:
        fill = rng.choice(alph["filler"], fill_len)
    else:
        fill = np.resize(rng.choice(alph["filler"], PHRASE), fill_len)
    at = int(rng.integers(0, fill_len + 1))
    ids = np.asarray([*fill[:at], *planted, *fill[at:], *tail], dtype=np.int64)
    mask = np.zeros(n, dtype=bool)
    mask[at:at + len(planted)] = ans[:len(planted)]
    mask[n - len(tail):] = ans[len(planted):]
    return ids, mask


def batch_at(seed: int, model_i: int, step: int, steps: int, tr: dict,
             tasks: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Step ``step``'s batch (ids, answer mask), from ``default_rng([seed, model_i, step])``
    alone: a length from those unlocked by the curriculum, ``tokens // length`` sequences, each
    of a random task, ``k`` in 1..max_k and filler kind."""
    rng = np.random.default_rng([seed, model_i, step])
    Ls = tr["lengths"]
    first = tr.get("first_stage")
    if first is None:
        unlocked = min(len(Ls), 1 + step * len(Ls) // max(1, steps))
    elif step < first:  # --first-stage: the first length alone for its steps, then the rest
        unlocked = 1
    else:
        unlocked = min(len(Ls), 2 + (step - first) * (len(Ls) - 1) // max(1, steps - first))
    n = int(Ls[int(rng.integers(unlocked))])
    b = max(1, tr["tokens"] // n)
    alph = alphabets(tr["vocab"])
    ids, mask = np.zeros((b, n), np.int64), np.zeros((b, n), bool)
    for i in range(b):
        task = tasks[int(rng.integers(len(tasks)))]
        k = int(rng.integers(1, tr["max_k"] + 1))
        ids[i], mask[i] = sequence(rng, task, n, k, alph, bool(rng.random() < tr["filler_iid"]))
    return ids, mask


def eval_items(task: str, lengths: list[int], items: int, vocab: int, seed: int,
               key_len: int = EVAL_KEY_LEN, depth: float = EVAL_DEPTH):
    """precsim's built-in task items (``experiment=task_eval task.name=...``), as it makes them."""
    t = SimpleNamespace(name=task, lengths=list(lengths), items=items, key_len=key_len,
                        depth=depth, seed=seed)
    return builtin_items(t, vocab)


# ---------------------------------------------------------------------------------------------
# models


def build(name: str, size: str, seed: int, vocab: int, hybrid: bool = False):
    """A fresh model (initialised on the CPU from ``seed``): transformers' initialisation, GDN
    ``dt_bias`` as flash-linear-attention's GatedDeltaNet (``experiments/trained/train.py``)."""
    import transformers as tf

    common = dict(vocab_size=vocab, bos_token_id=BOS, eos_token_id=BOS, pad_token_id=PAD,
                  tie_word_embeddings=True, initializer_range=0.02)
    if name == "mamba2":
        cfg = tf.Mamba2Config(**{**common, **MAMBA2[size]})
        cls = tf.Mamba2ForCausalLM
    else:
        kw = GDN[size]
        L = kw["num_hidden_layers"]
        types = (["linear_attention"] * (L - 1) + ["full_attention"] if hybrid
                 else ["linear_attention"] * L)
        cfg = tf.Qwen3_5TextConfig(**{**common, **kw}, layer_types=types,
                                   max_position_embeddings=16384)
        cls = tf.Qwen3_5ForCausalLM
    cfg.architectures = [cls.__name__]
    torch.manual_seed(seed)
    model = cls(cfg)
    with torch.no_grad():
        for _, mixer, fam in recipe().decay_mixers(model):
            if fam == "gdn":
                g = torch.Generator().manual_seed(seed)
                u = torch.rand(mixer.dt_bias.shape, generator=g)
                dt = torch.exp(u * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
                dt = dt.clamp(min=1e-4)
                mixer.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
    return model


@torch.no_grad()
def accuracy(model, items, device, batch_tokens: int = 1 << 16) -> dict[int, float]:
    """Per length: the share of items whose answer greedy decoding produces (the model's own
    forward, float32; teacher-forced, every answer position's argmax is the answer's token)."""
    was = model.training
    model.eval()
    by: dict[int, list] = {}
    for it in items:
        by.setdefault(it.length, []).append(it)
    out = {}
    for n, its in sorted(by.items()):
        ok = []
        b = max(1, batch_tokens // (n + 16))
        for i in range(0, len(its), b):
            chunk = its[i:i + b]
            seqs = [it.context + it.choices[0] for it in chunk]
            T = max(len(s) for s in seqs)
            x = torch.full((len(seqs), T), PAD, dtype=torch.long)
            for j, s in enumerate(seqs):
                x[j, :len(s)] = torch.tensor(s)
            arg = model(x.to(device), use_cache=False).logits.argmax(-1).cpu()
            for j, it in enumerate(chunk):
                c, a = len(it.context), it.choices[0]
                ok.append(bool((arg[j, c - 1:c - 1 + len(a)] == torch.tensor(a)).all()))
        out[int(n)] = float(np.mean(ok))
    model.train(was)
    return out


def hl_windows(tr: dict, seed: int) -> torch.Tensor:
    """Windows for the half-lives: MQAR items at the first evaluation length (one token more than
    the model reads, as ``half_lives`` expects)."""
    its = eval_items("mqar", [tr["eval_lengths"][0]], tr["hl_items"], tr["vocab"], seed + 7)
    return torch.tensor([it.context + it.choices[0] for it in its])


def gdn_chunk(size: int) -> None:
    """Training only: transformers' torch GDN scan (``torch_chunk_gated_delta_rule``, used
    without flash-linear-attention) in chunks of ``size`` positions instead of its 64. The same
    recurrence (the chunked form is exact; only float sums differ), a quarter of the Python loop's
    kernel launches at 256 (the GPU step is launch-bound: 2,863 against 5,243 ops a step on
    average over the curriculum); evaluation and checkpoints use transformers' own."""
    import functools

    import transformers.models.qwen3_5.modeling_qwen3_5 as q

    orig = getattr(q.torch_chunk_gated_delta_rule, "_recall_orig", q.torch_chunk_gated_delta_rule)
    fn = orig if size == 64 else functools.partial(orig, chunk_size=size)
    if fn is not orig:
        fn._recall_orig = orig
    q.torch_chunk_gated_delta_rule = fn


def gdn_kernel() -> str:
    """Which GDN scan trained the model: transformers uses flash-linear-attention's Triton
    ``chunk_gated_delta_rule`` when ``fla`` imports (and then ignores ``--gdn-chunk``), else its
    own torch loop."""
    try:
        import fla
    except Exception:
        return "transformers torch_chunk_gated_delta_rule"
    return f"flash-linear-attention {getattr(fla, '__version__', '?')} chunk_gated_delta_rule"


def train_one(mi: int, name: str, args, device, out: Path, R) -> dict:
    import transformers as tf

    tr = dict(TRAIN[args.size])
    if args.lr is not None:  # --lr: the recipe's peak learning rate replaced
        tr["lr"] = args.lr
    if args.first_stage is not None:  # --first-stage: the curriculum's first stage, in steps
        tr["first_stage"] = args.first_stage
    steps = args.steps or tr["steps"][name]
    amp = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda"
           else torch.autocast("cpu", enabled=False))
    model = build(name, args.size, args.seed + mi, tr["vocab"], args.gdn_hybrid).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    hw = hl_windows(tr, args.eval_seed)
    rpath = out / name / RESUME
    # what a paused run must share with the one that continues it
    key = {"model": name, "size": args.size, "seed": args.seed, "steps": steps,
           "tasks": args.tasks, "gdn_hybrid": args.gdn_hybrid, "gdn_chunk": args.gdn_chunk,
           "device": device.type, **({"lr": args.lr} if args.lr is not None else {}),
           **({"first_stage": args.first_stage} if args.first_stage is not None else {})}
    held = torch.load(rpath, map_location=device, weights_only=False) if rpath.is_file() else None
    if held is not None and held["key"] != key:
        raise SystemExit(f"train_recall.py: {rpath} was written by another command "
                         f"({held['key']}); allowed: the same --seed/--steps/--tasks/--size, "
                         f"or a new --out")
    if held is None:
        model.eval()
        init_hl = R.half_lives(model, hw, device, amp)
    else:
        model.load_state_dict(held["model"])
        init_hl = held["init_hl"]
    model.train()
    if name == "gdn":
        gdn_chunk(args.gdn_chunk)
    groups = [{"params": [p for n, p in model.named_parameters() if not R.no_decay(n, p)],
               "weight_decay": 0.1},
              {"params": [p for n, p in model.named_parameters() if R.no_decay(n, p)],
               "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=tr["lr"], betas=(0.9, 0.95), eps=1e-8,
                            fused=device.type == "cuda")
    print(f"[{name}] {type(model).__name__}, {n_params:,} parameters; {steps} steps x "
          f"{tr['tokens']} tokens, lengths {tr['lengths']} (curriculum), tasks {args.tasks}",
          flush=True)
    curve, acc_curve = [], []
    tot, tot_ok, tot_n = 0.0, 0, 0
    first, before = 0, 0.0  # the first step of this process, the paused parts' seconds
    if held is not None:
        opt.load_state_dict(held["opt"])
        curve, acc_curve, (tot, tot_ok, tot_n) = held["curve"], held["acc_curve"], held["tot"]
        first, before = held["step"], held["wall_s"]
        print(f"[{name}] resuming from {rpath} at step {first}/{steps}", flush=True)
    t0 = time.perf_counter() - before
    eval_every = args.eval_every or max(1, steps // 5)
    for step in range(first, steps):
        for g in opt.param_groups:
            g["lr"] = tr["lr"] * R.lr_at(step / steps, tr["warmup"])
        ids, mask = batch_at(args.seed, mi, step, steps, tr, args.tasks)
        x = torch.from_numpy(ids).to(device)
        m = torch.from_numpy(mask[:, 1:]).to(device)
        with amp:
            logits = model(x[:, :-1], use_cache=False).logits
        sel = logits.float()[m]
        tgt = x[:, 1:][m]
        loss = F.cross_entropy(sel, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        tot += float(loss.detach())
        tot_ok += int((sel.argmax(-1) == tgt).sum())
        tot_n += int(tgt.numel())
        done = step + 1
        if done % tr["log_every"] == 0 or done == steps:
            el = time.perf_counter() - t0
            row = {"step": done, "length": int(ids.shape[1]), "answer_loss":
                   tot / max(1, tr["log_every"] if done % tr["log_every"] == 0
                             else done % tr["log_every"]),
                   "answer_token_acc": tot_ok / max(1, tot_n),
                   "lr": opt.param_groups[0]["lr"], "wall_s": round(el, 2)}
            curve.append(row)
            tot, tot_ok, tot_n = 0.0, 0, 0
            print(f"[{name}] step {done:5d}/{steps} answer loss {row['answer_loss']:.4f} "
                  f"answer-token acc {row['answer_token_acc']:.3f} (len {row['length']}) "
                  f"{el:7.1f} s", flush=True)
        if args.eval_during and (done % eval_every == 0) and done < steps:
            a = {t: accuracy(model, eval_items(t, [tr["eval_lengths"][0]], tr["eval_items"] // 2
                                               or 1, tr["vocab"], args.eval_seed + 1), device)
                 for t in args.tasks}
            acc_curve.append({"step": done, "wall_s": round(time.perf_counter() - t0, 2),
                              "length": tr["eval_lengths"][0],
                              **{t: v[tr["eval_lengths"][0]] for t, v in a.items()}})
            print(f"[{name}] step {done}: item accuracy at {tr['eval_lengths'][0]} tokens "
                  f"{acc_curve[-1]}", flush=True)
        if done < steps and (done == args.pause_after or (
                args.pause_at is not None and time.monotonic() - T_START >= args.pause_at)):
            if device.type == "cuda":
                torch.cuda.synchronize()
            rpath.parent.mkdir(parents=True, exist_ok=True)
            tmp = rpath.with_suffix(".tmp")
            torch.save({"key": key, "step": done, "model": model.state_dict(),
                        "opt": opt.state_dict(), "curve": curve, "acc_curve": acc_curve,
                        "tot": (tot, tot_ok, tot_n), "wall_s": time.perf_counter() - t0,
                        "init_hl": init_hl}, tmp)
            os.replace(tmp, rpath)
            raise Paused(f"[{name}] paused at step {done}/{steps}: {rpath}; the same command "
                         f"continues it")
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    gdn_chunk(64)  # evaluation: transformers' own chunking
    model.eval()
    t1 = time.perf_counter()
    acc = {t: accuracy(model, eval_items(t, args.eval_lengths or tr["eval_lengths"],
                                         args.eval_items or tr["eval_items"], tr["vocab"],
                                         args.eval_seed), device, args.eval_batch_tokens)
           for t in ("mqar", "passkey")}
    eval_s = time.perf_counter() - t1
    hl = R.half_lives(model, hw, device, amp)
    folder = out / name
    model.float().save_pretrained(folder)
    for extra in folder.iterdir():
        if extra.name not in ("config.json", "model.safetensors"):
            extra.unlink()
    size = (folder / "model.safetensors").stat().st_size
    if size > MAX_BYTES:
        print(f"[{name}] warning: the checkpoint is {size:,} bytes, over the 8 MB to commit")
    log = {
        "model": name, "class": type(model).__name__, "size": args.size, "seed": args.seed,
        "model_seed": args.seed + mi, "parameters": n_params, "checkpoint_bytes": size,
        "dtype": "float32", "config": (MAMBA2 if name == "mamba2" else GDN)[args.size],
        "gdn_layers": ("3 GDN + 1 full attention" if args.gdn_hybrid else "all GDN")
        if name == "gdn" else None,
        "vocab": {"size": tr["vocab"], "pad": PAD, "bos": BOS,
                  "layout": "precsim.tasks.alphabets (markers, keys, values, filler)"},
        "train": {**{k: v for k, v in tr.items() if k != "steps"}, "steps": steps,
                  "tasks": args.tasks, "loss": "cross-entropy on the answer tokens only",
                  "optimizer": "AdamW(betas=(0.9, 0.95), weight decay 0.1 on matrices), linear "
                               "warmup then cosine to 10%; grad clip 1.0",
                  "autocast": "bf16" if device.type == "cuda" else "none (fp32)",
                  "deterministic": device.type == "cpu"},
        "wall_s": round(wall, 2), "s_per_step": round(wall / max(1, steps), 4),
        "eval_s": round(eval_s, 2),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else
        f"cpu ({torch.get_num_threads()} threads)",
        "versions": {"torch": torch.__version__, "transformers": tf.__version__,
                     "python": platform.python_version()},
        "accuracy": {"rule": "greedy exact match (teacher-forced argmax at every answer token), "
                             "the model's own forward in float32",
                     "items": "precsim.tasks.builtin_items (task_eval's generator)",
                     "seed": args.eval_seed, "key_len": EVAL_KEY_LEN, "depth": EVAL_DEPTH,
                     "items_per_length": args.eval_items or tr["eval_items"],
                     "by_task": {t: {str(k): v for k, v in a.items()} for t, a in acc.items()}},
        "gdn_train_chunk": args.gdn_chunk if name == "gdn" else None,
        "gdn_train_kernel": gdn_kernel() if name == "gdn" else None,
        "train_curve": curve, "accuracy_curve": acc_curve,
        "half_life": {"unit": "tokens; per head, the median over the measured tokens "
                              "(experiments/trained/train.py half_lives)",
                      "windows": f"{len(hw)} MQAR items of {hw.shape[1] - 1} tokens",
                      "trained": hl, "init": init_hl, "change": R.change(init_hl, hl)},
    }
    (folder / "train_log.json").write_text(json.dumps(log, indent=1, default=float) + "\n")
    rpath.unlink(missing_ok=True)
    s = hl["summary"]
    print(f"[{name}] done: {steps} steps, {wall:.1f} s; accuracy "
          + "; ".join(f"{t} " + " ".join(f"{k}:{v:.2f}" for k, v in a.items())
                      for t, a in acc.items())
          + f"; half-life median {s['median']:.3g} (max {s['max']:.3g}, init "
          f"{init_hl['summary']['median']:.3g})", flush=True)
    return log


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder (NAME/ per model, accuracy.json)")
    dev = ap.add_mutually_exclusive_group()
    dev.add_argument("--cpu", action="store_true", help="train on the CPU (deterministic)")
    dev.add_argument("--gpu", action="store_true", help="train on CUDA (the default size: full)")
    ap.add_argument("--tiny", action="store_true", help="--size tiny (a determinism check)")
    ap.add_argument("--size", choices=sorted(TRAIN), default=None,
                    help="tiny | small (CPU) | full (GPU); default full, or tiny with --tiny")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-seed", type=int, default=1000,
                    help="the evaluation items' seed (task.seed in task_eval)")
    ap.add_argument("--steps", type=int, default=None, help="override each model's step count")
    ap.add_argument("--models", default="mamba2,gdn", help="comma list of mamba2, gdn")
    ap.add_argument("--tasks", default="mqar,passkey", help="comma list of mqar, passkey")
    ap.add_argument("--gdn-hybrid", action="store_true",
                    help="GDN: the last layer full attention (it can then recall without the "
                         "state); default: every layer GDN")
    ap.add_argument("--eval-lengths", default=None, help="comma list (default: the size's)")
    ap.add_argument("--eval-items", type=int, default=None, help="items per length and task")
    ap.add_argument("--eval-during", action="store_true",
                    help="item accuracy at the first evaluation length every --eval-every steps")
    ap.add_argument("--eval-every", type=int, default=None)
    ap.add_argument("--gdn-chunk", type=int, default=64,
                    help="GDN training only: positions per chunk of transformers' torch scan "
                         "(64: its own; 256: a quarter of the launches, the same recurrence)")
    ap.add_argument("--eval-batch-tokens", type=int, default=1 << 16,
                    help="final evaluation: rows x positions per forward pass")
    ap.add_argument("--lr", type=float, default=None,
                    help="peak learning rate (default: the size's recipe, 3e-3)")
    ap.add_argument("--first-stage", type=int, default=None,
                    help="steps of the curriculum's first length alone; the other lengths then "
                         "unlock evenly over the remaining steps (default: all stages equal)")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (1: deterministic)")
    ap.add_argument("--pause-at", type=float, default=None,
                    help="seconds from the start: save the training state (NAME/resume.pt) at "
                         "the first step after them and exit 75; the same command continues")
    ap.add_argument("--pause-after", type=int, default=None,
                    help="steps: pause after this step (as --pause-at; for tests)")
    args = ap.parse_args(argv)
    if args.lr is not None and not args.lr > 0:
        ap.error(f"--lr={args.lr}; allowed: a learning rate > 0")
    if args.first_stage is not None and args.first_stage < 0:
        ap.error(f"--first-stage={args.first_stage}; allowed: a step count >= 0")
    args.size = args.size or ("tiny" if args.tiny else ("small" if args.cpu else "full"))
    names = [m for m in args.models.split(",") if m]
    if not names or set(names) - {"mamba2", "gdn"}:
        ap.error(f"--models={args.models!r}; allowed: a comma list of mamba2, gdn")
    args.tasks = [t for t in args.tasks.split(",") if t]
    if not args.tasks or set(args.tasks) - {"mqar", "passkey"}:
        ap.error("--tasks; allowed: a comma list of mqar, passkey")
    args.eval_lengths = ([int(v) for v in args.eval_lengths.split(",")]
                         if args.eval_lengths else None)
    if not args.cpu and not torch.cuda.is_available():
        ap.error("no CUDA device is visible; allowed: --cpu")
    out = Path(args.out)
    resuming = any((out / n / RESUME).is_file() for n in names)
    if not resuming and any((out / n / "model.safetensors").exists() for n in names):
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
    R = recipe()
    import transformers.models.mamba2.modeling_mamba2 as mm

    R.check_ssd_scan(mm)
    mm.mamba2_chunk_scan = R.ssd_scan  # training and measuring only: the checkpoint is unchanged
    t0 = time.perf_counter()
    logs = []
    for n in names:
        done = out / n / "train_log.json"
        if resuming and done.is_file() and not (out / n / RESUME).is_file():
            logs.append(json.loads(done.read_text()))  # finished before the pause
            continue
        try:
            logs.append(train_one(["mamba2", "gdn"].index(n), n, args, device, out, R))
        except Paused as e:
            print(e, flush=True)
            return EXIT_PAUSED
    summary = {"command": " ".join(sys.argv), "size": args.size, "seed": args.seed,
               "device": logs[0]["device"],
               "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
               "rule": logs[0]["accuracy"]["rule"],
               "accuracy": {lg["model"]: lg["accuracy"]["by_task"] for lg in logs},
               "half_life_median": {lg["model"]: lg["half_life"]["trained"]["summary"]["median"]
                                    for lg in logs},
               "wall_s": {lg["model"]: lg["wall_s"] for lg in logs}}
    (out / "accuracy.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {out}/{{{','.join(names)}}}/ and {out}/accuracy.json in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
