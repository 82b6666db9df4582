"""Study 9 (issue 14): studies 4 and 8 on traces recorded from tiny random models.

One command (CPU, 1-3 minutes):

    python experiments/studies/study_real_traces/run.py [--tokens 2048] [--window 128] [--out DIR]

It builds a tiny random Mamba-2 (``Mamba2ForCausalLM``) and Qwen3-Next (GDN) checkpoint offline
(weights N(0, 0.2^2), slowly decaying heads as ``tests/conftest.py::kl_ckpt``; state dims
that the formats' blocks divide), saves them to a temporary directory, records them with
``python -m precsim.record``, replays every recorded SSM layer under the schemes of study 4
(``experiment=study_precision_table``, 26 schemes) and study 8 (``experiment=study_kl_vs_paper``,
4 schemes) with ``workload=trace``, and writes ``results.csv`` (tidy), ``real_traces.png`` and
``run_info.json`` into ``--out``. THE WEIGHTS ARE RANDOM: the numbers show the pipeline and the
ordering of schemes on the mixer-input statistics of a random model, not a trained model.

On your own checkpoint the same steps are (docs/real-models.md):

    python -m precsim.record --model CKPT --tokens 4096 --out rec/ --device cuda
    python -m precsim -m experiment=study_precision_table workload=trace workload.path=rec/ \\
        workload.layer=K run.steps=T run.seqs=1 hydra.sweeper.params.model=mamba2 run.device=cuda
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import math
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
STUDIES = {"study_precision_table": 4, "study_kl_vs_paper": 8}
COLS = ("study", "family", "model_class", "layer", "heads", "head_dim", "state_dim", "steps",
        "scheme", "label", "kind", "fmt", "rounding", "read_fmt", "bytes_per_step", "step",
        "rel_err", "kl", "top1", "state_drift", "read_drift")


def _rs():
    """The studies' shared code (experiments/studies/studylib.py)."""
    sys.path.insert(0, str(HERE.parent))
    import studylib

    return studylib


def build(root: Path) -> dict[str, Path]:
    """The two tiny random checkpoints (seed 0), saved under ``root``."""
    import numpy as np
    import torch
    import transformers as tf

    from precsim import models

    cfgs = {
        # 2 SSM layers of 4 heads x head_dim 32 x state 64 (NVFP4 blocks of 16, MXFP4 of 32)
        "mamba2": tf.Mamba2Config(vocab_size=256, hidden_size=64, num_hidden_layers=2,
                                  num_heads=4, head_dim=32, expand=2, state_size=64, n_groups=1,
                                  conv_kernel=4, chunk_size=64, initializer_range=0.2),
        # 2 GDN layers (of 3) of 4 value heads x K 64 x V 32, 2 key heads
        "qwen3_next": tf.Qwen3NextConfig(
            vocab_size=256, hidden_size=64, num_hidden_layers=3, num_attention_heads=2,
            num_key_value_heads=1, head_dim=32, intermediate_size=64, moe_intermediate_size=32,
            shared_expert_intermediate_size=32, num_experts=2, num_experts_per_tok=1,
            linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=64,
            linear_value_head_dim=32, linear_conv_kernel_dim=4,
            layer_types=["linear_attention", "full_attention", "linear_attention"],
            initializer_range=0.2),
    }
    cls = {"mamba2": tf.Mamba2ForCausalLM, "qwen3_next": tf.Qwen3NextForCausalLM}
    out = {}
    for name, c in cfgs.items():
        torch.manual_seed(0)
        m = cls[name](c).eval()
        with torch.no_grad():  # slowly decaying heads: a state error persists
            for _, mixer, _ in models.ssm_layers(m):
                mixer.A_log.fill_(float(np.log(0.05)))
        m.save_pretrained(root / name)
        out[name] = root / name
    return out


