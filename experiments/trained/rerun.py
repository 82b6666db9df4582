"""The trained-model studies (12-14) corrected (issue 42, item 3): the whole-model runs again on
deduplicated held-out documents, float32 and bf16 weights, three SR seeds, the raw per-document
figures kept; the shared/split ratio per layer; the decays scaled toward longer memory.

    python experiments/trained/rerun.py ids                       # ids/heldout*.npy (committed)
    python experiments/trained/rerun.py run --out OUT --part a    # one H200: bits/byte, pairs
    python experiments/trained/rerun.py run --out OUT --part b    # one H200: engines
    python experiments/trained/rerun.py run --out OUT --part c    # one H200: per layer, decays
    python experiments/trained/rerun.py run --out OUT --tiny --device cpu   # pipeline check

Every run goes through ``precsim.api.simulate`` on the config the command line composes for the
same overrides (``precsim.cli.compose_config``; ``runs.jsonl`` lists each run's overrides, so
``python -m precsim OVERRIDES`` repeats it). Besides precsim's own ``metrics.csv`` and
``summary.json``, each run keeps its per-document, per-SR-seed KL and top-1 agreement in
256-token windows (``windows.npz``: read from the per-token arrays precsim's whole-model run
computes, by a wrapper around ``precsim.models.run.merge_seeds`` that only records its input).

Documents (``ids/ids.json`` says which files): ``heldout2k`` 48 x 2,048 tokens (every
deduplicated held-out stdlib file of >= 2,048 tokens, 22, and 26 files of sympy 1.14.0, which
the models never saw, chosen by the SHA-256 of their paths under the same near-duplicate rule
against the training files and the documents already chosen); ``heldout16k`` 8 x 16,384 (the
8 longest deduplicated held-out stdlib files); ``heldout_stream`` every deduplicated held-out
stdlib file (bits/byte).

Writes into OUT (<= 8 files): ``raw.tar.gz`` (each run's metrics.csv, summary.json,
windows.npz), ``runs.jsonl`` (overrides, wall time), ``bpb.json`` (bits/byte per model, weights
dtype and decay scale), ``half_lives.json`` (per layer and head, on heldout2k), ``log.txt``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import re
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
IDS = HERE / "ids"
MODELS = ("mamba2", "gdn")
ROW = {"mamba2": 64, "gdn": 32}
SSM_LAYERS = {"mamba2": list(range(8)), "gdn": [0, 1, 2, 4, 5, 6]}
DECAY_SCALES = (0.25, 4.0, 16.0)  # every head's half-life times this (A_log - ln k)
KEEP_W = 256  # windows.npz: per-document means over 256-token windows
N_SYMPY = 26


def recipe():
    sys.path.insert(0, str(HERE))
    import train

    return train


# ---------------------------------------------------------------------------------------------
# documents


def build_ids() -> None:
    """``ids/heldout2k.npy``, ``ids/heldout16k.npy``, ``ids/heldout_stream.npz`` and their
    files in ``ids/ids.json`` (the old ``val32k``/``train131k`` entries are kept)."""
    import platform

    import sympy

    T = recipe()
    kept, table = T.held_out()
    seen: set[bytes] = set()
    for _, _s, ids in T.documents(split="train"):
        seen |= T.long_lines(ids)
    for _, ids in kept:
        seen |= T.long_lines(ids)
    std = sorted(((len(i), r, i) for r, i in kept), key=lambda t: (-t[0], t[1]))
    docs2k = [(f"stdlib:{r}", i) for n, r, i in std if n >= 2048]
    root = Path(sympy.__file__).parent.parent
    cands = sorted((hashlib.sha256(f.relative_to(root).as_posix().encode()).hexdigest(), f)
                   for f in Path(sympy.__file__).parent.rglob("*.py")
                   if not {"tests", "benchmarks"} & set(f.relative_to(root).parts))
    sym = []
    for _, f in cands:
        ids = np.concatenate([[T.BOS], np.frombuffer(f.read_bytes(), np.uint8)]).astype(np.int64)
        ll = T.long_lines(ids)
        if len(ids) < 2048 or not ll or len(ll & seen) / len(ll) >= T.DUP_FRAC:
            continue
        sym.append((f"sympy:{f.relative_to(root).as_posix()}", ids))
        seen |= ll
        if len(sym) == N_SYMPY:
            break
    docs2k += sym
    docs16k = [(f"stdlib:{r}", i) for n, r, i in std[:8]]
    assert len(docs2k) == 48 and min(len(i) for _, i in docs16k) >= 16384
    IDS.mkdir(exist_ok=True)
    np.save(IDS / "heldout2k.npy", np.stack([i[:2048] for _, i in docs2k]).astype(np.int16))
    np.save(IDS / "heldout16k.npy", np.stack([i[:16384] for _, i in docs16k]).astype(np.int16))
    np.savez_compressed(IDS / "heldout_stream.npz",
                        ids=np.concatenate([i for _, i in kept]).astype(np.int16),
                        files=np.array([r for r, _ in kept]),
                        lengths=np.array([len(i) for _, i in kept]))
    val = [(r, i) for r, _, i in T.documents(split="val")]
    np.savez_compressed(IDS / "val_stream.npz",
                        ids=np.concatenate([i for _, i in val]).astype(np.int16),
                        files=np.array([r for r, _ in val]),
                        lengths=np.array([len(i) for _, i in val]))
    info = json.loads((IDS / "ids.json").read_text()) if (IDS / "ids.json").exists() else {}
    info.update({
        "heldout2k": {"tokens": 2048, "files": [[r, len(i)] for r, i in docs2k],
                      "rule": "every deduplicated held-out stdlib file of >= 2,048 tokens, then "
                              f"{N_SYMPY} sympy {sympy.__version__} files (not tests) in "
                              "SHA-256-of-path order, each kept when < 20% of its distinct "
                              "long lines occur in training files or earlier documents"},
        "heldout16k": {"tokens": 16384, "files": [[r, len(i)] for r, i in docs16k],
                       "rule": "the 8 longest deduplicated held-out stdlib files"},
        "heldout_stream": {"files": len(kept), "tokens": int(sum(len(i) for _, i in kept)),
                           "rule": T.corpus()["info"]["held_out"]["rule"]},
        "val_stream": {"files": len(val), "tokens": int(sum(len(i) for _, i in val)),
                       "rule": "every validation file (near-duplicates included)"},
        "held_out_table": table,
        "stdlib": {"python": platform.python_version(), "root": str(T.stdlib_root()),
                   "sha256": T.corpus()["info"]["sha256"]},
        "note": "val32k/train131k: the first studies' documents (val32k includes 2 codec "
                "tables that nearly copy training files; train131k are TRAINING files)",
    })
    (IDS / "ids.json").write_text(json.dumps(info, indent=1) + "\n")
    print(json.dumps({k: v for k, v in info.items() if k != "held_out_table"}, indent=1)[:3000])


# ---------------------------------------------------------------------------------------------
# the runs


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


def per_layer_schemes(m: str) -> str:
    """Per SSM layer i: shared NVFP4-SR and split FP32 + NVFP4 on layer i only (FP32 state
    elsewhere), as one ``schemes=`` override."""
    parts = []
    for i in SSM_LAYERS[m]:
        parts.append(f"shared_L{i}: {{kind: shared, fmt: fp32, rounding: sr, "
                     f"layers: {{{i}: nvfp4, default: fp32}}}}")
        parts.append(f"split_L{i}: {{kind: split, fmt: fp32, rounding: rne, read_fmt: fp32, "
                     f"layers: {{{i}: nvfp4, default: fp32}}}}")
    return "+schemes={" + ", ".join(parts) + "}"


def plan(part: str, tiny: bool, device: str, decay_dir: Path) -> list[tuple[str, list[str]]]:
    """``(run name, overrides)`` of every run of ``part`` (a: shared/split pairs; b: engines;
    c: per layer and the decay intervention)."""
    n2, k2, n16, k16 = (64, 2, 128, 2) if tiny else (2048, 48, 16384, 8)
    w = 64
    out = []

    def base(m, ids, n, k, dtype, path=None):
        return ["experiment=model_kl", f"model.path={path or f'experiments/trained/{m}'}",
                f"model.ids={IDS / ids}.npy", f"run.steps={n}", f"run.seqs={k}",
                f"run.device={device}", f"metrics.window={w}", f"model.dtype={dtype}",
                "run.sr_seeds=3", "run.progress=false", "run.checkpoint_s=0"]

    chunk = [] if tiny else ["model.chunk=1024"]  # many groups x 48 documents: GPU memory
    for m in MODELS:
        # 16,384 tokens at once: the GDN model's attention layers hold a pass x everything
        # before it (ran out of the H200's memory unchunked)
        c16 = chunk if m == "gdn" else []
        if part == "a":
            for dt in ("float32", "bfloat16"):
                out.append((f"pair2k_{m}_{dt}", base(m, "heldout2k", n2, k2, dt)
                            + ["schemes=replay_pair"]))
            out.append((f"pair16k_{m}_float32", base(m, "heldout16k", n16, k16, "float32")
                        + c16 + ["schemes=replay_pair"]))
        elif part == "b":
            for dt in ("float32", "bfloat16"):
                out.append((f"engines2k_{m}_{dt}", base(m, "heldout2k", n2, k2, dt) + chunk
                            + ["schemes=engines", "replay.buffer_len=16", *row_blocks(m)]))
        else:
            out.append((f"layers2k_{m}_float32", base(m, "heldout2k", n2, k2, "float32")
                        + chunk + ["~schemes", per_layer_schemes(m)]))
            for s in DECAY_SCALES:
                out.append((f"decay{s:g}_{m}_float32",
                            base(m, "heldout16k", n16, k16, "float32",
                                 path=str(decay_dir / f"{m}_x{s:g}")) + c16
                                + ["schemes=split_nvfp4"]))
    return out


def scaled_checkpoint(m: str, scale: float, dest: Path) -> None:
    """The committed checkpoint with every head's decay rate divided by ``scale`` (``A_log -=
    ln scale``: half-lives times ``scale``), saved in float32."""
    from safetensors.torch import load_file, save_file

    src = HERE / m
    sd = {k: v.float() for k, v in load_file(src / "model.safetensors").items()}
    n = 0
    for k in sd:
        if k.endswith("A_log"):
            sd[k] = sd[k] - math.log(scale)
            n += 1
    assert n == len(SSM_LAYERS[m]), (m, n)
    dest.mkdir(parents=True, exist_ok=True)
    save_file(sd, dest / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["torch_dtype"] = cfg["dtype"] = "float32"
    (dest / "config.json").write_text(json.dumps(cfg, indent=1))


class Capture:
    """Records the per-token arrays ``merge_seeds`` receives (every group, every SR seed)."""

    def __init__(self):
        import precsim.models.run as R

        self.R, self.orig, self.last = R, R.merge_seeds, None

        def wrapped(tok, groups, cfg):
            self.last = {g: {"kl": np.asarray(t["kl"]), "top1": np.asarray(t["top1"])}
                         for g, t in tok.items() if "kl" in t}
            return self.orig(tok, groups, cfg)

        R.merge_seeds = wrapped

    def windows(self) -> dict[str, np.ndarray]:
        """``kl|GROUP`` / ``top1|GROUP``: ``(documents, windows)`` means over windows of
        ``KEEP_W`` tokens (the run's length if shorter), and ``window|tokens``: that width."""
        out = {}
        for g, t in (self.last or {}).items():
            for k, a in t.items():
                K, N = a.shape
                W = min(KEEP_W, N)
                out[f"{k}|{g}"] = a[:, : N // W * W].reshape(K, N // W, W).mean(-1).astype(
                    np.float32)
                out["window|tokens"] = np.array(W)
        return out


def bits_per_byte(path: Path, dtype: str, stream: np.ndarray, device: str, ctx: int = 1024,
                  max_windows: int | None = None) -> dict:
    """train.py's validation loss (windows of ``ctx`` + 1 tokens spread over ``stream``, as
    many as fit without overlap) of a checkpoint in ``dtype``, in bits per byte."""
    import torch
    import transformers as tf

    T = recipe()
    dt = getattr(torch, dtype)
    model = tf.AutoModelForCausalLM.from_pretrained(path, dtype=dt).to(device).eval()
    n = len(stream) // (ctx + 1)
    if max_windows:
        n = min(n, max_windows)
    win = T.val_windows(stream.astype(np.int64), n, ctx)
    nats = T.evaluate(model, win, torch.device(device), torch.autocast("cpu", enabled=False))
    return {"bits_per_byte": nats / T.LN2, "nats": nats, "windows": int(len(win)),
            "tokens": int(win[:, 1:].numel())}


def run_all(out: Path, part: str, tiny: bool, device: str, match: str | None = None,
            extra: list[str] | None = None) -> None:
    """``part``'s runs into ``out``; ``match`` (a regular expression): only the runs whose name
    it finds, and no bits/byte or half-lives (a call that redoes failed runs; ``analyse_rerun.py
    raw`` reads every ``raw.tar.gz`` under its ``--work``); ``extra``: overrides added to
    each run's (e.g. a smaller ``model.chunk`` where a run ran out of device memory)."""
    import torch

    from precsim.api import simulate
    from precsim.cli import compose_config, register_configs

    register_configs()

    out.mkdir(parents=True, exist_ok=True)
    logf = (out / "log.txt").open("a")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    t_all = time.perf_counter()
    log(f"device {device}: {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}; "
        f"torch {torch.__version__}; part {part}; tiny {tiny}")
    T = recipe()
    import transformers.models.mamba2.modeling_mamba2 as mm

    orig_scan = mm.mamba2_chunk_scan
    mm.mamba2_chunk_scan = T.ssd_scan  # bits/byte and half-lives only (train.py's own scan)
    work = Path(tempfile.mkdtemp(prefix="rerun_"))
    decay_dir = work / "decay"
    if part in ("a", "c"):
        for m in MODELS:
            for s in DECAY_SCALES:
                scaled_checkpoint(m, s, decay_dir / f"{m}_x{s:g}")
    if part == "a" and match is None:
        # bits/byte: deduplicated held-out split and every validation file, each weights dtype
        st = np.load(IDS / "heldout_stream.npz")["ids"]
        va = np.load(IDS / "val_stream.npz")["ids"]
        mw, ctx = (1, 128) if tiny else (None, 1024)
        bpb = {}
        for m in MODELS:
            for dt in ("float32", "bfloat16"):
                for name, s in (("heldout_dedup", st), ("val_all", va)):
                    bpb[f"{m}|{dt}|{name}|x1"] = bits_per_byte(HERE / m, dt, s, device, ctx,
                                                               max_windows=mw)
            for sc in DECAY_SCALES:
                bpb[f"{m}|float32|heldout_dedup|x{sc:g}"] = bits_per_byte(
                    decay_dir / f"{m}_x{sc:g}", "float32", st, device, ctx, max_windows=mw)
        (out / "bpb.json").write_text(json.dumps(bpb, indent=1))
        log(f"bits/byte done ({time.perf_counter() - t_all:.0f} s)")
        # half-lives per layer and head on heldout2k (train.py's measurement)
        import transformers as tf

        h2k = torch.from_numpy(np.load(IDS / "heldout2k.npy").astype(np.int64))
        if tiny:
            h2k = h2k[:2, :129]
        hl = {}
        for m in MODELS:
            for sc in (1.0, *DECAY_SCALES):
                p = HERE / m if sc == 1.0 else decay_dir / f"{m}_x{sc:g}"
                model = tf.AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32)
                model = model.to(device).eval()
                hl[f"{m}|x{sc:g}"] = T.half_lives(model, h2k, torch.device(device),
                                                  torch.autocast("cpu", enabled=False))
        (out / "half_lives.json").write_text(json.dumps(hl, indent=1))
        log(f"half-lives done ({time.perf_counter() - t_all:.0f} s)")
    mm.mamba2_chunk_scan = orig_scan  # precsim's runs see transformers' own function
    cap = Capture()
    tar = tarfile.open(out / "raw.tar.gz", "w:gz")
    with (out / "runs.jsonl").open("a") as runs:
        for name, ov in plan(part, tiny, device, decay_dir):
            if match is not None and not re.search(match, name):
                continue
            ov = ov + list(extra or [])
            d = work / name
            t = time.perf_counter()
            cap.last = None
            try:
                res = simulate(compose_config(ov), out_dir=d, progress=False)
                if cap.last is None:
                    raise RuntimeError("precsim.models.run.merge_seeds was not called: the "
                                       "per-document arrays were not recorded")
            except Exception as e:  # noqa: BLE001 - one failed run must not cost the others
                log(f"[{name}] FAILED after {time.perf_counter() - t:.1f} s: "
                    f"{type(e).__name__}: {str(e)[:500]}")
                runs.write(json.dumps({"name": name, "overrides": ov, "error": str(e)[:2000]})
                           + "\n")
                continue
            wall = time.perf_counter() - t
            buf = io.BytesIO()
            np.savez_compressed(buf, **cap.windows())
            (d / "windows.npz").write_bytes(buf.getvalue())
            for f in ("metrics.csv", "summary.json", "windows.npz"):
                tar.add(d / f, arcname=f"{name}/{f}")
            runs.write(json.dumps({"name": name, "overrides": ov, "wall_s": round(wall, 2),
                                   "model_s": (res.info or {}).get("model_s")}) + "\n")
            runs.flush()
            log(f"[{name}] {wall:.1f} s (total {time.perf_counter() - t_all:.0f} s)")
            shutil.rmtree(d, ignore_errors=True)
    tar.close()
    shutil.rmtree(work, ignore_errors=True)
    log(f"done in {time.perf_counter() - t_all:.0f} s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("ids", "run"))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--part", choices=("a", "b", "c"), default="a")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--match", default=None, help="only the runs whose name matches (regex)")
    ap.add_argument("--extra", action="append", default=[], help="an override for every run")
    a = ap.parse_args(argv)
    if a.what == "ids":
        build_ids()
    else:
        if a.out is None:
            ap.error("run needs --out")
        run_all(a.out, a.part, a.tiny, a.device, a.match, a.extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
