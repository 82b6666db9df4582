"""Recall accuracy against context length per state scheme (issue 42): for each checkpoint
(``experiments/recall/train_recall.py``'s models) and each built-in task (``passkey``, ``mqar``),
one ``python -m precsim experiment=task_eval`` process runs every SSM layer's state under each
scheme below, side by side on the same items, at several lengths (docs/tasks.md); this script
collects each run's ``summary.json`` into one table and one plot.

Schemes: the state formats serving engines ship or have open, RTN and SR, under the three
kinds (FP32 the baseline, float64 the reference, both added by ``task_eval``):

* conventional: FP16, BF16, FP8 E4M3, INT8 row-scaled (``int8_b<B>``, one FP32 scale per state
  row: B = the state's last axis), NVFP4; each RTN and SR;
* shared ReplaySSM (``replay.buffer_len``, 16): FP16-SR, FP8 E4M3-SR, NVFP4-SR checkpoints;
* split ReplaySSM: FP32 + NVFP4 read, FP16-SR + NVFP4 read, FP32 + FP8 E4M3 read.

    python experiments/recall/study.py --out OUT CKPT [CKPT ...]     # GPU: lengths 512 .. 8K
    python experiments/recall/study.py --device cpu --lengths 128,256 --items 20 --out OUT CKPT
    python experiments/recall/study.py --table OUT                   # table and plot again

Writes OUT/runs/<model>_<task>/ (each precsim run directory), OUT/results.csv (one row per
model, task, scheme and length: accuracy, its 95% Wilson interval, the change against FP32 with
its paired interval, items lost/gained, McNemar p), OUT/table.md, OUT/accuracy_vs_length.png and
OUT/run_info.json (machine, date, commands, seconds).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TASKS = ("passkey", "mqar")


def row_block(ckpt: Path) -> int:
    """The state row the row-scaled formats scale over: Mamba-2's state_size; GDN's value head
    dim and key head dim's greatest common divisor (either may be the state's last axis)."""
    c = json.loads((ckpt / "config.json").read_text())
    if "state_size" in c:
        return int(c["state_size"])
    return math.gcd(int(c["linear_key_head_dim"]), int(c["linear_value_head_dim"]))


def schemes(block: int, ef: bool = False) -> dict[str, dict]:
    """name -> scheme fields (the order of the table); ``ef``: two error-feedback schemes too
    (INT8 row-scaled + an INT8 residual, FP8 E4M3 + an FP16 residual)."""
    out: dict[str, dict] = {}
    for fmt, tag in (("fp16", "fp16"), ("bf16", "bf16"), ("fp8_e4m3", "fp8"),
                     (f"int8_b{block}", "int8row"), ("nvfp4", "nvfp4")):
        for rnd in ("rne", "sr"):
            out[f"conv_{tag}" + ("_sr" if rnd == "sr" else "")] = dict(
                kind="conventional", fmt=fmt, rounding=rnd)
    for fmt, tag in (("fp16", "fp16"), ("fp8_e4m3", "fp8"), ("nvfp4", "nvfp4")):
        out[f"shared_{tag}_sr"] = dict(kind="shared", fmt=fmt, rounding="sr")
    out["split_fp32_nvfp4"] = dict(kind="split", fmt="fp32", rounding="rne", read_fmt="nvfp4")
    out["split_fp16sr_nvfp4"] = dict(kind="split", fmt="fp16", rounding="sr", read_fmt="nvfp4")
    out["split_fp32_fp8"] = dict(kind="split", fmt="fp32", rounding="rne", read_fmt="fp8_e4m3")
    if ef:  # error feedback (vLLM RFC #55196): each write's residual carried into the next
        out["conv_int8row_ef"] = dict(kind="conventional", fmt=f"int8_b{block}", rounding="rne",
                                      error_feedback=f"int8_b{block}")
        out["conv_fp8_ef"] = dict(kind="conventional", fmt="fp8_e4m3", rounding="rne",
                                  error_feedback="fp16")
    return out


def overrides(sch: dict[str, dict]) -> list[str]:
    """Hydra overrides replacing the preset's schemes by FP32 (the baseline) and ``sch``."""
    allx = {"fp32": dict(kind="conventional", fmt="fp32", rounding="rne"), **sch}
    body = ", ".join(f"{n}: {{" + ", ".join(f"{k}: {v}" for k, v in f.items()) + "}"
                     for n, f in allx.items())
    return ["~schemes", f"+schemes={{{body}}}"]


def model_name(ckpt: Path) -> str:
    return f"{ckpt.parent.name}_{ckpt.name}" if ckpt.parent.name != "checkpoints" else ckpt.name


