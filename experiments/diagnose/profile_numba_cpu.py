"""Where the fused CPU engine's time goes (``run.engine=numba``), engine only, one thread.

The study of ``bench_cpu.py`` (``experiment=seed_table``: five schemes + the float64 truth,
``model.heads`` x 64 x 128, L = 16) on ``run.threads=1``, so that the phases add up:

* each compiled task (one head and one slot: the truth or a scheme), timed around every call;
  per (head, slot) the fastest of the run's windows, so that time slices lost to other processes
  on a shared machine drop out (the figures are what a quiet core gives);
* the host's phases from cProfile (the inputs: counter-based normals; the ReplaySSM buffer
  terms: torch einsums; the metrics: ``row_stats`` and, with ``metrics.kl=true``, the readout's
  matmuls and softmaxes), with the KL metric on and off;
* the NumPy loop (``run.engine=numpy``) on the same study, for the ratio.

    python experiments/diagnose/profile_numba_cpu.py [--heads 8] [--steps 8192] [--numpy-steps 1024]
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import os
import pstats
import time


def config(engine: str, heads: int, steps: int, extra: tuple = ()):
    from hydra import compose, initialize_config_module

    from precsim.cli import register_configs
    from precsim.config import to_config

    register_configs()
    with initialize_config_module(config_module="precsim.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "experiment=seed_table", f"model.heads={heads}", f"run.steps={steps}",
            f"run.engine={engine}", "run.progress=false", *extra])
    return to_config(cfg)


def timed(cfg, prof: cProfile.Profile | None = None) -> tuple[float, float, dict]:
    """Wall and CPU seconds of one in-process run, and its info."""
    from precsim.engines import run

    t, c = time.perf_counter(), time.process_time()
    if prof is not None:
        prof.enable()
    res = run(cfg, progress=False)
    if prof is not None:
        prof.disable()
    return time.perf_counter() - t, time.process_time() - c, res.info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--steps", type=int, default=8192)
    ap.add_argument("--numpy-steps", type=int, default=1024,
                    help="steps of the NumPy loop's run (its time scales with the steps)")
    a = ap.parse_args()
    from precsim.cli import keep_freed_memory

    keep_freed_memory()
    import precsim.engines.numba_host as host

    names = list(config("numba", a.heads, 256).schemes)
    labels = {None: "float64 truth"}
    calls: dict = collections.defaultdict(list)
    orig = host.task_function

    def timing(kernel, consts):  # every task call timed (host.run looks task_function up per run)
        fn = orig(kernel, consts)
        if kernel is None:
            return fn

        class Timed:
            def __call__(self, t, *args):
                s = time.perf_counter()
                fn(t, *args)
                calls[(consts, t)].append(time.perf_counter() - s)

            def __getattr__(self, k):
                return getattr(fn, k)

        return Timed()

    host.task_function = timing
    timed(config("numba", a.heads, 256, ("run.threads=1",)))  # compiled code loaded (or built)
    calls.clear()
    cfg = config("numba", a.heads, a.steps, ("run.threads=1", "metrics.kl=false"))
    from precsim.engines.numba import scheme_codes, scheme_consts

    for n in names:
        labels[scheme_consts(scheme_codes(cfg.schemes[n]))] = n
    wall, cpu, info = timed(cfg)
    host.task_function = orig
    per: dict = collections.defaultdict(float)
    windows = max(len(v) for v in calls.values())
    for (consts, _), v in calls.items():
        per[consts] += min(v) * windows
    hs = a.heads * a.steps
    ktot = sum(per.values())
    print(f"# {time.strftime('%Y-%m-%d %H:%M %Z')}  cpus={os.cpu_count()}  load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"# experiment=seed_table model.heads={a.heads} run.steps={a.steps} run.threads=1, "
          f"metrics.kl=false: {wall:.2f} s wall, {cpu:.2f} CPU-s, kernel {info['kernel_s']:.2f} s")
    print(f"\ncompiled tasks (fastest window per head and slot, x {windows} windows)")
    print(f"{'slot':<24}{'s':>8}{'us/head-step':>14}{'share':>8}")
    for consts, t in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"{labels.get(consts, str(consts)):<24}{t:>8.3f}{1e6 * t / hs:>14.2f}"
              f"{t / ktot:>8.0%}")
    print(f"{'all tasks':<24}{ktot:>8.3f}{1e6 * ktot / hs:>14.2f}")

    def phases(kl: bool) -> None:
        prof = cProfile.Profile()
        w, c, inf = timed(config("numba", a.heads, a.steps,
                                 ("run.threads=1", f"metrics.kl={str(kl).lower()}")), prof)
        st = pstats.Stats(prof).stats
        def cum(pred):
            return sum(v[3] for k, v in st.items() if pred(k))
        def tot(pred):
            return sum(v[2] for k, v in st.items() if pred(k))
        rows = {
            "compiled tasks (kernel)": inf["kernel_s"],
            "inputs (workload.normals)": cum(lambda k: k[2] == "normals"),
            "buffer terms (torch)": cum(lambda k: k[2] in ("_buffer_terms", "_gdn_terms")),
            "row_stats": cum(lambda k: k[2] == "row_stats"),
            "KL readout (metrics._reduce)": cum(lambda k: k[2] == "_reduce"),
            "  of which the two matmuls": tot(lambda k: "mkldnn_linear" in k[2] or k[2] == "logp"),
        }
        print(f"\nphases, metrics.kl={str(kl).lower()} (cProfile, one thread): {w:.2f} s wall, "
              f"{c:.2f} CPU-s")
        for k, v in rows.items():
            print(f"  {k:<30}{v:>8.3f} s{v / w:>7.0%}")

    phases(False)
    phases(True)
    nsteps = min(a.numpy_steps, a.steps)
    for kl in (True, False):
        wn, cn, _ = timed(config("numpy", a.heads, nsteps, (f"metrics.kl={str(kl).lower()}",)))
        print(f"\nthe NumPy loop, run.steps={nsteps}, metrics.kl={str(kl).lower()}: {wn:.2f} s "
              f"wall, {cn:.2f} CPU-s = {1e6 * cn / (a.heads * nsteps):.1f} CPU-us/head-step")


if __name__ == "__main__":
    main()
