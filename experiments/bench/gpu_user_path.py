"""The GPU user path, measured as users run it (one call on a CUDA machine):

1. whole ``python -m precsim experiment=seed_table model=nemotron3_super run.device=cuda``
   processes (first: cold Triton cache; then warm), engine ``wall_s`` and phases from
   summary.json, and ``run.steps=131072``;
2. beside them, a plain PyTorch step loop of the same 5 schemes + float64 truth (128 heads);
3. the FP32 baseline on a 4-head, 16,384-step seed_article run: Triton engine vs the torch CPU
   engine vs a float64 recurrence holding a float32 state with correctly rounded decays, and
   ``model.decay_exp=fast``.

    python experiments/bench/gpu_user_path.py --out OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiments/bench: record.py
import record  # noqa: E402

CMD = [sys.executable, "-m", "precsim", "experiment=seed_table", "model=nemotron3_super",
       "run.device=cuda"]


def whole(extra, out: Path, tag: str) -> dict:
    d = out / f"run_{tag}"
    t = time.perf_counter()
    p = subprocess.run([*CMD, *extra, f"run.out_dir={d}"], capture_output=True, text=True)
    wall = time.perf_counter() - t
    if p.returncode:
        return {"tag": tag, "error": p.stderr.strip().splitlines()[-1:]}
    s = json.loads((d / "summary.json").read_text())
    return {"tag": tag, "process_s": round(wall, 2), "wall_s": round(s.get("wall_s", -1), 3),
            "engine": s.get("engine"), "phases": s.get("info", {}).get("phases_s"),
            "kernel_s": s.get("info", {}).get("kernel_s")}


def step_loop(steps: int) -> float:
    """Steps/s of a plain PyTorch loop: truth (fp64) + conv fp32 + conv nvfp4-sr + shared +
    2 split (the replay ones as a plain per-step state update, a lower bound of their cost)."""
    from precsim import formats as pf

    H, P, N = 128, 64, 128
    dev = "cuda"
    S64 = torch.zeros(H, P, N, dtype=torch.float64, device=dev)
    S32 = [torch.zeros(H, P, N, device=dev) for _ in range(5)]
    A = -torch.rand(H, dtype=torch.float64, device=dev)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for i in range(steps):
        dt = torch.nn.functional.softplus(torch.randn(H, dtype=torch.float64, device=dev))
        x = torch.randn(H, P, dtype=torch.float64, device=dev)
        B = torch.randn(H, N, dtype=torch.float64, device=dev) / N**0.5
        C = torch.randn(H, N, dtype=torch.float64, device=dev) / N**0.5
        a = torch.exp(dt * A)
        S64 = a[:, None, None] * S64 + (dt[:, None] * x)[:, :, None] * B[:, None, :]
        (S64 * C[:, None, :]).sum(-1)
        a32, dt32, x32, B32, C32 = (v.float() for v in (a, dt, x, B, C))
        for k in range(5):
            Sn = a32[:, None, None] * S32[k] + (dt32[:, None] * x32)[:, :, None] * B32[:, None, :]
            (Sn * C32[:, None, :]).sum(-1)
            S32[k] = pf.quantize(Sn, "nvfp4", "sr", seed=1, stream=i) if k == 1 else Sn
    torch.cuda.synchronize()
    return steps / (time.perf_counter() - t)


def fp32_check(steps: int) -> dict:
    from precsim.config import to_config
    from precsim.engines import numpy as np_engine  # noqa: F401 - the CPU reference path
    from precsim.engines import torch as torch_engine
    from precsim.engines import triton as triton_engine
    from precsim.workload import make_workload

    def cfg(**m):
        return to_config({"model": {"heads": 4, **m}, "workload": {"kind": "seed_article"},
                          "schemes": {"c32": {"kind": "conventional", "fmt": "fp32"}},
                          "run": {"steps": steps, "progress": False, "seed": 7},
                          "metrics": {"window": 1024, "kl": False}})
    out = {}
    c = cfg()
    tri = triton_engine.run(c, "cuda", progress=False)
    cpu = torch_engine.run(c, "cpu", progress=False)
    fast = triton_engine.run(cfg(decay_exp="fast"), "cuda", progress=False)
    # float64 recurrence holding a float32 state, decays correctly rounded (independent loop)
    tr = make_workload(c).trace(0, steps)
    A = tr["A"]
    S64 = np.zeros((4, 64, 128))
    S32 = np.zeros((4, 64, 128), np.float32)
    err = np.zeros(steps)
    for t in range(steps):
        dt = tr["dt"][t]
        a = np.exp(dt * A)
        S64 = a[:, None, None] * S64 + (dt[:, None] * tr["x"][t])[:, :, None] * tr["B"][t][:, None]
        a32 = a.astype(np.float32)
        S32 = (a32[:, None, None] * S32 + (dt.astype(np.float32)[:, None] * tr["x"][t].astype(
            np.float32))[:, :, None] * tr["B"][t].astype(np.float32)[:, None]).astype(np.float32)
        y = (S64 * tr["C"][t][:, None]).sum(-1)
        y32 = (S32 * tr["C"][t].astype(np.float32)[:, None]).sum(-1)
        err[t] = np.linalg.norm(y32 - y) / np.linalg.norm(y)
    win = 1024
    ref = err.reshape(-1, win).mean(1)
    out["windows"] = [r["step"] for r in tri.rows]
    out["triton"] = [r["rel_err"] for r in tri.rows]
    out["torch_cpu"] = [r["rel_err"] for r in cpu.rows]
    out["triton_fast"] = [r["rel_err"] for r in fast.rows]
    out["oracle_f32_state"] = ref.tolist()
    out["triton_over_cpu_max"] = float(np.max(np.array(out["triton"]) / np.array(out["torch_cpu"])))
    out["triton_over_oracle_max"] = float(np.max(np.array(out["triton"]) / ref))
    out["cpu_over_oracle_max"] = float(np.max(np.array(out["torch_cpu"]) / ref))
    return out


def trace_run(out: Path, steps: int) -> dict:
    """The study from a 128-head trace file (``np.savez``, float32, per-head B/C as the schema
    says) on local disk: the engine's ``wall_s`` beside the time to read the file once."""
    from precsim.config import to_config
    from precsim.workload import make_workload

    c = to_config({"model": {"heads": 128, "head_dim": 64, "state_dim": 128, "groups": 8},
                   "workload": {"kind": "seed_article"}, "run": {"steps": steps},
                   "schemes": {"c": {"kind": "conventional", "fmt": "fp32"}}})
    tr = {k: v.astype(np.float32) for k, v in make_workload(c, "cuda").trace(0, steps).items()}
    path = Path("/tmp/precsim_trace.npz")
    np.savez(path, **tr)
    del tr
    t = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(1 << 26):
            pass
    read_s = time.perf_counter() - t
    r = whole(["workload=trace", f"workload.path={path}", f"run.steps={steps}"], out, "trace")
    r.update(file_gb=round(path.stat().st_size / 1e9, 3), read_s=round(read_s, 3),
             steps=steps)
    path.unlink()
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--loop-steps", type=int, default=256)
    ap.add_argument("--check-steps", type=int, default=16384)
    ap.add_argument("--trace-steps", type=int, default=8192)
    ap.add_argument("--no-fp32-check", action="store_true", help="skip part 3")
    a = ap.parse_args(argv)
    out = Path(a.out)
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    import triton

    res["triton"] = triton.__version__
    runs = [whole([], out, "cold"), whole([], out, "warm1"), whole([], out, "warm2"),
            whole([], out, "warm3"), whole(["run.steps=131072"], out, "131k"),
            whole(["run.steps=131072"], out, "131k_2")]
    res["whole"] = runs
    for r in runs:
        print(json.dumps(r), flush=True)
    res["trace"] = trace_run(out, a.trace_steps)
    print(json.dumps(res["trace"]), flush=True)
    sps = step_loop(a.loop_steps)
    res["step_loop_steps_per_s"] = sps
    res["step_loop_32k_s"] = 32768 / sps
    print(f"step loop: {sps:.1f} steps/s -> {32768 / sps:.1f} s for 32,768 steps", flush=True)
    if not a.no_fp32_check:
        res["fp32"] = fp32_check(a.check_steps)
        print(json.dumps({k: v for k, v in res["fp32"].items() if "max" in k}), flush=True)
    print("record:", record.write(out, "gpu_user_path", res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
