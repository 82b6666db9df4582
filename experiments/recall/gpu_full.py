"""Issue 42's GPU runs in two device calls of at most 9 minutes each, and their post-processing.

    python experiments/recall/gpu_full.py train --out OUT        # call 1: 3 seeds x {Mamba-2, GDN}
    python experiments/recall/gpu_full.py study --out OUT        # call 2: the headline study
    python experiments/recall/gpu_full.py unpack OUT/FILE.tar.gz [...]  # here, after each call
    python experiments/recall/gpu_full.py report STUDY_DIR       # results.csv .. NOTES.md again
    ... --tiny --device cpu                                      # the same, tiny, on the CPU

``train`` trains the six recall models side by side (one process each; fixed step counts, no
clock), measures each one's float32 accuracy with its own forward at 1K..32K and its heads'
half-lives, and packs them (``recall_train_TAG_MODEL_seedS.tar.gz``); a model still training
near the budget's end pauses (its state saved) and ``train --resume TARBALLS`` continues it.
``unpack`` puts them in ``experiments/recall/checkpoints/TAG_{mamba2,gdn}_seed{0,1,2}/``
(``--tag``, ``full`` by default: one recipe's set).

``study`` runs ``experiment=task_eval`` (``study.py``'s schemes plus two error-feedback ones, SR
schemes under ``--sr-seeds`` seeds) on those checkpoints, one process per (model, weights dtype,
task, length group), a few at once, in priority order (MQAR with float32 weights first, then bf16
weights, then passkey); a job starts only if its estimated time (calibrated on the jobs done so
far) fits the budget, and whatever runs at the deadline is stopped and listed. It packs the run
folders (``recall_study.tar.gz``); ``unpack`` then writes ``experiments/recall/study_<name>/``:
``results.csv`` (one row per model, weights, task, scheme and length), ``items.csv.gz`` (every
item's correctness under every group and SR seed: the raw results), ``table.md``,
``accuracy_vs_length.png`` and ``NOTES.md`` (its headline table re-derived from ``results.csv``
by ``tests/experiments/test_recall.py``).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import study as ST  # noqa: E402

MODELS = ("mamba2", "gdn")
SEEDS = (0, 1, 2)
# fixed step counts (the recipe; no clock): Mamba-2's 1,200 steps reached MQAR 1.00 to 2,048
# tokens on one H200 in 56 s; GDN's step ~1.5x a Mamba-2 step with --gdn-chunk 256 (op counts)
STEPS = {"full": {"mamba2": 1200, "gdn": 1000}, "tiny": {"mamba2": 8, "gdn": 8}}
# seconds kept after a model's last step for its evaluation and save (GDN's at 1K..32K: ~30 s)
EVAL_MARGIN_S = {"full": 60.0, "tiny": 20.0}
EVAL_LENGTHS = {"full": [1024, 4096, 8192, 16384, 32768], "tiny": [32, 64, 128]}
EVAL_ITEMS = {"full": 100, "tiny": 4}
# study: length groups (one process each), items per length, tasks and weights in priority order
LENGTH_GROUPS = {"full": [[1024, 4096, 8192], [16384], [32768]], "tiny": [[32, 64], [128]]}
STUDY_ITEMS = {"full": 100, "tiny": 3}
WEIGHTS = ("float32", "bfloat16")
HEADLINE_DROP = 0.10  # a scheme "breaks" recall at a length: mean drop >= this ...
HEADLINE_SEEDS = 2  # ... and McNemar p < 0.05 in at least this many training seeds (all of
# them when fewer ran: one seed's own test decides alone, and the notes say how many ran)


def seeds_needed(q: dict) -> int:
    """Training seeds whose McNemar test must show the drop: HEADLINE_SEEDS, or every seed
    run when fewer ran."""
    return min(HEADLINE_SEEDS, max(1, int(q["seeds"])))


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def ckpt_name(model: str, seed: int, tag: str | dict = "full") -> str:
    """A checkpoint's folder name: ``TAG_MODEL_seedS`` (``--tag``: one training recipe's set;
    a dict: each model's own, e.g. ``{"mamba2": "long", "gdn": "lr1e3"}``)."""
    if isinstance(tag, dict):
        tag = tag[model]
    return f"{tag}_{model}_seed{seed}"


def parse_tag(text: str) -> str | dict:
    """``--tag``: ``TAG`` for every model, or ``mamba2=TAG,gdn=TAG`` (one recipe's set each)."""
    if "=" not in text:
        tags = {m: text for m in MODELS}
    else:
        tags = dict(part.partition("=")[::2] for part in text.split(","))
        if set(tags) != set(MODELS):
            raise SystemExit(f"gpu_full.py: --tag={text!r} names {', '.join(sorted(tags))}; "
                             f"allowed: TAG, or a tag for each of {', '.join(MODELS)} "
                             "(mamba2=TAG,gdn=TAG)")
    for t in tags.values():
        if not CKPT_RE.match(ckpt_name("mamba2", 0, t)):
            raise SystemExit(f"gpu_full.py: --tag={text!r}: letters and digits only")
    return text if "=" not in text else tags


CKPT_RE = re.compile(r"^(?P<tag>[A-Za-z0-9]+)_(?P<model>mamba2|gdn)_seed(?P<seed>\d+)$")


def parse_steps(text: str | None, size: str) -> dict:
    """``--steps``: one count for both models (``2400``) or per model (``mamba2=2400,gdn=2000``);
    the recipe's counts where not given."""
    steps = dict(STEPS[size])
    if not text:
        return steps
    for part in text.split(","):
        name, eq, val = part.partition("=")
        if not eq:
            steps = {m: int(name) for m in steps}
            continue
        if name not in steps:
            raise SystemExit(f"gpu_full.py: --steps names {name!r}; allowed: {', '.join(steps)}")
        steps[name] = int(val)
    return steps