def record(ckpts: dict[str, Path], root: Path, tokens: int) -> dict:
    """``python -m precsim.record`` on each checkpoint (timed as a whole process)."""
    out = {}
    for name, path in ckpts.items():
        rec = root / f"rec_{name}"
        cmd = [sys.executable, "-m", "precsim.record", "--model", str(path), "--tokens",
               str(tokens), "--out", str(rec)]
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
        meta = json.loads((rec / "record.json").read_text())
        out[name] = {"dir": rec, "process_s": time.perf_counter() - t0, "meta": meta}
    return out


def full_windows(steps: int, window: int) -> int:
    """The replayed length: whole windows only (else the last window is a short, noisy one)."""
    return steps - steps % window if steps >= window else steps


def replay(study: str, name: str, rec: dict, work: Path, window: int) -> tuple[Path, float, list]:
    """One Hydra multirun of ``study``'s preset over every recorded layer of one model."""
    layers = [lay["layer"] for lay in rec["meta"]["layers"]]
    sweep = work / f"{study}_{name}"
    cmd = [sys.executable, "-m", "precsim", "-m", f"experiment={study}", "workload=trace",
           f"workload.path={rec['dir']}", f"workload.layer={','.join(map(str, layers))}",
           f"run.steps={full_windows(rec['meta']['steps'], window)}", "run.seqs=1",
           f"metrics.window={window}",
           "run.device=cpu", "run.progress=false", "hydra.sweeper.params.model=mamba2",
           f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=job${hydra.job.num}"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{study} on {name} failed:\n{p.stderr[-3000:]}")
    shown = ["python", *cmd[1:]]
    return sweep, time.perf_counter() - t0, shown


def tidy(study: str, sweep: Path, rec: dict) -> list[dict]:
    from precsim import report
    from precsim import result as res

    out = []
    for job in report.collect(sweep):
        s = job.summary
        c = s["config"]
        m = c["model"]
        base = {"study": study, "family": m["family"], "model_class": rec["meta"]["model_class"],
                "layer": c["workload"]["layer"], "heads": m["heads"], "head_dim": m["head_dim"],
                "state_dim": m["state_dim"], "steps": s["steps"]}
        rows = res.read_rows(job.path / res.METRICS_FILE)
        for name, info in s["schemes"].items():
            sc = c["schemes"][name]
            b = {**base, "scheme": name, "label": info.get("label", name), "kind": sc["kind"],
                 "fmt": sc["fmt"], "rounding": sc["rounding"], "read_fmt": sc.get("read_fmt"),
                 "bytes_per_step": s.get("cost", {}).get(name, {}).get("bytes_per_step")}
            for x in sorted((x for x in rows if x["scheme"] == name), key=lambda x: x["step"]):
                out.append({**b, **{k: x.get(k) for k in COLS[-6:]}})
    return out


def write_csv(rows: list[dict], path: Path) -> None:
    _rs().write_csv(rows, path, COLS)


def read_csv(path: Path) -> list[dict]:
    rs = _rs()
    with open(path, newline="") as f:
        return [{k: rs.to_num(v) for k, v in r.items()} for r in csv.DictReader(f)]


def _lay(r: dict) -> str:
    fam = "Mamba-2" if r["family"] == "mamba2" else "GDN"
    return f"{fam} layer {r['layer']} ({r['heads']}×{r['head_dim']}×{r['state_dim']})"


def finals(rows: list[dict]) -> list[dict]:
    last: dict = {}
    for r in rows:
        key = (r["study"], r["family"], r["layer"], r["scheme"])
        if key not in last or r["step"] > last[key]["step"]:
            last[key] = r
    return list(last.values())


