"""What the studies of ``experiments/studies/`` share (issue 14; a driver per study: issue 43).

Each of the eight Hydra studies (``HYDRA_STUDIES``) is one multirun of its preset
``conf/experiment/<name>.yaml``, driven by ``experiments/studies/<name>/run.py``, which holds the
study's definition (``STUDY``: question, plot, result table) and calls :func:`main` with it. This
module runs the command, collects the run directories' ``metrics.csv`` and ``summary.json`` into
one tidy CSV (``results.csv``: one row per job, scheme and window end, thinned to log-spaced
window ends), draws the study's PNG, records the machine, date, command and run time
(``run_info.json``) and fills the result tables of its ``NOTES.md`` (between the ``results``
markers; the question and the finding outside them are kept).

    python experiments/studies/study_buffer_len/run.py          # one study, GPU size, its folder
    python experiments/studies/study_buffer_len/run.py --smoke  # CPU, reduced, experiments/_smoke
    python experiments/run_studies.py                           # every study (the dispatcher)
    python experiments/run_studies.py --out $OUT                # the same, one archive in $OUT
    python experiments/run_studies.py --unpack studies.tar.gz   # the archive into studies/
    python experiments/run_studies.py --notes                   # NOTES.md tables from the CSVs
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import importlib.util
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXP = ROOT / "experiments"
sys.path.insert(0, str(EXP / "bench"))
from record import machine  # noqa: E402  (bench/record.py: the one description of a machine)

STUDIES_DIR = EXP / "studies"  # one folder per study
# the Hydra studies (a preset each), in study order; each has studies/<name>/run.py
HYDRA_STUDIES = ("study_seed_table_131k", "study_buffer_len", "study_mamba2_vs_gdn",
                 "study_precision_table", "study_sr_bits", "study_speculative",
                 "study_decay_exp", "study_kl_vs_paper")
ARCHIVE = "studies.tar.gz"
CSV_NAME = "results.csv"
INFO_NAME = "run_info.json"
BEGIN = "<!-- results:begin (written by experiments/run_studies.py; edits here are replaced) -->"
END = "<!-- results:end -->"
FINDING_MARK = "<!-- FINDING: to be written by a person from the numbers above -->"
# The tidy CSV's columns (tests/experiments/test_studies.py checks them).
CONFIG_COLS = ("model", "family", "heads", "head_dim", "state_dim", "workload", "steps", "seqs",
               "buffer_len", "drafts", "acceptance", "gdn_u_source", "decay_exp")
SCHEME_COLS = ("scheme", "label", "kind", "fmt", "rounding", "read_fmt", "sr_bits",
               "bytes_per_step", "dead_at")
METRIC_COLS = ("step", "rel_err", "rel_err_p10", "rel_err_p50", "rel_err_p90", "kl", "kl_p10",
               "kl_p50", "kl_p90", "rel_err_max", "state_drift", "read_drift")
TIDY_COLS = ("study", "job", *CONFIG_COLS, *SCHEME_COLS, *METRIC_COLS)
LENGTHS = (256, 1024, 4096, 32768, 131072)
PLOT_LOCK = threading.Lock()
SMOKE_BASE = ("run.steps=1024", "model.heads=2", "model.groups=1")


# -- reading results -------------------------------------------------------------------------
def to_num(v):
    if v in (None, ""):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return v
    return int(f) if f.is_integer() and "." not in str(v) and "e" not in str(v) else f


def thin_steps(steps: list[int], points: int = 48) -> set[int]:
    """Window ends kept in the committed CSV: the ones nearest to ``points`` log-spaced steps,
    the reported lengths and the last."""
    if not steps:
        return set()
    lo, hi = steps[0], steps[-1]
    keep = {lo, hi, *[s for s in steps if s in LENGTHS]}
    if hi > lo:
        for k in range(points):
            target = lo * (hi / lo) ** (k / (points - 1))
            keep.add(min(steps, key=lambda s: abs(math.log(s / target))))
    return keep


def tidy_rows(study: str, sweep_dir: Path, thin: bool = True) -> list[dict]:
    """The tidy rows of every complete job under ``sweep_dir`` (see the module docstring)."""
    from precsim import report
    from precsim import result as res

    out = []
    for job in report.collect(sweep_dir):
        if job.summary is None:
            continue
        s = job.summary
        c = s["config"]
        m, r = c["model"], c["replay"]
        conf = {"model": m["name"], "family": m["family"], "heads": m["heads"],
                "head_dim": m["head_dim"], "state_dim": m["state_dim"],
                "workload": c["workload"]["kind"], "steps": s["steps"], "seqs": c["run"]["seqs"],
                "buffer_len": r["buffer_len"], "drafts": r["drafts"],
                "acceptance": r["acceptance"] if r["drafts"] else None,
                "gdn_u_source": r["gdn_u_source"] if m["family"] == "gdn" else None,
                "decay_exp": m.get("decay_exp", "exact")}
        rows = res.read_rows(job.path / res.METRICS_FILE)
        for name, info in s["schemes"].items():
            sc = c["schemes"][name]
            mine = sorted((x for x in rows if x["scheme"] == name), key=lambda x: x["step"])
            keep = thin_steps([x["step"] for x in mine]) if thin else {x["step"] for x in mine}
            base = {"study": study, "job": job.name, **conf, "scheme": name,
                    "label": info.get("label", name), "kind": sc["kind"], "fmt": sc["fmt"],
                    "rounding": sc["rounding"], "read_fmt": sc.get("read_fmt"),
                    "sr_bits": sc.get("sr_bits"),
                    "bytes_per_step": s.get("cost", {}).get(name, {}).get("bytes_per_step"),
                    "dead_at": info.get("dead_at")}
            for x in mine:
                if x["step"] in keep:
                    out.append({**base, **{k: x.get(k) for k in METRIC_COLS}})
    return out


def write_csv(rows: list[dict], path: Path, cols=TIDY_COLS) -> None:
    """Tidy CSV of ``rows`` with the columns ``cols`` (floats as %.6e, None as empty)."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else
                            f"{r[k]:.6e}" if isinstance(r[k], float) else r[k]) for k in cols})


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return [{k: to_num(v) for k, v in r.items()} for r in csv.DictReader(f)]