# ---------------------------------------------------------------------------------------------
# a pool of subprocesses under a deadline


class Pool:
    """Run commands a few at once; each job ``{"name", "cmd", "est"}``; a job starts only when
    ``now + est <= deadline`` (``est`` may be a callable of the pool); at the deadline the
    running ones are stopped (their whole process group). A failed job whose log says
    ``retry_when`` (by default precsim's out-of-memory error: jobs side by side can outgrow an
    80 GB card that one alone fits) runs once more, alone, after the others, if it fits."""

    retry_when = "ran out of cuda memory"

    def __init__(self, workers: int, deadline: float, logdir: Path, env=None,
                 append: bool = False):
        self.workers, self.deadline, self.logdir = workers, deadline, logdir
        self.env, self.mode = env, "a" if append else "w"
        self.done: list[dict] = []
        logdir.mkdir(parents=True, exist_ok=True)

    def run(self, jobs: list[dict], est=None) -> list[dict]:
        pending, running, self._solo = list(jobs), [], []
        while pending or running or self._solo:
            now = time.time()
            if not pending and not running and self._solo:  # the retries, one at a time
                pending = [self._solo.pop(0)]
            while len(running) < self.workers and pending:
                pick = None
                for j in pending:
                    e = est(j) if est else j.get("est", 0.0)
                    if now + e <= self.deadline:
                        pick = j
                        break
                if pick is None:
                    for j in pending:
                        self.done.append({**_pub(j), "status": "skipped (does not fit the "
                                          "budget)", "seconds": 0.0})
                        log(f"skip {j['name']}: estimated {est(j) if est else j.get('est', 0):.0f}"
                            f" s, {self.deadline - now:.0f} s left")
                    pending = []
                    break
                pending.remove(pick)
                f = (self.logdir / f"{pick['name']}.log").open("a" if pick.get("_solo")
                                                               else self.mode)
                p = subprocess.Popen(pick["cmd"], cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True, env=self.env)
                pick.update(_p=p, _f=f, _t0=time.time())
                running.append(pick)
                e = est(pick) if est else pick.get("est", 0)
                log(f"start {pick['name']} (estimated {e:.0f} s; {self.deadline - now:.0f} s "
                    "left)")
            for j in list(running):
                rc = j["_p"].poll()
                if rc is not None:
                    running.remove(j)
                    if rc != 0 and not j.get("_solo") and self._retry(j):
                        continue
                    self._finish(j, "ok" if rc == 0 else f"failed (exit {rc})")
            if time.time() > self.deadline:
                for j in running:
                    os.killpg(j["_p"].pid, signal.SIGKILL)
                    j["_p"].wait()
                    self._finish(j, "stopped at the deadline")
                running = []
                for j in pending + self._solo:
                    self.done.append({**_pub(j), "status": "skipped (deadline)",
                                      "seconds": 0.0})
                pending, self._solo = [], []
            if running and time.time() - getattr(self, "_shown", 0.0) > 30:  # progress
                self._shown = time.time()
                for j in running:
                    txt = (self.logdir / f"{j['name']}.log").read_text(errors="replace")
                    last = [ln for ln in txt.splitlines() if ln.strip()
                            and "falling back" not in ln][-1:]
                    log(f"  {j['name']} ({time.time() - j['_t0']:.0f} s): "
                        f"{last[0][-150:] if last else '(starting)'}")
            time.sleep(0.5)
        return self.done

    def _retry(self, j: dict) -> bool:
        """Queue a failed job for one solo rerun when its log says ``retry_when``."""
        txt = (self.logdir / f"{j['name']}.log").read_text(errors="replace")
        if self.retry_when not in txt[-2000:]:
            return False
        j["_f"].close()
        log(f"retry alone later: {j['name']} ({self.retry_when} after "
            f"{time.time() - j['_t0']:.0f} s beside others)")
        j["_solo"] = True
        self._solo.append(j)
        return True

    def _finish(self, j: dict, status: str) -> None:
        j["_f"].close()
        dt = time.time() - j["_t0"]
        self.done.append({**_pub(j), "status": status, "seconds": round(dt, 1)})
        tail = ""
        if status != "ok":
            tail = "\n" + (self.logdir / f"{j['name']}.log").read_text()[-2000:]
        log(f"{status}: {j['name']} in {dt:.0f} s{tail}")


def _pub(j: dict) -> dict:
    return {k: v for k, v in j.items() if not k.startswith("_") and k not in ("est",)}


def pack(out: Path, name: str, root: Path, members: list[Path]) -> Path:
    """``out/name`` (tar.gz) of ``members`` (paths under ``root``, stored relative to it)."""
    path = out / name
    with tarfile.open(path, "w:gz") as tf:
        for m in members:
            if m.exists():
                tf.add(m, arcname=str(m.relative_to(root)))
    log(f"packed {path} ({path.stat().st_size / 1e6:.2f} MB)")
    return path


# ---------------------------------------------------------------------------------------------
# call 1: training


