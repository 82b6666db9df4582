"""Real-model benchmark: whole ``python -m precsim ...`` / ``python -m precsim.record ...``
processes, side by side with ``model.mode=decode`` in one run.

    python experiments/bench/bench_models.py --cpu  [--out DIR]   # tiny Mamba-2, 2,048 tokens
    python experiments/bench/bench_models.py --gpu  [--out DIR]   # 1.3B-shape Mamba-2 and a
                                                                  # Qwen3-Next-shape GDN model

Random-weight checkpoints are built from transformers configs (no download). Every figure is
the wall time of a whole process (start-up, model load and files included) unless labelled
"in-process". Writes ``bench_models.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiments/bench: record.py
import record  # noqa: E402

PY = sys.executable
OUT: Path | None = None  # the record's directory


def run(cmd: list[str], label: str, rows: list, env=None, timeout=1800) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **(env or {})})
    wall = time.perf_counter() - t0
    tail = (p.stdout + p.stderr).strip().splitlines()[-3:]
    rows.append({"what": label, "wall_s": round(wall, 2), "rc": p.returncode,
                 "cmd": " ".join(cmd), "tail": tail})
    print(f"{label:<58} {wall:8.1f} s  rc={p.returncode}", flush=True)
    if OUT is not None:  # after every process: a run cut short keeps what it measured
        record.write_partial(OUT, "bench_models", {"rows": rows})
    if p.returncode:
        print("\n".join((p.stdout + p.stderr).strip().splitlines()[-15:]), flush=True)
    return wall


def build(kind: str, path: Path, device: str):
    """A random-weight checkpoint (bf16 on CUDA, fp32 on the CPU), seed 0."""
    import torch
    import transformers as tf

    if (path / "config.json").is_file():
        return
    torch.manual_seed(0)
    if kind == "tiny_mamba2":
        cfg = tf.Mamba2Config(vocab_size=256, hidden_size=64, num_hidden_layers=4, num_heads=8,
                              head_dim=16, expand=2, state_size=16, n_groups=1, chunk_size=64)
        arch = tf.Mamba2ForCausalLM
    elif kind == "mamba2_1b3":  # Mamba-2 1.3B's shape (state-spaces/mamba2-1.3b)
        cfg = tf.Mamba2Config(vocab_size=50288, hidden_size=2048, num_hidden_layers=48,
                              num_heads=64, head_dim=64, expand=2, state_size=128, n_groups=1,
                              chunk_size=256, tie_word_embeddings=True)
        arch = tf.Mamba2ForCausalLM
    elif kind == "mamba2_2b7":  # Mamba-2 2.7B's shape (state-spaces/mamba2-2.7b): 64 layers,
        # 80 heads x 64 x 128
        cfg = tf.Mamba2Config(vocab_size=50288, hidden_size=2560, num_hidden_layers=64,
                              num_heads=80, head_dim=64, expand=2, state_size=128, n_groups=1,
                              chunk_size=256, tie_word_embeddings=True)
        arch = tf.Mamba2ForCausalLM
    elif kind == "nemotron_h_8b_w12":  # Nemotron-H-8B's width (hidden 4096, Mamba-2 128 heads x
        # 64 x 128 in 8 groups, MLP 21,504, attention 32 heads / 8 KV), 12 layers: 6 Mamba-2,
        # 5 MLP, 1 attention (a 5 GB bf16 checkpoint with its 131,072-token vocabulary)
        cfg = tf.NemotronHConfig(
            vocab_size=131072, hidden_size=4096, num_hidden_layers=12,
            layers_block_type=["mamba", "mlp", "mamba", "mlp", "mamba", "mlp", "mamba",
                               "attention", "mamba", "mlp", "mamba", "mlp"],
            mamba_num_heads=128, mamba_head_dim=64, ssm_state_size=128, n_groups=8,
            intermediate_size=21504, num_attention_heads=32, num_key_value_heads=8,
            head_dim=128, chunk_size=128, tie_word_embeddings=False)
        arch = tf.NemotronHForCausalLM
    else:  # Qwen3-Next-80B-A3B's width (hidden 2048, GDN 32 v-heads x 128, 16 k-heads x 128),
        # 8 layers (6 GDN + 2 attention, its 3:1 pattern), 64 experts instead of 512
        cfg = tf.Qwen3NextConfig(
            vocab_size=151936, hidden_size=2048, num_hidden_layers=8, num_attention_heads=16,
            num_key_value_heads=2, head_dim=256, intermediate_size=5120,
            moe_intermediate_size=512, shared_expert_intermediate_size=512, num_experts=64,
            num_experts_per_tok=10, linear_num_value_heads=32, linear_num_key_heads=16,
            linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
            layer_types=["linear_attention"] * 3 + ["full_attention"]
            + ["linear_attention"] * 3 + ["full_attention"])
        arch = tf.Qwen3NextForCausalLM
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):
        m = arch(cfg).to(dt)
    m.save_pretrained(path)
    del m


BIG_ROWS = "mamba2_2b7:4,mamba2_2b7:1,mamba2_2b7:-4,nemotron_h_8b_w12:2"
BIG_VOCAB = {"mamba2_2b7": 50288, "nemotron_h_8b_w12": 131072}


def big_rows(spec: str) -> list[tuple[str, int]]:
    """``--big-rows``: ``KIND:S,...`` in order (``-S``: S documents with ``model.chunk=2048``)."""
    out = []
    for item in spec.split(","):
        kind, _, s = item.partition(":")
        if kind not in BIG_VOCAB or not s.lstrip("-").isdigit() or int(s) == 0:
            raise SystemExit(f"--big-rows item {item!r}; allowed: KIND:S with KIND one of "
                             f"{', '.join(BIG_VOCAB)} and S a nonzero integer")
        out.append((kind, int(s)))
    return out


def big(work: Path, tokens: int, hyd: list, rows: list, info: dict,
        spec: str = BIG_ROWS) -> None:
    """The large models' rows (``--big``): ``experiment=model_kl`` with the ``split_nvfp4``
    schemes over ``tokens`` of random ids, the Mamba-2 2.7B shape with 4 and 1 documents and the
    Nemotron-H-8B width with 2, at the default ``model.chunk`` (``auto`` since e8685f9; the
    2026-12-07 H100 figures were taken at 32,768, the default then); each checkpoint built once.
    Then the 4 documents again with ``model.chunk=2048`` (``placement.estimate``: 27 GiB a
    document at 32,768 positions a pass, 4.9 GiB at 2,048)."""
    todo = big_rows(spec)
    for kind, S in todo:  # (-S: S documents with model.chunk=2048)
        ck = work / kind
        if f"build_{kind}_s" not in info:
            t0 = time.perf_counter()
            build(kind, ck, "cuda")
            info[f"build_{kind}_s"] = round(time.perf_counter() - t0, 1)
            # the same ids as before --big-rows: seeded per kind, as many documents as any row
            most = max(abs(s) for k, s in todo if k == kind)
            np.save(work / f"ids_{kind}.npy", np.random.default_rng(
                list(BIG_VOCAB).index(kind)).integers(0, BIG_VOCAB[kind], (most, tokens)))
        chunk = ["model.chunk=2048"] if S < 0 else []
        run([PY, "-m", "precsim", "experiment=model_kl", f"model.path={ck}",
             f"model.ids={work / f'ids_{kind}.npy'}", f"run.steps={tokens}",
             f"run.seqs={abs(S)}", "run.device=cuda", "metrics.window=1024", *chunk, *hyd,
             f"hydra.run.dir={work}/kl_{kind}_s{S}_{time.time_ns()}"],
            f"model_kl split_nvfp4, {kind}, {tokens:,} tok x {abs(S)} docs"
            + (", model.chunk=2048" if S < 0 else ""), rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--cpu", action="store_true")
    g.add_argument("--gpu", action="store_true")
    ap.add_argument("--out", default="/tmp/bench_models")
    ap.add_argument("--work", default="/tmp/bench_models_work", help="checkpoints and traces")
    ap.add_argument("--tokens", type=int, default=32768, help="GPU: whole-model tokens")
    ap.add_argument("--record-tokens", type=int, default=131072, help="GPU: 8-layer recording")
    ap.add_argument("--skip-gdn", action="store_true")
    ap.add_argument("--skip-decode", action="store_true", help="GPU: no decode-mode run")
    ap.add_argument("--skip-replay", action="store_true", help="GPU: no layer replay")
    ap.add_argument("--skip-record", action="store_true", help="GPU: no recording, no replay")
    ap.add_argument("--skip-all-layers", action="store_true",
                    help="GPU: no 48-layer recording")
    ap.add_argument("--seqs", default="4",
                    help="GPU: documents of the whole-model runs, comma-separated (1 is the "
                         "experiment's default)")
    ap.add_argument("--big", action="store_true",
                    help="GPU: only the large models' rows instead (Mamba-2 2.7B shape, 4 and 1 "
                         "documents x --tokens; Nemotron-H-8B width, 12 layers, 2 documents)")
    ap.add_argument("--big-rows", default=BIG_ROWS,
                    help="GPU --big: the rows, KIND:S in order (-S: S documents with "
                         "model.chunk=2048)")
    ap.add_argument("--one-pass", action="store_true",
                    help="GPU: the Mamba-2 whole-model run also with model.chunk=0")
    a = ap.parse_args()
    global OUT
    out, work = Path(a.out), Path(a.work)
    OUT = out
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    rows: list = []
    info = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "host": platform.node(), "python": platform.python_version()}
    import torch
    import transformers

    info.update(torch=torch.__version__, transformers=transformers.__version__,
                cpus=os.cpu_count())
    hyd = ["hydra.job.chdir=false", "run.progress=false"]
    if a.cpu:
        ck = work / "tiny_mamba2"
        build("tiny_mamba2", ck, "cpu")
        np.save(work / "ids_cpu.npy", np.random.default_rng(0).integers(0, 256, (1, 2048)))
        base = [PY, "-m", "precsim", "experiment=model_kl", f"model.path={ck}",
                f"model.ids={work / 'ids_cpu.npy'}", "run.steps=2048", "run.device=cpu",
                "metrics.window=256", *hyd]
        par = run([*base, f"hydra.run.dir={work}/cpu_parallel_{time.time_ns()}"],
                  "CPU model_kl parallel, tiny Mamba-2, 2,048 tokens", rows)
        dec = run([*base, "model.mode=decode", f"hydra.run.dir={work}/cpu_decode_{time.time_ns()}"],
                  "CPU model_kl decode, the same", rows)
        info["cpu_speedup"] = round(dec / par, 1)
        print(f"parallel is {dec / par:.1f}x decode mode (whole processes)")
    elif a.big:
        info["gpu"] = torch.cuda.get_device_name(0)
        big(work, a.tokens, hyd, rows, info, a.big_rows)
    else:
        info["gpu"] = torch.cuda.get_device_name(0)
        ck = work / "mamba2_1b3"
        t0 = time.perf_counter()
        build("mamba2_1b3", ck, "cuda")
        info["build_mamba2_s"] = round(time.perf_counter() - t0, 1)
        rng = np.random.default_rng(0)
        np.save(work / "ids_long.npy", rng.integers(0, 50288, (1, a.record_tokens)))
        np.save(work / "ids4.npy", rng.integers(0, 50288, (4, a.tokens)))
        if not a.skip_record:
            rec8 = work / "rec8"
            layers8 = ",".join(str(i) for i in range(0, 48, 6))
            run([PY, "-m", "precsim.record", "--model", str(ck), "--ids-file",
                 str(work / "ids_long.npy"), "--layers", layers8, "--dtype", "bf16", "--device",
                 "cuda", "--out", str(rec8)],
                f"record {a.record_tokens:,} tokens, 8 layers, bf16", rows)
            rec48 = work / "rec48"
            if not a.skip_all_layers:
                run([PY, "-m", "precsim.record", "--model", str(ck), "--ids-file",
                     str(work / "ids4.npy"), "--tokens", str(a.tokens), "--dtype", "bf16",
                     "--device", "cuda", "--out", str(rec48)],
                    f"record {a.tokens:,} tokens, all 48 layers, bf16", rows)
            for r in (rec8, rec48):
                f = r / "record.json"
                meta = json.loads(f.read_text()) if f.is_file() else {}
                info[f"{r.name}_bytes"] = meta.get("bytes")
                info[f"{r.name}_bytes_per_token_layer"] = meta.get("bytes_per_token_layer")
                info[f"{r.name}_wall_s_in_process"] = meta.get("wall_s")
            if not a.skip_replay:
                run([PY, "-m", "precsim", "workload=trace", f"workload.path={rec8}",
                     "workload.layer=0", f"run.steps={a.record_tokens}", "run.device=cuda", *hyd,
                     f"hydra.run.dir={work}/replay0_{time.time_ns()}"],
                    f"replay layer 0 of the recording, {a.record_tokens:,} steps", rows)
        seqs = [int(x) for x in a.seqs.split(",")]
        for S in seqs:
            kl = [PY, "-m", "precsim", "experiment=model_kl", f"model.path={ck}",
                  f"model.ids={work / 'ids4.npy'}", f"run.steps={a.tokens}", f"run.seqs={S}",
                  "run.device=cuda", "metrics.window=1024", *hyd]
            run([*kl, f"hydra.run.dir={work}/kl_m2_s{S}_{time.time_ns()}"],
                f"model_kl split_nvfp4, Mamba-2 1.3B, {a.tokens:,} tok x {S} docs", rows)
        if a.one_pass:
            run([*kl, "model.chunk=0", f"hydra.run.dir={work}/kl_m2_onepass_{time.time_ns()}"],
                "the same, model.chunk=0 (one pass per document)", rows)
        if not a.skip_decode:
            dec_n = 64
            run([PY, "-m", "precsim", "experiment=model_kl", f"model.path={ck}",
                 f"model.ids={work / 'ids4.npy'}", f"run.steps={dec_n}", "run.device=cuda",
                 "metrics.window=32", "model.mode=decode", *hyd,
                 f"hydra.run.dir={work}/kl_m2_dec_{time.time_ns()}"],
                f"model_kl decode mode, the same model, {dec_n} tokens x 1 doc", rows)
        if not a.skip_gdn:
            ckg = work / "qwen3next_w"
            t0 = time.perf_counter()
            build("qwen3next", ckg, "cuda")
            info["build_gdn_s"] = round(time.perf_counter() - t0, 1)
            np.save(work / "ids4g.npy", rng.integers(0, 151936, (4, a.tokens)))
            for S in seqs:
                run([PY, "-m", "precsim", "experiment=model_kl", f"model.path={ckg}",
                     f"model.ids={work / 'ids4g.npy'}", f"run.steps={a.tokens}",
                     f"run.seqs={S}", "run.device=cuda", "metrics.window=1024", *hyd,
                     f"hydra.run.dir={work}/kl_gdn_s{S}_{time.time_ns()}"],
                    f"model_kl split_nvfp4, Qwen3-Next-shape 8 layers, {a.tokens:,} x {S}", rows)
    for d in sorted(work.glob("kl_*")):
        s = d / "summary.json"
        if s.is_file():
            j = json.loads(s.read_text())
            info[f"{d.name.rsplit('_', 1)[0]}_model_s"] = j["info"].get("model_s")
            info[f"{d.name.rsplit('_', 1)[0]}_phases_s"] = j["info"].get("phases_s")
            info[f"{d.name.rsplit('_', 1)[0]}_final"] = {
                n: {k: f["final"].get(k) for k in ("kl", "top1", "first_flip")}
                for n, f in j["figures"].items()}
    res = {"info": info, "rows": rows}
    print("record:", record.write(out, "bench_models", res))
    print(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
