"""Diagnosis (in-process, under torch.profiler; not a user's process): where a real model's
recording and whole-model run spend their time on one GPU.

    python experiments/diagnose/gpu_models_profile.py --work DIR --out DIR
        [--record-tokens 16384] [--kl-tokens 8192] [--seqs 4]

Uses (or builds) the random-weight Mamba-2 1.3B-shape checkpoint of ``bench_models.py``. Writes
``load.json`` (model load: precsim's ``load_model`` against transformers' ``device_map``
loading), ``record_profile.txt`` and ``kl_profile.txt`` (the top CUDA kernels and CPU ops by
total time), and prints the wall of each part.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent


def _bench_models():
    spec = importlib.util.spec_from_file_location("bench_models",
                                                  HERE.parent / "bench" / "bench_models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _table(prof, out: Path, title: str, wall: float) -> None:
    ka = prof.key_averages()
    txt = [f"{title}: {wall:.2f} s wall under the profiler",
           ka.table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70),
           ka.table(sort_by="cpu_time_total", row_limit=30, max_name_column_width=70)]
    out.write_text("\n\n".join(txt))
    print(txt[0])
    print("\n".join(txt[1].splitlines()[:22]), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/tmp/bench_models_work")
    ap.add_argument("--out", default="/tmp/gpu_models_profile")
    ap.add_argument("--record-tokens", type=int, default=16384)
    ap.add_argument("--kl-tokens", type=int, default=8192)
    ap.add_argument("--seqs", type=int, default=4)
    a = ap.parse_args(argv)
    from torch.profiler import ProfilerActivity, profile

    from precsim.config import to_config
    from precsim.models import run_model_kl
    from precsim.models.load import load_model
    from precsim.models.recording import record_document

    work, out = Path(a.work), Path(a.out)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    ck = work / "mamba2_1b3"
    _bench_models().build("mamba2_1b3", ck, "cuda")
    import transformers as tf

    res = {}
    t = time.perf_counter()
    model, _ = load_model(ck, "cuda")
    torch.cuda.synchronize()
    res["load_model_s"] = round(time.perf_counter() - t, 2)
    del model
    torch.cuda.empty_cache()
    t = time.perf_counter()
    m2 = tf.Mamba2ForCausalLM.from_pretrained(ck, device_map="cuda").eval()
    torch.cuda.synchronize()
    res["from_pretrained_device_map_cuda_s"] = round(time.perf_counter() - t, 2)
    print(res, flush=True)
    (out / "load.json").write_text(json.dumps(res, indent=1))

    ids = np.random.default_rng(0).integers(0, 50288, a.record_tokens)
    layers = list(range(0, 48, 6))
    record_document(m2, ids[:2048], work / "rec_warm", layers, "bf16")  # compile
    t = time.perf_counter()
    record_document(m2, ids, work / "rec_plain", layers, "bf16")
    plain = time.perf_counter() - t
    print(f"record {a.record_tokens} tokens x 8 layers (no profiler): {plain:.2f} s", flush=True)
    t = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        record_document(m2, ids, work / "rec_prof", layers, "bf16")
        torch.cuda.synchronize()
    _table(prof, out / "record_profile.txt", "record", time.perf_counter() - t)
    del m2
    torch.cuda.empty_cache()

    np.save(work / "ids_prof.npy", np.random.default_rng(1).integers(0, 50288,
                                                                     (a.seqs, a.kl_tokens)))
    cfg = to_config({"model": {"path": str(ck), "ids": str(work / "ids_prof.npy")},
                     "schemes": {"conventional_fp32": {"kind": "conventional", "fmt": "fp32"},
                                 "shared_nvfp4_sr": {"kind": "shared", "fmt": "nvfp4",
                                                     "rounding": "sr"},
                                 "split_fp32_nvfp4": {"kind": "split", "fmt": "fp32",
                                                      "read_fmt": "nvfp4"}},
                     "run": {"steps": a.kl_tokens, "seqs": a.seqs, "progress": False},
                     "metrics": {"window": 1024, "budget_metric": "kl"}})
    run_model_kl(cfg, "cuda", progress=False)  # compile, load
    t = time.perf_counter()
    r = run_model_kl(cfg, "cuda", progress=False)
    print(f"model_kl {a.seqs} x {a.kl_tokens} (no profiler): {time.perf_counter() - t:.2f} s; "
          f"phases {r.info.get('phases_s')}", flush=True)
    t = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run_model_kl(cfg, "cuda", progress=False)
        torch.cuda.synchronize()
    _table(prof, out / "kl_profile.txt", "model_kl", time.perf_counter() - t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