def finals(rows: list[dict]) -> list[dict]:
    """The last window of every (job, scheme)."""
    last: dict = {}
    for r in rows:
        key = (r["job"], r["scheme"])
        if key not in last or r["step"] > last[key]["step"]:
            last[key] = r
    return list(last.values())


def at(rows: list[dict], job: str, scheme: str, step: int) -> dict | None:
    return next((r for r in rows if r["job"] == job and r["scheme"] == scheme
                 and r["step"] == step), None)


# -- formatting ------------------------------------------------------------------------------
def g(v, digits: int = 3) -> str:
    if v is None or v == "" or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, str):
        return v
    if v == 0:
        return "0"
    return f"{v:.{digits}g}" if 1e-3 <= abs(v) < 1e5 else f"{v:.{max(digits - 1, 1)}e}"


def nbytes(v) -> str:
    return "–" if v is None else f"{v:,.0f}"


def md_table(head: list[str], body: list[list]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(x if isinstance(x, str) else g(x) for x in row) + " |"
              for row in body]
    return "\n".join(lines)


def _k(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


# -- plots -----------------------------------------------------------------------------------
def get_plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def finish_figure(fig, axes, path: Path, ncol: int = 3) -> None:
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    rows = math.ceil(len(labels) / ncol)
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, min(0.45, 0.035 * rows + 0.02), 1, 1))
    fig.savefig(path, dpi=110)
    get_plt().close(fig)


def loglog_axes(ax, xlabel: str, ylabel: str, title: str = "", xbase: int = 2) -> None:
    ax.set_xscale("log", base=xbase)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.35)
    ax.grid(True, which="minor", alpha=0.1)


def positive(v) -> float:
    return v if isinstance(v, (int, float)) and math.isfinite(v) and v > 0 else math.nan


