"""What a whole-model KL budget means in task accuracy (issue 40, item 5): on a recall model
(``experiments/recall/``), for each state scheme of ``experiments/recall/study.py`` and a few
context lengths, measure on the SAME token sequences

* (a) the task-accuracy change against the FP32 state with its paired interval, items lost /
  gained and the exact McNemar p (``python -m precsim experiment=task_eval task.name=mqar``);
* (b) the whole-model KL per token against the FP32 state and the top-1 flip rate
  (``python -m precsim experiment=model_kl model.ids=PROMPTS.npy``: the task's own prompts, one
  document each, written from ``precsim.tasks.builtin_items`` with the task's settings): the
  budget's own figure (the mean KL of the last ``metrics.window`` tokens), the mean over every
  token, and the KL and flip at the answer position (the last prompt token, whose argmax is the
  greedy answer);
* (c) generation divergence (``model.mode=generate model.new_tokens=G`` in the same run: the
  share of the G-token continuations identical to the FP32 state's);

then relate them (``--table``): results.csv (one row per model, scheme and length), items.csv
(one row per model, scheme, length and item), summary.json (the headline figures NOTES.md
quotes), calibration.png.

    python experiments/studies/calibration/calibrate.py --out OUT CKPT  # runs + table
    python experiments/studies/calibration/calibrate.py --out OUT CKPT --task-run DIR  # reuse
    python experiments/studies/calibration/calibrate.py --table OUT  # table + plot again

``--task-run DIR``: take (a) from an existing ``task_eval`` run directory (e.g. study.py's) when
its settings (checkpoint, task, lengths, items, seed, schemes, buffer length, SR seeds) are this
run's; anything else is an error. Every run is a real ``python -m precsim`` process; its
directory lands under OUT/runs/ (``per_step.npz`` is read, reduced into items.csv, and then
deleted unless ``--keep-per-step``: 12 MB a run).
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
import types
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO / "experiments" / "recall"))
import study  # noqa: E402  (the recall study's scheme list, overrides and names)

ROLES_SKIP = ("reference", "noise_floor")  # task_eval's floor rows (model_kl has them in info)


# -- running -------------------------------------------------------------------------------------
def task_cfg(args, lengths=None):
    return types.SimpleNamespace(name=args.task, lengths=list(lengths or args.lengths),
                                 items=args.items, key_len=args.key_len, depth=args.depth,
                                 seed=args.seed)


def vocab_of(ckpt: Path) -> int:
    return int(json.loads((ckpt / "config.json").read_text())["vocab_size"])


def prompts(args, ckpt: Path, length: int):
    """The task's items at ``length`` (precsim.tasks.builtin_items, task_eval's own) as a
    ``(K, length)`` array of prompts and their answers ``(K, answer tokens)``."""
    from precsim.tasks import builtin_items

    items = builtin_items(task_cfg(args, [length]), vocab_of(ckpt))
    ids = np.array([it.context for it in items], dtype=np.int64)
    ans = np.array([it.choices[0] for it in items], dtype=np.int64)
    if ids.shape != (args.items, length):
        raise SystemExit(f"calibrate.py: {args.task} items at {length} are {ids.shape}, "
                         f"expected ({args.items}, {length})")
    return ids, ans


def common(args) -> list[str]:
    return [f"run.device={args.device}", f"run.sr_seeds={args.sr_seeds}",
            f"replay.buffer_len={args.buffer_len}", "model.dtype=float32", "run.progress=false"]


def task_command(ckpt, args, run_dir, sch):
    return [sys.executable, "-m", "precsim", "experiment=task_eval", f"model.path={ckpt}",
            f"task.name={args.task}", f"task.lengths=[{','.join(map(str, args.lengths))}]",
            f"task.items={args.items}", f"task.key_len={args.key_len}",
            f"task.depth={args.depth}", f"task.seed={args.seed}", *common(args),
            f"run.out_dir={run_dir}", *study.overrides(sch)]


def kl_command(ckpt, args, run_dir, sch, ids_file, length):
    return [sys.executable, "-m", "precsim", "experiment=model_kl", f"model.path={ckpt}",
            f"model.ids={ids_file}", f"run.steps={length}", f"run.seqs={args.items}",
            f"metrics.window={args.window}", "model.mode=generate",
            f"model.new_tokens={args.new_tokens}", *common(args), f"run.out_dir={run_dir}",
            *study.overrides(sch)]


def check_task_run(d: Path, ckpt: Path, args, sch: dict) -> None:
    """A reused task_eval run must be this run's settings (else: an error naming the field)."""
    s = json.loads((d / "summary.json").read_text())
    c = s["config"]
    rel = str(ckpt.relative_to(REPO)) if ckpt.is_relative_to(REPO) else str(ckpt)
    have_p = c["model"]["path"]  # (absolute in the machine's checkout that ran it)
    want = {"model.path": (rel if have_p.endswith("/" + rel) or have_p == rel else have_p, rel),
            "task.name": (c["task"]["name"], args.task),
            "task.items": (c["task"]["items"], args.items),
            "task.key_len": (c["task"]["key_len"], args.key_len),
            "task.depth": (float(c["task"]["depth"]), float(args.depth)),
            "task.seed": (c["task"]["seed"], args.seed),
            "run.sr_seeds": (c["run"]["sr_seeds"], args.sr_seeds),
            "run.seed": (c["run"]["seed"], 0),
            "replay.buffer_len": (c["replay"]["buffer_len"], args.buffer_len),
            "metrics.baseline": (c["metrics"]["baseline"], "fp32")}
    for k, (have, need) in want.items():
        if have != need:
            raise SystemExit(f"calibrate.py: --task-run {d}: {k}={have!r}, this run's is "
                             f"{need!r}")
    missing = set(args.lengths) - set(c["task"]["lengths"])
    if missing:
        raise SystemExit(f"calibrate.py: --task-run {d} lacks lengths {sorted(missing)}")
    for n, f in sch.items():
        have = {k: c["schemes"].get(n, {}).get(k) for k in f}
        if have != f:
            raise SystemExit(f"calibrate.py: --task-run {d}: scheme {n} is {have}, this "
                             f"run's is {f}")
    dt = s["model"].get("dtype") or json.loads((ckpt / "config.json").read_text()).get(
        "dtype") or json.loads((ckpt / "config.json").read_text()).get("torch_dtype")
    if dt != "float32":
        raise SystemExit(f"calibrate.py: --task-run {d} ran {dt} weights; allowed: float32")


