"""Diagnosis (labelled so): torch calls per generated token and layer in ``model.mode=generate``
(issue 39: the one-token step is the host's dispatch of these calls, on a CPU and a GPU alike;
experiments/bench/bench_floor_gen.md). Two runs in this process, ``--tokens`` and ``--tokens``
+ 16 new tokens, of ``experiment=model_kl`` over a tiny random Mamba-2 (``bench_models.py``'s
``tiny_mamba2``: 4 layers) on the CPU, each under a ``TorchFunctionMode`` that counts every
torch function call by whether the calling frame is precsim's; the difference over the 16 extra
tokens and the model's layers is printed.

    python experiments/diagnose/step_torch_calls.py [--tokens 16] [--schemes split_nvfp4]
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

BENCH = Path(__file__).resolve().parents[1] / "bench"
LAYERS = 4  # tiny_mamba2's


class Count(TorchFunctionMode):
    def __init__(self, calls: collections.Counter):
        super().__init__()
        self.calls = calls

    def __torch_function__(self, func, types, args=(), kwargs=None):
        own = "/precsim/" in sys._getframe(1).f_code.co_filename.replace("\\", "/")
        self.calls["precsim" if own else "other"] += 1
        return func(*args, **(kwargs or {}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--schemes", default="split_nvfp4")
    a = ap.parse_args()
    from precsim.cli import main as cli_main

    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_models", BENCH / "bench_models.py")
    bm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bm)
    work = Path(tempfile.mkdtemp(prefix="step_torch_calls_"))
    bm.build("tiny_mamba2", work / "m", "cpu")
    np.save(work / "ids.npy", np.random.default_rng(0).integers(0, 256, (1, 64)))
    counts = []
    for n in (a.tokens, a.tokens + 16):
        calls: collections.Counter = collections.Counter()
        with Count(calls):
            rc = cli_main(["experiment=model_kl", f"model.path={work / 'm'}",
                           f"model.ids={work / 'ids.npy'}", "model.mode=generate",
                           f"model.new_tokens={n}", "run.steps=64", f"schemes={a.schemes}",
                           "run.device=cpu", "run.progress=false", "metrics.plot=false",
                           f"run.out_dir={work / f'run{n}'}"])
        if rc:
            raise SystemExit(f"step_torch_calls.py: the run of {n} new tokens exited {rc}")
        counts.append(calls)
    per = {k: (counts[1][k] - counts[0][k]) / 16 / LAYERS for k in ("precsim", "other")}
    print(f"torch calls per generated token and layer ({a.schemes}, torch {torch.__version__}):"
          f" precsim {per['precsim']:.1f}, other (transformers, torch) {per['other']:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
