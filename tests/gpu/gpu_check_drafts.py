"""GPU check of speculative decoding (issue 28): the Triton engine with drafts against the torch
engine, then study 6 at production size as whole processes.

    python tests/gpu/gpu_check_drafts.py $OUT            # one H200, ~2-4 minutes
    python tests/gpu/gpu_check_drafts.py $OUT --smoke    # any machine: tiny sizes, CPU
                                                                 # (Triton interpreter, numba)

1. **check**: Mamba-2 (8 heads of Nemotron-3-Super's 64 x 128) and GDN (8 heads of Qwen3.5's
   128 x 128), 2,048 steps, T = 4 drafts with the profile [0.9, 0.8, 0.7, 0.6], the study's
   schemes plus shared FP16 (IEEE overflow) that dies when the inputs grow 1e7x from step 1,024:
   the Triton engine on CUDA against the torch engine on CUDA (same inputs, same SR streams, same
   schedule). Gates: no fallback, the same flushes and dead steps, the same finite outputs up to
   the dying step, each scheme's mean window rel_err within 1e-3 (Mamba-2, RNE) or 2e-2 (SR
   schemes, GDN: the engines sum in different orders, so an SR or GDN state differs by rounding
   flips; tests/engines/test_drafts.py). Reported, not gated: the fraction of outputs equal bit
   for bit and the largest output difference relative to the largest output. The same without
   drafts, so a change in the no-draft path would show.
2. **single**: ``python -m precsim experiment=study_speculative run.device=cuda`` (one
   production job: Nemotron-3-Super, 131,072 steps, T = 4), a whole process, timed; its
   summary must say engine triton, no fallback.
3. **study**: ``python -m precsim -m experiment=study_speculative run.device=cuda`` (20 jobs in
   one process, through experiments/run_studies.py's ``run_study``), timed
   (``--sweep-timeout``, default 240 s: then stopped, finished jobs kept); every job triton,
   no fallback.

Writes three files to OUT: ``gpu_check_drafts.txt`` (what it printed), ``gpu_check_drafts.json``
(every number) and ``studies.tar.gz`` (experiments/run_studies.py's archive of the study: its
results.csv, PNG, run_info.json, run.log; ``python experiments/run_studies.py --unpack
OUT/studies.tar.gz`` puts them into experiments/studies/study_speculative and refreshes its NOTES
results block). Run directories go to a temporary directory, removed at the end. Exit status 0
when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STUDY = ("conventional_fp32", "shared_nvfp4_sr", "split_fp32_nvfp4", "split_fp16sr_nvfp4")
SCHEMES = {"conventional_fp32": {"kind": "conventional", "fmt": "fp32"},
           "shared_nvfp4_sr": {"kind": "shared", "fmt": "nvfp4", "rounding": "sr"},
           "split_fp32_nvfp4": {"kind": "split", "fmt": "fp32", "read_fmt": "nvfp4"},
           "split_fp16sr_nvfp4": {"kind": "split", "fmt": "fp16", "rounding": "sr",
                                  "read_fmt": "nvfp4"},
           "shared_fp16_ieee": {"kind": "shared", "fmt": "fp16", "overflow": "ieee"}}
PROFILE = [0.9, 0.8, 0.7, 0.6]
SMOKE = ("run.steps=512", "model.heads=2", "model.groups=1", "metrics.window=128")


class Report:
    """Prints and keeps the lines (gpu_check_drafts.txt) and the numbers (.json)."""

    def __init__(self):
        self.lines: list[str] = []
        self.data: dict = {"ok": True, "failures": []}

    def say(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)

    def fail(self, what: str) -> None:
        self.data["ok"] = False
        self.data["failures"].append(what)
        self.say(f"FAIL: {what}")


def _cfg(family: str, steps: int, heads: int, drafts: int, smoke: bool):
    from precsim.config import to_config

    P, N = ((16, 32) if smoke else (64, 128)) if family == "mamba2" else \
        ((16, 32) if smoke else (128, 128))
    return to_config({
        "model": {"family": family, "name": family, "heads": heads, "head_dim": P,
                  "state_dim": N},
        "schemes": SCHEMES, "workload": {"kind": "synthetic"},
        "replay": {"drafts": drafts, "acceptance": PROFILE, "buffer_len": 16},
        "run": {"steps": steps, "progress": False, "seqs": 1},
        "metrics": {"window": 256 if steps >= 1024 else 32, "vocab": 1024}})


@contextlib.contextmanager
def _growing(key: str, t_from: int, factor: float):
    """The synthetic workload's ``key`` inputs times ``factor`` from step ``t_from`` on."""
    import torch

    from precsim import workload as wmod

    orig = wmod.RandomWorkload.chunk

    def big(self, t0, t1):
        out = dict(orig(self, t0, t1))
        v = out[key]
        s = torch.where(torch.arange(t0, t1, device=v.device) >= t_from, factor, 1.0)
        out[key] = v * s.to(v.dtype).reshape(-1, *[1] * (v.ndim - 1))
        return out

    wmod.RandomWorkload.chunk = big
    try:
        yield
    finally:
        wmod.RandomWorkload.chunk = orig


