"""Device-side inputs: the synthetic / seed_article streams from a counter-based generator.

The NumPy workload (``precsim.workload``) draws its normals from PCG64 on the host, about 0.6 us
per head-step: at 128 heads that alone takes longer than the fused kernels. ``CounterInputs``
draws the same distributions (same per-head constants ``wl.params``, same transforms) from
``precsim.formats.random_bits_torch`` — a pure function of (seed, stream, element index) — on the
device, so any device (CPU included) reproduces them bit for bit up to the last ulp of log/cos.
It is a different random stream from the NumPy workload: statistics agree, draws do not.

Normals: Box-Muller on two 32-bit words per value, ``z = sqrt(-2 ln u1) cos(2 pi u2)`` with
``u1 = (w1 + 0.5) / 2^32``, ``u2 = w2 / 2^32``; element index = flat index in the full
``(T, S, ...)`` array, so chunking never changes a value.
"""

from __future__ import annotations

import math

import torch

from precsim import formats as pf
from precsim.errors import PrecsimError

TAGS = {"dt": 1, "x": 2, "B": 3, "C": 4, "g": 5, "beta": 6, "q": 7, "k": 8, "v": 9}


def normals(seed: int, tag: int, tail: tuple, t0: int, t1: int, device) -> torch.Tensor:
    """Standard normals (float64) of rows ``t0..t1-1`` of a ``(T, *tail)`` array."""
    per = math.prod(tail)
    n, off = (t1 - t0) * per, t0 * per
    w1 = pf.random_bits_torch(n, seed, pf.stream_id(0x1A7A, tag, 0), off, device=device)
    w2 = pf.random_bits_torch(n, seed, pf.stream_id(0x1A7A, tag, 1), off, device=device)
    u1 = (w1.to(torch.float64) + 0.5) * 2.0**-32
    u2 = w2.to(torch.float64) * 2.0**-32
    z = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)
    return z.reshape(t1 - t0, *tail)


class CounterInputs:
    """``chunk(t0, t1)`` → dict of float64 device tensors (Mamba-2 B/C per group: (n,S,G,N))."""

    def __init__(self, cfg, params: dict, device):
        if cfg.workload.kind not in ("synthetic", "seed_article"):
            raise PrecsimError(f"inputs='device' needs workload.kind synthetic or seed_article, "
                               f"got {cfg.workload.kind!r}; use inputs='host'")
        m = cfg.model
        self.family, self.style = m.family, cfg.workload.kind
        self.S, self.H, self.P, self.N, self.G = cfg.run.seqs, m.heads, m.head_dim, m.state_dim, \
            m.groups
        self.seed, self.noise = cfg.run.seed, cfg.workload.dt_noise
        self.dev = torch.device(device)
        self.p = {k: torch.as_tensor(v, dtype=torch.float64, device=self.dev)
                  for k, v in params.items()}

    def _z(self, key: str, tail: tuple, t0: int, t1: int) -> torch.Tensor:
        return normals(self.seed, TAGS[key], tail, t0, t1, self.dev)

    def chunk(self, t0: int, t1: int) -> dict:
        S, H, P, N, G = self.S, self.H, self.P, self.N, self.G
        sp = torch.nn.functional.softplus
        if self.family == "mamba2":
            z = self._z("dt", (S, H), t0, t1)
            if self.style == "seed_article":
                dt, bc = sp(z), 1.0 / math.sqrt(N)
            else:
                dt, bc = sp(self.noise * z + self.p["dt_bias"]), 1.0
            return {"dt": dt, "x": self._z("x", (S, H, P), t0, t1),
                    "B": self._z("B", (S, G, N), t0, t1) * bc,
                    "C": self._z("C", (S, G, N), t0, t1) * bc}
        raw = self._z("g", (S, H), t0, t1)
        g = -torch.exp(self.p["A_log"]) * sp(self.noise * raw + self.p["dt_bias"])
        beta = torch.sigmoid(self._z("beta", (S, H), t0, t1))
        q = self._z("q", (S, H, N), t0, t1)
        k = self._z("k", (S, H, N), t0, t1)
        q = q / (torch.linalg.vector_norm(q, dim=-1, keepdim=True) * math.sqrt(N))
        k = k / torch.linalg.vector_norm(k, dim=-1, keepdim=True)
        return {"g": g, "beta": beta, "q": q, "k": k, "v": self._z("v", (S, H, P), t0, t1)}

    def trace(self, t0: int, t1: int, seq: int = 0) -> dict:
        """One sequence's inputs as a trace dict (``precsim.oracle.decode``), NumPy float64."""
        c = {k: v[:, seq].cpu().numpy() for k, v in self.chunk(t0, t1).items()}
        if self.family == "mamba2":
            rep = self.H // self.G
            c["B"], c["C"] = c["B"].repeat(rep, axis=1), c["C"].repeat(rep, axis=1)
            c["A"] = self.p["A"].cpu().numpy()
        return c
