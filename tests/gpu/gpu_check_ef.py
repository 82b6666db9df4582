"""Error feedback on one GPU (issue 30): the Triton kernels against the torch engine on CUDA, then
study 10 at 131,072 steps as whole processes.

    python tests/gpu/gpu_check_ef.py OUT_DIR            # CUDA (one H200: ~2-4 min)
    python tests/gpu/gpu_check_ef.py OUT_DIR --smoke    # CPU: Triton's interpreter, tiny

1. ``check``: the study's schemes (INT8 / FP8 block 128 with RTN, SR, error feedback; ReplaySSM
   with SR or error feedback) on a 16-head Nemotron-shaped Mamba-2 layer (2,048 steps) run on the
   Triton and the torch engine on the same device: conventional states and residuals bit-equal;
   ReplaySSM's ``Q + E`` within the residual's rounding in the interpreter (reported only on
   CUDA, where the fold's ``tl.dot`` sums in another order than torch's matmul); every scheme's
   window rel_err within 2% of torch's (FP32: 50%), on that layer and on a 4-head
   Qwen3.5-shaped GDN layer.
2. ``study``: ``experiments/studies/study_error_feedback/run.py``'s processes at the GPU size
   (every head,
   131,072 steps, 1 sequence), on the long-memory ``seed_article`` inputs and then the synthetic
   ones, each under a time limit (``--limit``, 120 s) and none running past ``--budget`` (240 s
   after the start: a process that would is cut, the rest skipped, and the table says so): the
   whole script ends within ~4.5 min; a compact table.

3. ``engines``: ``experiment=engines`` (its error-feedback rows among the engines' formats,
   32,768 steps, the Nemotron-3-Super layer, 4 sequences) as one process.

Writes ``OUT_DIR/check_ef.csv``, ``OUT_DIR/study_ef.csv`` and ``OUT_DIR/engines_ef.csv`` (the
study's results.csv columns;
``python experiments/studies/study_error_feedback/run.py --plot-only --out DIR`` draws
its PNG after a
copy to ``DIR/results.csv``). Exit status 1 if a check fails.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _window_rows(fam, cfg, device, run_triton, run_torch) -> list[dict]:
    """Each scheme's largest relative difference of window rel_err, Triton against torch."""
    a = run_triton(cfg, device, progress=False)
    b = run_torch(cfg, device, progress=False)
    assert a.engine == "triton", a.info.get("triton_fallback")
    worst: dict = {}
    for ra, rb in zip(a.rows, b.rows, strict=True):
        d = abs(ra["rel_err"] / rb["rel_err"] - 1) if rb["rel_err"] > 0 else 0.0
        if rb["rel_err"] < 1e-5:  # FP32: the error is the summation order itself
            d *= 0.04
        worst[ra["scheme"]] = max(worst.get(ra["scheme"], 0.0), d)
    return [{"family": fam, "scheme": n, "check": "rel_err within 2% of torch (FP32 50%)",
             "value": v, "ok": v <= 0.02} for n, v in worst.items()]


def check(device: str, smoke: bool) -> list[dict]:
    """Part 1: Triton vs torch on ``device`` (rows of check_ef.csv)."""
    import yaml

    from precsim.config import to_config
    from precsim.engines.held import compare, held_states
    from precsim.engines.torch import run as run_torch
    from precsim.engines.triton import run as run_triton

    schemes = yaml.safe_load((ROOT / "conf/schemes/error_feedback.yaml").read_text())
    rows = []
    sizes = {"mamba2": (16, 64, 128, 2048), "gdn": (4, 128, 128, 1024)}
    for fam, (H, P, N, steps) in sizes.items():
        if smoke:
            H, P, N, steps = 2, 16, 128, 32
        cfg = to_config({"model": {"family": fam, "name": fam, "heads": H, "head_dim": P,
                                   "state_dim": N},
                         "schemes": schemes, "replay": {"buffer_len": 16},
                         "run": {"steps": steps, "device": device, "progress": False,
                                 "checkpoint_s": 0},
                         "metrics": {"window": min(256, steps), "lengths": [steps]}})
        t0 = time.perf_counter()
        if fam == "mamba2":
            c = compare(held_states("torch", cfg, device), held_states("triton", cfg, device),
                        cfg)
            for n, r in c.items():  # precsim.engines.held.compare: its "ok" rule
                conv = cfg.schemes[n].kind == "conventional"
                # ReplaySSM's fold: tl.dot on CUDA sums in another order than torch's matmul,
                # which moves block scales (ReplaySSM SR without a residual fails it too, on the
                # H200): the strict rule is gated in the interpreter, reported on CUDA, where the
                # windows' errors below are the gate (as for GDN)
                gated = conv or device == "cpu"
                rows.append({"family": fam, "scheme": n, "value": r["sum_dev"],
                             "check": "state and residual bits" if conv else
                             "Q+E within E's rounding" + ("" if gated else " (reported, not gated"
                                                          " on CUDA: the fold's sum order)"),
                             "ok": bool(r["ok"]) or not gated})
        rows += _window_rows(fam, cfg, device, run_triton, run_torch)
        print(f"check {fam}: {time.perf_counter() - t0:.1f} s", flush=True)
    return rows


