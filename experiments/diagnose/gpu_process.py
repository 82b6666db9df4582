"""Diagnosis on a CUDA machine (labelled: not the headline benchmark): where the time of a whole
``python -m precsim experiment=seed_table model=nemotron3_super run.device=cuda`` process goes.

1. the installation: whether torch's modules have their bytecode (``__pycache__``) and whether
   it can be written (a missing cache makes every process compile torch's sources);
2. the floor: ``python -c pass``, ``import torch``, ``import torch`` + CUDA, twice each;
3. the user's command, first with an empty Triton cache, then warm (``--warm`` times): process
   seconds, the phases from summary.json (startup, setup, compile, kernels, metrics, files) and
   the exit tail (summary.json written -> process gone);
4. one warm process under ``-X importtime`` (the slowest top-level imports) and one under
   cProfile (cumulative top 45, ``OUT/process_profile.txt``);
5. in this process, after the CLI's warm-up: the engine's first run under cProfile
   (``OUT/engine_first_run.txt``) and a second run.

    python experiments/diagnose/gpu_process.py --out OUT_DIR [--warm 3] [extra overrides ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

CMD = [sys.executable, "-m", "precsim", "experiment=seed_table", "model=nemotron3_super",
       "run.device=cuda"]


def installation() -> dict:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    root = Path(spec.origin).parent
    tag = sys.implementation.cache_tag
    pyc = list(root.rglob(f"__pycache__/*.{tag}.pyc"))
    src = list(root.rglob("*.py"))
    return {"torch_dir": str(root), "py_files": len(src), "pyc_files": len(pyc),
            "pycache_writable": os.access(root / "__pycache__", os.W_OK)
            if (root / "__pycache__").exists() else os.access(root, os.W_OK),
            "PYTHONPYCACHEPREFIX": os.environ.get("PYTHONPYCACHEPREFIX"),
            "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE")}


def floor() -> dict:
    out = {}
    for name, code in (("python", "pass"), ("import torch", "import torch"),
                       ("torch + cuda init", "import torch; torch.zeros(1, device='cuda')")):
        ts = []
        for _ in range(2):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], capture_output=True, check=True)
            ts.append(round(time.perf_counter() - t, 3))
        out[name] = ts
    return out


def process(out: Path, tag: str, extra: list[str], prefix: list[str] | None = None) -> dict:
    d = out / f"run_{tag}"
    t = time.perf_counter()
    p = subprocess.run([*(prefix or [sys.executable]), *CMD[1:], *extra, f"run.out_dir={d}"],
                       capture_output=True, text=True)
    end = time.time()
    wall = time.perf_counter() - t
    if p.returncode:
        return {"tag": tag, "error": p.stderr.strip().splitlines()[-3:]}
    s = json.loads((d / "summary.json").read_text())
    r = {"tag": tag, "process_s": round(wall, 3), "wall_s": round(s.get("wall_s", -1), 3),
         "phases": s.get("info", {}).get("phases_s"), "kernel_s": s.get("info", {}).get("kernel_s"),
         "exit_tail_s": round(end - (d / "summary.json").stat().st_mtime, 3)}
    r["stderr"] = p.stderr if prefix else ""
    shutil.rmtree(d, ignore_errors=True)
    return r


def importtime(text: str, top: int = 20) -> list:
    rows = []
    for line in text.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if m and len(m.group(3)) <= 1:  # top-level imports
            rows.append((int(m.group(2)) / 1e6, m.group(4)))
    return [f"{s:.3f} {n}" for s, n in sorted(rows, reverse=True)[:top]]


def engine_first_run(out: Path, extra: list[str]) -> dict:
    """In one process, after the CLI's warm-up (torch, CUDA, cuBLAS, Triton's key): the first
    engine run under cProfile (where its one-off costs are), then a second run, untimed by the
    profiler, for comparison."""
    import cProfile
    import io
    import pstats

    from precsim.compose import compose_config, register_configs
    from precsim.engines import run
    from precsim.process import join_warm_up, warm_up

    over = [*CMD[3:], *extra, "run.progress=false"]
    warm_up(over)
    register_configs()
    c = compose_config(over)
    join_warm_up()
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    r1 = run(c, progress=False)
    prof.disable()
    first = time.perf_counter() - t
    t = time.perf_counter()
    r2 = run(c, progress=False)
    second = time.perf_counter() - t
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s)
    st.sort_stats("tottime").print_stats(60)
    st.sort_stats("cumulative").print_stats(80)
    st.sort_stats("cumulative").print_stats(r"precsim|kernels|triton/runtime", 60)
    (out / "engine_first_run.txt").write_text(s.getvalue())
    return {"first_s": round(first, 3), "first_phases": r1.info.get("phases_s"),
            "second_s": round(second, 3), "second_phases": r2.info.get("phases_s"),
            "kernel_s": [r1.info.get("kernel_s"), r2.info.get("kernel_s")]}


VARIANT = """
import gc, json, sys, time
from precsim.compose import compose_config, register_configs
from precsim.process import join_warm_up, warm_up
from precsim.engines import triton
over = json.loads(sys.argv[1])
warm_up(over)
register_configs()
c = compose_config(over)
join_warm_up()
gc.freeze()
t = time.perf_counter()
opts = json.loads(sys.argv[2])
r = triton.run(c, "cuda", progress=False, **triton.settings(**opts))
print(json.dumps({**opts, "run_s": round(time.perf_counter() - t, 3),
                  "wall_s": round(r.wall_s, 3), "phases": r.info["phases_s"],
                  "kernel_s": round(r.info["kernel_s"], 3),
                  "final": {x["scheme"]: [x["rel_err"], x.get("kl"), x.get("state_drift")]
                            for x in r.rows if x["step"] == r.steps}}))
