"""CPU engines vs the plain NumPy per-step loop, measured side by side in one run.

First, the card's command as a user runs it, ``python -m precsim experiment=split_nvfp4`` (the
fused numba engine, ``run.engine=auto``), as whole processes: the first process after an install
(``NUMBA_CACHE_DIR`` a new, empty folder: it compiles) and the warm ones after it (the compiled
code loaded from that cache), ``--repeats`` times, beside the same command on the NumPy loop
(``run.engine=numpy``). ``--card-only`` stops there.

Both sides run the same study — ``experiment=seed_table`` (five schemes + float64 truth,
seed_article workload, L = 16) — as whole processes (``python -m precsim ...``: interpreter start,
imports, Hydra, simulation, files and plot), then in-process (simulation only) so the ratio of the
engines themselves is visible too. The NumPy side is ``run.engine=numpy``
(``precsim/engines/numpy.py``): one token at a time, a buffer list per scheme, output-only
evaluation by
a loop over the buffer, as in the article.

The fused numba engine (``run.engine=numba``, ``precsim/engines/numba.py``) is timed beside them:
engine only at ``--steps`` against both, and as a whole process at ``--whole-steps`` (32,768)
against the NumPy loop, its compile cache warm (a warm-up process fills it first); the first
process's compile time is measured with an empty cache (``NUMBA_CACHE_DIR`` set to a new folder).

    python experiments/bench/bench_cpu.py [--heads 8] [--steps 4096] [--repeats 1] [--numba-only]
                                          [--card-only]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiments/bench: record.py
import record  # noqa: E402

FLOOR = 256  # steps of the short runs (compile, cache, process floor): one metrics window
CARD = ["experiment=split_nvfp4"]  # the card's command (README, Quick start)


def command(overrides: list[str], env: dict | None = None, cpu: list | None = None) -> float:
    """Wall seconds of one whole ``python -m precsim`` process (a new run directory); its CPU
    seconds (user + system, its helper processes included) appended to ``cpu``."""
    with tempfile.TemporaryDirectory() as d:
        args = [sys.executable, "-m", "precsim", *overrides, f"hydra.run.dir={d}/out"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        r = subprocess.run(args, capture_output=True, text=True,
                           env={**os.environ, **(env or {})})
        wall = time.perf_counter() - t
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if r.returncode != 0:
            raise SystemExit(f"{' '.join(overrides)} failed:\n{r.stderr[-2000:]}")
        if cpu is not None:
            cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        return wall


def whole_process(engine: str, heads: int, steps: int, env: dict | None = None) -> float:
    return command(["experiment=seed_table", f"model.heads={heads}", f"run.steps={steps}",
                    f"run.engine={engine}", "run.progress=false"], env)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def card_section(repeats: int) -> None:
    """The card's command: first process (empty numba cache), warm processes, the NumPy loop."""
    print(f"\nthe card's command, python -m precsim {' '.join(CARD)}, whole processes "
          f"({load()})")
    print(f"{'rep':>4}{'first process s':>17}{'warm s':>16}{'CPU s: first':>14}{'warm':>14}")
    firsts, warms = [], []
    for rep in range(repeats):
        cpu: list[float] = []
        with tempfile.TemporaryDirectory() as cache:
            env = {"NUMBA_CACHE_DIR": cache}
            first = command(CARD, env, cpu)
            warm = [command(CARD, env, cpu) for _ in range(2)]
        firsts.append(first)
        warms += warm
        print(f"{rep:>4}{first:>17.2f}{' / '.join(f'{w:.2f}' for w in warm):>16}"
              f"{cpu[0]:>14.2f}{' / '.join(f'{c:.2f}' for c in cpu[1:]):>14}")
    t_np = command([*CARD, "run.engine=numpy"])
    print(f"first process {min(firsts):.1f}-{max(firsts):.1f} s, warm {min(warms):.1f}-"
          f"{max(warms):.1f} s; the NumPy loop (run.engine=numpy), one process: {t_np:.1f} s "
          f"({t_np / min(warms):.1f}x the warm process) ({load()})")