def study(smoke: bool, limit_s: float, deadline: float):
    """Parts 2 and 3: the study's processes (synthetic, then long-memory seed_article inputs),
    then experiment=engines, each under ``limit_s`` and none started after ``deadline``
    (``time.perf_counter()``): (rows of study_ef.csv, rows of engines_ef.csv, the study's
    module)."""
    sys.path.insert(0, str(ROOT / "experiments/studies/study_error_feedback"))
    import run as st

    size = {"heads": 2, "steps": 512, "seqs": 1} if smoke else st.GPU
    device = "cpu" if smoke else "cuda"
    rows: dict[str, list] = {"study": [], "engines": []}
    tiny = ["model.heads=2", "model.groups=1", "run.steps=512", "metrics.window=256"]
    # long-memory inputs first (where the thread's collapse shows), then the synthetic ones
    jobs = [(m, w) for w in ("seed_article", None) for m in st.MODELS] + [("engines", None)]
    with tempfile.TemporaryDirectory() as tmp:
        for model, wl in jobs:
            tag = model + (f"+{wl}" if wl else "")
            d = Path(tmp) / tag
            if model == "engines":
                cmd = [sys.executable, "-m", "precsim", "experiment=engines",
                       f"run.device={device}", f"run.out_dir={d}", "run.progress=false",
                       "run.checkpoint_s=0", *(tiny if smoke else [])]
            else:
                cmd = st.command(model, size, d, device, wl)
            left = deadline - time.perf_counter()
            if left < 20:
                print(f"{tag}: skipped (the time budget is spent)", flush=True)
                continue
            t0 = time.perf_counter()
            try:
                p = subprocess.run(cmd, capture_output=True, text=True,
                                   timeout=min(limit_s, left))
                err = p.stderr[-1500:] if p.returncode else None
            except subprocess.TimeoutExpired:
                err = f"over {min(limit_s, left):.0f} s"
            wall = time.perf_counter() - t0
            if err:
                print(f"{tag}: FAILED ({err})", flush=True)
                continue
            print(f"{tag}: {wall:.1f} s (whole process)", flush=True)
            for r in st.rows_of(model if model != "engines" else "nemotron3_super", d):
                r["wall_s"] = round(wall, 1)  # the process, not only the engine
                r["model"] = tag if model != "engines" else r["model"]
                rows["engines" if model == "engines" else "study"].append(r)
    for k, v in rows.items():
        print(f"\n{k}:\n{st.table(v)}")
    return rows["study"], rows["engines"], st


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="directory for check_ef.csv and study_ef.csv")
    ap.add_argument("--smoke", action="store_true", help="CPU: Triton's interpreter, tiny sizes")
    ap.add_argument("--limit", type=float, default=120.0, help="seconds per process")
    ap.add_argument("--budget", type=float, default=240.0,
                    help="no process runs past this many seconds from the start (default 240)")
    ap.add_argument("--check-only", action="store_true", help="step 1 alone (check_ef.csv)")
    a = ap.parse_args(argv)
    if a.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    import torch

    device = "cuda" if torch.cuda.is_available() and not a.smoke else "cpu"
    if device == "cpu" and not a.smoke:
        print("no CUDA device: use --smoke on the CPU", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rows = check(device, a.smoke)
    with open(a.out / "check_ef.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["family", "scheme", "check", "value", "ok"])
        w.writeheader()
        w.writerows(rows)
    bad = [r for r in rows if not r["ok"]]
    print(f"check: {len(rows) - len(bad)}/{len(rows)} pass"
          + "".join(f"\n  FAIL {r['family']} {r['scheme']}: {r['check']} ({r['value']:.3g})"
                    for r in bad), flush=True)
    if a.check_only:
        return 1 if bad else 0
    srows, erows, st = study(a.smoke, a.limit, t0 + a.budget)
    st.write_csv(srows, a.out / "study_ef.csv")
    st.write_csv(erows, a.out / "engines_ef.csv")
    print(f"total {time.perf_counter() - t0:.0f} s -> {a.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
