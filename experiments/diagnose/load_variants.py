"""Diagnosis (labelled so; not a user's process): where a checkpoint's load goes, each variant
in a fresh process after the page cache is warm (issue 44: a 5 GB Nemotron-H-width checkpoint
took 15.7 s of "load" on an H200, against 2-3 s to read 5 GB).

    python experiments/diagnose/load_variants.py CHECKPOINT [--device cuda] [--out DIR]

Variants: ``cpu_then_device`` (``from_pretrained`` on the CPU, then ``.to(device)``: what
``precsim.models.load.load_model`` did before 977f65b) and ``device_map``
(``from_pretrained(device_map={"": device})``: the weights straight to the device, its way
since). Each row: the import of transformers and the model class, ``from_pretrained``, the
move, seconds each (the device synchronised). With ``--out``, one record
(``experiments/bench/record.py``'s format) in ``DIR/load_variants.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # record.py
import record  # noqa: E402

ONE = r"""import json, sys, time
t0 = time.perf_counter()
import torch, transformers as tf
path, device, variant = sys.argv[1:4]
arch = json.load(open(path + "/config.json"))["architectures"][0]
cls = getattr(tf, arch)
t1 = time.perf_counter()
if device == "cuda":
    torch.cuda.init(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t2 = time.perf_counter()
if variant == "device_map":
    m = cls.from_pretrained(path, device_map={"": device})
    t3 = time.perf_counter()
else:
    m = cls.from_pretrained(path)
    t3 = time.perf_counter()
    m = m.to(device)
if device == "cuda":
    torch.cuda.synchronize()
t4 = time.perf_counter()
print(json.dumps({"variant": variant, "import_s": round(t1 - t0, 3),
                  "cuda_init_s": round(t2 - t1, 3), "from_pretrained_s": round(t3 - t2, 3),
                  "move_s": round(t4 - t3, 3), "total_s": round(t4 - t0, 3),
                  "device": str(next(m.parameters()).device),
                  "dtype": str(next(m.parameters()).dtype)}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out")
    a = ap.parse_args()
    rows = []
    # the first process warms the page cache; each variant then runs twice, alternating
    for variant in ("cpu_then_device", "cpu_then_device", "device_map", "cpu_then_device",
                    "device_map"):
        r = subprocess.run([sys.executable, "-c", ONE, a.checkpoint, a.device, variant],
                           capture_output=True, text=True, timeout=600)
        line = (r.stdout.strip().splitlines() or [""])[-1]
        try:
            rows.append(json.loads(line))
        except ValueError:
            rows.append({"variant": variant, "rc": r.returncode, "err": r.stderr[-600:]})
        print(rows[-1], flush=True)
    if a.out:
        print("record:", record.write(a.out, "load_variants", {
            "checkpoint": a.checkpoint, "rows": rows[1:], "warm_up": rows[0]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
