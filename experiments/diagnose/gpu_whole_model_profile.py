"""Diagnosis (in-process under torch.profiler, labelled so; not a user's process): where a
whole-model run (``experiment=model_kl``, the ``split_nvfp4`` schemes, the floor on) spends its
time on one GPU at issue 44's sizes: a random bf16 checkpoint of ``bench_models.py``'s kinds
(``mamba2_2b7``: Mamba-2 2.7B shape; ``nemotron_h_8b_w12``: Nemotron-H-8B width, 12 layers).
A first run warms (Triton compile), the second is timed with its phases, the third runs under
the profiler.

    python experiments/diagnose/gpu_whole_model_profile.py --out DIR [--kind mamba2_2b7]
        [--tokens 8192] [--seqs 4] [--work /tmp/bench_models_work]
    python experiments/diagnose/gpu_whole_model_profile.py --out DIR --kind tiny_mamba2 \\
        --device cpu --tokens 256 --seqs 2          # the same path on the CPU (smoke)

Writes ``<kind>_<seqs>x<tokens>.json`` (walls, phases, device busy time, launches),
``..._ops.txt`` (top operators by device time and by CPU time) and ``<kind>_load.txt`` (the
model's load in a fresh process, importing transformers included, under cProfile: the 40 top
functions by cumulative time) into ``--out``.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
VOCAB = {"mamba2_2b7": 50288, "mamba2_1b3": 50288, "nemotron_h_8b_w12": 131072,
         "tiny_mamba2": 256}


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


LOAD = """import cProfile, pstats, sys, time
t = time.perf_counter()
prof = cProfile.Profile()
prof.enable()
from precsim.models.load import load_model
model, _ = load_model(sys.argv[1], sys.argv[2])
if sys.argv[2] == "cuda":
    import torch
    torch.cuda.synchronize()
prof.disable()
print(f"load in a fresh process (import included): {time.perf_counter() - t:.2f} s")
pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(40)
"""


def load_profile(ck: Path, device: str, path: Path) -> None:
    """The model's load in a fresh process under cProfile, into ``path``."""
    r = subprocess.run([sys.executable, "-c", LOAD, str(ck), device], capture_output=True,
                       text=True, timeout=600)
    path.write_text(r.stdout + (f"\nrc={r.returncode}\n{r.stderr[-3000:]}" if r.returncode
                                else ""))
    print(r.stdout.splitlines()[0] if r.stdout else r.stderr[-2000:], flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="/tmp/whole_model_profile")
    ap.add_argument("--work", default="/tmp/bench_models_work", help="checkpoints (built once)")
    ap.add_argument("--kind", default="mamba2_2b7", choices=sorted(VOCAB))
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    a = ap.parse_args()
    sys.path.insert(0, str(HERE.parent / "bench"))  # bench_models' record.py import
    build = _load("bench_models", HERE.parent / "bench" / "bench_models.py").build
    profile_cli = _load("gpu_task_profile", HERE / "gpu_task_profile.py").profile_cli
    work, out = Path(a.work), Path(a.out)
    work.mkdir(parents=True, exist_ok=True)
    ck = work / f"{a.kind}_{a.device}"
    build(a.kind, ck, a.device)
    ids = work / f"ids_profile_{a.kind}_{a.seqs}x{a.tokens}.npy"
    np.save(ids, np.random.default_rng(0).integers(0, VOCAB[a.kind], (a.seqs, a.tokens)))
    argv = ["experiment=model_kl", f"model.path={ck}", f"model.ids={ids}",
            f"run.steps={a.tokens}", f"run.seqs={a.seqs}", f"run.device={a.device}",
            "metrics.window=1024" if a.tokens >= 1024 else f"metrics.window={a.tokens}",
            "metrics.plot=false", "run.progress=false"]
    out.mkdir(parents=True, exist_ok=True)
    load_profile(ck, a.device, out / f"{a.kind}_load.txt")
    profile_cli(argv, out, a.device, f"{a.kind}_{a.seqs}x{a.tokens}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