def train(args) -> int:
    size = "tiny" if args.tiny else "full"
    out, work = args.out, args.work
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    deadline = t0 + args.budget
    dev = ["--cpu", "--tiny"] if args.device == "cpu" else ["--gpu"]
    jobs = []
    steps = parse_steps(args.steps, size)
    for tb in args.resume or []:  # an earlier call's tarballs: finished and paused models
        with tarfile.open(tb) as tf:
            tf.extractall(work, filter="data")
        log(f"resume: unpacked {tb}")
    # a model still training at this point saves its state and exits 75 ("paused"; a later call
    # with --resume continues it): its evaluation, half-lives and packing still fit the budget
    pause_at = max(1.0, deadline - args.reserve - EVAL_MARGIN_S[size] - time.time())
    earlier = []
    for s in SEEDS:
        for m in args.models:  # the first seed of each first (priority if the pool is smaller)
            jobs.append({"name": f"train_{m}_seed{s}", "model": m, "seed": s, "cmd": [
                sys.executable, str(HERE / "train_recall.py"), *dev, "--seed", str(s),
                "--models", m, "--steps", str(steps[m]),
                "--gdn-chunk", str(args.gdn_chunk),
                *(["--lr", str(args.lr)] if args.lr is not None else []),
                *(["--first-stage", str(args.first_stage)] if args.first_stage is not None
                  else []),
                "--eval-lengths", ",".join(map(str, EVAL_LENGTHS[size])),
                "--eval-items", str(EVAL_ITEMS[size]), "--eval-batch-tokens", str(1 << 18),
                "--pause-at", f"{pause_at:.0f}",
                "--out", str(work / "train" / ckpt_name(m, s, args.tag))]})
            ck = work / "train" / ckpt_name(m, s, args.tag) / m
            if (ck / "model.safetensors").is_file() and not (ck / "resume.pt").is_file():
                earlier.append({**_pub(jobs.pop()), "status": "ok", "seconds": 0.0,
                                "call": "earlier"})
                log(f"{earlier[-1]['name']}: finished in an earlier call")
    jobs.sort(key=lambda j: (j["seed"], j["model"]))
    # the memory measurement and packing need ~1 minute after training
    pool = Pool(args.workers, deadline - args.reserve, work / "logs", append=bool(args.resume))
    done = pool.run(jobs)
    for j in done:
        if j["status"] == "failed (exit 75)":
            j["status"] = "paused"
    # per-head half-lives (CPU, one process per checkpoint, all at once)
    procs = []
    for j in done:
        ck = work / "train" / ckpt_name(j["model"], j["seed"], args.tag) / j["model"]
        if (j["status"] == "ok" and (ck / "model.safetensors").is_file()
                and not (ck.parent / "memory.json").is_file()):
            procs.append((j, subprocess.Popen(
                [sys.executable, str(HERE / "memory.py"), str(ck), "--length",
                 str(EVAL_LENGTHS[size][0] * (2 if size == "full" else 1)), "--json",
                 str(ck.parent / "memory.json")], cwd=REPO, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True)))
    for j, p in procs:
        try:
            txt, _ = p.communicate(timeout=max(5.0, deadline - 20 - time.time()))
            (work / "logs" / f"memory_{j['model']}_seed{j['seed']}.log").write_text(txt)
            j["memory"] = "ok" if p.returncode == 0 else f"failed (exit {p.returncode})"
        except subprocess.TimeoutExpired:
            p.kill()
            j["memory"] = "stopped at the deadline"
        log(f"memory {j['name']}: {j['memory']}")
    manifest = {"phase": "train", "size": size, "device": _device(), "date": _now(),
                "argv": sys.argv, "budget_s": args.budget, "seconds": round(time.time() - t0, 1),
                "steps": {m: steps[m] for m in args.models}, "tag": args.tag,
                "gdn_train_chunk": args.gdn_chunk, "lr": args.lr,
                "first_stage": args.first_stage, "jobs": earlier + done}
    mpath = work / "train" / "manifest.json"
    if mpath.is_file():  # the earlier calls' manifests stay in "calls"
        old = json.loads(mpath.read_text())
        manifest["calls"] = old.pop("calls", []) + [old]
    mpath.write_text(json.dumps(manifest, indent=1) + "\n")
    out.mkdir(parents=True, exist_ok=True)
    # one tarball per model (a paused model's state is ~12 MB: files come back <= 16 MB each)
    for m in args.models:
        for s in SEEDS:
            pack(out, f"recall_train_{args.tag}_{m}_seed{s}.tar.gz", work,
                 [work / "train" / ckpt_name(m, s, args.tag), work / "logs" /
                  f"train_{m}_seed{s}.log", work / "logs" / f"memory_{m}_seed{s}.log", mpath])
    ok = sum(j["status"] == "ok" for j in earlier + done)
    paused = [j["name"] for j in done if j["status"] == "paused"]
    log(f"train: {ok}/{len(earlier) + len(done)} models finished in {time.time() - t0:.0f} s"
        + (f"; paused (continue with --resume OUT/recall_train_*.tar.gz): {', '.join(paused)}"
           if paused else ""))
    return 0 if ok or paused else 1


# ---------------------------------------------------------------------------------------------
# call 2: the study


def study_schemes(ck: Path) -> dict:
    return ST.schemes(ST.row_block(ck), ef=True)


def n_groups(sch: dict, sr_seeds: int) -> int:
    """Groups of a run: reference, FP32, noise floor, each scheme and its SR seeds."""
    return 3 + sum(sr_seeds if v.get("rounding") == "sr" else 1 for v in sch.values())