def run(cmd: list[str], run_dir: Path, info: dict, what: str) -> None:
    if (run_dir / "summary.json").is_file():
        print(f"{run_dir}: done before, kept", flush=True)
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"[{what}] {' '.join(cmd[1:])}", flush=True)
    t1 = time.perf_counter()
    log = run_dir / "calibrate_stdout.txt"
    with log.open("w") as f:
        p = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, text=True)
    dt = time.perf_counter() - t1
    if p.returncode != 0:
        raise SystemExit(f"calibrate.py: {what} failed (exit {p.returncode}):\n"
                         f"{log.read_text()[-3000:]}")
    info["runs"].append({"what": what, "seconds": round(dt, 1),
                         "command": [c.replace(str(REPO) + "/", "") for c in cmd[1:]]})
    print(f"[{what}] {dt:.1f} s", flush=True)


def reduce_kl_run(d: Path, ids: np.ndarray, ans: np.ndarray, keep: bool) -> None:
    """OUT/runs/<model>_kl_<n>/per_doc.json: per scheme and document the KL and top-1 at the
    answer position (the last prompt token), the mean KL and flip rate over every token and
    over the last window (the budget's figure), read from per_step.npz (then deleted unless
    ``keep``); and the documents' answers."""
    out = d / "per_doc.json"
    if out.is_file():
        return
    s = json.loads((d / "summary.json").read_text())
    W = int(s["config"]["metrics"]["window"])
    z = np.load(d / "per_step.npz")
    names = sorted({k.split(":")[0] for k in z.files})
    res = {"answers": ans.tolist(), "window": W, "schemes": {}}
    for n in names:
        kl, top1 = z[f"{n}:kl"].astype(np.float64).T, z[f"{n}:top1"].astype(np.float64).T
        S = kl.shape[0] // ids.shape[0]  # SR seeds stacked seed-major
        kl, top1 = (a.reshape(S, ids.shape[0], -1).mean(0) for a in (kl, top1))
        N = kl.shape[1]
        res["schemes"][n] = {"kl_answer": kl[:, -1].tolist(), "top1_answer": top1[:, -1].tolist(),
                             "kl_all": kl.mean(1).tolist(), "flip_all": (1 - top1.mean(1)).tolist(),
                             "kl_window": kl[:, N - W:].mean(1).tolist(),
                             "flip_window": (1 - top1[:, N - W:].mean(1)).tolist()}
    out.write_text(json.dumps(res) + "\n")
    if not keep:
        (d / "per_step.npz").unlink()


