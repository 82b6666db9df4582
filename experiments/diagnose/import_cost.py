"""Diagnosis (labelled so; not a user's process): what a model run's imports cost, by top-level
package, and which packages register torch custom operators at import (issue 44: on the GPU
image, importing torch, transformers and a model class took 11-16 s of a Nemotron-H-width
run's 11.6 s "load"; cProfile put 7.2 s on registering 128 torch custom operators, from a
package it did not name, and 2.9 s on scikit-learn, which transformers' generation utilities
import; experiments/bench/bench_models.md).

    python experiments/diagnose/import_cost.py [CHECKPOINT] [--out DIR] [--repeat N] [--also M,..]

Each measurement is a fresh ``python -X importtime`` process that imports torch, transformers,
``precsim.models.run`` (and ``--also``'s modules) and (with CHECKPOINT) the checkpoint's model
class, as ``load_model`` does, with ``torch.library``'s registration entry points wrapped to
count and time, per calling package, the operators defined (``Library.define``, where
``custom_op``, ``triton_op`` and ``library.define`` end; one that imports more is timed with
it).
The first process compiles what has no bytecode yet; with ``--repeat 2`` (the default) the
second shows a warm run (where the packages' folders are not writable, only with
``PYTHONPYCACHEPREFIX`` set to a writable one). Printed: per process the total, the top-level
packages by import time (self times summed: a package's share, wherever it was imported
from), and the custom-operator registrations by package. ``--out DIR``: one record
(``experiments/bench/record.py``'s format) in ``DIR/import_cost.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # record.py
import record  # noqa: E402

CHILD = r"""import collections, json, sys, time, traceback
t0 = time.perf_counter()
import torch
ops, secs, depth = collections.Counter(), collections.Counter(), [0]

def who():
    for fr in reversed(traceback.extract_stack()[:-2]):
        f = fr.filename.replace("\\", "/")
        if "/torch/" in f or "/importlib/" in f or f.startswith("<"):
            continue
        if "site-packages/" in f:
            return f.split("site-packages/")[-1].split("/")[0].removesuffix(".py")
        return "/".join(f.split("/")[-2:])  # (outside site-packages: the file itself)
    return "torch"

def wrap(owner, name):
    orig = getattr(owner, name, None)
    if orig is None:
        return
    def counted(*a, **k):
        if depth[0]:  # (a definition inside one: counted with it)
            return orig(*a, **k)
        t = time.perf_counter()
        depth[0] += 1
        try:
            return orig(*a, **k)
        finally:
            depth[0] -= 1
            w = who()
            ops[w] += 1
            secs[w] += time.perf_counter() - t
    setattr(owner, name, counted)

wrap(torch.library.Library, "define")  # (custom_op, triton_op and library.define end here)
t1 = time.perf_counter()
import transformers
import importlib
import precsim.models.run  # noqa: F401
for mod in filter(None, sys.argv[2].split(",")):  # --also
    importlib.import_module(mod)
t2 = time.perf_counter()
if sys.argv[1]:
    arch = json.load(open(sys.argv[1] + "/config.json"))["architectures"][0]
    getattr(transformers, arch)
t3 = time.perf_counter()
row = {"torch_s": round(t1 - t0, 3),
       "transformers_precsim_s": round(t2 - t1, 3), "model_class_s": round(t3 - t2, 3),
       "total_s": round(t3 - t0, 3), "custom_ops": dict(ops.most_common()),
       "custom_ops_s": {k: round(v, 3) for k, v in secs.most_common()}}
if sys.argv[3]:  # --load DEVICE: then the model's load, its registrations apart
    ops.clear(), secs.clear()
    from precsim.models.load import load_model
    load_model(sys.argv[1], sys.argv[3])
    if sys.argv[3].startswith("cuda"):
        torch.cuda.synchronize()
    row.update(load_s=round(time.perf_counter() - t3, 3),
               custom_ops_load=dict(ops.most_common()),
               custom_ops_load_s={k: round(v, 3) for k, v in secs.most_common()})
print("IMPORT_COST " + json.dumps(row))
"""

LINE = re.compile(r"import time:\s+(\d+)\s+\|\s+(\d+)\s+\|\s?( *)(\S+)")


def by_package(stderr: str) -> Counter:
    """Self microseconds of ``-X importtime``'s lines, summed per top-level package."""
    out: Counter = Counter()
    for ln in stderr.splitlines():
        m = LINE.match(ln)
        if m:
            out[m.group(4).split(".")[0]] += int(m.group(1))
    return out


def measure(checkpoint: str | None, also: str = "", load: str = "") -> dict:
    cmd = [sys.executable, "-X", "importtime", "-c", CHILD, checkpoint or "", also, load]
    r = subprocess.run(cmd, capture_output=True, text=True)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("IMPORT_COST ")]
    if r.returncode or not line:
        raise SystemExit(f"import_cost.py: the child failed (exit {r.returncode}): "
                         f"{(r.stderr.strip().splitlines() or ['?'])[-1]}")
    row = json.loads(line[0].split(" ", 1)[1])
    pk = by_package(r.stderr)
    row["packages_s"] = {k: round(v / 1e6, 3) for k, v in pk.most_common(12)}
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint", nargs="?")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--also", default="",
                    help="more modules to import after precsim's (comma list), e.g. a plug-in")
    ap.add_argument("--load", default="", metavar="DEVICE",
                    help="then load the checkpoint (precsim's load_model) on DEVICE (cpu, cuda) "
                         "and count the operators registered during the load apart")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.load and not a.checkpoint:
        raise SystemExit("import_cost.py: --load needs a CHECKPOINT; allowed: --load DEVICE "
                         "after a transformers checkpoint directory")
    if a.repeat < 1:
        raise SystemExit(f"import_cost.py: --repeat={a.repeat}; allowed: an integer >= 1")
    if a.checkpoint and not (Path(a.checkpoint) / "config.json").is_file():
        raise SystemExit(f"import_cost.py: {a.checkpoint!r} holds no config.json; allowed: a "
                         "transformers checkpoint directory")
    rows = []
    for i in range(a.repeat):
        row = measure(a.checkpoint, a.also, a.load)
        rows.append(row)
        print(f"process {i + 1}: {row['total_s']:.2f} s (torch {row['torch_s']:.2f}, "
              f"transformers + precsim {row['transformers_precsim_s']:.2f}, model class "
              f"{row['model_class_s']:.2f})")
        print("  packages (self import time, s): " + ", ".join(
            f"{k} {v:.2f}" for k, v in row["packages_s"].items()))
        ops = row["custom_ops"]
        secs = row["custom_ops_s"]
        print(f"  torch custom operators registered: {sum(ops.values())} in "
              f"{sum(secs.values()):.2f} s" + (" (" + ", ".join(
                  f"{k} {v} in {secs.get(k, 0):.2f} s" for k, v in ops.items()) + ")"
                  if ops else ""))
        if "load_s" in row:
            lo, ls = row["custom_ops_load"], row["custom_ops_load_s"]
            print(f"  then the load on {a.load}: {row['load_s']:.2f} s; custom operators "
                  f"registered during it: {sum(lo.values())} in {sum(ls.values()):.2f} s" + (
                      " (" + ", ".join(f"{k} {v} in {ls.get(k, 0):.2f} s"
                                       for k, v in lo.items()) + ")" if lo else ""))
    if a.out:
        record.write(a.out, "import_cost", {"rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