def curves(rows: list[dict], path: Path, key_of: Callable[[dict], str], title: str,
           panels=(("rel_err", "relative output error (window mean)"),
                   ("kl", "KL(p_ref ‖ p_sim), nats/token")),
           style_of: Callable[[dict], str] | None = None, split_by=None,
           color_of: Callable[[dict], str] | None = None) -> None:
    """Log-log metric vs decode steps, one line per ``key_of(row)``; one panel per metric (and
    per value of ``split_by``). Colours by ``color_of`` (default: the line), line styles by
    ``style_of`` (default: cycled, so coinciding curves stay visible)."""
    plt = get_plt()
    groups = sorted({split_by(r) for r in rows}) if split_by else [None]
    n = len(panels) * len(groups)
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4.6), squeeze=False)
    axes = list(axes[0])
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    keys = list(dict.fromkeys(key_of(r) for r in rows))
    color_of = color_of or key_of
    ckeys = list(dict.fromkeys(color_of(r) for r in rows))
    for gi, grp in enumerate(groups):
        sub = [r for r in rows if split_by is None or split_by(r) == grp]
        for pi, (metric, ylabel) in enumerate(panels):
            ax = axes[gi * len(panels) + pi]
            for i, k in enumerate(keys):
                pts = sorted((r["step"], positive(r[metric])) for r in sub if key_of(r) == k)
                if not pts or all(math.isnan(p[1]) for p in pts):
                    continue
                first = next(r for r in sub if key_of(r) == k)
                ls = style_of(first) if style_of else ("-", "--", "-.", ":")[i % 4]
                c = colors[ckeys.index(color_of(first)) % 10]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], ls=ls, color=c,
                        lw=1.6, label=k, marker="o" if len(pts) <= 3 else None, ms=3)
            loglog_axes(ax, "decode steps (tokens)", ylabel, f"{grp}" if grp else "")
    fig.suptitle(title, fontsize=10)
    finish_figure(fig, axes, path, ncol=3 if len(keys) > 4 else len(keys) or 1)


def shape_label(r: dict) -> str:
    return f"{r['model']} ({r['heads']}×{r['head_dim']}×{r['state_dim']})"


def title_line(rows: list[dict], what: str) -> str:
    r = rows[0]
    return f"{what}: {r['steps']:,} steps, {r['workload']} workload, seqs={r['seqs']}"








def pareto_points(pts):
    """Pareto front (min cost, min value) of (cost, value, ...) tuples."""
    best, out = math.inf, []
    for p in sorted(pts, key=lambda p: (p[0], p[1])):
        if p[1] < best:
            out.append(p)
            best = p[1]
    return out






def profile_label(r: dict) -> str:
    """A job's acceptance, short: a rate, or a per-position profile's first entries."""
    acc = r["acceptance"]
    if not r["drafts"] or acc is None:
        return "–"
    if isinstance(acc, (str, list)):
        vals = [float(v) for v in (acc.strip("[]").split(",") if isinstance(acc, str) else acc)
                if str(v).strip()]
        return "p = " + ",".join(f"{v:g}" for v in vals[:4]) + ("…" if len(vals) > 4 else "")
    return f"p = {acc:g}"








# -- result tables (NOTES.md) ----------------------------------------------------------------
def _lengths_of(rows):
    return [L for L in LENGTHS if any(r["step"] == L for r in rows)]


















# -- a study ---------------------------------------------------------------------------------
@dataclass
class Study:
    name: str  # preset conf/experiment/<name>.yaml and folder experiments/<name>/
    number: int
    title: str
    question: str
    look_for: str
    published: str
    plot: Callable
    table: Callable
    smoke: tuple[str, ...] = SMOKE_BASE
    gpu_jobs: int = 1  # joblib workers on the GPU (a multirun's jobs side by side)
    expected_gpu_s: str = ""
    cost: int = 1  # relative GPU time: the costliest studies start first
    notes: list[str] = field(default_factory=list)

    @property
    def command(self) -> str:
        return f"python -m precsim -m experiment={self.name} run.device=cuda"


NEMOTRON = ("Nemotron 3 (median accuracy drop vs an FP32 SSM cache; RTN vs SR): FP16 2.32% vs "
            "-0.32%, INT8 block 128 2.87% vs 0.00%, FP8 block 128 12.68% vs 1.96%.")
REPLAY_KL = ("ReplaySSM: KL 0.136 (shared NVFP4 checkpoint) vs 0.0038 (split precision), a ratio "
             "of ~36x, measured on a real model's next-token distributions.")
ARTICLE = ("The article's table (docs/workloads.md, experiments/studies/seed_table/NOTES.md): "
           "conventional FP32 1.8e-07 … 1.8e-06; conventional NVFP4 every step 0.681 … 1.198; "
           "shared NVFP4 checkpoint 0.243 … 1.187; split FP32 + NVFP4 0.078 … 0.090; split "
           "FP16-SR + NVFP4 0.079 … 0.091 (1–256 … to 32,768 steps).")



# -- running ---------------------------------------------------------------------------------
def study_command(st: Study, sweep_dir: Path, device: str, smoke: bool,
                  extra: tuple[str, ...] = ()) -> list[str]:
    cmd = [sys.executable, "-m", "precsim", "-m", f"experiment={st.name}", f"run.device={device}",
           "run.progress=false", f"hydra.sweep.dir={sweep_dir}",
           "hydra.sweep.subdir=job${hydra.job.num}"]
    if smoke:
        cmd += list(st.smoke)
    elif st.gpu_jobs > 1 and _has_joblib():  # else Hydra's basic launcher: jobs in turn
        cmd += ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={st.gpu_jobs}"]
    return cmd + list(extra)


