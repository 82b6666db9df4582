"""What the floor and generation cost (issue 39): whole ``python -m precsim`` processes, side by
side in one run, on a Mamba-2 1.3B-shape checkpoint (random bf16 weights), ``split_nvfp4``.

    python experiments/bench/bench_floor_gen.py --old DIR [--docs 64 --prompt 4096 --new 256]

Rows (each the wall time of a whole process, start-up, load and files included):
1. ``model_kl`` over ``docs x (prompt + new)`` tokens by the code before the floor (``--old``: a
   tree of that commit, installed into its own folder): the whole-model run a user had;
2. the same run by this tree (the floor: the FP32 state and the noise run beside the schemes);
3. ``model.mode=generate``: ``docs`` prompts of ``prompt`` tokens, ``new`` greedy tokens each.
Ratios: (2)/(1) = what the floor adds; (3)/(2) = generation against a whole-model run over the
same tokens. Writes ``bench_floor_gen.json`` into ``--out`` after every process.
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

sys.path.insert(0, str(Path(__file__).parent))
import record  # noqa: E402  (experiments/bench/record.py)
from bench_models import build  # noqa: E402

PY = sys.executable


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", required=True, help="site folder holding the pre-floor precsim")
    ap.add_argument("--out", default="/tmp/bench_floor_gen")
    ap.add_argument("--work", default="/tmp/bench_floor_gen_work")
    ap.add_argument("--docs", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=4096)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--chunk", type=int, default=1024, help="model.chunk (64 x 4,352 tokens "
                    "of the 1.3B shape in one pass ran out of the H200's memory, before the "
                    "floor too)")
    ap.add_argument("--skip", default="", help="comma-separated rows to skip: old,new,gen")
    a = ap.parse_args()
    out, work = Path(a.out), Path(a.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    import torch

    info = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "host": platform.node(), "gpu": torch.cuda.get_device_name(0),
            "torch": torch.__version__, "docs": a.docs, "prompt": a.prompt, "new": a.new,
            "chunk": a.chunk}
    ck = work / "mamba2_1b3"
    t0 = time.perf_counter()
    build("mamba2_1b3", ck, "cuda")
    info["build_s"] = round(time.perf_counter() - t0, 1)
    N = a.prompt + a.new
    np.save(work / "ids.npy", np.random.default_rng(0).integers(0, 50288, (a.docs, N)))
    rows: list = []
    skip = set(filter(None, a.skip.split(",")))

    def run(label, extra, env=None):
        d = work / f"{label}_{time.time_ns()}"
        cmd = [PY, "-m", "precsim", "experiment=model_kl", f"model.path={ck}",
               f"model.ids={work / 'ids.npy'}", f"run.seqs={a.docs}", "run.device=cuda",
               "hydra.job.chdir=false", "run.progress=false", f"hydra.run.dir={d}",
               f"model.chunk={a.chunk}", *extra]
        t = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=1500, cwd=work,
                           env={**os.environ, **(env or {})})
        wall = time.perf_counter() - t
        s = d / "summary.json"
        j = json.loads(s.read_text()) if s.is_file() else {}
        rows.append({"what": label, "wall_s": round(wall, 2), "rc": p.returncode,
                     "cmd": " ".join(cmd[1:]), "phases_s": j.get("info", {}).get("phases_s"),
                     "model_s": j.get("info", {}).get("model_s"),
                     # documents a prompt batch, and (generation) written together
                     "doc_batch": j.get("info", {}).get("doc_batch"),
                     "write_docs": j.get("info", {}).get("write_docs"),
                     "tail": (p.stdout + p.stderr).strip().splitlines()[-12:]})
        print(f"{label:<40} {wall:8.1f} s rc={p.returncode} phases={rows[-1]['phases_s']}",
              flush=True)
        if p.returncode:
            print("\n".join(rows[-1]["tail"]), flush=True)
        record.write_partial(out, "bench_floor_gen", {"info": info, "rows": rows})  # if cut short
        return wall if p.returncode == 0 else float("nan")

    w = {}
    if "old" not in skip:
        env = {"PYTHONPATH": a.old + os.pathsep + os.environ.get("PYTHONPATH", "")}
        w["old"] = run("model_kl before the floor", [f"run.steps={N}", "metrics.window=256"],
                       env)
    if "new" not in skip:
        w["new"] = run("model_kl with the floor", [f"run.steps={N}", "metrics.window=256"])
    if "gen" not in skip:
        w["gen"] = run("generate", [f"run.steps={a.prompt}", "metrics.window=256",
                                    "model.mode=generate", f"model.new_tokens={a.new}"])
    if "old" in w and "new" in w:
        info["floor_adds"] = round(w["new"] / w["old"] - 1, 3)
    if "new" in w and "gen" in w:
        info["generate_over_whole_model"] = round(w["gen"] / w["new"], 3)
    print("record:", record.write(out, "bench_floor_gen", {"info": info, "rows": rows}))
    print(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