def commit() -> str | None:
    """The commit the runs ran (``CALIBRATE_COMMIT`` for a snapshot without .git)."""
    import os

    if os.environ.get("CALIBRATE_COMMIT"):
        return os.environ["CALIBRATE_COMMIT"]
    p = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                       text=True)
    return p.stdout.strip() or None


# -- relating ------------------------------------------------------------------------------------
def spearman(x, y) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    from scipy.stats import spearmanr

    r = spearmanr(x, y).statistic
    return float(r) if r == r else float("nan")


def collect(out: Path) -> tuple[list[dict], list[dict]]:
    """(rows per model, scheme and length; rows per model, scheme, length and item)."""
    rows, items = [], []
    for meta_f in sorted((out / "runs").glob("*/calibrate_meta.json")):
        meta = json.loads(meta_f.read_text())
        if meta["kind"] != "task":
            continue
        td = out / meta["run_dir"]  # (inside OUT: a fresh run or the copy of a reused one)
        ts = json.loads((td / "summary.json").read_text())
        with (td / "items.csv").open() as f:
            titems = list(csv.DictReader(f))
        for L in meta["lengths"]:
            kd = out / "runs" / f"{meta['model']}_kl_{L}"
            ks = json.loads((kd / "summary.json").read_text())
            pd = json.loads((kd / "per_doc.json").read_text())
            gen = ks["info"]["generation"]["schemes"]
            floor = ks["info"]["floor"]
            ti = [r for r in titems if int(r["length"]) == L]  # the items in task_eval's order
            for name, r in ts["schemes"].items():
                if r["role"] in ROLES_SKIP or name not in pd["schemes"]:
                    continue
                b = r["by_length"][str(L)]
                p = pd["schemes"][name]
                g = gen[name]
                nd = len(p["kl_answer"])
                fd = [v for v in g["first_divergence"]]
                S = len(fd) // nd
                div1 = [float(np.mean([fd[s * nd + i] == 1 for s in range(S)])) for i in range(nd)]
                row = {"model": meta["model"], "task": meta["task"], "scheme": name,
                       "role": r["role"], "length": L, "items": b["items"],
                       "acc": b["acc"], "acc_base": None, "delta": b["delta"],
                       "delta_lo": b["delta_lo"], "delta_hi": b["delta_hi"], "lost": b["lost"],
                       "gained": b["gained"], "p_mcnemar": b["p_mcnemar"], "mdd": b["mdd"],
                       "kl_window": float(np.mean(p["kl_window"])),
                       "kl_window_lo": None, "kl_window_hi": None,
                       "kl_all": float(np.mean(p["kl_all"])),
                       "kl_answer": float(np.mean(p["kl_answer"])),
                       "flip_window": float(np.mean(p["flip_window"])),
                       "flip_all": float(np.mean(p["flip_all"])),
                       "flip_answer": float(1 - np.mean(p["top1_answer"])),
                       "gen_identical": g["identical_rate"],
                       "gen_diverge_first": float(np.mean(div1)),
                       "floor_noise_kl_window": floor["noise"]["kl"],
                       "floor_fp32_vs_fp64_kl_window": floor["fp32_vs_fp64"]["kl"]}
                fin = ks["figures"].get(name, {}).get("final", {}) if "figures" in ks else {}
                if "kl_lo" in fin:
                    row["kl_window_lo"], row["kl_window_hi"] = fin["kl_lo"], fin["kl_hi"]
                rows.append(row)
                for i, tr in enumerate(ti):
                    items.append({"model": meta["model"], "scheme": name, "length": L, "item": i,
                                  "answer": pd["answers"][i][0],
                                  "base_correct": int(float(tr["fp32:correct"])),
                                  "correct": float(tr[f"{name}:correct"]),
                                  "kl_window": p["kl_window"][i], "kl_all": p["kl_all"][i],
                                  "kl_answer": p["kl_answer"][i],
                                  "flip_answer": 1 - p["top1_answer"][i],
                                  "flip_all": p["flip_all"][i], "diverge_first": div1[i]})
            base = ts["schemes"]["fp32"]["by_length"][str(L)]["acc"]
            for row in rows:
                if row["model"] == meta["model"] and row["length"] == L:
                    row["acc_base"] = base
    return rows, items