def plot(rows: list[dict], path: Path) -> None:
    rs = _rs()
    plt = rs.get_plt()
    fams = list(dict.fromkeys(r["family"] for r in rows))
    fig, axes = plt.subplots(2, len(fams), figsize=(6.6 * len(fams), 9.6), squeeze=False)
    fin = [r for r in finals(rows) if r["study"] == "study_precision_table"]
    kind_m = {"conventional": "s", "shared": "^", "split": "o"}
    for j, fam in enumerate(fams):
        ax = axes[0][j]
        sub = [r for r in fin if r["family"] == fam]
        for li, lay in enumerate(dict.fromkeys(_lay(r) for r in sub)):
            pts = [r for r in sub if _lay(r) == lay]
            for kind, mk in kind_m.items():
                k = [r for r in pts if r["kind"] == kind]
                ax.scatter([r["bytes_per_step"] for r in k], [rs.positive(r["rel_err"]) for r in k],
                           marker=mk, s=34, color=f"C{li}", alpha=0.75,
                           label=f"{lay.split(' (')[0]}, {kind}", zorder=3)
            front = rs.pareto_points([(r["bytes_per_step"], rs.positive(r["rel_err"])) for r in pts
                               if not math.isnan(rs.positive(r["rel_err"]))])
            ax.plot([p[0] for p in front], [p[1] for p in front], "-", color=f"C{li}", lw=1,
                    alpha=0.6, zorder=1)
        for r in sub:  # name the references once (first layer's)
            if r["kind"] != "split" and r["layer"] == sub[0]["layer"]:
                short = r["label"].replace("conventional", "conv.")
                up = r["kind"] == "shared"
                ax.annotate(short, (r["bytes_per_step"], rs.positive(r["rel_err"])), fontsize=6.5,
                            xytext=(4, 5 if up else -10), textcoords="offset points",
                            bbox=dict(fc="white", ec="none", alpha=0.7, pad=0.3))
        rs.loglog_axes(ax, "bytes per decode step per head (cost model)",
                   f"rel. output error, window ending at step {sub[0]['step']:,}",
                   f"study 4 schemes, {sub[0]['model_class']} (lines: Pareto fronts)", xbase=10)
        ax.legend(fontsize=7, ncol=2, loc="best")
        ax = axes[1][j]
        sub = [r for r in rows if r["study"] == "study_kl_vs_paper" and r["family"] == fam
               and r["kind"] != "conventional"]
        labels = list(dict.fromkeys(r["label"] for r in sub))
        for li, lay in enumerate(dict.fromkeys(_lay(r) for r in sub)):
            for si, lab in enumerate(labels):
                pts = sorted((r["step"], rs.positive(r["kl"])) for r in sub
                             if _lay(r) == lay and r["label"] == lab)
                wide = "fp32 update" in lab  # drawn under the FP16-SR split it coincides with
                ax.plot([p[0] for p in pts], [p[1] for p in pts], ("-", "--", ":")[li % 3],
                        color=f"C{si + 2}", lw=3.2 if wide else 1.5, alpha=0.55 if wide else 1,
                        label=f"{lab}, {lay.split(' (')[0]}")
        rs.loglog_axes(ax, "decode step (tokens)", "KL(p_ref ‖ p_sim), window mean, nats/token",
                   f"study 8 schemes, {sub[0]['model_class']}")
        ax.legend(fontsize=6.5, loc="best", framealpha=0.85)
    fig.suptitle("Traces recorded from tiny RANDOM-weight models (not trained): "
                 f"{rows[0]['steps']:,} steps, window {_window(rows)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _window(rows):
    steps = sorted({r["step"] for r in rows})
    return steps[1] - steps[0] if len(steps) > 1 else steps[0]


# -- NOTES.md tables -------------------------------------------------------------------------
def _layers(fin):
    return list(dict.fromkeys((r["family"], r["layer"]) for r in sorted(
        fin, key=lambda r: (r["family"] != "mamba2", r["layer"]))))


def table_precision(rows: list[dict], budgets=(0.01, 0.0625, 0.25)) -> str:
    rs = _rs()
    fin = [r for r in finals(rows) if r["study"] == "study_precision_table"]
    lays = _layers(fin)
    cell = {(r["family"], r["layer"], r["scheme"]): r for r in fin}
    fams = list(dict.fromkeys(f for f, _ in lays))
    name = {"mamba2": "M", "gdn": "G"}
    out = []
    for metric, unit in (("rel_err", "relative output error"),
                         ("kl", "KL through the readout head, nats/token")):
        head = ["scheme"] + ([f"B/step/head ({f})" for f in fams] if metric == "rel_err" else [])
        head += [f"{name[f]}{lay}" for f, lay in lays]
        body = []
        for sc in dict.fromkeys(r["scheme"] for r in fin):
            anyr = next(r for r in fin if r["scheme"] == sc)
            row = [anyr["label"]]
            if metric == "rel_err":
                row += [rs.nbytes(next((cell[(f, lay, sc)]["bytes_per_step"] for f2, lay in lays
                                        if f2 == f and (f, lay, sc) in cell), None)) for f in fams]
            row += [(cell.get((f, lay, sc)) or {}).get(metric) for f, lay in lays]
            body.append(row)
        out.append(f"**Study 4 schemes: {unit}, window ending at step {fin[0]['step']:,}** "
                   f"(M = Mamba-2 layer, G = GDN layer, by the model's layer index)\n\n"
                   + rs.md_table(head, body))
    rec = []
    for f, lay in lays:
        sub = [r for r in fin if (r["family"], r["layer"]) == (f, lay)]
        for b in budgets:
            ok = sorted((r for r in sub if rs.positive(r["rel_err"]) <= b),
                        key=lambda r: (r["bytes_per_step"], r["rel_err"]))
            rec.append([f"{name[f]}{lay}", f"rel_err ≤ {b:g}"] + (
                [ok[0]["label"], rs.nbytes(ok[0]["bytes_per_step"]), ok[0]["rel_err"]]
                if ok else ["none fits", "–", "–"]))
    out.append("**Cheapest scheme within a budget (last window)**\n\n" + rs.md_table(
        ["layer", "budget", "scheme", "B/step/head", "rel_err"], rec))
    return "\n\n".join(out)


def table_kl(rows: list[dict]) -> str:
    rs = _rs()
    fin = [r for r in finals(rows) if r["study"] == "study_kl_vs_paper"]
    body = []
    for f, lay in _layers(fin):
        sub = {r["scheme"]: r for r in fin if (r["family"], r["layer"]) == (f, lay)}
        sh, sp, sp16 = (sub.get(k) for k in ("shared_nvfp4_sr", "split_fp32_nvfp4",
                                              "split_fp16sr_nvfp4"))
        c = sub.get("conventional_fp32")
        body.append([_lay(sh), c and c["kl"], sh["kl"], sp["kl"], sp16 and sp16["kl"],
                     sh["kl"] / sp["kl"] if sp["kl"] else None,
                     sh["rel_err"] / sp["rel_err"] if sp["rel_err"] else None,
                     sh["top1"], sp["top1"]])
    body.append(["ReplaySSM paper (trained model, real logits)", None, 0.136, 0.0038, None,
                 0.136 / 0.0038, None, None, None])
    return (f"**Study 8 schemes: KL at the window ending at step {fin[0]['step']:,}, nats/token "
            "(through the readout head)**\n\n" + rs.md_table(
                ["layer", "conv. FP32", "shared NVFP4-SR", "split FP32+NVFP4",
                 "split FP16-SR+NVFP4", "KL ratio shared/split", "rel_err ratio shared/split",
                 "top-1 shared", "top-1 split"], body))


def results_block(folder: Path) -> str:
    info = json.loads((folder / "run_info.json").read_text())
    rows = read_csv(folder / "results.csv")
    rec = "; ".join(f"{k}: {v['steps']} steps, {v['s_per_token'] * 1e3:.1f} ms/token in the model, "
                    f"{v['process_s']:.1f} s as a process" for k, v in info["record"].items())
    reps = "; ".join(f"{k}: {v:.1f} s" for k, v in info["replay_s"].items())
    return "\n".join([
        f"Run {info['started_utc']} on {info['machine']['host']} (CPU, "
        f"{info['machine']['cpus']} cores, shared), torch {info['machine'].get('torch')}, "
        f"transformers {info['transformers']}.",
        f"Command: `{info['command']}`; run time {info['wall_s']:.0f} s in all.",
        f"Recording ({info['tokens']} generated tokens after an 8-id fixed prompt): {rec}.",
        f"Replays (one Hydra multirun per study and model, every SSM layer, numba engine): "
        f"{reps}.", "",
        "Units: rel_err = ‖y − y_ref‖₂ / ‖y_ref‖₂ of the layer's SSM output against the float64 "
        f"truth, mean over the {_window(rows)}-step window ending at the step named; KL in "
        "nats/token through precsim's fixed random readout head (vocab 1024, logit scale 3) on "
        "that layer's output, not the model's own logits; top-1 = share of tokens whose readout "
        "argmax agrees with the truth's; bytes per decode step per head from the cost model "
        "(precsim/cost.py).", "",
        table_precision(rows), "", table_kl(rows), "",
        "![study 9](real_traces.png)", "",
        "Files: `results.csv` (tidy: one row per study, layer, scheme and window end), the PNG, "
        "`run_info.json`."])


BEGIN = ("<!-- results:begin (written by experiments/studies/study_real_traces/run.py; edits "
         "here are "
         "replaced) -->")
END = "<!-- results:end -->"


def write_notes(folder: Path) -> None:
    path = folder / "NOTES.md"
    block = f"{BEGIN}\n{results_block(folder)}\n{END}"
    text = (path.read_text() if path.is_file()
            else f"# Study 9\n\n## Results\n\n{BEGIN}\n{END}\n")
    head, rest = text.split(BEGIN, 1)
    path.write_text(head + block + rest.split(END, 1)[1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=2048, help="generated tokens per model")
    p.add_argument("--window", type=int, default=128, help="metrics window (steps)")
    p.add_argument("--out", type=Path, default=HERE, help="results folder (default: here)")
    p.add_argument("--notes", action="store_true", help="only redraw the PNG and refresh the "
                   "NOTES tables from --out/results.csv")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if not a.notes:
        import transformers

        rs = _rs()
        started = dt.datetime.now(dt.timezone.utc)
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="study9_") as tmp:
            tmp = Path(tmp)
            recs = record(build(tmp / "ckpt"), tmp, a.tokens)
            rows, replay_s, cmds = [], {}, []
            for study in STUDIES:
                for name, rec in recs.items():
                    sweep, wall, cmd = replay(study, name, rec, tmp / "work", a.window)
                    replay_s[f"{study} / {name}"] = wall
                    cmds.append(shlex.join(cmd))
                    rows += tidy(study, sweep, rec)
        write_csv(rows, a.out / "results.csv")
        info = {"study": "study_real_traces", "number": 9, "tokens": a.tokens,
                "window": a.window, "started_utc": started.isoformat(timespec="seconds"),
                "command": "python " + shlex.join(["experiments/studies/study_real_traces/run.py",
                                                   *(argv if argv is not None else sys.argv[1:])]),
                "wall_s": round(time.perf_counter() - t0, 1), "machine": rs.machine(),
                "transformers": transformers.__version__,
                "record": {k: {"model_class": v["meta"]["model_class"],
                               "layers": [x["layer"] for x in v["meta"]["layers"]],
                               "steps": v["meta"]["steps"],
                               "s_per_token": v["meta"]["s_per_token"],
                               "process_s": round(v["process_s"], 1)} for k, v in recs.items()},
                "replay_s": {k: round(v, 1) for k, v in replay_s.items()},
                "replay_commands": [c.replace(str(tmp), "<tmp>") for c in cmds]}
        (a.out / "run_info.json").write_text(json.dumps(info, indent=1) + "\n")
    rows = read_csv(a.out / "results.csv")
    plot(rows, a.out / "real_traces.png")
    write_notes(a.out)
    print(f"study 9 -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
