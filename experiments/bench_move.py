"""Kernels before and after the architecture move, same machine, same run (diagnosis).

Runs the seed_table study (128 heads, 32,768 steps, KL on) in-process on the engine of the
tree at ``--old`` (installed to a site folder) and on this tree, best of ``--repeat`` after a
warm-up each, and prints the kernels' GPU time (CUDA events around the launches).

    python experiments/bench_move.py --old-site /tmp/oldsite --out OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CODE = r'''
import json, sys
if {old}:  # the old tree's site folder, not this tree's editable install
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
{imp}
from precsim.config import to_config
S = {{"conventional_fp32": {{"kind": "conventional", "fmt": "fp32"}},
     "conventional_nvfp4_sr": {{"kind": "conventional", "fmt": "nvfp4", "rounding": "sr"}},
     "shared_nvfp4_sr": {{"kind": "shared", "fmt": "nvfp4", "rounding": "sr"}},
     "split_fp32_nvfp4": {{"kind": "split", "fmt": "fp32", "read_fmt": "nvfp4"}},
     "split_fp16sr_nvfp4": {{"kind": "split", "fmt": "fp16", "rounding": "sr",
                            "read_fmt": "nvfp4"}}}}
cfg = to_config({{"model": {{"family": "mamba2", "heads": 128, "head_dim": 64, "state_dim": 128,
                           "groups": 8}}, "workload": {{"kind": "seed_article"}}, "schemes": S,
                 "run": {{"steps": {steps}, "progress": False, "device": "cuda"}}}})
ks, walls = [], []
for i in range({repeat} + 1):
    r = {call}
    if i:
        ks.append(r.info["kernel_s"]); walls.append(r.wall_s)
print(json.dumps({{"kernel_s": ks, "wall_s": walls}}))
'''
OLD = ("from precsim.kernels import run_triton",
       "run_triton(cfg, 'cuda', progress=False, inputs='device')")
NEW = ("from precsim.engines.triton import run as run_triton",
       "run_triton(cfg, 'cuda', progress=False)")


def measure(which, env, steps, repeat):
    imp, call = OLD if which == "old" else NEW
    code = CODE.format(imp=imp, call=call, steps=steps, repeat=repeat, old=which == "old")
    # cwd elsewhere: ``python -c`` puts the cwd first on sys.path (this tree's precsim/)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd="/tmp")
    if p.returncode:
        return {"error": p.stderr.strip().splitlines()[-3:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old-site", required=True)
    ap.add_argument("--steps", type=int, default=32768)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args(argv)
    env_old = dict(os.environ, PYTHONPATH=a.old_site + os.pathsep + os.environ.get(
        "PYTHONPATH", ""))
    res = {}
    for _ in range(2):  # old, new, old, new: drift of the machine shows
        for which, env in (("old", env_old), ("new", dict(os.environ))):
            res.setdefault(which, []).append(measure(which, env, a.steps, a.repeat))
            print(which, json.dumps(res[which][-1]), flush=True)
    best = {w: min(k for r in rs if "kernel_s" in r for k in r["kernel_s"]) for w, rs in
            res.items() if any("kernel_s" in r for r in rs)}
    res["best_kernel_s"] = best
    if len(best) == 2:
        res["new_over_old"] = best["new"] / best["old"]
    print(json.dumps({k: v for k, v in res.items() if k not in ("old", "new")}), flush=True)
    with open(os.path.join(a.out, "bench_move.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
