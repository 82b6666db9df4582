"""Diagnosis (in-process under torch.profiler, labelled so; not a user's process): where a
``task_eval`` run of the recall study spends its time on one GPU. The study's own job for one
checkpoint (``experiments/recall/gpu_full.py``'s command: every scheme, three SR seeds),
fewer items and one length; a first run warms (Triton compile), the second is timed, the third
runs under the profiler.

    python experiments/diagnose/gpu_task_profile.py --out DIR
        [--ckpt experiments/recall/checkpoints/full_mamba2_seed0] [--length 8192] [--items 16]

Writes ``task_profile.json`` (wall, phases, device busy time, launches) and
``task_profile_ops.txt`` (top operators by device time and by CPU time).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def job_argv(ckpt: Path, length: int, items: int, device: str, work: Path) -> list[str]:
    """The recall study's overrides for ``ckpt`` at one length (gpu_full.py's job command)."""
    sys.path.insert(0, str(REPO / "experiments" / "recall"))
    import gpu_full as GF

    a = argparse.Namespace(tiny=False, sr_seeds=3, batch_tokens=1 << 21, chunk=4096,
                           device=device, items=items, work=work, tasks="mqar,passkey",
                           weights=",".join(GF.WEIGHTS), schemes=None, one_job=False,
                           tag=GF.parse_tag("full"))
    fam = "gdn" if "gdn" in ckpt.name else "mamba2"
    jobs = GF.study_jobs(a, {(fam, 0): ckpt.resolve()})
    cmd = jobs[0]["cmd"]
    argv = [c for c in cmd[3:] if not c.startswith(("task.lengths=", "run.out_dir=",
                                                     "run.progress="))]
    return argv + [f"task.lengths=[{length}]", "run.progress=false"]


def profile_cli(argv: list[str], out: Path, device: str, stem: str, runs: int = 2) -> dict:
    """``runs`` plain in-process runs of ``python -m precsim *argv`` (the first warms: Triton
    compile, caches), then one under torch.profiler. Writes ``<stem>.json`` (walls, the last
    plain run's ``timing_s`` and ``info.phases_s``, device busy time, launches) and
    ``<stem>_ops.txt`` (top operators by device time and by CPU time) into ``out``; returns
    the json's dict."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from precsim.cli import main as cli_main

    out.mkdir(parents=True, exist_ok=True)
    print("argv:", " ".join(argv), flush=True)
    walls = []
    for i in range(runs):
        t = time.perf_counter()
        rc = cli_main(argv + [f"run.out_dir={out / 'work' / f'run{i}'}"])
        walls.append(round(time.perf_counter() - t, 2))
        print(f"run {i}: rc={rc} {walls[-1]} s", flush=True)
    summ = json.loads((out / "work" / f"run{runs - 1}" / "summary.json").read_text())
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    t = time.perf_counter()
    with profile(activities=acts) as prof:
        cli_main(argv + [f"run.out_dir={out / 'work' / 'profiled'}"])
    prof_wall = time.perf_counter() - t
    ev = prof.key_averages()
    kern = [e for e in ev if e.device_type.name == "CUDA"]
    info = {"argv": argv, "gpu": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
            "walls_s": walls, "timing_s": summ.get("timing_s"),
            "phases_s": (summ.get("info") or {}).get("phases_s"),
            "profiled_wall_s": round(prof_wall, 2), "kernels": sum(e.count for e in kern),
            "device_busy_s": round(sum(e.self_device_time_total for e in kern) / 1e6, 3)}
    print(json.dumps(info, indent=1))
    gt = ev.table(sort_by="self_device_time_total", row_limit=30, max_name_column_width=60)
    ct = ev.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60)
    print(gt)
    print(ct)
    (out / f"{stem}.json").write_text(json.dumps(info, indent=1) + "\n")
    (out / f"{stem}_ops.txt").write_text(gt + "\n\n" + ct + "\n")
    return info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="/tmp/task_profile")
    ap.add_argument("--ckpt", type=Path,
                    default=REPO / "experiments/recall/checkpoints/full_mamba2_seed0")
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--items", type=int, default=16)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    out = Path(a.out)
    argv = job_argv(a.ckpt, a.length, a.items, a.device, out / "work")
    profile_cli(argv, out, a.device, "task_profile")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