def _has_joblib() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is not None
    except ModuleNotFoundError:  # no hydra_plugins namespace at all
        return False


def run_study(st: Study, work: Path, dest: Path, device: str, smoke: bool,
              extra: tuple[str, ...] = (), concurrent: int = 1,
              timeout_s: float | None = None) -> dict:
    """Run one study's command into ``work/<name>``, write its CSV, PNG, run_info.json and NOTES
    into ``dest/<name>``. Returns the run info."""
    sweep = work / st.name
    if sweep.exists():
        shutil.rmtree(sweep)
    if concurrent > 1 and device == "cpu":  # studies side by side: one core each
        extra = (*extra, "run.threads=1")
    cmd = study_command(st, sweep, device, smoke, extra)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    started = dt.datetime.now(dt.timezone.utc)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
        rc = proc.returncode
    except subprocess.TimeoutExpired:  # stop this study's process group; keep finished jobs
        os.killpg(proc.pid, signal.SIGTERM)
        stdout, stderr = proc.communicate()
        rc, stderr = "timeout", stderr + f"\nstopped after --timeout={timeout_s} s"
    wall = time.perf_counter() - t0
    out = dest / st.name
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.log").write_text(stdout[-20000:] + "\n--- stderr ---\n" + stderr[-20000:])
    rows = tidy_rows(st.name, sweep) if sweep.is_dir() else []
    summaries = [(f.parent.name, json.loads(f.read_text()))
                 for f in sorted(sweep.glob("*/summary.json"))]
    shown = [c if not c.startswith("hydra.sweep.dir=") else "hydra.sweep.dir=<work>/" + st.name
             for c in cmd[1:]]
    info = {"study": st.name, "number": st.number, "smoke": smoke,
            "command": "python " + shlex.join(shown), "started_utc": started.isoformat(
                timespec="seconds"), "wall_s": round(wall, 1), "returncode": rc,
            "concurrent_studies": concurrent, "machine": machine(),
            "jobs": [{"job": name, "engine": s.get("engine"),
                      "device": s.get("device"), "wall_s": s.get("wall_s"),
                      "model": s["config"]["model"]["name"], "steps": s.get("steps")}
                     for name, s in summaries]}
    (out / INFO_NAME).write_text(json.dumps(info, indent=1) + "\n")
    with PLOT_LOCK:  # matplotlib is not thread-safe; studies run in threads
        if rows:
            write_csv(rows, out / CSV_NAME)
            replot(st, out)
        write_notes(st, out)
    status = "ok" if rc == 0 and rows else f"FAILED (rc {rc}; see run.log)"
    print(f"{st.name}: {status}, {wall:.0f} s, {len(rows)} CSV rows -> {out}", flush=True)
    return info


def replot(st: Study, folder: Path) -> Path | None:
    """The study's PNG drawn from its CSV (so a figure always matches the committed numbers)."""
    if not (folder / CSV_NAME).is_file():
        return None
    path = folder / f"{st.name.removeprefix('study_')}.png"
    st.plot(read_csv(folder / CSV_NAME), path)
    return path


