"""What task accuracy costs against a whole-model run over the same tokens: whole
``python -m precsim`` processes, side by side in one run, on a Mamba-2 1.3B-shape checkpoint
(random bf16 weights), ``schemes=split_nvfp4``.

    python experiments/bench/bench_tasks.py                      # ~4 min on one H200
    python experiments/bench/bench_tasks.py --items 500 --ctx 2048 --passkey-len 32768 \\
        --passkey-items 100                                      # the issue's full sizes
    python experiments/bench/bench_tasks.py --cpu --tiny         # a tiny Mamba-2 on the CPU

Rows (each the wall time of a whole process, start-up, load and files included; run in the
order 2, 1, 3, so that the bounded model_kl part comes first in a call with a time limit):
1. ``experiment=task_eval`` over ``--items`` multiple-choice items (a ``--ctx``-token context and
   4 choices of ``--choice-len`` tokens each, token ids drawn from ``--seed``, written as JSONL):
   ``items x 4`` rows (token-sequences) of ``ctx + choice-len`` tokens (task_eval reads each
   context once for its 4 rows since 2026-12-07);
2. ``experiment=model_kl`` over the same rows as documents (the same token ids, ``run.steps =
   ctx + choice-len``; ``--kl-rows``: the first N of them, for its pace), ``--kl-seqs`` rows a
   process (a model_kl run holds all its documents x
   groups in each forward pass; the Triton scans make a pass at least 2,048 positions), the
   processes' seconds summed;
3. ``experiment=task_eval task.name=passkey`` at ``--passkey-len`` tokens, ``--passkey-items``
   items (generative: one row each).
Figures: token-sequences per second of (1) and (2), by the whole process and by the model's own
seconds (``model_s``), and their ratio (target: task_eval >= 0.8 of model_kl); the passkey run's
time. Writes ``bench_tasks.json`` into ``--out`` after every process.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import record  # noqa: E402  (experiments/bench/record.py)
from bench_models import build  # noqa: E402

PY = sys.executable
CHOICES = 4
TINY = {"items": 4, "ctx": 32, "choice_len": 2, "passkey_len": 128, "passkey_items": 2,
        "chunk": 64, "kl_seqs": 8}


def write_items(path: Path, items: int, ctx: int, choice_len: int, vocab: int, seed: int):
    """``items`` multiple-choice items of token ids (a ``ctx``-token context, 4 distinct choices of
    ``choice_len`` tokens) as JSONL, and their rows (each choice after its context) as an array
    ``(items x 4, ctx + choice_len)``, item-major."""
    rng = np.random.default_rng(seed)
    rows, lines = [], []
    for _ in range(items):
        c = rng.integers(0, vocab, ctx)
        ch = rng.integers(0, vocab, (CHOICES, choice_len))
        ch[:, 0] = rng.choice(vocab, CHOICES, replace=False)  # distinct choices
        lines.append(json.dumps({"context": c.tolist(), "choices": ch.tolist(),
                                 "gold": int(rng.integers(CHOICES))}))
        rows += [np.concatenate([c, x]) for x in ch]
    path.write_text("\n".join(lines) + "\n")
    return np.stack(rows).astype(np.int64)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="/tmp/bench_tasks")
    ap.add_argument("--work", default="/tmp/bench_tasks_work")
    ap.add_argument("--cpu", action="store_true", help="run on the CPU (run.device=cpu)")
    ap.add_argument("--tiny", action="store_true", help="a tiny Mamba-2 (vocab 256) and tiny "
                    f"sizes ({', '.join(f'{k}={v}' for k, v in TINY.items())}) unless given")
    ap.add_argument("--items", type=int, default=None, help="multiple-choice items (64)")
    ap.add_argument("--ctx", type=int, default=None, help="context tokens per item (1,024)")
    ap.add_argument("--choice-len", type=int, default=None, help="tokens per choice (4)")
    ap.add_argument("--passkey-len", type=int, default=None, help="passkey prompt tokens (8,192)")
    ap.add_argument("--passkey-items", type=int, default=None, help="passkey items (16)")
    ap.add_argument("--chunk", type=int, default=None, help="model_kl's model.chunk (256; the "
                    "Triton scans round it up to 2,048 positions: rows of up to 2K tokens go in "
                    "one pass)")
    ap.add_argument("--kl-seqs", type=int, default=None, help="model_kl rows (documents) per "
                    "process (128: 128 x 1,028 tokens x 5 groups in one pass; 64 x 2,048 x 6 "
                    "ran in bench_floor_gen, one pass of 64 x 4,352 did not fit the H200); more "
                    "rows: several processes, their seconds summed")
    ap.add_argument("--kl-rows", type=int, default=None,
                    help="model_kl over the first N rows only (default: all): its pace, rows "
                         "per second, from a part of the task's rows")
    ap.add_argument("--task-procs", type=int, default=1, help="task_eval in N processes of "
                    "items/N items each (their seconds summed; each pays its start-up)")
    ap.add_argument("--passkey-procs", type=int, default=1, help="passkey in N processes of "
                    "passkey-items/N items each (task.seed = seed + i), seconds summed")
    ap.add_argument("--prior", type=Path, nargs="*", default=[],
                    help="records (bench_tasks.jsonl / .partial.jsonl) of earlier calls with "
                         "the same sizes: their finished processes count as done, not rerun "
                         "(one measurement over several device calls)")
    ap.add_argument("--batch-tokens", type=int, default=None,
                    help="task.batch_tokens of the task runs (default: the config's)")
    ap.add_argument("--passkey-chunk", type=int, default=None,
                    help="the passkey runs' model.chunk (default: the config's, 32,768): more "
                         "rows a pass at a smaller chunk")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip", default="", help="comma-separated rows to skip: task,kl,passkey")
    a = ap.parse_args()
    full = {"items": 64, "ctx": 1024, "choice_len": 4, "passkey_len": 8192,
            "passkey_items": 16, "chunk": 256, "kl_seqs": 128}
    for k, v in (TINY if a.tiny else full).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    out, work = Path(a.out), Path(a.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    import torch

    dev = "cpu" if a.cpu else "cuda"
    kind = "tiny_mamba2" if a.tiny else "mamba2_1b3"
    vocab = 256 if a.tiny else 50288
    info = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "host": platform.node(), "device": dev,
            "gpu": torch.cuda.get_device_name(0) if dev == "cuda" else None,
            "torch": torch.__version__, "model": kind, "items": a.items, "ctx": a.ctx,
            "choices": CHOICES, "choice_len": a.choice_len, "rows": a.items * CHOICES,
            "row_tokens": a.ctx + a.choice_len, "passkey_len": a.passkey_len,
            "passkey_items": a.passkey_items, "chunk": a.chunk, "kl_seqs": a.kl_seqs,
            "batch_tokens": a.batch_tokens, "seed": a.seed, "passkey_chunk": a.passkey_chunk,
            "schemes": "split_nvfp4"}
    ck = work / f"{kind}_{dev}"
    t0 = time.perf_counter()
    build(kind, ck, dev)
    info["build_s"] = round(time.perf_counter() - t0, 1)
    N = a.ctx + a.choice_len
    tag = f"{a.items}x{a.ctx}+{a.choice_len}_s{a.seed}"
    ids = write_items(work / f"mc_{tag}.jsonl", a.items, a.ctx, a.choice_len, vocab, a.seed)
    rows: list = []
    skip = set(filter(None, a.skip.split(",")))
    hyd = ["hydra.job.chdir=false", "run.progress=false", f"run.device={dev}",
           "schemes=split_nvfp4", "metrics.plot=false"]
    bt = [f"task.batch_tokens={a.batch_tokens}"] if a.batch_tokens else []

    def save():  # after every process: a run cut short keeps what it measured
        record.write_partial(out, "bench_tasks", {"info": info, "rows": rows})

    done = {}  # label -> an earlier call's finished row (--prior)
    same = ("model", "device", "items", "ctx", "choice_len", "passkey_len", "passkey_items",
            "chunk", "kl_seqs", "batch_tokens", "seed", "passkey_chunk")
    for f in a.prior:
        for rec in record.read(f):
            old = rec["figures"]["info"]
            if any(old.get(k) != info[k] for k in same):
                continue  # (other sizes: not this measurement)
            for r in rec["figures"]["rows"]:
                if r["rc"] == 0 and r["model_s"]:
                    done[r["what"]] = {**r, "prior": str(f)}

    def run(label, args):
        if label in done:
            rows.append(done[label])
            print(f"{label:<34} {done[label]['wall_s']:8.1f} s (from {done[label]['prior']})",
                  flush=True)
            save()
            return done[label]["wall_s"], done[label]["model_s"]
        d = work / f"{label}_{time.time_ns()}"
        cmd = [PY, "-m", "precsim", *args, f"model.path={ck}", *hyd, f"hydra.run.dir={d}"]
        t = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=work)
        wall = time.perf_counter() - t
        s = d / "summary.json"
        j = json.loads(s.read_text()) if s.is_file() else {}
        model_s = (j.get("timing_s") or {}).get("model_s") or (j.get("info") or {}).get(
            "model_s")
        rows.append({"what": label, "wall_s": round(wall, 2), "rc": p.returncode,
                     "model_s": model_s, "phases_s": (j.get("info") or {}).get("phases_s"),
                     "timing_s": j.get("timing_s"), "cmd": " ".join(cmd[1:]),
                     "tail": (p.stdout + p.stderr).strip().splitlines()[-12:]})
        print(f"{label:<34} {wall:8.1f} s rc={p.returncode} model_s={model_s}", flush=True)
        if p.returncode:
            print("\n".join(rows[-1]["tail"]), flush=True)
        save()
        # (the recorded, rounded seconds: a later call's --prior sums the same numbers)
        return (rows[-1]["wall_s"], model_s) if p.returncode == 0 and model_s else None

    def total(parts):  # (wall, model seconds) of processes, summed; None if one failed
        return tuple(map(sum, zip(*parts, strict=True))) if all(parts) else None

    R = a.items * CHOICES
    Rk = min(R, a.kl_rows or R)  # model_kl's rows
    info["kl_rows"] = Rk
    w = {}
    if "kl" not in skip:  # --kl-seqs rows a process (one pass over them: see --kl-seqs)
        parts = []
        for i in range(0, Rk, a.kl_seqs):
            part = ids[i:min(Rk, i + a.kl_seqs)]
            f = work / f"rows_{tag}_{i}.npy"
            np.save(f, part)
            parts.append(run(f"model_kl rows {i}..{i + len(part) - 1}",
                             ["experiment=model_kl", f"model.ids={f}", f"run.seqs={len(part)}",
                              f"run.steps={N}", f"metrics.window={min(N, 256)}",
                              f"model.chunk={a.chunk}"]))
        info["kl_processes"] = len(parts)
        w["kl"] = total(parts)
    if "task" not in skip:  # --task-procs processes of consecutive items
        lines = (work / f"mc_{tag}.jsonl").read_text().splitlines(keepends=True)
        n = max(1, a.task_procs)
        parts = []
        for i in range(n):
            f = work / f"mc_{tag}_part{i}of{n}.jsonl"
            f.write_text("".join(lines[i * len(lines) // n:(i + 1) * len(lines) // n]))
            parts.append(run("task_eval" if n == 1 else f"task_eval part {i + 1}/{n}",
                             ["experiment=task_eval", f"task.path={f}", *bt]))
        info["task_processes"] = n
        w["task"] = total(parts)
    for k, n in (("task", R), ("kl", Rk)):
        if w.get(k):
            info[f"{k}_rows_per_s"] = round(n / w[k][0], 3)
            info[f"{k}_rows_per_model_s"] = round(n / w[k][1], 3)
    if w.get("task") and w.get("kl"):  # rows/s ratios, whole runs and model seconds
        info["task_over_kl"] = round(info["task_rows_per_s"] / info["kl_rows_per_s"], 3)
        info["task_over_kl_model_s"] = round(info["task_rows_per_model_s"]
                                             / info["kl_rows_per_model_s"], 3)
        info["target_0.8_met"] = info["task_over_kl"] >= 0.8
    if "passkey" not in skip:  # --passkey-procs processes, each its own items' seed
        n = max(1, a.passkey_procs)
        each = [a.passkey_items * (i + 1) // n - a.passkey_items * i // n for i in range(n)]
        pk_chunk = [] if a.passkey_chunk is None else [f"model.chunk={a.passkey_chunk}"]
        parts = [run("passkey" if n == 1 else f"passkey part {i + 1}/{n}",
                     ["experiment=task_eval", "task.name=passkey",
                      f"task.lengths=[{a.passkey_len}]", f"task.items={k}",
                      f"task.seed={a.seed + i}", *bt, *pk_chunk]) for i, k in enumerate(each)]
        info["passkey_processes"] = n
        if total(parts):
            wall, ms = total(parts)
            info["passkey_wall_s"], info["passkey_model_s"] = round(wall, 2), round(ms, 3)
            info["passkey_tokens_per_model_s"] = round(a.passkey_len * a.passkey_items / ms)
    print("record:", record.write(out, "bench_tasks", {"info": info, "rows": rows}))
    print(json.dumps(info, indent=1))
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