def summarize(rows: list[dict], items: list[dict]) -> dict:
    """The headline figures NOTES.md quotes (each re-derived by
    tests/experiments/test_calibration.py from results.csv and items.csv)."""
    sch = [r for r in rows if r["role"] != "baseline"]
    sig = [r for r in sch if r["p_mcnemar"] < 0.05]
    drops = [r for r in sig if r["delta"] < 0]
    ns = [r for r in sch if r["p_mcnemar"] >= 0.05]
    out = {"rows": len(sch), "significant": len(sig), "significant_drops": len(drops),
           "min_mdd": min(r["mdd"] for r in sch), "max_mdd": max(r["mdd"] for r in sch)}
    for m in ("kl_window", "kl_all", "kl_answer", "flip_all", "flip_answer"):
        out[f"min_{m}_significant"] = min((r[m] for r in sig), default=None)
        out[f"max_{m}_not_significant"] = max((r[m] for r in ns), default=None)
        out[f"spearman_{m}_abs_delta"] = spearman([r[m] for r in sch],
                                                  [abs(r["delta"]) for r in sch])
    out["spearman_gen_identical_abs_delta"] = spearman([r["gen_identical"] for r in sch],
                                                       [abs(r["delta"]) for r in sch])
    # per item: the answer flips that change correctness, and the flips that do not
    it = [i for i in items if i["scheme"] != "fp32"]
    out["items"] = len(it)
    out["item_changed"] = sum(1 for i in it if i["correct"] != i["base_correct"])
    out["item_flip_answer"] = sum(1 for i in it if i["flip_answer"] > 0)
    out["item_changed_without_flip"] = sum(1 for i in it if i["correct"] != i["base_correct"]
                                           and i["flip_answer"] == 0)
    # rows within a budget b of kl_window: the largest |change| and any significant change
    for b in (1e-3, 1e-2, 1e-1):
        within = [r for r in sch if r["kl_window"] <= b]
        keys = {(r["model"], r["scheme"], r["length"]) for r in within}
        its = [i for i in it if (i["model"], i["scheme"], i["length"]) in keys]
        out[f"within_{b:g}"] = {"rows": len(within),
                                "max_abs_delta": max((abs(r["delta"]) for r in within),
                                                     default=None),
                                "significant": sum(1 for r in within if r["p_mcnemar"] < 0.05),
                                "items": len(its),
                                "items_changed": sum(1 for i in its
                                                     if i["correct"] != i["base_correct"])}
    return out


def write(out: Path, rows: list[dict], items: list[dict]) -> dict:
    if not rows:
        raise SystemExit(f"calibrate.py: no complete runs under {out / 'runs'}")
    for name, rs in (("results.csv", rows), ("items.csv", items)):
        with (out / name).open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rs[0]))
            w.writeheader()
            w.writerows(rs)
    head = summarize(rows, items)
    (out / "summary.json").write_text(json.dumps(head, indent=1) + "\n")
    return head