def command(ckpt: Path, task: str, args, run_dir: Path, sch: dict) -> list[str]:
    return [sys.executable, "-m", "precsim", "experiment=task_eval", f"model.path={ckpt}",
            f"task.name={task}", f"task.lengths=[{','.join(map(str, args.lengths))}]",
            f"task.items={args.items}", f"task.key_len={args.key_len}",
            f"task.depth={args.depth}", f"task.seed={args.seed}",
            f"task.batch_tokens={args.batch_tokens}", f"run.device={args.device}",
            f"run.sr_seeds={args.sr_seeds}", f"replay.buffer_len={args.buffer_len}",
            f"run.out_dir={run_dir}", *overrides(sch)]


def collect(out: Path) -> list[dict]:
    """Every run's per-length figures as tidy rows."""
    rows = []
    for summ in sorted((out / "runs").glob("*/summary.json")):
        s = json.loads(summ.read_text())
        meta = json.loads((summ.parent / "study_meta.json").read_text())
        for name, r in s["schemes"].items():
            for L, b in (r.get("by_length") or {}).items():
                rows.append({"model": meta["model"], "task": meta["task"], "scheme": name,
                             "role": r["role"], "length": int(L), "items": b.get("items"),
                             "acc": b["acc"], "acc_lo": b["acc_lo"], "acc_hi": b["acc_hi"],
                             "delta": b.get("delta"), "delta_lo": b.get("delta_lo"),
                             "delta_hi": b.get("delta_hi"), "lost": b.get("lost"),
                             "gained": b.get("gained"), "p_mcnemar": b.get("p_mcnemar")})
    return rows


