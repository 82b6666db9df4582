"""Diagnosis on a CUDA machine (labelled: not the headline benchmark): what the Triton engine's
first run in a fresh process pays beyond its GPU time, for the user's command
``python -m precsim experiment=seed_table model=nemotron3_super run.device=cuda``.

1. one CLI process fills Triton's cache;
2. fresh processes (the CLI's warm-up, one composition, then the engine): the first run and a
   second one in the same process, each with its phases, the GPU time of its step launches and
   the GPU's idle time between them (``info["gpu_idle_s"]``); per variant of the environment;
3. one first run under cProfile: the top functions by own time (``OUT/first_run_profile.txt``).

    python experiments/diagnose/gpu_first_run.py --out OUT_DIR [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CMD = [sys.executable, "-m", "precsim", "experiment=seed_table", "model=nemotron3_super",
       "run.device=cuda"]

CHILD = """
import cProfile, gc, io, json, pstats, sys, time
t_proc = time.perf_counter()
from precsim.compose import compose_config, register_configs
from precsim.process import join_warm_up, warm_up
from precsim.engines import triton
over = json.loads(sys.argv[1])
warm_up(over)
register_configs()
c = compose_config(over)
t_w = time.perf_counter()
join_warm_up()
ready = time.perf_counter()
gc.freeze()
prof = cProfile.Profile() if sys.argv[2] == "profile" else None
rows = []
for k in range(2):
    if prof is not None and k == 0:
        prof.enable()
    t = time.perf_counter()
    r = triton.run(c, "cuda", progress=False, **triton.settings(**json.loads(sys.argv[3])))
    run_s = time.perf_counter() - t
    if prof is not None and k == 0:
        prof.disable()
    rows.append({"run_s": round(run_s, 3), "wall_s": round(r.wall_s, 3),
                 "phases": r.info["phases_s"], "kernel_s": round(r.info["kernel_s"], 3),
                 "gpu_idle_s": r.info["gpu_idle_s"],
                 "final": {x["scheme"]: [x["rel_err"], x.get("kl"), x.get("state_drift")]
                           for x in r.rows if x["step"] == r.steps}})
out = {"startup_s": round(ready - t_proc, 3), "join_wait_s": round(ready - t_w, 3),
       "runs": rows}
if prof is not None:
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s)
    st.sort_stats("tottime").print_stats(50)
    st.sort_stats("cumulative").print_stats(r"precsim|triton/runtime|triton/compiler", 50)
    out["profile"] = s.getvalue()
print(json.dumps(out))
"""


def child(over: list[str], mode: str, env: dict, opts: dict | None = None) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(over), mode,
                        json.dumps(opts or {})],
                       capture_output=True, text=True, env={**os.environ, **env})
    if p.returncode:
        return {"error": p.stderr.strip().splitlines()[-5:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--variants", default="default;CUDA_MODULE_LOADING=EAGER",
                    help="environment variants, ';'-separated, each 'K=V,K=V' or 'default'; "
                    "'opt:' + JSON: engine options (e.g. 'opt:{\"metrics_thread\": false}')")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    subprocess.run([*CMD, f"hydra.run.dir={out}/cold", "run.progress=false"], check=True,
                   capture_output=True)
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": " ".join(CMD[1:]),
           "cold_process_s": round(time.perf_counter() - t, 2), "variants": {}}
    over = [*CMD[3:], "run.progress=false"]
    for v in args.variants.split(";"):
        opts = json.loads(v[4:]) if v.startswith("opt:") else {}
        env = {} if v == "default" or opts else dict(kv.split("=", 1) for kv in v.split(","))
        rows = [child(over, "plain", env, opts) for _ in range(args.repeats)]
        res["variants"][v] = rows
        print(v, json.dumps(rows), flush=True)
    prof = child(over, "profile", {})
    (out / "first_run_profile.txt").write_text(prof.pop("profile", ""))
    res["profiled"] = prof
    print("profiled", json.dumps(prof), flush=True)
    (out / "gpu_first_run.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
