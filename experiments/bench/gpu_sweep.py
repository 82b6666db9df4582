"""Issue 29's figures on one GPU machine, as users run them: whole ``python -m precsim``
processes (sweeps with ``-m``), each timed from launch to exit, with the Triton cache empty
("fresh machine") or as the previous row left it ("warm"); then the kernels' speed in-process
(diagnosis: the 32K and 131K seed-table study, engine time, runtime-argument kernels beside
per-configuration ones).

    python experiments/bench/gpu_sweep.py --out OUT_DIR           # on the GPU machine
    python experiments/bench/gpu_sweep.py --out OUT_DIR --smoke   # any machine: tiny sizes

Every process gets ``run.out_dir`` / ``hydra.sweep.dir`` under a fresh folder, so no row finds
an earlier row's results. ``PRECSIM_KERNEL_CODES=runtime`` selects the runtime-argument
kernels for the comparison row (``precsim.engines.triton.Options.runtime_codes``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiments/bench: record.py
import record  # noqa: E402

PM = [sys.executable, "-m", "precsim"]


def whole(args: list[str], out: Path, tag: str, cache: Path, env: dict | None = None) -> dict:
    """One process: wall seconds, exit code, and the last stderr line on failure."""
    d = out / tag
    sweep = "-m" in args
    dirs = [f"hydra.sweep.dir={d}"] if sweep else [f"run.out_dir={d}"]
    e = {**os.environ, "TRITON_CACHE_DIR": str(cache), **(env or {})}
    t = time.perf_counter()
    p = subprocess.run([*PM, *args, *dirs], capture_output=True, text=True, env=e)
    wall = time.perf_counter() - t
    row = {"tag": tag, "cmd": "python -m precsim " + " ".join(args), "process_s": round(wall, 2),
           "rc": p.returncode}
    if p.returncode:
        row["stderr"] = p.stderr.strip().splitlines()[-3:]
    elif not sweep:
        s = json.loads((d / "summary.json").read_text())
        row["engine_wall_s"] = round(s.get("wall_s", -1), 3)
        row["compile_s"] = (s.get("info", {}).get("phases_s") or {}).get("compile")
    else:
        jobs = sorted(d.glob("*/summary.json"), key=lambda f: int(f.parent.name.split("_")[0]))
        row["jobs"] = len(jobs)
        row["job_engine_s"] = [round(json.loads(f.read_text()).get("wall_s", -1), 2)
                               for f in jobs]
    return row


def kernels(steps: int, smoke: bool, runtime: bool, repeat: int = 2,
            lanes: bool | None = None) -> dict:
    """Engine seconds of the seed-table study (diagnosis: in-process, after a warm-up run).
    ``lanes``: each scheme in a launch of its own (``engines.triton.Diagnosis.lanes``; None: the
    engine's default)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_gpu import study

    dev = "cuda" if not smoke else "cpu"
    kw = dict(runtime_codes=runtime, lanes=lanes)
    study(256, dev, smoke, **kw)  # compile
    study(steps, dev, smoke, **kw)  # warm at size
    best = min(study(steps, dev, smoke, **kw)[0] for _ in range(repeat))
    return {"steps": steps, "runtime_codes": runtime, "lanes": lanes, "engine_s": round(best, 3)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on any device")
    ap.add_argument("--only", default="", help="comma list of row groups: sweep,single,kernels "
                    "(buffer_len: that sweep alone; runtime: a runtime-codes single row too)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    groups = set(a.only.split(",")) if a.only else {"sweep", "single", "kernels"}
    if "buffer_len" in groups:  # the buffer-length sweep alone, first and warm
        groups.add("sweep")
    work = Path(tempfile.mkdtemp(prefix="precsim-sweep-bench-"))
    dev = "cpu" if a.smoke else "cuda"
    # (smoke: a metrics window that fits the 64 steps, else every process stops at validation)
    small = ["run.steps=64", "model.heads=8", "metrics.window=32"] if a.smoke else []
    rows: list[dict] = []

    def add(row):
        rows.append(row)
        print(json.dumps(row), flush=True)

    if "kernels" in groups:
        for steps in ((256, 512) if a.smoke else (32768, 131072)):
            for rt, lanes in ((True, None), (False, False), (False, True)):
                add({"tag": "kernels", **kernels(steps, a.smoke, rt, lanes=lanes)})
    if "sweep" in groups:
        c = work / "cache_sweep"
        ps = ["-m", "experiment=precision_sweep", f"run.device={dev}", *small]
        if "buffer_len" not in groups:
            add(whole(ps, work, "precision_sweep_fresh", c))
            add(whole(ps, work, "precision_sweep_warm", c))
        bl = ["-m", "experiment=study_buffer_len", f"run.device={dev}",
              "run.steps=" + ("64" if a.smoke else "32768"), *small[1:]]
        add(whole(bl, work, "buffer_len_first", c))
        add(whole(bl, work, "buffer_len_warm", c))
    if "single" in groups:
        add(whole(["experiment=split_nvfp4", f"run.device={dev}", *small], work,
                  "split_nvfp4_fresh", work / "cache_split"))
        add(whole(["experiment=split_nvfp4", f"run.device={dev}", *small], work,
                  "split_nvfp4_fresh_one_launch", work / "cache_split_one",
                  {"PRECSIM_KERNEL_LANES": "0"}))
        add(whole(["experiment=engines", f"run.device={dev}", *small], work, "engines_fresh",
                  work / "cache_engines"))
        if "runtime" in groups:  # diagnosis: the runtime-code kernels on a single run
            add(whole(["experiment=engines", f"run.device={dev}", *small], work,
                      "engines_fresh_runtime_codes", work / "cache_engines_rt",
                      {"PRECSIM_KERNEL_CODES": "runtime"}))
        bad = whole(["workload=trace", "workload.path=/no/such/dir", f"run.device={dev}"], work,
                    "bad_trace_path", work / "cache_split")
        add({**bad, "ok": bad["rc"] == 2})
    import torch

    card = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    res = {"card": card, "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="minutes"),
           "rows": rows}
    rec = record.write(out, "gpu_sweep", res)
    print(f"\n{'row':<28} {'process s':>10} {'engine s':>10}  command")
    for r in rows:
        sec = r.get("engine_s", r.get("process_s"))
        print(f"{r['tag']:<28} {sec:>10} {r.get('engine_wall_s', ''):>10}  {r.get('cmd', '')}")
    failed = [r["tag"] for r in rows if r.get("rc", 0) != (2 if r["tag"] == "bad_trace_path"
                                                              else 0)]
    print(f"record: {rec}")
    if failed:
        print(f"FAILED (exit status): {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
