"""Whole-model mode, sequence-parallel (``model.mode=parallel``, the default).

Under teacher forcing everything in the model but the SSM recurrences is parallel over positions.
So one forward pass over the documents runs the reference and every scheme as batch elements
(group ``g`` holds rows ``[g*K, (g+1)*K)``), and each SSM mixer's scan is replaced by
:func:`precsim.models.scan.scan`, which advances every group's state over the whole sequence.
The output head runs in chunks of positions on the backbone's last hidden state, so the logits
of the whole run are never held at once.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from .hook import Hook
from .load import base_and_head
from .metrics import token_metrics
from .scan import scan


class ScanHandler:
    """Hook handler: every SSM layer's scan under every group (see :mod:`.scan`)."""

    def __init__(self, groups, K: int, cfg, compute, backend: str, bar=None):
        self.groups, self.K, self.cfg, self.compute = groups, K, cfg, compute
        self.backend, self.bar = backend, bar
        self.layers_done = 0

    def __call__(self, step, run_own):
        y = scan(step, self.groups, self.K, self.cfg, self.compute, self.backend)
        self.layers_done += 1
        if self.bar is not None:
            self.bar.update(1)
        return y, None


def run_parallel(model, ids: np.ndarray, groups, cfg, compute, backend: str,
                 bar=None, head_chunk: int = 1024, phases: dict | None = None) -> dict:
    """Per-token metrics ``{scheme: {"kl"|"top1"|"rel": (K, N)}}`` of every scheme group against
    the reference group (``groups[0]``) over the documents ``ids (K, N)``; the forward pass's
    and the output head's seconds go to ``phases``."""
    phases = {} if phases is None else phases
    dev = next(model.parameters()).device
    K, N = ids.shape
    batch = torch.as_tensor(ids, device=dev).repeat(len(groups), 1)
    base, head = base_and_head(model)
    handler = ScanHandler(groups, K, cfg, compute, backend, bar)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    with torch.no_grad(), Hook(model, handler):
        h = base(input_ids=batch, use_cache=False).last_hidden_state
    sync()
    phases["forward_s"] = round(time.perf_counter() - t0, 3)
    out = {g.name: {k: np.empty((K, N)) for k in ("kl", "top1", "rel")} for g in groups[1:]}
    with torch.no_grad():
        for c0 in range(0, N, head_chunk):
            c1 = min(N, c0 + head_chunk)
            lr = head(h[:K, c0:c1]).double()
            for gi, g in enumerate(groups[1:], 1):
                ls = head(h[gi * K:(gi + 1) * K, c0:c1]).double()
                for k, v in token_metrics(lr, ls).items():
                    out[g.name][k][:, c0:c1] = v
    phases["head_s"] = round(time.perf_counter() - t0 - phases["forward_s"], 3)
    return out