def in_process(engine: str, heads: int, steps: int, only: str | None = None,
               extra: tuple = ()) -> tuple[float, dict]:
    from hydra import compose, initialize_config_module

    from precsim.cli import register_configs
    from precsim.config import to_config
    from precsim.engines import run

    register_configs()
    with initialize_config_module(config_module="precsim.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "experiment=seed_table", f"model.heads={heads}", f"run.steps={steps}",
            f"run.engine={engine}", "run.progress=false", *extra])
    c = to_config(cfg)
    if only is not None:  # one scheme beside the truth: where the time goes
        c.schemes = {only: c.schemes[only]}
    t = time.perf_counter()
    res = run(c, progress=False)
    wall = time.perf_counter() - t
    last = {r["scheme"]: r["rel_err"] for r in res.rows if r["step"] == res.rows[-1]["step"]}
    return wall, last


def numba_section(heads: int, steps: int, whole_steps: int, skip_numpy_whole: bool,
                  repeats: int = 1) -> None:
    """Engine only: numba vs torch vs the NumPy loop (best of ``repeats``; with and without the
    KL metric, which every engine computes the same way on the host); whole process: numba vs
    the NumPy loop."""
    with tempfile.TemporaryDirectory() as cache:
        t_cold = whole_process("numba", heads, FLOOR, {"NUMBA_CACHE_DIR": cache})
        t_warm = whole_process("numba", heads, FLOOR, {"NUMBA_CACHE_DIR": cache})
    whole_process("numba", heads, FLOOR)  # fill the default cache for what follows
    print(f"\nnumba compile: first process (empty cache) {t_cold:.2f} s, cache warm "
          f"{t_warm:.2f} s (run.steps={FLOOR}): compile ~{t_cold - t_warm:.1f} s, once per install")
    in_process("numba", heads, FLOOR)  # this process: load the compiled code once
    def best(engine, extra=()):
        runs = [in_process(engine, heads, steps, extra=extra) for _ in range(repeats)]
        return min(r[0] for r in runs), runs[0][1]

    t_nb, e_nb = best("numba")
    t_pt, e_pt = best("torch")
    t_np, e_np = best("numpy")
    nokl = ("metrics.kl=false",)
    k_nb, k_pt, k_np = best("numba", nokl)[0], best("torch", nokl)[0], best("numpy", nokl)[0]
    t_n1, k_n1 = best("numba", ("run.threads=1",))[0], best("numba", ("run.threads=1", *nokl))[0]
    hs = heads * steps
    print(f"\nengine only, run.steps={steps}, model.heads={heads} (best of {repeats})")
    print(f"{'engine':<14}{'s':>9}{'us/head-step':>14}{'numba speed-up':>16}"
          f"{'s, kl=false':>13}{'speed-up':>10}")
    for name, t, k in (("numpy loop", t_np, k_np), ("torch", t_pt, k_pt), ("numba", t_nb, k_nb)):
        print(f"{name:<14}{t:>9.2f}{1e6 * t / hs:>14.1f}{t / t_nb:>15.2f}x"
              f"{k:>13.2f}{k / k_nb:>9.2f}x")
    print(f"numba, run.threads=1 (one core): {t_n1:.2f} s, kl=false {k_n1:.2f} s; vs the NumPy "
          f"loop {t_np / t_n1:.2f}x ({k_np / k_n1:.2f}x), vs torch {t_pt / t_n1:.2f}x "
          f"({k_pt / k_n1:.2f}x)")
    print(f"(every engine at its default run.threads=auto above: numba on {os.cpu_count()} "
          "threads, torch ops on one; the KL metric is the same host computation in every "
          "engine)")
    print("final-window rel_err (numba | torch | numpy):")
    for k in e_nb:
        print(f"  {k:<24}{e_nb[k]:>12.4g} | {e_pt[k]:.4g} | {e_np[k]:.4g}")
    w_nb = whole_process("numba", heads, whole_steps)
    print(f"\nwhole process, run.steps={whole_steps} (numba cache warm)")
    print(f"  numba       {w_nb:>9.2f} s")
    w_pt = whole_process("torch", heads, whole_steps)
    print(f"  torch       {w_pt:>9.2f} s   numba speed-up {w_pt / w_nb:.2f}x")
    if not skip_numpy_whole:
        w_np = whole_process("numpy", heads, whole_steps)
        print(f"  numpy loop  {w_np:>9.2f} s   speed-up {w_np / w_nb:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--whole-steps", type=int, default=32768)
    ap.add_argument("--numba-only", action="store_true",
                    help="only the numba section (engine only and whole process)")
    ap.add_argument("--card-only", action="store_true",
                    help="only the card's command (first and warm processes, the NumPy loop)")
    ap.add_argument("--skip-numpy-whole", action="store_true",
                    help="leave out the NumPy loop's whole process at --whole-steps (minutes)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/precsim_bench"),
                    help="directory of the record <bench>.jsonl (record.py)")
    a = ap.parse_args()
    with record.transcript(a.out, "bench_cpu", vars(a)):  # what it prints, as one record
        _run(a)