def study_jobs(args, ckpts: dict) -> list[dict]:
    size = "tiny" if args.tiny else "full"
    jobs = []
    order = [("mqar", "float32"), ("mqar", "bfloat16"), ("passkey", "float32"),
             ("passkey", "bfloat16")]
    order = [(t, w) for t, w in order if t in args.tasks and w in args.weights]
    for task, wd in order:
        for s in SEEDS:
            groups = LENGTH_GROUPS[size]
            for lg in ([sorted(L for g in groups for L in g)] if args.one_job else groups):
                for m in MODELS:
                    ck = ckpts.get((m, s))
                    if ck is None:
                        continue
                    sch = study_schemes(ck)
                    if args.schemes:
                        sch = {k: v for k, v in sch.items() if k in args.schemes}
                    G = n_groups(sch, args.sr_seeds)
                    # rows x positions x groups per pass: >= 4 rows of the longest length
                    bt = max(args.batch_tokens, 4 * G * max(lg))
                    name = f"{ckpt_name(m, s, args.tag)}_{wd}_{task}_L{max(lg)}"
                    run_dir = args.work / "study" / "runs" / name
                    cmd = [sys.executable, "-m", "precsim", "experiment=task_eval",
                           f"model.path={ck}", f"model.dtype={wd}", f"task.name={task}",
                           f"task.lengths=[{','.join(map(str, lg))}]",
                           f"task.items={args.items}", "task.key_len=4", "task.depth=0.5",
                           "task.seed=0", f"task.batch_tokens={bt}",
                           f"model.chunk={args.chunk}", f"run.device={args.device}",
                           f"run.sr_seeds={args.sr_seeds}", "replay.buffer_len=16",
                           "run.progress=true", "metrics.plot=false",
                           f"run.out_dir={run_dir}", *ST.overrides(sch)]
                    meta = {"model": ckpt_name(m, s, args.tag), "family": m, "train_seed": s,
                            "weights": wd, "task": task, "lengths": lg,
                            "checkpoint": str(ck), "items": args.items,
                            "sr_seeds": args.sr_seeds, "groups": G}
                    jobs.append({"name": name, "cmd": cmd, "meta": meta, "run_dir": str(run_dir),
                                 "work": args.items * sum(lg) * G})
    return jobs


def find_ckpts(root: Path, tag: str = "full") -> dict:
    out = {}
    for m in MODELS:
        for s in SEEDS:
            d = root / ckpt_name(m, s, tag)
            for c in (d, d / m):
                if (c / "config.json").is_file() and (c / "model.safetensors").is_file():
                    out[(m, s)] = c.resolve()
                    break
    return out


