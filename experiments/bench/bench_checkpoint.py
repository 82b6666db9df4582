"""What checkpoints cost: whole processes of one study with checkpoints off and forced often.

Each process runs ``python -m precsim experiment=split_nvfp4 run.steps=STEPS model.heads=HEADS``
(the 8-head 32K CPU study by default) into a new directory, alternating ``run.checkpoint_s=0``
(off) and ``run.checkpoint_s=FORCED`` (a checkpoint every FORCED seconds of engine time), and
reads back ``summary.json``: the engine's seconds (``wall_s``), the checkpoints' count, seconds
and size (``info.checkpoints`` / ``checkpoint_s`` / ``checkpoint_bytes``; the checkpoint is
written and then removed when the run completes). The cost at the default interval (120 s) is
the per-checkpoint seconds over 120 s.

    python experiments/bench/bench_checkpoint.py [--heads 8] [--steps 32768] [--forced 1]
        [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiments/bench: record.py
import record  # noqa: E402


def one(heads: int, steps: int, every: float, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as d:
        args = [sys.executable, "-m", "precsim", "experiment=split_nvfp4", f"run.steps={steps}",
                f"model.heads={heads}", "run.progress=false", "metrics.plot=false",
                f"run.checkpoint_s={every}", f"hydra.run.dir={d}/out", *extra]
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode:
            sys.exit(r.stderr[-2000:])
        s = json.loads(open(f"{d}/out/summary.json").read())
    info = s["info"]
    return {"engine_s": s["wall_s"], "n": info.get("checkpoints", 0),
            "ck_s": info.get("checkpoint_s", 0.0), "bytes": info.get("checkpoint_bytes", 0),
            "engine": s["engine"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--steps", type=int, default=32768)
    ap.add_argument("--forced", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/precsim_bench"),
                    help="directory of the record <bench>.jsonl (record.py)")
    ap.add_argument("extra", nargs="*", help="more overrides, e.g. run.engine=torch")
    a = ap.parse_args()
    one(a.heads, 1024, 0, a.extra)  # warm: numba's compile cache, the OS's file cache
    off, on = [], []
    for _ in range(a.repeats):
        off.append(one(a.heads, a.steps, 0, a.extra))
        on.append(one(a.heads, a.steps, a.forced, a.extra))
    e_off = statistics.median(r["engine_s"] for r in off)
    e_on = statistics.median(r["engine_s"] for r in on)
    per = statistics.median(r["ck_s"] / r["n"] for r in on if r["n"])
    size = max(r["bytes"] for r in on)
    n = statistics.median(r["n"] for r in on)
    print(f"{platform.node()} {os.cpu_count()} cores, {on[0]['engine']} engine, "
          f"{a.heads} heads x {a.steps:,} steps, medians of {a.repeats} processes each")
    print(f"engine s: checkpoints off {e_off:.2f}, every {a.forced:g} s {e_on:.2f} "
          f"({n:g} checkpoints, {100 * (e_on - e_off) / e_off:+.1f}%)")
    print(f"per checkpoint: {1e3 * per:.1f} ms, {size / 2**20:.2f} MiB (the last one); at the "
          f"default 120 s interval: {100 * per / 120:.3f}% of the engine time")
    print("runs:", json.dumps({"off": off, "on": on}))
    print("record:", record.write(a.out, "bench_checkpoint", {
        "heads": a.heads, "steps": a.steps, "forced_s": a.forced, "repeats": a.repeats,
        "extra": a.extra, "engine_s_off": e_off, "engine_s_on": e_on, "checkpoints": n,
        "per_checkpoint_s": per, "checkpoint_bytes": size, "off": off, "on": on}))


if __name__ == "__main__":
    main()