# -- NOTES.md --------------------------------------------------------------------------------
def results_block(st: Study, folder: Path) -> str:
    info_f, csv_f = folder / INFO_NAME, folder / CSV_NAME
    if not info_f.is_file() or not csv_f.is_file():
        return f"_No results yet: run `python experiments/studies/{st.name}/run.py` (GPU)._"
    info = json.loads(info_f.read_text())
    rows = read_csv(csv_f)
    m = info["machine"]
    hw = m.get("gpu") or f"CPU ({m.get('cpus')} cores)"
    engines = sorted({f"{j['engine']} on {j['device']}" for j in info["jobs"]})
    jobs_s = [j["wall_s"] for j in info["jobs"] if j.get("wall_s") is not None]
    lines = []
    if info.get("smoke"):
        lines.append("**SMOKE RUN (reduced sizes, CPU): a check of the pipeline, not the study's "
                     "result.**\n")
    if info.get("returncode") != 0:
        lines.append(f"**Incomplete: the command ended with {info.get('returncode')!r}; "
                     f"{len(info['jobs'])} job(s) complete (see run.log).**\n")
    lines += [f"Run {info['started_utc']} on {m['host']}: {hw}, torch {m.get('torch', '?')}; "
              f"engines: {', '.join(engines) or '–'}.",
              f"Command: `{info['command']}`.",
              f"Run time: {info['wall_s']:.0f} s for the whole command (process start-up and "
              f"Triton compilation included; {info['concurrent_studies']} studies side by side), "
              f"{len(jobs_s)} job(s) of {g(min(jobs_s) if jobs_s else None)}–"
              f"{g(max(jobs_s) if jobs_s else None)} s engine wall time each.",
              "",
              "Units: rel_err = ‖y − y_ref‖₂ / ‖y_ref‖₂ over the layer output, the mean of the "
              "256-step window ending at the step named (dimensionless); KL in nats per token "
              "through the fixed readout head (vocab 1024, logit scale 3); state drift "
              "‖S − S_ref‖_F / ‖S_ref‖_F; bytes per decode step per head from the cost model "
              "(precsim/cost.py).",
              "",
              st.table(rows),
              "",
              f"![{st.title}]({st.name.removeprefix('study_')}.png)",
              "",
              f"Files: `{CSV_NAME}` (tidy: one row per job, scheme and window end; window ends "
              "thinned to ~48 log-spaced ones), the PNG, `run_info.json`, `run.log`."]
    return "\n".join(lines)


def write_notes(st: Study, folder: Path) -> Path:
    """Write NOTES.md, or replace only its results block when it exists."""
    path = folder / "NOTES.md"
    block = f"{BEGIN}\n{results_block(st, folder)}\n{END}"
    if path.is_file() and BEGIN in path.read_text():
        text = path.read_text()
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1] if END in rest else ""
        path.write_text(head + block + tail)
        return path
    extra = "".join(f"\n\n{n}" for n in st.notes)
    path.write_text(f"""# Study {st.number}: {st.title}

**Question.** {st.question}

**Command** (one GPU; `python experiments/studies/{st.name}/run.py` runs it and writes this
folder, `python experiments/run_studies.py` every study):

    {st.command}

CPU check at reduced size: `python experiments/studies/{st.name}/run.py --smoke`.
Expected GPU time (H200): {st.expected_gpu_s or '–'}.{extra}

**What to look for.** {st.look_for}

**Published numbers.** {st.published}

## Results

{block}

## Finding

{FINDING_MARK}
_Not written yet: two or three sentences from the numbers above, by a person, after the GPU run._

## Comparison with the published numbers

{FINDING_MARK}
_Not written yet._
""")
    return path


# -- archive ---------------------------------------------------------------------------------
def pack(dest: Path, out_dir: Path, studies: list[Study] | None = None) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / ARCHIVE
    with tarfile.open(path, "w:gz") as tar:
        for st in studies or all_studies():
            if (dest / st.name).is_dir():
                tar.add(dest / st.name, arcname=st.name)
    return path


def unpack(archive: Path, into: Path = STUDIES_DIR,
           studies: list[Study] | None = None) -> list[str]:
    """Extract the archive's study folders into ``into`` (member names checked), then refresh
    every NOTES.md results block."""
    by_name = {s.name: s for s in studies or all_studies()}
    names = []
    with tarfile.open(archive) as tar:
        members = []
        for mem in tar.getmembers():
            top = mem.name.split("/", 1)[0]
            if top not in by_name or ".." in Path(mem.name).parts or not (mem.isfile()
                                                                          or mem.isdir()):
                raise SystemExit(f"{archive}: unexpected member {mem.name!r}")
            members.append(mem)
            names.append(top)
        for mem in members:
            if mem.isfile():
                target = into / mem.name
                if target.name == "NOTES.md" and target.is_file():
                    continue  # keep what a person wrote; its results block is refreshed below
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(mem).read())
    done = list(dict.fromkeys(names))
    for n in done:
        write_notes(by_name[n], into / n)  # the PNG came with the archive
    return done