def table(rows: list[dict]) -> str:
    md = ["| model | length | scheme | acc (FP32) | change [95% CI] | lost/gained | p | "
          "KL window | KL all | KL answer | flips all | flips answer | gen identical |",
          "|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["model"], r["length"], -r["kl_window"])):
        if r["role"] == "baseline":
            continue
        md.append(f"| {r['model']} | {r['length']:,} | {r['scheme']} | {r['acc']:.2f} "
                  f"({r['acc_base']:.2f}) | {r['delta']:+.2f} [{r['delta_lo']:+.2f}, "
                  f"{r['delta_hi']:+.2f}] | {r['lost']:g}/{r['gained']:g} | "
                  f"{r['p_mcnemar']:.2g}{'*' if r['p_mcnemar'] < 0.05 else ''} | "
                  f"{r['kl_window']:.2e} | {r['kl_all']:.2e} | {r['kl_answer']:.2e} | "
                  f"{r['flip_all']:.4f} | {r['flip_answer']:.2f} | {r['gen_identical']:.2f} |")
    return "\n".join(md) + "\n"


def plot(out: Path, rows: list[dict], head: dict, budget: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sch = [r for r in rows if r["role"] != "baseline"]
    panels = (("kl_window", f"KL per token, last window (the budget's figure; default "
                            f"{budget:g})"),
              ("kl_answer", "KL at the answer position"),
              ("flip_all", "top-1 flip rate, every token"),
              ("gen_identical", "share of greedy continuations identical to FP32's"))
    fig, axes = plt.subplots(2, 2, figsize=(14, 9.5))
    axes = axes.ravel()
    Ls = sorted({r["length"] for r in sch})
    mk = dict(zip(sorted({r["model"] for r in sch}), "os^D", strict=False))
    for ax, (m, lab) in zip(axes, panels, strict=True):
        for r in sch:
            c = "C3" if r["p_mcnemar"] < 0.05 and r["delta"] < 0 else (
                "C2" if r["p_mcnemar"] < 0.05 else "0.5")
            x = r[m] if m.startswith(("flip", "gen")) else max(r[m], 1e-16)
            ax.errorbar(x, r["delta"], yerr=[[r["delta"] - r["delta_lo"]],
                                             [r["delta_hi"] - r["delta"]]],
                        fmt=mk[r["model"]], c=c, ms=5, elinewidth=0.6,
                        mfc=c if r["length"] == Ls[-1] else "none", alpha=0.85)
            if r["p_mcnemar"] < 0.05 or abs(r["delta"]) >= 0.04:
                ax.annotate(f"{r['scheme']}@{r['length']}", (x, r["delta"]), fontsize=6,
                            xytext=(3, 3), textcoords="offset points")
        if m == "kl_window":
            ax.axvline(budget, c="k", ls="--", lw=1, label=f"default budget {budget:g}")
            fl = max(r["floor_noise_kl_window"] for r in sch)
            ax.plot([], [], " ", label=f"(the model's noise floor: KL <= {fl:.1e})")
            ax.legend(fontsize=7, loc="lower left")
        if m == "gen_identical":
            ax.set_xlim(-0.03, 1.03)
        ax.axhline(0, c="k", lw=0.5)
        ax.set(xscale="linear" if m.startswith("gen") else "log", xlabel=lab,
               ylabel="accuracy change vs FP32 state [95% paired CI]")
        if m.startswith("flip"):
            ax.set_xscale("symlog", linthresh=1e-3)
            ax.set_xlim(left=-1e-4)
        rho = head[f"spearman_{m}_abs_delta"] if m != "gen_identical" else head[
            "spearman_gen_identical_abs_delta"]
        ax.set_title(f"Spearman(x, |change|) = {rho:.2f}", fontsize=9)
    fig.suptitle("Whole-model KL / flips against the task-accuracy change, same sequences "
                 f"({', '.join(sorted(mk))}; lengths {', '.join(map(str, Ls))})\nfilled: "
                 f"{Ls[-1]}; red: significant drop, green: significant gain, grey: "
                 "McNemar p >= 0.05", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "calibration.png", dpi=100)
    plt.close(fig)


def headline_md(head: dict) -> str:
    """The headline figures as NOTES.md's table rows (3 significant digits; the test reads
    them back and re-derives each from results.csv / items.csv)."""
    flat = {}
    for k, v in head.items():
        if isinstance(v, dict):
            flat.update({f"{k}.{kk}": vv for kk, vv in v.items()})
        else:
            flat[k] = v
    out = ["<!-- headline -->", "| figure | value |", "|---|---|"]
    for k, v in flat.items():
        if v is None or (isinstance(v, float) and math.isnan(v)):
            s = "none"
        elif isinstance(v, int):
            s = str(v)
        elif v != 0 and (abs(v) < 0.01 or abs(v) >= 100):
            s = f"{v:.2e}"
        else:
            s = f"{v:.3g}" if abs(v) >= 1 else f"{v:.3f}".rstrip("0").rstrip(".") or "0"
        out.append(f"| `{k}` | {s} |")
    return "\n".join(out + ["<!-- /headline -->"]) + "\n"


def report(out: Path, budget: float) -> None:
    rows, items = collect(out)
    head = write(out, rows, items)
    md = table(rows)
    (out / "table.md").write_text(md)
    print(md)
    print(headline_md(head))
    plot(out, rows, head, budget)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoints", nargs="*", type=Path)
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--table", type=Path, default=None, help="only the table and plot again")
    ap.add_argument("--task", default="mqar", choices=("mqar",),
                    help="a one-token answer, so the answer position is one token")
    ap.add_argument("--lengths", default="512,1024")
    ap.add_argument("--items", type=int, default=50)
    ap.add_argument("--key-len", type=int, default=4)
    ap.add_argument("--depth", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sr-seeds", type=int, default=1)
    ap.add_argument("--buffer-len", type=int, default=16)
    ap.add_argument("--window", type=int, default=64, help="metrics.window (model_kl's preset)")
    ap.add_argument("--new-tokens", type=int, default=8, help="model.new_tokens")
    ap.add_argument("--budget", type=float, default=0.01, help="the default drawn on the plot")
    ap.add_argument("--task-run", type=Path, default=None,
                    help="reuse this task_eval run directory for (a) (one checkpoint)")
    ap.add_argument("--keep-per-step", action="store_true")
    args = ap.parse_args(argv)
    if args.table:
        report(args.table.resolve(), args.budget)
        return 0
    if not args.checkpoints:
        ap.error("give checkpoint folders (or --table OUT)")
    if args.task_run and len(args.checkpoints) != 1:
        ap.error("--task-run goes with one checkpoint")
    args.lengths = [int(v) for v in args.lengths.split(",")]
    out = args.out.resolve()
    (out / "runs").mkdir(parents=True, exist_ok=True)
    info = {"machine": platform.node(), "python": platform.python_version(),
            "cpus": __import__("os").cpu_count(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "argv": sys.argv,
            "commit": commit(), "runs": []}
    t0 = time.perf_counter()
    for ck in args.checkpoints:
        ck = ck.resolve()
        name = study.model_name(ck)
        sch = study.schemes(study.row_block(ck))
        if args.task_run:
            src = args.task_run.resolve()
            check_task_run(src, ck, args, sch)
            td = out / "runs" / f"{name}_task"  # a copy: this study's raw results stay put
            td.mkdir(parents=True, exist_ok=True)
            for f in ("summary.json", "items.csv"):
                (td / f).write_bytes((src / f).read_bytes())
            (td / "copied_from.txt").write_text(
                f"{src.relative_to(REPO) if src.is_relative_to(REPO) else src} (task_eval's "
                "summary.json and items.csv, checked to be this study's settings)\n")
        else:
            td = out / "runs" / f"{name}_task"
            run(task_command(ck, args, td, sch), td, info, f"{name} task_eval")
        for L in args.lengths:
            ids, ans = prompts(args, ck, L)
            kd = out / "runs" / f"{name}_kl_{L}"
            kd.mkdir(parents=True, exist_ok=True)
            f = kd / "prompts.npy"
            np.save(f, ids)
            run(kl_command(ck, args, kd, sch, f, L), kd, info, f"{name} model_kl {L}")
            reduce_kl_run(kd, ids, ans, args.keep_per_step)
        rel = lambda p: str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)  # noqa: E731
        (out / "runs" / f"{name}_task").mkdir(parents=True, exist_ok=True)
        (out / "runs" / f"{name}_task" / "calibrate_meta.json").write_text(json.dumps(
            {"kind": "task", "model": name, "task": args.task, "checkpoint": rel(ck),
             "run_dir": str(td.relative_to(out)), "lengths": args.lengths}) + "\n")
    info["seconds"] = round(time.perf_counter() - t0, 1)
    prev = out / "run_info.json"
    if prev.is_file():  # keep the earlier invocations' runs (a resumed study)
        old = json.loads(prev.read_text())
        info["earlier"] = old.get("earlier", []) + [{k: old[k] for k in old if k != "earlier"}]
    prev.write_text(json.dumps(info, indent=1) + "\n")
    report(out, args.budget)
    return 0


if __name__ == "__main__":
    sys.exit(main())
