"""Per-layer precision on a random-weight Mamba-2 1.3B-shape checkpoint, on one GPU, as whole
processes (issue 24; study: experiments/studies/study_per_layer/NOTES.md).

    python experiments/studies/study_per_layer/run.py OUT_DIR [--tokens 2048] [--docs 1]
        [--budget KL]
    python experiments/studies/study_per_layer/run.py OUT_DIR --tiny  # a CPU smoke run (tiny model)

1. Builds the checkpoint (``bench_models.py``'s 1.3B shape: 48 layers, 64 heads x 64 x 128, seed
   0) in float32 weights: a random bf16 model turns a 1e-7 difference into KL ~0.8 over 48 layers
   (docs/real-models.md), which would swamp every format's error. Random token ids as documents.
2. Process 1, ``experiment=model_kl``: the uniform split schemes (FP32 master, read copy FP16 /
   FP8 / NVFP4). Unless ``--budget`` is given, the KL budget is the geometric mean of the FP8
   and NVFP4 figures, so the uniform NVFP4 misses it and the question is which layers need more.
3. Process 2, ``experiment=per_layer``: sensitivities (1 + 48 x 3 one-layer runs as batch rows),
   the exact assignment, its verification beside the uniform schemes.

Prints a table (the assignment against the best uniform scheme: bytes per token over all SSM
layers, KL at the horizon, margin; the process times) and writes three files to OUT_DIR:
``per_layer_gpu.json`` (the figures, the assignment, the per-layer sensitivities, the process
times and commands), ``sensitivity.csv`` and ``sensitivity.png`` (from the run). The checkpoint
and run directories live in a temporary directory, removed at the end (``--keep`` keeps it).
About 2-3 min on one H200 at the defaults (an estimate from bench_models.md's scan rates, not
measured yet); the sensitivity pass scales with tokens x docs (``--tokens 4096`` about doubles
it).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PY = sys.executable
FORMATS = ("fp16", "fp8_e4m3", "nvfp4")


def build(path: Path, tiny: bool, device: str) -> float:
    import torch
    import transformers as tf

    t0 = time.perf_counter()
    torch.manual_seed(0)
    if tiny:
        cfg = tf.Mamba2Config(vocab_size=96, hidden_size=32, num_hidden_layers=4, num_heads=4,
                              head_dim=16, expand=2, state_size=16, n_groups=2, chunk_size=8,
                              initializer_range=0.2)
    else:  # Mamba-2 1.3B's shape (state-spaces/mamba2-1.3b), as bench_models.py
        cfg = tf.Mamba2Config(vocab_size=50288, hidden_size=2048, num_hidden_layers=48,
                              num_heads=64, head_dim=64, expand=2, state_size=128, n_groups=1,
                              chunk_size=256, tie_word_embeddings=True)
    with torch.device(device):
        m = tf.Mamba2ForCausalLM(cfg).float()
    m.save_pretrained(path)
    vocab = cfg.vocab_size
    del m
    return time.perf_counter() - t0, vocab


def run(cmd: list[str], label: str, log: list) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    log.append({"what": label, "wall_s": round(wall, 2), "rc": p.returncode,
                "cmd": " ".join(cmd)})
    print(f"{label:<52} {wall:7.1f} s  rc={p.returncode}", flush=True)
    if p.returncode:
        print("\n".join((p.stdout + p.stderr).strip().splitlines()[-20:]), flush=True)
        raise SystemExit(f"{label} failed (rc={p.returncode})")
    return wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="where the three result files go")
    ap.add_argument("--tokens", type=int, help="tokens per document (default 2048; tiny 64)")
    ap.add_argument("--docs", type=int, default=1, help="documents (random token ids)")
    ap.add_argument("--window", type=int, help="the horizon's window (default tokens/4)")
    ap.add_argument("--budget", type=float, help="KL budget (default: from process 1)")
    ap.add_argument("--tiny", action="store_true", help="a tiny model on the CPU (smoke run)")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint and run dirs")
    a = ap.parse_args()
    N = a.tokens or (64 if a.tiny else 2048)
    W = a.window or max(1, N // 4)
    dev = "cpu" if a.tiny else "cuda"
    a.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="precsim_per_layer_"))
    log: list = []
    try:
        ck = work / "ckpt"
        build_s, vocab = build(ck, a.tiny, dev)
        print(f"{'checkpoint (float32 weights, seed 0)':<52} {build_s:7.1f} s", flush=True)
        np.save(work / "ids.npy", np.random.default_rng(0).integers(0, vocab, (a.docs, N)))
        common = [f"model.path={ck}", f"model.ids={work / 'ids.npy'}", f"run.steps={N}",
                  f"run.seqs={a.docs}", f"metrics.window={W}", f"run.device={dev}",
                  "run.progress=false", "replay.buffer_len=16"]
        # the schemes group's preset dropped (~schemes) and a whole dict given (+schemes=...)
        name = {f: f"u_{f}" for f in FORMATS}
        uni = ", ".join(f"{name[f]}: {{kind: split, fmt: fp32, rounding: rne, read_fmt: {f}}}"
                        for f in FORMATS)
        run([PY, "-m", "precsim", "experiment=model_kl", "~schemes", f"+schemes={{{uni}}}",
             *common,
             f"hydra.run.dir={work / 'uniform'}"], "1. uniform schemes (experiment=model_kl)",
            log)
        u = json.loads((work / "uniform" / "summary.json").read_text())
        ukl = {f: u["figures"][name[f]]["final"]["kl"] for f in FORMATS}
        budget = a.budget or math.sqrt(ukl["fp8_e4m3"] * ukl["nvfp4"])
        print("   uniform KL at the horizon: "
              + ", ".join(f"{f} {v:.3g}" for f, v in ukl.items())
              + f"; budget {budget:.3g}" + ("" if a.budget else " (geometric mean fp8/nvfp4)"))
        run([PY, "-m", "precsim", "experiment=per_layer", *common, f"metrics.budget={budget}",
             "per_layer.groups_per_pass=73", f"hydra.run.dir={work / 'per_layer'}"],
            "2. per-layer assignment (experiment=per_layer)", log)
        s = json.loads((work / "per_layer" / "summary.json").read_text())
        pl = s["info"]["per_layer"]
        for f in ("sensitivity.csv", "sensitivity.png"):
            shutil.copy(work / "per_layer" / f, a.out / f)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    rd = pl["rounds"][-1] if pl["rounds"] else None
    print(f"\nMamba-2 {'tiny' if a.tiny else '1.3B-shape'} (random weights), {a.docs} x {N:,} "
          f"tokens, KL at the last {W:,}-token window, budget {budget:.3g} nats/token; "
          f"all-FP32 floor {pl['base_value']:.3g}")
    print(f"{'configuration':<60}{'B/token':>12}{'KL':>11}  status")
    rows = [(f"uniform {f}", pl["uniform"][f]["bytes_per_token"], pl["uniform"][f]["value"])
            for f in FORMATS]
    if rd:
        rows.append((f"per-layer {_short(rd['layers'])}", rd["bytes_per_token"],
                     rd["measured"]))
    for name, b, v in sorted(rows, key=lambda r: r[1]):
        print(f"{name[:60]:<60}{b:>12,.0f}{v:>11.3g}  "
              f"{'fits' if v <= budget else 'misses'} ({budget / v if v else math.inf:.2g}x)")
    best = pl["best_uniform"]
    if rd and best:
        ub = pl["uniform"][best]["bytes_per_token"]
        print(f"per-layer ({'verified' if pl['verified'] else 'NOT verified'}) against the best "
              f"uniform ({best}): {100 * (1 - rd['bytes_per_token'] / ub):.1f}% fewer bytes; "
              f"{len(pl['rounds'])} verification(s)")
    result = {"model": "tiny" if a.tiny else "mamba2_1b3 (random, float32 weights)",
              "tokens": N, "docs": a.docs, "window": W, "budget": budget,
              "budget_from": "--budget" if a.budget else "geomean(uniform fp8, nvfp4)",
              "uniform_kl": ukl, "per_layer": pl, "build_s": round(build_s, 1),
              "processes": log, "phases_s": s["info"].get("phases_s")}
    (a.out / "per_layer_gpu.json").write_text(json.dumps(result, indent=1))
    print(f"-> {a.out}/per_layer_gpu.json, sensitivity.csv, sensitivity.png")
    return 0


def _short(layers: dict) -> str:
    """'nvfp4 + 3 layers' / the map itself when short."""
    rest = [k for k in layers if k != "default"]
    if len(rest) <= 2:
        return "{" + ", ".join(f"{k}: {v}" for k, v in layers.items()) + "}"
    return f"{layers['default']} + {len(rest)} layers wider"


if __name__ == "__main__":
    sys.exit(main())
