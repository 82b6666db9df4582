"""Throughput of ``precsim.formats.quantize`` on NumPy vs torch (CPU), side by side.

For every registered format and both roundings (RNE, SR), fake-quantize one float32 SSM state of
shape (128, 64, 128) = (heads, head_dim, d_state), i.e. 2^20 elements, and report the median over
several repeats in Melem/s for NumPy and for torch on the CPU, and the torch/NumPy ratio.

    python experiments/bench/bench_formats.py [--repeats 15] [--shape 128 64 128] [--threads 1]

torch runs with one intra-op thread by default, like NumPy (per-core comparison; ``--threads 0``
keeps torch's own default). Not a test: numbers depend on the machine and on its load (printed in
the header); on a shared machine torch's multi-threaded pool suffers most from oversubscription.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import precsim.formats as pf
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiments/bench: record.py
import record  # noqa: E402


def median_seconds(xs, name: str, rounding: str, repeats: int) -> list[float]:
    """Median time of ``quantize(x, name, rounding)`` for each x in ``xs``, the backends timed
    alternately within every repeat so that drifting machine load hits them alike."""
    for x in xs:  # warm-up (allocations, lazy imports, torch dispatch caches)
        pf.quantize(x, name, rounding, seed=1)
    times = [[] for _ in xs]
    for _ in range(repeats):
        for x, t in zip(xs, times, strict=True):
            t0 = time.perf_counter()
            pf.quantize(x, name, rounding, seed=1)
            t.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def machine() -> str:
    proc = platform.processor() or platform.machine()
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                         "")
    except OSError:
        pass
    load = ""
    if hasattr(os, "getloadavg"):
        load = ", load avg {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    return f"{proc} {model}".strip() + f", {os.cpu_count()} CPUs{load}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=int, nargs="+", default=[128, 64, 128])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (default 1, like NumPy; 0 = torch's default)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/precsim_bench"),
                    help="directory of the record <bench>.jsonl (record.py)")
    ap.add_argument("--formats", nargs="*", default=None, help="default: every registered format")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    shape = tuple(args.shape)
    n = int(np.prod(shape))
    x_np = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    x_t = torch.from_numpy(x_np.copy())

    print(f"# machine: {machine()}")
    print(f"# numpy {np.__version__}, torch {torch.__version__} "
          f"({torch.get_num_threads()} intra-op threads), python {platform.python_version()}")
    print(f"# float32 state {shape} = {n} elements; median of {args.repeats} repeats after one "
          f"warm-up, NumPy and torch timed alternately; Melem/s = 10^6 elements per second")
    print()
    print(f"| {'format':<13} | {'rounding':<8} | {'numpy Melem/s':>13} | {'torch Melem/s':>13} "
          f"| {'torch/numpy':>11} |")
    print(f"|{'-' * 15}|{'-' * 10}|{'-' * 15}|{'-' * 15}|{'-' * 13}|")
    rows = []
    for name in args.formats or pf.names():
        for rounding in pf.ROUNDINGS:
            t_np, t_t = median_seconds((x_np, x_t), name, rounding, args.repeats)
            copy = pf.get(name).kind == "identity" or name == "fp32"  # of a float32 input
            label = f"{name} (copy)" if copy else name
            print(f"| {label:<13} | {rounding:<8} | {n / t_np / 1e6:>13.1f} "
                  f"| {n / t_t / 1e6:>13.1f} | {t_np / t_t:>11.2f} |")
            rows.append({"format": label, "rounding": rounding, "numpy_melem_s": n / t_np / 1e6,
                         "torch_melem_s": n / t_t / 1e6})
    print("record:", record.write(args.out, "bench_formats", {
        "shape": list(shape), "repeats": args.repeats, "threads": torch.get_num_threads(),
        "numpy": np.__version__, "rows": rows}))


if __name__ == "__main__":
    main()