# -- main ------------------------------------------------------------------------------------
def load_study(name: str) -> Study:
    """``STUDY`` of ``experiments/studies/<name>/run.py`` (imported once)."""
    mod_name = f"precsim_study_{name}"
    if mod_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(mod_name, STUDIES_DIR / name / "run.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[mod_name].STUDY


def all_studies() -> list[Study]:
    """Every Hydra study, in study order."""
    return [load_study(n) for n in HYDRA_STUDIES]


def main(argv: list[str] | None = None, studies: list[Study] | None = None,
         prog: str | None = None) -> int:
    """The command line of one study's ``run.py`` (``studies``: that study) or of the
    dispatcher (default: every study)."""
    STUDIES = studies or all_studies()
    BY_NAME = {s.name: s for s in STUDIES}
    from precsim.errors import argument_parser

    p = argument_parser(prog or Path(sys.argv[0]).name, prog=prog,
                        description=__doc__.split("\n\n")[0],
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true",
                   help="reduced sizes on the CPU, into experiments/_smoke (not committed)")
    p.add_argument("--only", help="comma-separated study names (default: all)")
    p.add_argument("--jobs", type=int, help="studies run side by side (default: 4 on the GPU, "
                   "1 with --smoke)")
    p.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda, cpu with --smoke")
    p.add_argument("--dest", type=Path, help="where study folders go (default: experiments/, "
                   "experiments/_smoke with --smoke, a temporary folder with --out)")
    p.add_argument("--out", type=Path, help=f"also write one archive {ARCHIVE} of every study "
                   "folder into this directory")
    p.add_argument("--timeout", type=float, help="seconds per study; a study past it is stopped "
                   "and its finished jobs are kept (default: none)")
    p.add_argument("--deadline", type=float, help="seconds for the whole run: each study is "
                   "stopped at it (finished jobs kept), a study not started 30 s before it is "
                   "skipped, and the archive is written")
    p.add_argument("--work", type=Path, help="Hydra run directories (default: a temporary one)")
    p.add_argument("--unpack", type=Path, metavar="ARCHIVE",
                   help="extract an archive of --out into experiments/ and refresh the NOTES")
    p.add_argument("--notes", action="store_true",
                   help="redraw every PNG and refresh every NOTES.md results block from the "
                   "study CSVs under --dest (default: experiments/)")
    a = p.parse_args(argv)
    unknown = [n.strip() for n in (a.only or "").split(",") if n.strip() not in BY_NAME]
    if a.only is not None and unknown:  # (a KeyError traceback)
        p.error(f"--only={a.only!r}: no study {', '.join(map(repr, unknown))}; allowed: "
                f"{', '.join(BY_NAME)}")
    if a.jobs is not None and a.jobs < 1:
        p.error(f"--jobs={a.jobs} is invalid; allowed: an integer >= 1")
    if a.unpack:
        if not (a.unpack.is_file() and tarfile.is_tarfile(a.unpack)):  # (a traceback)
            p.error(f"--unpack={str(a.unpack)!r} is not a {ARCHIVE} archive; allowed: the "
                    "archive that --out wrote")
        print("unpacked:", ", ".join(unpack(a.unpack, studies=STUDIES)))
        return 0
    if a.notes:
        for st in STUDIES:
            folder = (a.dest or STUDIES_DIR) / st.name
            folder.mkdir(parents=True, exist_ok=True)
            replot(st, folder)
            print(write_notes(st, folder))
        return 0
    studies = STUDIES if not a.only else [BY_NAME[n.strip()] for n in a.only.split(",")]
    device = a.device or ("cpu" if a.smoke else "cuda")
    jobs = a.jobs or (1 if a.smoke else 4)
    tmp = None
    if a.dest:
        dest = a.dest
    elif a.out:
        dest = Path(tmp := tempfile.mkdtemp(prefix="studies_")) / "results"
    else:
        dest = EXP / "_smoke" if a.smoke else STUDIES_DIR
    work = a.work or Path(tempfile.mkdtemp(prefix="studies_work_"))
    t0 = time.perf_counter()

    def one(st: Study) -> dict:
        left = a.deadline - (time.perf_counter() - t0) if a.deadline else math.inf
        if left < 30:
            print(f"{st.name}: not run ({left:.0f} s left of --deadline={a.deadline:g})")
            return {"study": st.name, "returncode": "not run"}
        limit = min(a.timeout or math.inf, left)
        return run_study(st, work, dest, device, a.smoke, concurrent=min(jobs, len(studies)),
                         timeout_s=None if math.isinf(limit) else limit)

    # the longest first, so that the side-by-side slots stay busy
    order = sorted(studies, key=lambda st: -st.cost)
    with ThreadPoolExecutor(max_workers=jobs) as ex:
        infos = list(ex.map(one, order))
    print(f"all studies: {time.perf_counter() - t0:.0f} s")
    if a.out:
        print("archive:", pack(dest, a.out, STUDIES))
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(i["returncode"] == 0 for i in infos) else 1

