"""Study 10: error feedback for INT8 / FP8 SSM states (issue 30; vLLM RFC #55196).

Runs ``python -m precsim experiment=study_error_feedback`` as whole processes on the Qwen3.5 GDN
layer and the Nemotron-3-Super Mamba-2 layer and gathers, per (model, scheme), the last window's
error, KL, top-1 agreement, the mean top-1 over the run, the first flip, the state drift and the
bytes per step into one tidy CSV, plus a PNG (error against bytes) and run_info.json.

    python experiments/studies/study_error_feedback/run.py                    # CPU size (NOTES.md)
    python experiments/studies/study_error_feedback/run.py --gpu --out DIR    # 131,072 steps, cuda
    python experiments/studies/study_error_feedback/run.py --plot-only  # the PNG from results.csv
    python experiments/studies/study_error_feedback/run.py --workload seed_article  # long memory

The CPU size: 4 heads of each layer, 16,384 steps, 1 sequence (the GPU size: every head,
131,072 steps, 1 sequence).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = {"qwen35_gdn": ["model=qwen35_gdn"],
          "nemotron3_super": ["model=nemotron3_super"]}
CPU = {"heads": 4, "steps": 16384, "seqs": 1}
GPU = {"heads": None, "steps": 131072, "seqs": 1}
COLUMNS = ["model", "scheme", "label", "kind", "fmt", "rounding", "error_feedback", "steps",
           "rel_err_256", "rel_err", "kl", "top1", "mean_top1", "first_flip", "flipped",
           "state_drift",
           "bytes_per_step", "resid_bytes_per_step", "wall_s"]


def command(model: str, size: dict, out: Path, device: str, workload: str | None = None
            ) -> list[str]:
    """The ``python -m precsim`` command of one model at one size."""
    over = [*MODELS[model], *([f"workload={workload}"] if workload else []),
            f"run.steps={size['steps']}", f"run.seqs={size['seqs']}",
            f"run.device={device}", f"run.out_dir={out}", "run.progress=false",
            f"metrics.lengths=[256,{size['steps']}]", "run.checkpoint_s=0"]
    if size["heads"]:
        over.append(f"model.heads={size['heads']}")
        if model == "nemotron3_super":
            over.append("model.groups=1")
    return [sys.executable, "-m", "precsim", "experiment=study_error_feedback", *over]


def rows_of(model: str, run_dir: Path) -> list[dict]:
    """The tidy rows of one finished run directory (summary.json + metrics.csv)."""
    s = json.loads((run_dir / "summary.json").read_text())
    with open(run_dir / "metrics.csv") as f:
        met = list(csv.DictReader(f))
    out = []
    for name, info in s["schemes"].items():
        mine = [r for r in met if r["scheme"] == name]
        last = max(mine, key=lambda r: int(r["step"]))
        first = min(mine, key=lambda r: int(r["step"]))
        cost = s["cost"][name]
        top1 = [float(r["top1"]) for r in mine if r["top1"] not in ("", "nan")]
        out.append({
            "model": model, "scheme": name, "label": info["label"], "kind": info["kind"],
            "fmt": info["fmt"], "rounding": info["rounding"],
            "error_feedback": info.get("error_feedback") or "none", "steps": s["steps"],
            "rel_err_256": float(first["rel_err"]), "rel_err": float(last["rel_err"]),
            "kl": float(last["kl"] or "nan"),
            "top1": float(last["top1"] or "nan"),
            "mean_top1": sum(top1) / len(top1) if top1 else float("nan"),
            "first_flip": float(last["first_flip"] or "nan"),
            "flipped": last["flipped"], "state_drift": float(last["state_drift"] or "nan"),
            "bytes_per_step": cost["bytes_per_step"],
            "resid_bytes_per_step": cost.get("resid_read", 0) + cost.get("resid_write", 0),
            "wall_s": s["wall_s"]})
    return out


def run(size: dict, device: str, out_dir: Path, timeout: float | None = None,
        workload: str | None = None) -> list[dict]:
    """Both models as whole processes; returns the rows (and writes results[_workload].csv)."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in MODELS:
            d = Path(tmp) / model
            cmd = command(model, size, d, device, workload)
            print("$", " ".join(cmd[1:]), flush=True)
            t0 = time.perf_counter()
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            if p.returncode != 0:
                print(p.stdout[-2000:], p.stderr[-2000:], sep="\n", file=sys.stderr)
                raise SystemExit(f"{model}: exit {p.returncode}")
            print(f"  {model}: {time.perf_counter() - t0:.1f} s (process)", flush=True)
            rows += rows_of(model, d)
    write_csv(rows, out_dir / f"results{'_' + workload if workload else ''}.csv")
    return rows


