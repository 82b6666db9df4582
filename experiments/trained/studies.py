"""The studies of issue 25 on the trained checkpoints (``experiments/trained/{mamba2,gdn}``), as
first run (2026-12-01). Superseded for the whole-model figures by ``rerun.py`` (issue 42:
deduplicated held-out documents, float32 and bf16 weights, 3 SR seeds, bands, raw results);
kept for the layer-level runs (recordings and their replays) and the head statistics:

* ``study_trained_kl``: study 8 again, shared NVFP4-SR vs split KL per token, whole model, over
  8 held-out documents x 32,768 tokens and 4 training documents x 131,072 (the longest the corpus
  gives for 4 documents), bands over documents;
* ``study_trained_engines``: ``experiment=engines``'s schemes again, whole model (KL, top-1,
  first flip) and per layer (each recorded layer replayed on the layer engine): does SR help?
* ``study_trained_verdict``: the card's candidate schemes (``split_nvfp4``) and budget: the
  layer-level verdict on the synthetic workload at the trained layers' shapes, on the trained
  layers' recorded inputs, and the whole-model verdict.

Every figure comes from whole ``python -m precsim`` processes (``commands()`` lists them):

    python experiments/trained/studies.py ids                # token files from this stdlib
    python experiments/trained/studies.py run --work W [--only S]  # a GPU (--device cpu: slow)
    python experiments/trained/studies.py pack --work W --out F.tar.gz   # runs, no per-token arrays
    python experiments/trained/studies.py analyse --work W   # CSV, PNG, run_info, NOTES tables

``--smoke`` shrinks every run (64 tokens, 2 documents) to check the pipeline on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
EXP = REPO / "experiments"
IDS = HERE / "ids"
MODELS = ("mamba2", "gdn")
# the trained layers' shapes, for the synthetic layer-level runs (train.py's configs)
SHAPES = {"mamba2": ["model=mamba2", "model.heads=8", "model.head_dim=64", "model.state_dim=64"],
          "gdn": ["model=gdn", "model.heads=8", "model.head_dim=32", "model.state_dim=32"]}
# block formats scale one state row, as b128 does on the 128-wide production states
ROW = {"mamba2": 64, "gdn": 32}
HORIZONS = {"val32k": (32768, 8), "train131k": (131072, 4)}
STUDIES = ("kl", "engines", "verdict")


def build_ids() -> None:
    """``ids/val32k.npy`` (8 held-out files, the first 32,768 tokens of each, longest first) and
    ``ids/train131k.npy`` (the 4 training files of >= 131,072 tokens): the recipe's tokens
    (BOS then bytes) of this machine's stdlib, int16."""
    sys.path.insert(0, str(HERE))
    import train

    IDS.mkdir(exist_ok=True)
    info = {}
    for name, split in (("val32k", "val"), ("train131k", "train")):
        n, k = HORIZONS[name]
        docs = sorted(((len(i), r, i) for r, _, i in train.documents(split=split)),
                      key=lambda t: (-t[0], t[1]))
        docs = [d for d in docs if d[0] >= n][:k]
        if len(docs) < k:
            raise SystemExit(f"{name}: only {len(docs)} {split} files of >= {n} tokens here")
        np.save(IDS / f"{name}.npy", np.stack([i[:n] for _, _, i in docs]).astype(np.int16))
        info[name] = {"split": split, "tokens": n, "files": [[r, ln] for ln, r, _ in docs]}
    info["python"] = platform.python_version()
    (IDS / "ids.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info, indent=1))


def row_blocks(m: str) -> list[str]:
    """``schemes=engines``'s block-128 formats at the model's state row (64 or 32 wide)."""
    b, out = ROW[m], []
    for el, lab in (("int8", "INT8"), ("fp8_e4m3", "FP8 E4M3")):
        key = f"schemes.conventional_{el.split('_')[0]}_b128"
        out += [f"{key}.fmt={el}_b{b}", f"{key}_sr.fmt={el}_b{b}", f"{key}_ef.fmt={el}_b{b}",
                f"{key}_ef.error_feedback={el}_b{b}", f"{key}.label='{lab} block {b}'",
                f"{key}_sr.label='{lab} block {b} SR'",
                f"{key}_ef.label='{lab} block {b} + EF {lab.split()[0]}'"]
    return out


def commands(device: str, smoke: bool) -> list[tuple[str, str, list[str]]]:
    """``(study, run name, argv)`` for every process the studies need, in order."""
    def size(h):
        n, k = HORIZONS[h]
        return (64, 2) if smoke else (n, k)

    out = []
    for m in MODELS:
        path = f"experiments/trained/{m}"
        for h in HORIZONS:
            n, k = size(h)
            whole = ["experiment=model_kl", f"model.path={path}", f"model.ids={IDS / h}.npy",
                     f"run.steps={n}", f"run.seqs={k}", f"run.device={device}",
                     "metrics.window=64" if not smoke else "metrics.window=16"]
            # a hybrid's attention holds chunk x everything before it: 2,048 at 131K tokens
            big = ["model.chunk=2048"] if m == "gdn" and h == "train131k" and not smoke else []
            out.append(("kl", f"{m}_{h}_pair", ["-m", "precsim", *whole, *big,
                                                "schemes=replay_pair"]))
            if h == "val32k":
                out.append(("engines", f"{m}_{h}_engines",
                            ["-m", "precsim", *whole, "schemes=engines", "replay.buffer_len=16",
                             *row_blocks(m)]))
                out.append(("verdict", f"{m}_{h}_split", ["-m", "precsim", *whole,
                                                          "schemes=split_nvfp4"]))
        n, _ = size("val32k")
        rec = f"rec_{m}"
        out.append(("engines", rec, ["-m", "precsim.record", "--model", path, "--ids-file",
                                     f"{IDS / 'val32k'}.npy", "--tokens", str(n), "--device",
                                     device, "--out", "{work}/" + rec]))
        trace = ["workload=trace", "workload.path={work}/" + rec, f"run.steps={n}",
                 f"run.device={device}", "metrics.window=256" if not smoke else
                 "metrics.window=16"]
        out.append(("engines", f"{m}_trace_engines", ["-m", "precsim", *trace,
                                                     "schemes=engines", "replay.buffer_len=16",
                                                     *row_blocks(m)]))
        out.append(("verdict", f"{m}_trace_split", ["-m", "precsim", *trace,
                                                   "schemes=split_nvfp4"]))
        syn = ["experiment=split_nvfp4", *SHAPES[m], f"run.steps={n}", f"run.device={device}"]
        if smoke:
            syn += ["run.seqs=2", "metrics.window=16"]
        out.append(("verdict", f"{m}_synthetic_split", ["-m", "precsim", *syn]))
    return out


def run(work: Path, device: str, smoke: bool, only: set[str]) -> None:
    work.mkdir(parents=True, exist_ok=True)
    log = work / "runs.jsonl"
    for study, name, argv in commands(device, smoke):
        if study not in only:
            continue
        dest = work / name
        argv = [a.replace("{work}", str(work)) for a in argv]
        if not name.startswith("rec_"):
            argv.append(f"run.out_dir={dest}")
        done = dest / ("record.json" if name.startswith("rec_") else "summary.json")
        if done.exists() or (dest / "layers.csv").exists():
            print(f"[{name}] done before, kept", flush=True)
            continue
        cmd = [sys.executable, *argv]
        print(f"[{name}] {shlex.join(['python', *argv])}", flush=True)
        t = time.perf_counter()
        p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - t
        tail = (p.stdout + p.stderr)[-3000:]
        print(tail if p.returncode else "\n".join(p.stdout.splitlines()[-14:]), flush=True)
        print(f"[{name}] rc={p.returncode} wall={wall:.1f}s", flush=True)
        with log.open("a") as f:
            f.write(json.dumps({"study": study, "name": name, "argv": ["python", *argv],
                                "rc": p.returncode, "wall_s": round(wall, 2),
                                "stdout_tail": p.stdout[-4000:]}) + "\n")


def stats(work: Path, smoke: bool) -> None:
    """``stats_M.json``: head memory and input scales of each recorded layer and of the
    synthetic workload at the same layer shape (``analyse_trained.trace_stats``)."""
    sys.path.insert(0, str(HERE))
    from analyse_trained import record_stats, synthetic_stats

    for m in MODELS:
        rec, dest = work / f"rec_{m}", work / f"stats_{m}.json"
        if dest.exists() or not (rec / "record.json").exists():
            continue
        shape = {k.split("=")[0][6:]: v for k, v in (a.split("=") for a in SHAPES[m][1:])}
        st = {f"trained layer {i}": v for i, v in record_stats(rec).items()}
        st["synthetic (card default)"] = synthetic_stats(
            m if m == "gdn" else "mamba2", **{k: int(v) for k, v in shape.items()},
            steps=64 if smoke else 4096)
        dest.write_text(json.dumps(st))
        print(f"wrote {dest}", flush=True)


def pack(work: Path, out: Path) -> None:
    """The runs without per-token arrays or recordings (what ``analyse`` reads)."""
    with tarfile.open(out, "w:gz") as tar:
        for f in sorted(work.rglob("*")):
            if f.is_file() and "rec_" not in f.parts[-2] and f.suffix in (
                    ".csv", ".json", ".jsonl", ".txt", ".log") or f.name == "record.json":
                tar.add(f, arcname=str(f.relative_to(work)))
    print(f"packed {out} ({out.stat().st_size:,} B)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("ids", "run", "pack", "analyse"))
    ap.add_argument("--work", type=Path, default=REPO / "experiments" / "_trained_runs")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--only", default=",".join(STUDIES))
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    if a.what == "ids":
        build_ids()
    elif a.what == "run":
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        run(a.work, a.device, a.smoke, set(a.only.split(",")))
        stats(a.work, a.smoke)
    elif a.what == "pack":
        pack(a.work, a.out)
    else:
        sys.path.insert(0, str(HERE))
        from analyse_trained import analyse

        analyse(a.work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
