"""Diagnosis (in-process, labelled so): what a generation step costs on the GPU, by
torch.profiler. A Mamba-2 1.3B-shape checkpoint (random bf16 weights, built if missing),
``split_nvfp4`` schemes, ``--docs`` documents, a short prompt so that the one-token steps
dominate; prints the step's wall time, the device's busy time (CUDA kernels) per step, kernel
launches per step and the top operators, and writes them to ``--out``/gen_steps.json.

    python experiments/diagnose/gpu_gen_steps.py --out DIR [--docs 16 --new 32]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_models import build  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="/tmp/gen_steps")
    ap.add_argument("--work", default="/tmp/bench_floor_gen_work")
    ap.add_argument("--docs", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new", type=int, default=32)
    a = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from precsim.config import to_config
    from precsim.models.run import run_model_kl

    out, work = Path(a.out), Path(a.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    ck = work / "mamba2_1b3"
    build("mamba2_1b3", ck, "cuda")
    ids = work / f"gen_ids_{a.docs}x{a.prompt}.npy"
    np.save(ids, np.random.default_rng(0).integers(0, 50288, (a.docs, a.prompt)))
    base = {"model": {"path": str(ck), "ids": str(ids), "mode": "generate"},
            "schemes": {"conventional_fp32": {"kind": "conventional", "fmt": "fp32"},
                        "shared_nvfp4_sr": {"kind": "shared", "fmt": "nvfp4", "rounding": "sr"},
                        "split_fp32_nvfp4": {"kind": "split", "fmt": "fp32",
                                             "read_fmt": "nvfp4"}},
            "run": {"steps": a.prompt, "seqs": a.docs, "progress": False},
            "metrics": {"window": a.prompt}}
    res = {}
    for new in (2, a.new):  # the difference: the steps alone
        cfg = to_config({**base, "model": {**base["model"], "new_tokens": new}})
        run_model_kl(cfg, "cuda", progress=False)  # warm (compile, caches)
        t = time.perf_counter()
        r = run_model_kl(cfg, "cuda", progress=False)
        res[new] = {"wall_s": time.perf_counter() - t, "phases": r.info["phases_s"]}
        print(new, res[new], flush=True)
    steps = a.new - 2
    per_tok = (res[a.new]["phases"]["generate_s"] - res[2]["phases"]["generate_s"]) / steps
    cfg = to_config({**base, "model": {**base["model"], "new_tokens": a.new}})
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run_model_kl(cfg, "cuda", progress=False)
    ev = prof.key_averages()
    kern = [e for e in ev if e.device_type.name == "CUDA"]
    n_k = sum(e.count for e in kern)
    busy = sum(e.self_device_time_total for e in kern) / 1e6
    table = ev.table(sort_by="self_cpu_time_total", row_limit=25)
    gtable = ev.table(sort_by="self_device_time_total", row_limit=15)
    info = {"docs": a.docs, "prompt": a.prompt, "new": a.new, "gpu": torch.cuda.get_device_name(0),
            "step_wall_s": round(per_tok, 4), "runs": res,
            "profiled_run": {"kernels": n_k, "device_busy_s": round(busy, 3)}}
    print(json.dumps(info, indent=1))
    print(table)
    print(gtable)
    (out / "gen_steps.json").write_text(json.dumps(info, indent=1))
    (out / "gen_steps_ops.txt").write_text(table + "\n\n" + gtable)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
