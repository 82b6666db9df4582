"""Diagnosis on a CUDA machine (labelled: not the headline benchmark): where a user process's
time goes, and the real-model path on the GPU.

1. The process floor's parts: ``import torch``, CUDA initialisation, ``import precsim.cli``;
2. ``experiment=seed_table model=nemotron3_super`` in one process: the first engine run under
   cProfile (cumulative top 30), then a second run (warm in-process) with its phases;
3. real models on the GPU: tiny random Mamba-2 and Qwen3-Next checkpoints (built offline),
   ``python -m precsim.record --device cuda`` and whole-model mode (``model.path``) on cuda,
   timed per token.

    python experiments/diagnose/gpu_diagnose.py --out OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def floor() -> dict:
    out = {}
    for name, code in (("python", "pass"), ("import torch", "import torch"),
                       ("torch + cuda init", "import torch; torch.zeros(1, device='cuda')"),
                       ("import precsim.cli", "import precsim.cli"),
                       ("precsim --help", None)):
        t = time.perf_counter()
        cmd = [sys.executable, "-m", "precsim", "--help"] if code is None else \
            [sys.executable, "-c", code]
        subprocess.run(cmd, capture_output=True, check=True)
        out[name] = round(time.perf_counter() - t, 3)
    return out


def engine_profile(out: Path) -> dict:
    """The engine's first run in this process under cProfile, then a second run
    (``gpu_process.engine_first_run``: after the CLI's warm-up; profile in OUT)."""
    from gpu_process import engine_first_run

    return engine_first_run(out, [])


def models_on_gpu(root: Path, device: str = "cuda", tokens: int = 64) -> dict:
    import numpy as np
    import torch
    import transformers as tf

    from precsim.config import to_config
    from precsim.models import run_model_kl, ssm_layers

    def mamba2():
        return tf.Mamba2ForCausalLM(tf.Mamba2Config(
            vocab_size=96, hidden_size=32, num_hidden_layers=2, num_heads=4, head_dim=16,
            expand=2, state_size=16, n_groups=2, conv_kernel=4, chunk_size=8,
            initializer_range=0.2))

    def qwen3_next():
        return tf.Qwen3NextForCausalLM(tf.Qwen3NextConfig(
            vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, intermediate_size=32, moe_intermediate_size=16,
            shared_expert_intermediate_size=16, num_experts=2, num_experts_per_tok=1,
            linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
            linear_value_head_dim=8, linear_conv_kernel_dim=4,
            layer_types=["linear_attention", "full_attention"], initializer_range=0.2))

    out = {}
    for name, build in (("mamba2", mamba2), ("qwen3_next", qwen3_next)):
        torch.manual_seed(0)
        m = build().eval()
        with torch.no_grad():
            for _, mixer, _ in ssm_layers(m):
                mixer.A_log.fill_(float(np.log(0.05)))
        path = root / name
        m.save_pretrained(path)
        t = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "precsim.record", "--model", str(path),
                            "--tokens", str(tokens), "--out", str(root / f"rec_{name}"),
                            "--device", device], capture_output=True, text=True)
        rec_s = time.perf_counter() - t
        meta = json.loads((root / f"rec_{name}" / "record.json").read_text()) \
            if p.returncode == 0 else {"error": p.stderr.strip().splitlines()[-1:]}
        cfg = to_config({"model": {"path": str(path)}, "schemes": {
            "fp32": {"kind": "conventional", "fmt": "fp32"},
            "shared": {"kind": "shared", "fmt": "nvfp4", "rounding": "sr"},
            "split": {"kind": "split", "fmt": "fp32", "read_fmt": "nvfp4"}},
            "run": {"steps": tokens, "progress": False, "device": device},
            "metrics": {"window": min(16, tokens)}})
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        r = run_model_kl(cfg, device, progress=False)
        kl_s = time.perf_counter() - t
        last = {row["scheme"]: {k: row.get(k) for k in ("kl", "top1", "state_drift")}
                for row in r.rows if row["step"] == tokens}
        out[name] = {"record_process_s": round(rec_s, 2), "record_rc": p.returncode,
                     "record_steps": meta.get("steps"), "model_kl_s": round(kl_s, 2),
                     "model_kl_ms_per_token_per_run": round(1e3 * kl_s / tokens / 4, 1),
                     "peak_gpu_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1)
                     if device == "cuda" else None,
                     "final": last, "engine": r.engine, "device": r.device}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--skip-models", action="store_true")
    a = ap.parse_args(argv)
    out = Path(a.out)
    res = {"floor_s": floor()}
    print(json.dumps(res["floor_s"]), flush=True)
    res["engine"] = engine_profile(out)
    print(json.dumps(res["engine"]), flush=True)
    print((out / "engine_first_run.txt").read_text()[:6000], flush=True)
    if not a.skip_models:
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            res["models"] = models_on_gpu(Path(d))
        print(json.dumps(res["models"], indent=1), flush=True)
    (out / "gpu_diagnose.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