def study(args) -> int:
    t0 = time.time()
    deadline = t0 + args.budget - args.reserve
    ckpts = find_ckpts(args.ckpts, args.tag)
    if not ckpts:
        want = " or ".join(dict.fromkeys(ckpt_name(m, "{0,1,2}", args.tag) for m in MODELS))
        raise SystemExit(f"gpu_full.py study: no {want} checkpoint under {args.ckpts}")
    log(f"study: {len(ckpts)} checkpoints under {args.ckpts}: "
        + ", ".join(f"{m} seed {s}" for m, s in sorted(ckpts)))
    if args.schemes:
        known = set(study_schemes(next(iter(ckpts.values()))))
        if args.schemes - known:
            raise SystemExit(f"gpu_full.py study: --schemes names {sorted(args.schemes - known)}; "
                             f"allowed: {', '.join(sorted(known))}")
    jobs = study_jobs(args, ckpts)
    if args.match:
        jobs = [j for j in jobs if re.search(args.match, j["name"])]
    if args.only_first:
        jobs = jobs[:args.only_first]
    # calibration: seconds = start + rate * (items x tokens x groups); the start (imports,
    # model, Triton's compile on a fresh machine) and the rate from the jobs done so far,
    # conservatively (the slowest rate seen); the prior from one H200 run (50 items at
    # 1,024 + 4,096 tokens, 21 groups: 38.9 s for the whole process)
    cal = {"start": args.prior_start, "rate": args.prior_rate, "seen": 0}

    def est(j):
        return cal["start"] + cal["rate"] * j["work"]

    done: list[dict] = []
    pool = Pool(args.workers, deadline, args.work / "logs")
    orig_finish = pool._finish

    def finish(j, status):
        orig_finish(j, status)
        if status == "ok":
            Path(j["run_dir"], "study_meta.json").write_text(json.dumps(j["meta"]) + "\n")
            dt = pool.done[-1]["seconds"]
            r = max(0.0, dt - cal["start"]) / j["work"]
            cal["rate"] = r if cal["seen"] == 0 else max(cal["rate"] * 0.5 + r * 0.5, r)
            cal["seen"] += 1

    pool._finish = finish
    done = pool.run(jobs, est)
    manifest = {"phase": "study", "device": _device(), "date": _now(), "argv": sys.argv,
                "budget_s": args.budget, "seconds": round(time.time() - t0, 1),
                "calibration": cal, "jobs": [{k: v for k, v in j.items() if k != "cmd"}
                                             for j in done],
                "commands": {j["name"]: j["cmd"][1:] for j in jobs}}
    (args.work / "study").mkdir(parents=True, exist_ok=True)
    (args.work / "study" / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    keep = []
    for j in done:
        rd = Path(j["run_dir"])
        if j["status"] == "ok":
            keep += [rd / "summary.json", rd / "items.csv", rd / "study_meta.json"]
    args.out.mkdir(parents=True, exist_ok=True)
    pack(args.out, "recall_study.tar.gz", args.work,
         keep + [args.work / "study" / "manifest.json"]
         + sorted((args.work / "logs").glob("*.log")))
    ok = sum(j["status"] == "ok" for j in done)
    log(f"study: {ok}/{len(done)} jobs in {time.time() - t0:.0f} s")
    return 0 if ok else 1


# ---------------------------------------------------------------------------------------------
# here: unpack and report


def unpack(args) -> int:
    for tb in args.tarballs:
        tmp = Path(args.tmp) / tb.name.replace(".tar.gz", "")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        with tarfile.open(tb) as tf:
            tf.extractall(tmp, filter="data")
        if (tmp / "train").is_dir():
            man = json.loads((tmp / "train" / "manifest.json").read_text())
            for d in sorted((tmp / "train").glob("*_seed*")):
                hit = CKPT_RE.match(d.name)
                if not hit:
                    continue
                m = hit["model"]
                src = d / m
                if not (src / "model.safetensors").is_file():
                    log(f"{d.name}: no checkpoint (training did not finish)")
                    continue
                dst = args.dest / "checkpoints" / d.name
                dst.mkdir(parents=True, exist_ok=True)
                for f in ("config.json", "model.safetensors", "train_log.json"):
                    shutil.copy2(src / f, dst / f)
                for f in ("accuracy.json", "memory.json"):
                    if (d / f).is_file():
                        shutil.copy2(d / f, dst / f)
                logf = tmp / "logs" / f"train_{m}_seed{d.name[-1]}.log"
                if logf.is_file():
                    (dst / "train_stdout.txt").write_text(
                        "".join(ln for ln in logf.read_text().splitlines(True)
                                if "falling back" not in ln))
                job = next((j for j in man["jobs"] if j["name"] == f"train_{m}_seed"
                            f"{d.name[-1]}"), {})
                (dst / "NOTES.md").write_text(ckpt_notes(dst, man, job))
                log(f"wrote {dst}")
        if (tmp / "study").is_dir():
            dst = args.dest / f"study_{args.name}"
            runs = dst / "runs"
            if runs.exists() and not args.merge:
                shutil.rmtree(runs)
            runs.mkdir(parents=True, exist_ok=True)
            for rd in sorted((tmp / "study" / "runs").glob("*")):
                shutil.copytree(rd, runs / rd.name, dirs_exist_ok=True)
            man = json.loads((tmp / "study" / "manifest.json").read_text())
            mans = json.loads((dst / "manifests.json").read_text()) if (
                args.merge and (dst / "manifests.json").is_file()) else []
            mans.append(man)
            (dst / "manifests.json").write_text(json.dumps(mans, indent=1) + "\n")
            report(dst)
    return 0


def ckpt_notes(d: Path, man: dict, job: dict) -> str:
    lg = json.loads((d / "train_log.json").read_text())
    acc = lg["accuracy"]["by_task"]
    Ls = sorted({int(k) for a in acc.values() for k in a})
    rows = [f"| {t} | " + " | ".join(f"{acc[t].get(str(L), math.nan):.2f}" for L in Ls) + " |"
            for t in acc]
    hl = lg["half_life"]["trained"]["summary"]
    cmd = re.sub(r"--out \S+", "--out OUT",
                 " ".join(job.get("cmd", [])[1:]).replace(str(REPO) + "/", ""))
    return "\n".join([
        f"# {d.name}: a GPU-trained recall model (issue 42)", "",
        f"- Recipe: `{cmd}` (size `{lg['size']}`, "
        f"{lg['parameters']:,} parameters, {lg['train']['steps']} steps of "
        f"{lg['train']['tokens']:,} tokens, lengths {lg['train']['lengths']} (curriculum), "
        f"tasks {', '.join(lg['train']['tasks'])}; model seed {lg['model_seed']}).",
        f"- Machine: {lg['device']} (torch {lg['versions']['torch']}, transformers "
        f"{lg['versions']['transformers']}), {man['date']}; training {lg['wall_s']:.1f} s "
        f"({lg['s_per_step'] * 1000:.0f} ms a step; six models trained side by side, one "
        "process each, by `experiments/recall/gpu_full.py train`). GPU training is not "
        "bit-reproducible (bf16 autocast, cuBLAS); the CPU recipe is.",
        f"- Weights float32, {lg['checkpoint_bytes'] / 1e6:.1f} MB.",
        "- Accuracy with a float32 state and float32 weights (the model's own forward, greedy "
        f"exact match, {lg['accuracy']['items_per_length']} items a length, depth 0.5, 4-token "
        "keys / pairs):", "",
        "| task | " + " | ".join(f"{L:,}" for L in Ls) + " |",
        "|---|" + "---:|" * len(Ls), *rows, "",
        f"- Per-head memory: median half-life {hl['median']:.3g} tokens, longest "
        f"{hl['max']:.3g} (`train_log.json`; filler-only in `memory.json`).", ""])


def _f(v):
    return None if v in ("", None) else float(v)


def collect(dst: Path) -> list[dict]:
    rows = []
    for summ in sorted((dst / "runs").glob("*/summary.json")):
        s = json.loads(summ.read_text())
        meta = json.loads((summ.parent / "study_meta.json").read_text())
        for name, r in s["schemes"].items():
            for L, b in (r.get("by_length") or {}).items():
                rows.append({"model": meta["model"], "family": meta["family"],
                             "train_seed": meta["train_seed"], "weights": meta["weights"],
                             "task": meta["task"], "scheme": name, "role": r["role"],
                             "length": int(L), "items": b.get("items"),
                             "sr_seeds": s.get("sr_seeds"), "acc": b["acc"],
                             "acc_lo": b["acc_lo"], "acc_hi": b["acc_hi"],
                             "delta": b.get("delta"), "delta_lo": b.get("delta_lo"),
                             "delta_hi": b.get("delta_hi"), "lost": b.get("lost"),
                             "gained": b.get("gained"), "p_mcnemar": b.get("p_mcnemar")})
    return rows


def read_results(path: Path) -> list[dict]:
    with path.open() as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ("acc", "acc_lo", "acc_hi", "delta", "delta_lo", "delta_hi", "lost", "gained",
                  "p_mcnemar"):
            r[k] = _f(r[k])
        for k in ("train_seed", "length", "items", "sr_seeds"):
            r[k] = int(float(r[k])) if r[k] not in ("", None) else None
    return rows


def pooled(rows: list[dict]) -> dict:
    """(family, weights, task, scheme, length) -> mean accuracy over training seeds, its
    min and max, the mean change against FP32, seeds, seeds with McNemar p < 0.05 and a drop."""
    by: dict = {}
    for r in rows:
        by.setdefault((r["family"], r["weights"], r["task"], r["scheme"], r["length"]),
                      []).append(r)
    out = {}
    for k, rs in by.items():
        acc = [r["acc"] for r in rs]
        d = [r["delta"] or 0.0 for r in rs]
        out[k] = {"acc": sum(acc) / len(acc), "lo": min(acc), "hi": max(acc),
                  "delta": sum(d) / len(d), "seeds": len(rs),
                  "sig_drop": sum((r["p_mcnemar"] if r["p_mcnemar"] is not None else 1.0) < 0.05
                                  and (r["delta"] or 0) < 0 for r in rs),
                  "items": sum(r["items"] or 0 for r in rs), "role": rs[0]["role"]}
    return out


def headline(rows: list[dict]) -> list[str]:
    """Per family, weights and task: each scheme's break length (the first length where the
    mean drop against FP32 over the training seeds is >= HEADLINE_DROP and McNemar p < 0.05 in
    >= HEADLINE_SEEDS seeds, every seed when fewer ran) and its accuracy at the longest length
    (mean [min, max] over training seeds). One markdown table; a test re-derives it from
    results.csv."""
    P = pooled(rows)
    keys = sorted({k[:3] for k in P}, key=lambda k: (k[2] != "mqar", k[1] != "float32", k[0]))
    md = ["| model | weights | task | scheme | breaks at | accuracy at the longest length "
          "(mean [min, max] over training seeds) |", "|---|---|---|---|---|---|"]
    for fam, wd, task in keys:
        Ls = sorted({k[4] for k in P if k[:3] == (fam, wd, task)})
        names = list(dict.fromkeys(r["scheme"] for r in rows
                                   if (r["family"], r["weights"], r["task"]) == (fam, wd, task)))
        for n in names:
            if P[(fam, wd, task, n, Ls[0])]["role"] in ("reference", "noise"):
                continue
            brk = next((L for L in Ls if (fam, wd, task, n, L) in P
                        and -P[(fam, wd, task, n, L)]["delta"] >= HEADLINE_DROP - 1e-12
                        and P[(fam, wd, task, n, L)]["sig_drop"]
                        >= seeds_needed(P[(fam, wd, task, n, L)])), None)
            q = P.get((fam, wd, task, n, Ls[-1]))
            last = (f"{Ls[-1]:,}: {q['acc']:.2f} [{q['lo']:.2f}, {q['hi']:.2f}] "
                    f"({q['seeds']} seeds)" if q else "-")
            md.append(f"| {fam} | {wd} | {task} | {n} | "
                      f"{f'{brk:,}' if brk else 'none'} | {last} |")
    return md


def write_table(dst: Path, rows: list[dict]) -> None:
    P = pooled(rows)
    md = ["Accuracy (greedy exact match) per length: the mean over the training seeds, in "
          "brackets the lowest and highest seed; `*`: the mean change against the FP32 state is "
          f"<= -{HEADLINE_DROP:.2f} with McNemar p < 0.05 in >= {HEADLINE_SEEDS} seeds (every "
          "seed when fewer ran).", ""]
    for fam, wd, task in sorted({k[:3] for k in P},
                                key=lambda k: (k[2] != "mqar", k[1] != "float32", k[0])):
        Ls = sorted({k[4] for k in P if k[:3] == (fam, wd, task)})
        names = list(dict.fromkeys(r["scheme"] for r in rows
                                   if (r["family"], r["weights"], r["task"]) == (fam, wd, task)))
        seeds = sorted({r["train_seed"] for r in rows
                        if (r["family"], r["weights"], r["task"]) == (fam, wd, task)})
        md += [f"### {fam}, {wd} weights: {task} (training seeds {seeds})", "",
               "| scheme | " + " | ".join(f"{L:,}" for L in Ls) + " |",
               "|---|" + "---:|" * len(Ls)]
        for n in names:
            cells = []
            for L in Ls:
                q = P.get((fam, wd, task, n, L))
                if q is None:
                    cells.append("-")
                    continue
                star = "*" if (-q["delta"] >= HEADLINE_DROP - 1e-12
                               and q["sig_drop"] >= seeds_needed(q)) else ""
                cells.append(f"{q['acc']:.2f} [{q['lo']:.2f}, {q['hi']:.2f}]{star}")
            md.append(f"| {n} | " + " | ".join(cells) + " |")
        md.append("")
    (dst / "table.md").write_text("\n".join(md) + "\n")


def plot(dst: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    P = pooled(rows)
    keys = sorted({k[:3] for k in P}, key=lambda k: (k[2] != "mqar", k[1] != "float32", k[0]))
    cols = min(4, len(keys))
    nr = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(nr, cols, figsize=(4.8 * cols, 3.9 * nr), squeeze=False)
    for ax in axes.ravel()[len(keys):]:
        ax.axis("off")
    for ax, (fam, wd, task) in zip(axes.ravel(), keys, strict=False):
        Ls = sorted({k[4] for k in P if k[:3] == (fam, wd, task)})
        names = [n for n in dict.fromkeys(r["scheme"] for r in rows
                                          if (r["family"], r["weights"], r["task"])
                                          == (fam, wd, task))
                 if n not in ("reference", "noise_floor")]
        for i, n in enumerate(names):
            pts = [(L, P[(fam, wd, task, n, L)]) for L in Ls if (fam, wd, task, n, L) in P]
            x = [L * 2 ** (0.02 * (i - (len(names) - 1) / 2)) for L, _ in pts]
            y = [q["acc"] for _, q in pts]
            base = P[(fam, wd, task, n, Ls[0])]["role"] == "baseline"
            style = dict(ls="--", lw=2, c="k") if base else dict(
                ls=":" if n.startswith("shared") else ("-." if n.startswith("split") else "-"),
                c=f"C{i % 10}", lw=1)
            ax.plot(x, y, marker="osD^vP*Xh<>p"[i % 11], ms=3, label=n, **style)
            ax.fill_between(x, [q["lo"] for _, q in pts], [q["hi"] for _, q in pts],
                            color=style["c"], alpha=0.08 if not base else 0.15, lw=0)
        ax.set(xscale="log", xlabel="context length (tokens)", ylim=(-0.02, 1.02),
               ylabel="accuracy (mean; band: min-max over training seeds)",
               title=f"{fam}, {wd} weights: {task}")
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xticks(Ls)
        ax.set_xticklabels([f"{L:,}" for L in Ls], fontsize=7)
        ax.yaxis.label.set_size(7)
    axes.ravel()[min(len(keys), axes.size) - 1].legend(fontsize=5, loc="center left",
                                                        bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(dst / "accuracy_vs_length.png", dpi=90)
    plt.close(fig)


ITEM_KEY = 6  # model, family, train_seed, weights, task, length: one run's rows at a length


def items_raw(dst: Path) -> int:
    """items.csv.gz: one row per run, item and group (SR seeds as NAME~seedK): correct 0/1.
    The runs unpacked now (their ``items.csv``) and, for every other run and length, the rows
    already in ``items.csv.gz`` (an earlier unpack deleted those runs' ``items.csv``)."""
    n = 0
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["model", "family", "train_seed", "weights", "task", "length", "item", "group",
                "correct"])
    new_rows = []
    for itf in sorted((dst / "runs").glob("*/items.csv")):
        meta = json.loads((itf.parent / "study_meta.json").read_text())
        with itf.open() as f:
            for r in csv.DictReader(f):
                for k, v in r.items():
                    if k.endswith(":correct"):
                        new_rows.append([str(x) for x in (
                            meta["model"], meta["family"], meta["train_seed"], meta["weights"],
                            meta["task"], r["length"], r["item"], k[:-len(":correct")], v)])
    fresh = {tuple(r[:ITEM_KEY]) for r in new_rows}
    old = []
    if (dst / "items.csv.gz").is_file():
        with gzip.open(dst / "items.csv.gz", "rt") as f:
            old = [r for r in list(csv.reader(f))[1:] if tuple(r[:ITEM_KEY]) not in fresh]
    for r in old + new_rows:
        w.writerow(r)
        n += 1
    with gzip.open(dst / "items.csv.gz", "wt") as f:
        f.write(buf.getvalue())
    return n


def report(dst: Path) -> None:
    rows = collect(dst)
    if not rows:
        raise SystemExit(f"gpu_full.py report: no run results under {dst / 'runs'}")
    with (dst / "results.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    rows = read_results(dst / "results.csv")  # everything below from the CSV as committed
    n = items_raw(dst)
    write_table(dst, rows)
    plot(dst, rows)
    mans = json.loads((dst / "manifests.json").read_text()) if (
        dst / "manifests.json").is_file() else []
    kept = ""  # what follows HAND in NOTES.md is written by hand: kept as it is
    if (dst / "NOTES.md").is_file():
        txt = (dst / "NOTES.md").read_text()
        if HAND in txt:
            kept = txt[txt.index(HAND):]
    (dst / "NOTES.md").write_text(notes(dst, rows, mans, n) + ("\n" + kept if kept else ""))
    # the bulky per-run files go: summary.json stays (config, timing), items.csv is in the gz
    for itf in (dst / "runs").glob("*/items.csv"):
        itf.unlink()
    log(f"wrote {dst}/results.csv, items.csv.gz ({n:,} rows), table.md, "
        "accuracy_vs_length.png, NOTES.md")


HEAD_BEGIN, HEAD_END = "<!-- headline: begin -->", "<!-- headline: end -->"
HAND = "<!-- written by hand below: report keeps it -->"


def notes(dst: Path, rows: list[dict], mans: list[dict], n_items: int) -> str:
    fams = sorted({r["family"] for r in rows})
    seeds = sorted({r["train_seed"] for r in rows})
    wds = sorted({r["weights"] for r in rows})
    tasks = sorted({r["task"] for r in rows})
    Ls = sorted({r["length"] for r in rows})
    items = sorted({r["items"] for r in rows if r["items"]})
    srs = sorted({r["sr_seeds"] for r in rows if r["sr_seeds"]})
    jobs = [j for m in mans for j in m.get("jobs", [])]
    ran = {j["name"] for j in jobs if j["status"] == "ok"}  # (a later call ran it)
    not_run = list(dict.fromkeys(f"{j['name']} ({j['status']})" for j in jobs
                                 if j["status"] != "ok" and j["name"] not in ran))
    cmds = sorted({" ".join(m.get("argv", [])) for m in mans})
    tags = sorted({CKPT_RE.match(r["model"])["tag"] for r in rows if CKPT_RE.match(r["model"])})
    dev = sorted({m.get("device", "?") for m in mans})
    secs = sum(m.get("seconds", 0) for m in mans)
    return "\n".join([
        f"# Recall accuracy against context length under the engines' state formats "
        f"({dst.name}, issue 42)", "",
        "Question: at what context length does each state format break recall, and which "
        "scheme keeps it?", "",
        f"- Models: {', '.join(fams)}; training seeds {seeds} (`experiments/recall/checkpoints/"
        f"{'|'.join(tags)}_*_seed*/`, float32 checkpoints).",
        f"- Weights dtype: {', '.join(wds)} (`model.dtype`; the state float32 in the baseline, "
        "float64 in the reference).",
        f"- Tasks: {', '.join(tasks)} (`experiment=task_eval task.name=...`, task.key_len=4, "
        f"task.depth=0.5, task.seed=0); lengths {', '.join(f'{L:,}' for L in Ls)}; {items} "
        "items a length and run.",
        f"- SR seeds: {srs} for every stochastic-rounding scheme (pooled in each row's "
        "accuracy; per seed in `items.csv.gz`).",
        "- Bands: per run the 95% Wilson interval over items and the paired bootstrap interval "
        "of the change against FP32 with McNemar's exact p (`results.csv`); across training "
        "seeds the mean and [min, max] (`table.md`, the plot's bands).",
        f"- Machine: {', '.join(dev)}; {secs:.0f} s in all; command(s): "
        + "; ".join(f"`{c}`" for c in cmds) + " (each run's own command in "
        "`runs/*/summary.json` and `manifests.json`).",
        f"- Raw results: `results.csv` ({len(rows)} rows), `items.csv.gz` ({n_items:,} "
        "item x group rows).",
        "- Not run: " + (", ".join(not_run) if not_run else "nothing") + ".", "",
        f"Headline (a scheme breaks recall at the first length where its mean accuracy over the "
        f"training seeds is >= {HEADLINE_DROP:.2f} below the FP32 state's and McNemar p < 0.05 "
        f"in >= {HEADLINE_SEEDS} seeds, or every seed when fewer ran; re-derived from "
        "`results.csv` by "
        "`tests/experiments/test_recall.py`):", "", HEAD_BEGIN, *headline(rows), HEAD_END, "",
        "Full tables: `table.md`; plot: `accuracy_vs_length.png`.", ""])


def _device() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return f"{torch.cuda.get_device_name(0)} (torch {torch.__version__})"
    except Exception:  # noqa: BLE001
        pass
    return f"cpu ({platform.machine()})"


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="phase", required=True)
    for ph in ("train", "study"):
        p = sub.add_parser(ph)
        p.add_argument("--out", type=Path, required=True, help="where the tarballs go")
        p.add_argument("--work", type=Path, default=None,
                       help="working folder (default: OUT/../recall_work_PHASE)")
        p.add_argument("--tiny", action="store_true", help="tiny models / lengths (CPU smoke)")
        p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
        p.add_argument("--budget", type=float, default=510.0,
                       help="seconds from the start to the packed tarballs")
        p.add_argument("--reserve", type=float, default=None,
                       help="seconds kept for what follows the pool (default 75 train, 20 study)")
        p.add_argument("--workers", type=int, default=None)
        p.add_argument("--tag", default="full",
                       help="checkpoint set: TAG_{mamba2,gdn}_seed{0,1,2}; study: also "
                            "mamba2=TAG,gdn=TAG (each model's own set)")
        if ph == "train":
            p.add_argument("--steps", default=None,
                           help="step counts: N for both models or mamba2=N,gdn=M")
            p.add_argument("--models", default=",".join(MODELS), help="comma list of models")
            p.add_argument("--resume", type=Path, nargs="+", default=None,
                           help="an earlier call's recall_train_*.tar.gz: skip its finished "
                                "models, continue its paused ones")
            p.add_argument("--gdn-chunk", type=int, default=256)
            p.add_argument("--lr", type=float, default=None,
                           help="peak learning rate for train_recall.py (default: its recipe's)")
            p.add_argument("--first-stage", type=int, default=None,
                           help="train_recall.py --first-stage (steps of the first length alone)")
        else:
            p.add_argument("--ckpts", type=Path, default=HERE / "checkpoints")
            p.add_argument("--items", type=int, default=None)
            p.add_argument("--sr-seeds", type=int, default=3)
            p.add_argument("--batch-tokens", type=int, default=1 << 21)
            p.add_argument("--chunk", type=int, default=4096, help="model.chunk")
            p.add_argument("--prior-start", type=float, default=30.0)
            p.add_argument("--prior-rate", type=float, default=2.0e-7,
                           help="seconds per item x token x group before any job is done")
            p.add_argument("--only-first", type=int, default=0, help="the first N jobs only")
            p.add_argument("--match", default=None, help="jobs whose name matches (regex)")
            p.add_argument("--schemes", default=None,
                           help="comma list: only these of study.py's schemes (default: all)")
            p.add_argument("--tasks", default="mqar,passkey")
            p.add_argument("--one-job", action="store_true",
                           help="every length in one process per model and task")
            p.add_argument("--weights", default=",".join(WEIGHTS))
    p = sub.add_parser("unpack")
    p.add_argument("tarballs", nargs="+", type=Path)
    p.add_argument("--dest", type=Path, default=HERE)
    p.add_argument("--name", default="full", help="study_<name>/")
    p.add_argument("--merge", action="store_true",
                   help="add to study_<name>/runs instead of replacing it")
    p.add_argument("--tmp", default="/tmp/recall_unpack")
    p = sub.add_parser("report")
    p.add_argument("dir", type=Path)
    args = ap.parse_args(argv)
    if args.phase == "unpack":
        return unpack(args)
    if args.phase == "report":
        report(args.dir)
        return 0
    args.work = args.work or args.out.parent / f"recall_work_{args.phase}"
    if args.reserve is None:
        args.reserve = 75.0 if args.phase == "train" else 20.0
    if args.workers is None:
        args.workers = (6 if args.phase == "train" else 3) if args.device == "cuda" else 2
    args.tag = parse_tag(args.tag)
    if args.phase == "train" and isinstance(args.tag, dict):
        ap.error(f"--tag={args.tag!r}: train takes one tag (TAG); allowed: letters and digits")
    if args.phase == "train":
        args.models = [m for m in args.models.split(",") if m]
        if not args.models or set(args.models) - set(MODELS):
            ap.error(f"--models={','.join(args.models)!r}; allowed: {', '.join(MODELS)}")
        return train(args)
    args.schemes = set(args.schemes.split(",")) if args.schemes else None
    args.tasks = args.tasks.split(",")
    args.weights = args.weights.split(",")
    args.items = args.items or STUDY_ITEMS["tiny" if args.tiny else "full"]
    return study(args)


if __name__ == "__main__":
    sys.exit(main())