def write_table(out: Path, rows: list[dict]) -> str:
    """results.csv and table.md (accuracy per scheme and length, one block per model and task;
    the change against FP32 in brackets where it is not zero)."""
    if not rows:
        raise SystemExit(f"study.py: no run results under {out / 'runs'}")
    with (out / "results.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    md = []
    for m in sorted({r["model"] for r in rows}):
        for t in [t for t in TASKS if any(r["task"] == t and r["model"] == m for r in rows)]:
            rs = [r for r in rows if r["model"] == m and r["task"] == t]
            Ls = sorted({r["length"] for r in rs})
            names = list(dict.fromkeys(r["scheme"] for r in rs))
            md += [f"### {m}: {t}", "",
                   "| scheme | " + " | ".join(f"{L:,}" for L in Ls) + " |",
                   "|---|" + "---:|" * len(Ls)]
            for n in names:
                cells = []
                for L in Ls:
                    r = next(x for x in rs if x["scheme"] == n and x["length"] == L)
                    c = f"{r['acc']:.2f}"
                    d = r["delta"]
                    if r["role"] not in ("baseline",) and d is not None and abs(d) > 1e-12:
                        c += f" ({d:+.2f}" + ("*" if (r["p_mcnemar"] or 1) < 0.05 else "") + ")"
                    cells.append(c)
                md.append(f"| {n} | " + " | ".join(cells) + " |")
            md.append("")
    md.append("Accuracy (greedy exact match) per length; in brackets the change against the FP32 "
              "state on the same items (* McNemar p < 0.05).")
    text = "\n".join(md) + "\n"
    (out / "table.md").write_text(text)
    return text


def plot(out: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401

    keys = [(m, t) for m in sorted({r["model"] for r in rows}) for t in TASKS
            if any(r["model"] == m and r["task"] == t for r in rows)]
    fig, axes = plt.subplots(1, len(keys), figsize=(5.2 * len(keys), 4.2), squeeze=False)
    for ax, (m, t) in zip(axes[0], keys, strict=True):
        rs = [r for r in rows if r["model"] == m and r["task"] == t]
        names = list(dict.fromkeys(r["scheme"] for r in rs))
        seen: dict[tuple, str] = {}
        for i, n in enumerate(names):
            pts = sorted((float(r["length"]), float(r["acc"]), float(r["acc_lo"]),
                          float(r["acc_hi"])) for r in rs if r["scheme"] == n)
            role = next(r["role"] for r in rs if r["scheme"] == n)
            style = dict(ls="--", lw=2, c="k") if role in ("baseline", "reference") else dict(
                ls=":" if n.startswith("shared") else ("-." if n.startswith("split") else "-"),
                c=f"C{i % 10}")
            # set a little aside with a marker of its own, so that equal curves stay visible; a
            # curve equal to an earlier one says so; the Wilson interval as an error bar
            x = [p[0] * 2 ** (0.02 * (i - (len(names) - 1) / 2)) for p in pts]
            acc = tuple(p[1] for p in pts)
            same = seen.setdefault(acc, n)
            ax.errorbar(x, acc, yerr=[[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]],
                        marker="osD^vP*Xh<>p"[i % 11], ms=4, capsize=0, elinewidth=0.6,
                        mfc="none" if same != n else None,
                        label=n if same == n else f"{n} (= {same})", **style)
        ax.set(xscale="log", xlabel="context length (tokens)",
               ylabel="accuracy (95% Wilson)", ylim=(-0.02,
               1.02), title=f"{m}: {t}")
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        Ls = sorted({int(r["length"]) for r in rs})
        ax.set_xticks(Ls)
        ax.set_xticklabels([f"{L:,}" for L in Ls], fontsize=7)
    axes[0][-1].legend(fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(out / "accuracy_vs_length.png", dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoints", nargs="*", type=Path, help="checkpoint folders")
    ap.add_argument("--out", type=Path, help="output folder")
    ap.add_argument("--table", type=Path, default=None,
                    help="only collect OUT's runs into the table and plot again")
    ap.add_argument("--tasks", default="passkey,mqar")
    ap.add_argument("--lengths", default="512,1024,2048,4096,8192")
    ap.add_argument("--items", type=int, default=100, help="items per length")
    ap.add_argument("--key-len", type=int, default=4, help="task.key_len")
    ap.add_argument("--depth", type=float, default=0.5, help="task.depth")
    ap.add_argument("--seed", type=int, default=0, help="task.seed")
    ap.add_argument("--device", default="auto", help="run.device (auto, cpu, cuda)")
    ap.add_argument("--sr-seeds", type=int, default=1)
    ap.add_argument("--buffer-len", type=int, default=16, help="replay.buffer_len")
    ap.add_argument("--batch-tokens", type=int, default=1 << 18, help="task.batch_tokens")
    ap.add_argument("--only", default=None,
                    help="comma list of scheme names (default: all; see schemes())")
    args = ap.parse_args(argv)
    if args.table:
        rows = collect(args.table)
        print(write_table(args.table, rows))
        plot(args.table, rows)
        return 0
    if not args.checkpoints or args.out is None:
        ap.error("give checkpoint folders and --out (or --table OUT)")
    args.lengths = [int(v) for v in args.lengths.split(",")]
    tasks = [t for t in args.tasks.split(",") if t]
    if set(tasks) - set(TASKS):
        ap.error(f"--tasks={args.tasks!r}; allowed: passkey, mqar")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    info = {"machine": platform.node(), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "argv": sys.argv, "runs": []}
    t0 = time.perf_counter()
    for ck in args.checkpoints:
        ck = ck.resolve()
        if not (ck / "config.json").is_file():
            ap.error(f"{ck} holds no config.json; allowed: a checkpoint folder")
        sch = schemes(row_block(ck))
        if args.only:
            keep = args.only.split(",")
            sch = {k: v for k, v in sch.items() if k in keep}
        for t in tasks:
            run_dir = out / "runs" / f"{model_name(ck)}_{t}"
            if (run_dir / "summary.json").is_file():
                print(f"{run_dir}: done before, kept", flush=True)
                continue
            run_dir.mkdir(parents=True, exist_ok=True)
            cmd = command(ck, t, args, run_dir, sch)
            t1 = time.perf_counter()
            print(f"[{model_name(ck)} {t}] {' '.join(cmd[1:])}", flush=True)
            log = run_dir / "study_stdout.txt"  # live: precsim's progress line every 5 s
            with log.open("w") as f:
                p = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, text=True)
            dt = time.perf_counter() - t1
            if p.returncode != 0:
                raise SystemExit(f"study.py: {model_name(ck)} {t} failed (exit {p.returncode}):"
                                 f"\n{log.read_text()[-3000:]}")
            (run_dir / "study_meta.json").write_text(json.dumps(
                {"model": model_name(ck), "task": t, "checkpoint": str(ck)}) + "\n")
            info["runs"].append({"model": model_name(ck), "task": t, "seconds": round(dt, 1),
                                 "command": cmd[1:]})
            print(f"[{model_name(ck)} {t}] {dt:.1f} s", flush=True)
    info["seconds"] = round(time.perf_counter() - t0, 1)
    (out / "run_info.json").write_text(json.dumps(info, indent=1) + "\n")
    rows = collect(out)
    print(write_table(out, rows))
    plot(out, rows)
    print(f"wrote {out}/results.csv, table.md, accuracy_vs_length.png", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