def write_csv(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def table(rows: list[dict]) -> str:
    """A compact text table: one line per (model, scheme)."""
    lines = [f"{'model':24} {'scheme':26} {'err@256':>9} {'rel_err':>9} {'KL':>9} {'top1':>6} "
             f"{'mean top1':>9} "
             f"{'flip':>7} {'B/step/head':>12}"]
    for r in rows:
        lines.append(f"{r['model']:24} {r['label']:26} {r['rel_err_256']:9.3g} "
                     f"{r['rel_err']:9.3g} {r['kl']:9.3g} "
                     f"{r['top1']:6.4f} {r['mean_top1']:9.5f} {r['first_flip']:7.0f} "
                     f"{r['bytes_per_step']:12,.0f}")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    """rel_err against bytes per step, one panel per model (FP32 left out: ~1e-7);
    RTN / SR / EF / ReplaySSM marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.8), squeeze=False)
    for ax, m in zip(axes[0], models, strict=True):
        for r in (r for r in rows if r["model"] == m and r["fmt"] != "fp32"):
            ef = r["error_feedback"] != "none"
            mark = ("s" if r["kind"] != "conventional" else
                    "*" if ef else "^" if r["rounding"] == "sr" else "o")
            color = "C0" if r["fmt"].startswith("int8") else "C1" if r["fmt"].startswith("fp8") \
                else "k"
            ax.scatter(r["bytes_per_step"], r["rel_err"], marker=mark, s=70 if ef else 40,
                       color=color, facecolors=color if ef or r["kind"] != "conventional"
                       else "none")
            ax.annotate(r["label"], (r["bytes_per_step"], r["rel_err"]), fontsize=7,
                        xytext=(4, 2), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("bytes per decode step per head")
        ax.set_ylabel(f"rel_err at step {rows[0]['steps']:,}")
        ax.set_title(m)
        ax.grid(alpha=0.3, which="both")
    fig.suptitle("error feedback vs RTN / SR / ReplaySSM (o RTN, ^ SR, * EF, s ReplaySSM; "
                 "blue INT8, orange FP8 block 128, black 16-bit; FP32 off the chart)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def read_csv(path: Path) -> list[dict]:
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in COLUMNS[8:]:
            if k != "flipped":
                r[k] = float(r[k])
        r["steps"] = int(r["steps"])
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", action="store_true", help="131,072 steps, every head, on cuda")
    ap.add_argument("--out", type=Path, default=HERE, help="results directory (default: here)")
    ap.add_argument("--plot-only", action="store_true")
    ap.add_argument("--workload", help="workload preset (default: the preset's, synthetic)")
    a = ap.parse_args(argv)
    tag = f"_{a.workload}" if a.workload else ""
    if a.plot_only:
        plot(read_csv(a.out / f"results{tag}.csv"), a.out / f"error_vs_bytes{tag}.png")
        return
    size, device = (GPU, "cuda") if a.gpu else (CPU, "cpu")
    t0 = time.time()
    rows = run(size, device, a.out, workload=a.workload)
    print(table(rows))
    plot(rows, a.out / f"error_vs_bytes{tag}.png")
    info = {"command": "python experiments/studies/study_error_feedback/run.py"
            + (" --gpu" if a.gpu else "") + (f" --workload {a.workload}" if a.workload else ""),
            "size": size, "device": device, "machine": platform.node(),
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "run_s": round(time.time() - t0, 1),
            "processes": [" ".join(command(m, size, Path("OUT") / m, device, a.workload)[1:])
                          for m in MODELS]}
    (a.out / f"run_info{tag}.json").write_text(json.dumps(info, indent=1) + "\n")


if __name__ == "__main__":
    main()
