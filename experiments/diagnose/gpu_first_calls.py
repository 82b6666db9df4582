# ruff: noqa: B023, E402  (lambdas run at once; imports after the warm-up, on purpose)
"""Diagnosis on a CUDA machine (labelled: not a benchmark): the host time of each first call of
the Triton engine's metrics path in a fresh process (after the CLI's warm-up), device
synchronised after each, then the same calls again. Shapes: the user's seed table on the
nemotron3_super model (one metrics batch of 2,048 steps, 128 heads x 64, 5 schemes).

    python experiments/diagnose/gpu_first_calls.py > OUT.json
"""

import json
import sys
import time

from precsim.compose import compose_config, register_configs
from precsim.process import join_warm_up, warm_up

over = ["experiment=seed_table", "model=nemotron3_super", "run.device=cuda", "run.progress=false"]
warm_up(over)
register_configs()
c = compose_config(over)
join_warm_up()

import torch
from precsim.kernels.metrics import NO_STEP, drift_partials, row_stats

from precsim.engines import triton as te
from precsim.families import decays
from precsim.metrics import DeviceAccumulator, kl_rows
from precsim.workload import make_workload

dev = torch.device("cuda")
H, P, N, ns, nB = c.model.heads, c.model.head_dim, c.model.state_dim, 5, 2048
out = {}


def step(name, fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    r = fn()
    torch.cuda.synchronize()
    out.setdefault(name, []).append(round(time.perf_counter() - t, 4))
    return r


for _rep in range(2):
    wl = step("workload", lambda: make_workload(c, "cuda"))
    inp = step("chunk", lambda: wl.chunk(0, nB))
    params = {k: torch.as_tensor(v, dtype=torch.float64, device=dev) for k, v in wl.params.items()}
    step("decays", lambda: decays("mamba2", inp, params, torch.float64))
    te._READOUTS.clear()
    ro = step("readout", lambda: te._readout(H * P, c.metrics.vocab, c.metrics.logit_scale, dev))
    S64 = torch.zeros((H, P, N), dtype=torch.float64, device=dev)
    st = torch.zeros((ns, H, P, N), dtype=torch.float32, device=dev)
    step("drift_partials", lambda: drift_partials(S64, st, st, ns, 1))
    y64 = torch.zeros((nB, H, P), dtype=torch.float64, device=dev)
    y32 = torch.zeros((ns, nB, H, P), dtype=torch.float32, device=dev)
    x = torch.zeros((nB, H, P), dtype=torch.float64, device=dev)
    D = torch.zeros(H, dtype=torch.float64, device=dev)
    first = torch.full((ns,), NO_STEP, dtype=torch.int32, device=dev)
    err, dd, yh = step("row_stats", lambda: row_stats(y32, y64, x, D, first, 0, 1, nB, P, True))
    torch.backends.cuda.matmul.allow_tf32 = True
    step("sgemm tf32", lambda: dd.reshape(ns * nB, -1) @ ro.W32.T)
    torch.backends.cuda.matmul.allow_tf32 = False
    step("sgemm ieee", lambda: dd.reshape(ns * nB, -1) @ ro.W32.T)
    step("dgemm", lambda: yh @ ro.W64.T)
    kl = step("kl_rows", lambda: kl_rows(ro, yh, dd, True, True))
    acc = DeviceAccumulator([f"s{i}" for i in range(ns)], c.metrics.window, ro)
    step("push_stats", lambda: acc.push_stats(err, *kl, order=list(range(ns))))
    step("finish", acc.finish)
    step("to_host", lambda: acc.to_host({f"s{i}": None for i in range(ns)}))
json.dump(out, sys.stdout, indent=1)