def _run(a) -> None:
    from precsim.process import keep_freed_memory

    keep_freed_memory()  # as the command line does: the in-process rows run under its malloc
    import numba
    import numpy as np
    import torch

    print(f"# {time.strftime('%Y-%m-%d %H:%M %Z')}  {platform.platform()}  {cpu_model()}  "
          f"cpus={os.cpu_count()}  python {platform.python_version()}  numpy {np.__version__}  "
          f"torch {torch.__version__} (threads {torch.get_num_threads()})  numba "
          f"{numba.__version__}")
    card_section(a.repeats)
    if a.card_only:
        return
    print(f"# study: experiment=seed_table, model.heads={a.heads} (x64x128), "
          f"run.steps={a.steps}, 5 schemes + float64 truth")
    if a.numba_only:
        numba_section(a.heads, a.steps, a.whole_steps, a.skip_numpy_whole, a.repeats)
        return
    rows = []
    for label, fn in (("whole process", whole_process), ("engine only", None)):
        for rep in range(a.repeats):
            if fn is not None:
                t_np = fn("numpy", a.heads, a.steps)
                t_pt = fn("torch", a.heads, a.steps)
            else:
                t_np, e_np = in_process("numpy", a.heads, a.steps)
                t_pt, e_pt = in_process("torch", a.heads, a.steps)
            rows.append((label, rep, t_np, t_pt))
    print(f"\n{'what':<15}{'rep':>4}{'numpy loop s':>14}{'torch engine s':>16}{'speed-up':>10}"
          f"{'us/head-step np':>17}{'us/head-step pt':>17}")
    hs = a.heads * a.steps
    for label, rep, t_np, t_pt in rows:
        print(f"{label:<15}{rep:>4}{t_np:>14.2f}{t_pt:>16.2f}{t_np / t_pt:>9.2f}x"
              f"{1e6 * t_np / hs:>17.1f}{1e6 * t_pt / hs:>17.1f}")
    # the part of a whole process that no engine can speed up: interpreter start, imports
    # (torch alone ~2.6 s here), Hydra composition, writing files and the plot
    f_np, f_pt = whole_process("numpy", a.heads, FLOOR), whole_process("torch", a.heads, FLOOR)
    whole_np = rows[0][2]
    print(f"{'process floor':<15}{'':>4}{f_np:>14.2f}{f_pt:>16.2f}{'':>10}   (run.steps={FLOOR})")
    print(f"ceiling of the whole-process speed-up with an engine that took no time at all: "
          f"{whole_np:.2f} / {f_pt:.2f} = {whole_np / f_pt:.2f}x")
    print("\nfinal-window rel_err (numpy engine | torch engine):")
    for k in e_np:
        print(f"  {k:<24}{e_np[k]:>12.4g} | {e_pt[k]:.4g}")
    steps = min(a.steps, 1024)
    print(f"\nwhere the time goes: one scheme + the float64 truth, engine only, {steps} steps")
    print(f"{'scheme':<26}{'numpy s':>10}{'torch s':>10}{'speed-up':>10}")
    for k in e_np:
        t_np, _ = in_process("numpy", a.heads, steps, only=k)
        t_pt, _ = in_process("torch", a.heads, steps, only=k)
        print(f"{k:<26}{t_np:>10.2f}{t_pt:>10.2f}{t_np / t_pt:>9.2f}x")
    numba_section(a.heads, a.steps, a.whole_steps, a.skip_numpy_whole, a.repeats)


if __name__ == "__main__":
    main()