def check(rep: Report, device: str, smoke: bool) -> None:
    """Section 1: the Triton engine with drafts against the torch engine, same device."""
    import numpy as np

    from precsim.engines.torch import run as run_torch
    from precsim.engines.triton import run as run_triton

    steps, heads = (64, 1) if smoke else (2048, 8)
    rep.say(f"== check: Triton vs torch engine on {device}, {heads} heads, {steps:,} steps ==")
    rep.say(f"{'family':7} {'T':>2} {'flushes':>7} {'dead_at':>8} {'bit-equal':>9} "
            f"{'max|dy|/max|y|':>14} {'mean rel_err':>12} {'triton s':>8} {'torch s':>8}")
    out = []
    for family in ("mamba2", "gdn"):
        for drafts in (4, 0):
            cfg = _cfg(family, steps, heads, drafts, smoke)
            grow = ("x" if family == "mamba2" else "v", steps // 2, 1e7)
            try:
                with _growing(*grow):
                    t = time.perf_counter()
                    tri = run_triton(cfg, device, progress=False, record_outputs=True)
                    t_tri = time.perf_counter() - t
                    t = time.perf_counter()
                    ref = run_torch(cfg, device, progress=False, record_outputs=True)
                    t_ref = time.perf_counter() - t
            except Exception:  # noqa: BLE001 - report it, go on with the rest
                rep.fail(f"check {family} T={drafts}: {traceback.format_exc(limit=3)}")
                continue
            name = f"check {family} T={drafts}"
            if tri.engine != "triton" or "triton_fallback" in tri.info:
                rep.fail(f"{name}: ran {tri.engine} ({tri.info.get('triton_fallback')})")
            if tri.info["flushes"] != ref.info["flushes"]:
                rep.fail(f"{name}: flushes {tri.info['flushes']} vs {ref.info['flushes']}")
            if tri.schemes != ref.schemes:
                rep.fail(f"{name}: schemes (dead_at) differ {tri.schemes} vs {ref.schemes}")
            dead = tri.schemes["shared_fp16_ieee"]["dead_at"]
            if dead is None:
                rep.fail(f"{name}: shared_fp16_ieee did not die")
            eq, diff = [], 0.0  # per step: reported (an SR flip moves a few outputs)
            for n in ["truth", *SCHEMES]:
                a, b = tri.info["outputs"][n], ref.info["outputs"][n]
                d = ref.schemes[n]["dead_at"] if n != "truth" else None
                a, b = a.reshape(b.shape)[:d], b[:d]  # after the dying step: not compared
                live = np.isfinite(b)
                if not np.array_equal(np.isfinite(a), live):
                    rep.fail(f"{name}: {n}: finite outputs differ")
                    continue
                if n != "truth":
                    eq.append(float(np.mean(a[live] == b[live])))
                    diff = max(diff, float(np.abs(a[live] - b[live]).max() /
                                           np.abs(b[live]).max()))
            worst = 0.0  # per scheme, the mean window rel_err: the gate
            for n, sc in SCHEMES.items():
                ea = np.array([r["rel_err"] for r in tri.rows if r["scheme"] == n])
                eb = np.array([r["rel_err"] for r in ref.rows if r["scheme"] == n])
                ok = np.isfinite(eb) & (eb > 1e-5)
                if not ok.any():
                    continue
                d = abs(ea[ok].mean() / eb[ok].mean() - 1)
                tol = 1e-3 if family == "mamba2" and sc.get("rounding") != "sr" else 2e-2
                worst = max(worst, d)
                if d > tol:
                    rep.fail(f"{name}: {n}: mean window rel_err differs by {d:.2e} (> {tol})")
            row = {"family": family, "drafts": drafts, "flushes": tri.info["flushes"],
                   "dead_at": dead, "bit_equal_fraction": min(eq) if eq else None,
                   "max_rel_output_diff": diff, "worst_mean_rel_err_diff": worst,
                   "triton_s": round(t_tri, 3), "torch_s": round(t_ref, 3)}
            out.append(row)
            rep.say(f"{family:7} {drafts:>2} {row['flushes']:>7} {str(dead):>8} "
                    f"{row['bit_equal_fraction'] or 0:>9.3f} {diff:>14.2e} {worst:>12.2e} "
                    f"{t_tri:>8.2f} {t_ref:>8.2f}")
    rep.data["check"] = out


def _precsim(args: list[str], timeout: float) -> tuple[int, float, str]:
    """``python -m precsim ARGS`` as a whole process: (exit status, seconds, output tail)."""
    t = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-m", "precsim", *args], cwd=ROOT, text=True,
                           capture_output=True, timeout=timeout)
        rc, tail = p.returncode, (p.stdout + p.stderr)[-3000:]
    except subprocess.TimeoutExpired as e:
        rc, tail = 124, f"timed out after {timeout} s; {str(e.stdout or '')[-1000:]}"
    return rc, time.perf_counter() - t, tail