"""


def variants(extra: list[str], values: list[dict], repeats: int = 2) -> list:
    """The engine's first run in fresh processes (after the CLI's warm-up) per set of
    ``Options`` fields."""
    over = [*CMD[3:], *extra, "run.progress=false"]
    rows = []
    for _ in range(repeats):
        for k in values:
            p = subprocess.run([sys.executable, "-c", VARIANT, json.dumps(over), json.dumps(k)],
                               capture_output=True, text=True)
            rows.append(json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0
                        else {**k, "error": p.stderr.strip().splitlines()[-3:]})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--warm", type=int, default=3)
    ap.add_argument("--variants", default="", help="e.g. 'inflight=5,metrics_lag=1;"
                    "inflight=32': the engine's first run in fresh processes per set of "
                    "Options fields, then exit")
    ap.add_argument("--engine-only", action="store_true",
                    help="only part 5 (the engine's first run under cProfile), then exit")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.engine_only:
        r = engine_first_run(out, a.extra)
        print(json.dumps(r, indent=1))
        return 0
    if a.variants:
        sets = [{k: int(v) for k, v in (kv.split("=") for kv in spec.split(",") if kv)}
                for spec in a.variants.split(";")]
        rows = variants(a.extra, sets)
        (out / "gpu_process_variants.json").write_text(json.dumps(rows, indent=1))
        return 0
    rec: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "command": " ".join(["python -m precsim", *CMD[3:], *a.extra]),
                 "installation": installation(), "floor": floor()}
    print(json.dumps(rec, indent=1), flush=True)
    runs = [process(out, "cold", a.extra)]
    runs += [process(out, f"warm{i}", a.extra) for i in range(1, a.warm + 1)]
    for r in runs:
        print(json.dumps(r), flush=True)
    rec["runs"] = runs
    imp = process(out, "importtime", a.extra, prefix=[sys.executable, "-X", "importtime"])
    rec["importtime_top"] = importtime(imp.pop("stderr", ""))
    prof = out / "process.prof"
    r = process(out, "cprofile", a.extra, prefix=[sys.executable, "-m", "cProfile", "-o",
                                                  str(prof)])
    r.pop("stderr", None)
    rec["cprofile_run"] = r
    if prof.exists():
        import io
        import pstats

        s = io.StringIO()
        pstats.Stats(str(prof), stream=s).sort_stats("cumulative").print_stats(45)
        (out / "process_profile.txt").write_text(s.getvalue())
        prof.unlink()
    rec["engine_first_run"] = engine_first_run(out, a.extra)
    print(json.dumps({k: rec[k] for k in ("importtime_top", "cprofile_run", "engine_first_run")},
                     indent=1))
    (out / "gpu_process.json").write_text(json.dumps(rec, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
