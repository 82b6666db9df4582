"""Diagnosis (kernels alone, not a user's process): the whole-model scan's launches on one GPU.

    python experiments/diagnose/gpu_scan_split.py [--steps 8192] [--out F.json]

Times, per configuration, one launch over ``--steps`` tokens of random inputs at real shapes
(Mamba-2 1.3B: 64 heads x 64 x 128, 1 group; Qwen3-Next GDN: 32 heads x 128 x 128), for one
sequence (a recording) and four (a whole-model run of 4 documents):

- the float64 truth alone (the reference group, a recording): the fused kernel's truth slot
  (rows = P, a program per head) against ``mamba2_truth``/``gdn_truth`` with ``rows`` state rows
  per program and ``warps`` warps;
- one scheme slot (a scheme group's launch) at 4 and 8 warps, for the ``split_nvfp4`` schemes.

Also checks that every truth split gives the fused slot's outputs to float64 rounding. Prints
a table (microseconds per token) and writes it as JSON. Needs CUDA.
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import numpy as np
import torch

SHAPES = {"mamba2": (64, 64, 128), "gdn": (32, 128, 128)}  # heads, P (value dim), N (key dim)
SCHEMES = {"conventional_fp32": {"kind": "conventional", "fmt": "fp32", "rounding": "rne"},
           "shared_nvfp4_sr": {"kind": "shared", "fmt": "nvfp4", "rounding": "sr"},
           "split_fp32_nvfp4": {"kind": "split", "fmt": "fp32", "rounding": "rne",
                                "read_fmt": "nvfp4"}}


def inputs(fam, S, H, P, N, n, dev):
    g = torch.Generator(device=dev).manual_seed(0)

    def r(*shape, lo=None, hi=None):
        x = torch.rand(*shape, generator=g, device=dev, dtype=torch.float64)
        return lo + (hi - lo) * x if lo is not None else 2 * x - 1

    a = r(n, S * H, lo=0.9, hi=1.0)
    inp = {"_a64": a, "_a32": a.float(), "_dA32": a.log().float()}
    if fam == "mamba2":
        inp.update(dt=r(n, S * H, lo=0.01, hi=0.1), x=r(n, S, H, P), B=r(n, S, 1, N),
                   C=r(n, S, 1, N))
    else:
        inp.update(beta=r(n, S * H, lo=0.1, hi=0.9), q=r(n, S, H, N), k=r(n, S, H, N) / 8,
                   v=r(n, S, H, P))
    return inp


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, reps=3):
    fn()  # compile
    _sync()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        _sync()
        best = min(best, time.perf_counter() - t)
    return best


def _truth_launch(launch, S0, fam, inp, S64, z, y, k1, ph, n, H, nw, kw):
    S64.copy_(S0)
    launch(fam, inp, S64, z, z, y, z.new_empty((1, *y.shape)), k1, ph, 0, [], [], True, 0, n, n,
           H, 16, 16, nw, None, **kw)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8192)
    ap.add_argument("--out", default="gpu_scan_split.json")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes on the CPU (TRITON_INTERPRET=1): checks the script runs")
    a = ap.parse_args(argv)
    import precsim.kernels.mamba2 as m2_k
    from precsim.kernels import gdn as gdn_k
    from precsim.kernels.codes import dispatch_order
    from precsim.kernels.quant import SCOPE_MATRIX, scale_flags

    from precsim.config import to_config
    from precsim.engines.base import segment_phase
    from precsim.engines.triton import ef_code, launch_span, scheme_block, scheme_code

    dev = torch.device("cpu" if a.smoke else "cuda")
    n = a.steps
    shapes = {"mamba2": (2, 16, 32), "gdn": (2, 16, 32)} if a.smoke else SHAPES
    rows, bad = [], []
    for fam, (H, P, N) in shapes.items():
        for S in (1, 4):
            inp = inputs(fam, S, H, P, N, n, dev)
            S0 = torch.randn((S * H, P, N), dtype=torch.float64, device=dev)
            z = torch.zeros((1, S * H, P, N), dtype=torch.float32, device=dev)
            k1 = torch.zeros((1, n), dtype=torch.int32, device=dev)
            ph = torch.zeros(n, dtype=torch.int32, device=dev)
            kw = dict(lpt=True, buf=0, sfloor=0, scope=SCOPE_MATRIX, u_master=False,
                      kernels=(m2_k, gdn_k), order=dispatch_order)
            ref_y = None
            for pb, nw in [(P, 4), (P, 8), (32, 4), (16, 4), (16, 8), (8, 4), (8, 2)]:
                m2_k.TRUTH_ROWS, m2_k.TRUTH_WARPS = pb, nw
                S64 = S0.clone()
                y = torch.empty((n, S * H, P), dtype=torch.float64, device=dev)

                t = timed(functools.partial(
                    _truth_launch, launch_span, S0, fam, inp, S64, z, y, k1, ph, n, H, nw, kw))
                if ref_y is None:
                    ref_y = y.clone()
                err = float(((y - ref_y).abs().max() / ref_y.abs().max()).item())
                if err > 1e-13:
                    bad.append((fam, S, pb, nw, err))
                rows.append({"family": fam, "seqs": S, "what": "truth", "rows": pb, "warps": nw,
                             "us_per_token": round(t / n * 1e6, 3), "max_rel_diff": err})
                print(f"{fam:6} S={S} truth rows={pb:3} warps={nw}  {t / n * 1e6:7.2f} us/token"
                      f"  diff {err:.1e}", flush=True)
            m2_k.TRUTH_ROWS, m2_k.TRUTH_WARPS = 0, 0
            cfg = to_config({"schemes": SCHEMES})
            sfl = scale_flags(cfg.formats.scale_floor, cfg.formats.nvfp4_scale)
            for name, sc in cfg.schemes.items():
                kw2 = dict(kw, sfloor=sfl)
                for nw in (4, 8):
                    st = torch.zeros((1, S * H, P, N), dtype=torch.float32, device=dev)
                    y32 = torch.empty((1, n, S * H, P), dtype=torch.float32, device=dev)
                    y64 = torch.empty((1, 1, P), dtype=torch.float64, device=dev)
                    ef = torch.zeros_like(st)
                    ends = np.unique(np.minimum(np.arange(16, n + 16, 16), n))
                    ph16 = torch.from_numpy(segment_phase(ends, n, True)).to(dev)

                    t = timed(functools.partial(
                        launch_span, fam, inp, S0, st, st.clone(), y64, y32, k1, ph16, 0, [0],
                        [scheme_code(sc)], False, 0, n, n, H, scheme_block(sc) or 16, 16, nw,
                        None, ef=ef, efs=ef_code(sc), **kw2))
                    rows.append({"family": fam, "seqs": S, "what": name, "warps": nw,
                                 "us_per_token": round(t / n * 1e6, 3)})
                    print(f"{fam:6} S={S} {name:18} warps={nw}  {t / n * 1e6:7.2f} us/token",
                          flush=True)
    with open(a.out, "w") as f:
        dev_name = "cpu" if a.smoke else torch.cuda.get_device_name()
        json.dump({"device": dev_name, "steps": n, "rows": rows, "bad": bad}, f, indent=1)
    if bad:
        print("MISMATCH", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
