"""Diagnosis (in-process, labelled so; not a user's process): what one SSM layer's whole-model
scan costs on the Triton backend (:func:`precsim.models.scan.scan`, the hook's handler), per
group and per variant of the launch, at issue 44's sizes: a Mamba-2 2.7B-shape layer (80 heads
x 64 x 128, one group of B/C) over ``--docs`` documents in chunks of ``--tokens`` positions,
the ``split_nvfp4`` schemes with the floor (5 groups: the float64 reference, the FP32 state,
the noise run, shared NVFP4-SR, split FP32 + NVFP4).

    python experiments/diagnose/gpu_layer_scan.py [--docs 4] [--tokens 2048] [--chunks 6]
        [--heads 80] [--variants base,maxnreg,truth,segments] [--docs-list 1,2,3,5]
        [--whole TOKENS] [--out DIR]

Prints a table: microseconds per token of the layer (a chunk's wall / its tokens, the median
of ``--chunks`` chunks after a warm-up one) for all groups together, then per ``--variants``:
``base`` the groups on one stream and the reference with each group alone; ``maxnreg``
registers capped at 96 / 128 / 168; ``truth`` the reference's rows split over programs;
``segments`` the ReplaySSM groups' segments as matrix products
(``precsim.kernels.mamba2.SEGMENT_DOTS``); ``--docs-list`` the same at other document counts;
``--whole`` whole-model runs in this process (as run, and at the fastest register cap). Then
each compiled kernel's warps, registers and spills, and torch.profiler's top operators of one
chunk. ``--out``: the table as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # (the CPU: a smoke test, the torch scan)


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()

SCHEMES = {"conventional_fp32": {"kind": "conventional", "fmt": "fp32", "rounding": "rne"},
           "shared_nvfp4_sr": {"kind": "shared", "fmt": "nvfp4", "rounding": "sr"},
           "split_fp32_nvfp4": {"kind": "split", "fmt": "fp32", "rounding": "rne",
                                "read_fmt": "nvfp4"}}


def inputs(T: int, b: int, H: int, P: int, N: int, seed: int = 0) -> tuple[dict, dict]:
    """A Step's inputs for ``b`` rows (every group's documents), as the hook hands them: float32
    (a bf16 model's values widened), dt after softplus."""
    g = torch.Generator(device=DEV).manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=g, device=DEV)

    docs = r(T, b // 5, H, P)  # every group sees the same inputs here (the first layer's case)
    x = docs.repeat(1, 5, 1, 1).to(torch.bfloat16).float()
    dt = torch.nn.functional.softplus(r(T, b // 5, H) - 2).repeat(1, 5, 1)
    B = (r(T, b // 5, 1, N) / N ** 0.5).repeat(1, 5, 1, 1).to(torch.bfloat16).float()
    C = (r(T, b // 5, 1, N) / N ** 0.5).repeat(1, 5, 1, 1).to(torch.bfloat16).float()
    A = -torch.exp(torch.linspace(-4, 2, H, device=DEV))
    return {"dt": dt, "x": x, "B": B, "C": C}, {"A": A, "D": torch.ones(H, device=DEV)}


def time_variant(groups, K, cfg, inp, const, T, chunks_n, streams=True, warps=0, maxnreg=None,
                 truth_rows=0, truth_warps=0, segs=False) -> float:
    from precsim.kernels import mamba2 as km

    from precsim.models import scan_triton as st
    from precsim.models.hook import Step
    from precsim.models.scan import Chunks, scan

    st.NUM_WARPS, st.STREAMS, st.MAXNREG = warps, streams, maxnreg
    km.TRUTH_ROWS, km.TRUTH_WARPS, km.SEGMENT_DOTS = truth_rows, truth_warps, segs
    rows = len(groups) * K
    sub = {k: v[:, :rows] for k, v in inp.items()}
    ch = Chunks(horizon=T * (chunks_n + 1))
    walls = []
    for c in range(chunks_n + 1):
        ch.offset = c * T
        step = Step(layer=0, family="mamba2", inp=sub, const=const, state=None, recurrent=False)
        sync()
        t = time.perf_counter()
        scan(step, groups, K, cfg, torch.float32, "triton", chunks=ch)
        sync()
        ch.settle()
        if c:
            walls.append(time.perf_counter() - t)
    st.NUM_WARPS, st.STREAMS, st.MAXNREG = 0, True, None
    km.TRUTH_ROWS = km.TRUTH_WARPS = 0
    km.SEGMENT_DOTS = False
    return statistics.median(walls) / T * 1e6


def whole_run(tokens: int, docs: int, maxnreg) -> dict:
    """One ``experiment=model_kl`` run in this process (``precsim.cli.main``) over a random
    bf16 Mamba-2 2.7B-shape checkpoint (built once where ``bench_models.py --big`` keeps it),
    the scan's registers capped at ``maxnreg``; its ``info.phases_s``."""
    import importlib.util
    import sys
    import tempfile

    import numpy as np

    from precsim.cli import main as cli_main
    from precsim.models import scan_triton as st

    bench = Path(__file__).resolve().parents[1] / "bench"
    sys.path.insert(0, str(bench))
    spec = importlib.util.spec_from_file_location("bench_models", bench / "bench_models.py")
    bm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bm)
    work = Path("/tmp/bench_models_work")
    ck = work / "mamba2_2b7"
    bm.build("mamba2_2b7", ck, "cuda")
    ids = work / f"ids_layer_scan_{docs}x{tokens}.npy"
    np.save(ids, np.random.default_rng(0).integers(0, 50288, (docs, tokens)))
    out = Path(tempfile.mkdtemp(prefix="layer_scan_whole_")) / "run"
    st.MAXNREG = maxnreg
    try:
        cli_main(["experiment=model_kl", f"model.path={ck}", f"model.ids={ids}",
                  f"run.steps={tokens}", f"run.seqs={docs}", "run.device=cuda",
                  "metrics.window=1024", "metrics.plot=false", "run.progress=false",
                  f"run.out_dir={out}"])
    finally:
        st.MAXNREG = None
    summ = json.loads((out / "summary.json").read_text())
    return (summ.get("info") or {}).get("phases_s")


def kernel_stats() -> dict:
    """Wrap the Mamba-2 kernels' launcher: each compiled kernel's warps, registers per thread
    and spilled bytes, by launch kind (the returned dict fills as launches happen)."""
    from precsim.kernels import mamba2 as km

    seen: dict = {}
    own = km.launch

    def launch(**kw):
        k = own(**kw)
        key = (f"{'truth' if kw['truth'] else ''}{'+' if kw['truth'] and kw['slots'] else ''}"
               f"{'schemes ' + str(kw['codes']) if kw['slots'] else ''}")
        try:
            seen[key + f" w{kw['num_warps']} r{kw.get('maxnreg')}"] = (
                k.num_warps if hasattr(k, "num_warps") else kw["num_warps"], k.n_regs,
                k.n_spills)
        except AttributeError:
            pass
        return k

    km.launch = launch
    return seen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--chunks", type=int, default=6)
    ap.add_argument("--heads", type=int, default=80)
    ap.add_argument("--out", default=None)
    ap.add_argument("--docs-list", default="", help="also: these document counts (1,2,3,...)")
    ap.add_argument("--variants", default="base",
                    help="base,maxnreg,truth,segments (comma-separated)")
    ap.add_argument("--whole", type=int, default=0, metavar="TOKENS",
                    help="then whole-model runs in this process (a random bf16 2.7B-shape "
                         "checkpoint, --docs documents of TOKENS): the forward phase as the scan "
                         "runs and with the fastest maxnreg of the 'all 5 groups' rows")
    a = ap.parse_args()
    from precsim.config import to_config
    from precsim.models.run import build_groups

    cfg = to_config({"schemes": SCHEMES, "run": {"progress": False}})
    groups = build_groups(cfg, torch.bfloat16)
    K, T, H = a.docs, a.tokens, a.heads
    inp, const = inputs(T, K * len(groups), H, 64, 128)
    gpu = torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu"
    print(f"{gpu}; groups: {[g.name for g in groups]}; {K} docs x "
          f"{H} heads x 64 x 128, chunks of {T} tokens", flush=True)
    rows = []

    def row(label, gs, **kw):
        us = time_variant(gs, K, cfg, inp, const, T, a.chunks, **kw)
        rows.append({"variant": label, "us_per_token": round(us, 3)})
        print(f"{label:58s} {us:9.3f} us/token", flush=True)

    stats = kernel_stats()
    todo = a.variants.split(",")
    row("all 5 groups (the scan as run)", groups)
    if "base" in todo:
        row("all 5 groups, one stream", groups, streams=False)
        row("reference alone", groups[:1])
        for g in groups[1:]:
            row(f"reference + {g.name}", [groups[0], g])
    if "maxnreg" in todo:
        for r in (96, 128, 168):
            row(f"all 5 groups, maxnreg {r}", groups, maxnreg=r)
            row(f"reference + shared_nvfp4_sr, maxnreg {r}", [groups[0], groups[3]], maxnreg=r)
            row(f"reference alone, maxnreg {r}", groups[:1], maxnreg=r)
    if "segments" in todo:  # kernels.mamba2.SEGMENT_DOTS: ReplaySSM segments as matrix products
        row("all 5 groups, segments as matrix products", groups, segs=True)
        for g in groups[3:]:
            row(f"reference + {g.name}, segments as matrix products", [groups[0], g], segs=True)
    if "truth" in todo:
        for rows_, w in ((32, 4), (16, 2), (16, 4)):
            row(f"reference alone, {rows_} rows a program, {w} warps", groups[:1],
                truth_rows=rows_, truth_warps=w)
    for d in [int(v) for v in a.docs_list.split(",") if v]:
        di, dc = inputs(T, d * len(groups), H, 64, 128)
        for label, gs in (("reference alone", groups[:1]),
                          ("reference + conventional_fp32", groups[:2]),
                          ("reference + shared_nvfp4_sr", [groups[0], groups[3]]),
                          ("all 5 groups", groups)):
            us = time_variant(gs, d, cfg, di, dc, T, a.chunks)
            rows.append({"variant": f"{d} docs: {label}", "us_per_token": round(us, 3)})
            print(f"{d} docs: {label:50s} {us:9.3f} us/token", flush=True)
    if a.whole:
        nreg = [(r["us_per_token"], int(r["variant"].rsplit(" ", 1)[1])) for r in rows
                if r["variant"].startswith("all 5 groups, maxnreg")]
        best = min(nreg)[1] if nreg else None
        for label, mx in (("warm-up", None), ("as run", None), (f"maxnreg {best}", best)):
            if label.startswith("maxnreg") and best is None:
                continue
            ph = whole_run(a.whole, K, mx)
            rows.append({"variant": f"whole model {K} x {a.whole}: {label}", "phases_s": ph})
            print(f"whole model {K} x {a.whole} tokens, {label}: {ph}", flush=True)
    print("kernels (warps, registers, spills, grid):")
    for k, v in sorted(stats.items()):
        print(f"  {k}: {v}")
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV == "cuda" else [])
    with profile(activities=acts) as prof:
        time_variant(groups, K, cfg, inp, const, T, 1)
    tab = prof.key_averages().table(sort_by="self_device_time_total", row_limit=25,
                                    max_name_column_width=70)
    print(tab)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "gpu_layer_scan.json").write_text(json.dumps(
            {"gpu": gpu, "docs": K,
             "tokens": T, "heads": H, "rows": rows}, indent=1) + "\n")
        (Path(a.out) / "gpu_layer_scan_ops.txt").write_text(tab + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