def _jobs(root: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(root.rglob("summary.json"))]


def _no_fallback(rep: Report, what: str, summaries: list[dict], want: int) -> None:
    bad = [s["engine"] + str(s["info"].get("triton_fallback") or s["info"].get("numba_fallback")
                             or "") for s in summaries
           if s["engine"] not in ("triton", "numba") or "triton_fallback" in s["info"]
           or "numba_fallback" in s["info"]]
    if len(summaries) != want:
        rep.fail(f"{what}: {len(summaries)} of {want} jobs finished")
    if bad:
        rep.fail(f"{what}: fell back: {bad[:3]}")


def study(rep: Report, device: str, smoke: bool, work: Path, sweep_timeout: float,
          out: Path) -> None:
    """Sections 2 and 3: the preset as whole processes, then the table."""
    extra = [f"run.device={device}", "run.progress=false", *(SMOKE if smoke else ())]
    rep.say("\n== single: python -m precsim experiment=study_speculative " + " ".join(extra))
    rc, secs, tail = _precsim(["experiment=study_speculative", *extra,
                               f"hydra.run.dir={work / 'single'}"], 600)
    single = _jobs(work / "single")
    rep.data["single"] = {"rc": rc, "wall_s": round(secs, 2),
                          "engine": single[0]["engine"] if single else None,
                          "engine_wall_s": single[0]["wall_s"] if single else None}
    rep.say(f"exit {rc}, {secs:.1f} s whole process; engine "
            f"{rep.data['single']['engine']}, {rep.data['single']['engine_wall_s']} s in it")
    if rc != 0:
        rep.fail(f"single: exit {rc}: {tail}")
    _no_fallback(rep, "single", single, 1)

    sys.path.insert(0, str(ROOT / "experiments"))
    import run_studies as rs

    st = rs.BY_NAME["study_speculative"]
    dest = work / "results"
    cmd = rs.study_command(st, work / st.name, device, smoke)
    rep.say(f"\n== study: python {' '.join(cmd[1:])}")
    info = rs.run_study(st, work, dest, device, smoke, timeout_s=sweep_timeout)
    jobs = _jobs(work / st.name)
    rc, secs = info["returncode"], info["wall_s"]
    rep.data["study"] = {"rc": rc, "wall_s": secs, "jobs": len(jobs),
                         "engine_wall_s": [s["wall_s"] for s in jobs]}
    rep.say(f"exit {rc}, {secs:.1f} s whole process, {len(jobs)} jobs, engine wall "
            f"{sum(s['wall_s'] for s in jobs):.1f} s in all")
    if rc != 0:
        rep.fail(f"study: exit {rc}: {(dest / st.name / 'run.log').read_text()[-2000:]}")
    _no_fallback(rep, "study", jobs, 20)
    if (dest / st.name / rs.CSV_NAME).is_file():
        rep.say(f"archive for `python experiments/run_studies.py --unpack`: {rs.pack(dest, out)}")
    rows = rs.tidy_rows(st.name, work / st.name, thin=False)
    if not rows:
        return
    last = max(r["step"] for r in rows)
    fin = [r for r in rs.finals(rows) if r["kind"] != "conventional"]
    rep.say(f"\nrel_err at {last:,} steps (bytes/step/head in brackets); T = 0 is the no-draft "
            "baseline")
    profiles = sorted({rs.profile_label(r) for r in fin if r["drafts"]})
    Ts = sorted({r["drafts"] for r in fin})
    table = []
    for model in dict.fromkeys(r["model"] for r in fin):
        for lab in dict.fromkeys(r["label"] for r in fin if r["model"] == model):
            for prof in profiles:
                cells = []
                for T in Ts:
                    r = next((x for x in fin if x["model"] == model and x["label"] == lab
                              and x["drafts"] == T
                              and (T == 0 or rs.profile_label(x) == prof)), None)
                    cells.append(None if r is None else (r["rel_err"], r["bytes_per_step"]))
                table.append({"model": model, "scheme": lab, "profile": prof, "T": Ts,
                              "rel_err_bytes": cells})
                rep.say(f"{model[:15]:15} {lab[:34]:34} {prof:22} " + " ".join(
                    f"T{T}:{'–' if c is None else f'{c[0]:.3g}({c[1]:,.0f})'}"
                    for T, c in zip(Ts, cells, strict=True)))
    rep.data["table"] = table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="directory for the three result files (e.g. $OUT)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes on the CPU (Triton interpreter, numba): checks the script")
    ap.add_argument("--sweep-timeout", type=float, default=240.0)
    ap.add_argument("--only", default="check,study", help="sections: check, study")
    a = ap.parse_args(argv)
    if a.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    import torch

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    device = "cpu" if a.smoke else "cuda"
    rep = Report()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA"
    import triton

    rep.data["env"] = {"host": platform.node(), "gpu": gpu, "torch": torch.__version__,
                       "triton": triton.__version__, "smoke": a.smoke,
                       "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    rep.say(f"gpu_check_drafts: {gpu}, torch {torch.__version__}, triton {triton.__version__}"
            f"{' (smoke: CPU, tiny sizes)' if a.smoke else ''}")
    if not a.smoke and not torch.cuda.is_available():
        rep.fail("no CUDA device (use --smoke to check the script on a CPU)")
    t0 = time.perf_counter()
    sections = set(a.only.split(","))
    with tempfile.TemporaryDirectory(prefix="gpu_check_drafts_") as tmp:
        if "check" in sections and rep.data["ok"]:
            import numpy as np

            # the engines' fallback notes; the interpreter's NumPy warnings on Inf/NaN (a scheme
            # that overflows on purpose)
            with contextlib.redirect_stderr(io.StringIO()), np.errstate(all="ignore"):
                check(rep, device, a.smoke)
        if "study" in sections and (a.smoke or torch.cuda.is_available()):
            try:
                study(rep, device, a.smoke, Path(tmp), a.sweep_timeout, out)
            except Exception:  # noqa: BLE001 - the files below are still written
                rep.fail(f"study: {traceback.format_exc(limit=4)}")
    rep.data["total_s"] = round(time.perf_counter() - t0, 1)
    verdict = "ALL CHECKS PASSED" if rep.data["ok"] else "FAILED: " + "; ".join(
        f[:200] for f in rep.data["failures"])
    rep.say(f"\n{verdict} ({rep.data['total_s']} s)")
    (out / "gpu_check_drafts.json").write_text(json.dumps(rep.data, indent=1, default=str))
    (out / "gpu_check_drafts.txt").write_text("\n".join(rep.lines) + "\n")
    return 0 if rep.data["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
