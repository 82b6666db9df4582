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
import triton
import triton.language as tl

from precsim import formats as pf
from precsim.errors import PrecsimError

from .quant import _i32
from .rng import element_index, random_bits

TAGS = {"dt": 1, "x": 2, "B": 3, "C": 4, "g": 5, "beta": 6, "q": 7, "k": 8, "v": 9}


@triton.jit
def _normals_kernel(out_ptr, n, off_lo, off_hi, k0a, k1a, k0b, k1b, BLOCK: tl.constexpr):
    """out[i] = Box-Muller normal of element ``off + i`` (the torch reference, fused)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    lo, hi = element_index(off_lo.to(tl.uint32), off_hi.to(tl.uint32), i)
    w1 = random_bits(k0a.to(tl.uint32), k1a.to(tl.uint32), lo, hi)
    w2 = random_bits(k0b.to(tl.uint32), k1b.to(tl.uint32), lo, hi)
    u1 = (w1.to(tl.float64) + 0.5) * 2.3283064365386963e-10
    u2 = w2.to(tl.float64) * 2.3283064365386963e-10
    z = tl.sqrt(-2.0 * tl.log(u1)) * tl.cos(6.283185307179586 * u2)
    tl.store(out_ptr + i, z, mask=i < n)


def normals(seed: int, tag: int, tail: tuple, t0: int, t1: int, device,
            fused: bool | None = None) -> torch.Tensor:
    """Standard normals (float64) of rows ``t0..t1-1`` of a ``(T, *tail)`` array.

    ``fused`` (default: on CUDA) draws them with one Triton kernel instead of the torch ops below
    (same function; log/cos may differ in the last ulp).
    """
    per = math.prod(tail)
    n, off = (t1 - t0) * per, t0 * per
    dev = torch.device(device)
    if fused if fused is not None else dev.type == "cuda":
        ka = pf.stream_keys(seed, pf.stream_id(0x1A7A, tag, 0))
        kb = pf.stream_keys(seed, pf.stream_id(0x1A7A, tag, 1))
        out = torch.empty(n, dtype=torch.float64, device=dev)
        _normals_kernel[(triton.cdiv(n, 1024),)](
            out, n, _i32(off & 0xFFFFFFFF), _i32(off >> 32), _i32(ka[0]), _i32(ka[1]),
            _i32(kb[0]), _i32(kb[1]), BLOCK=1024)
        return out.reshape(t1 - t0, *tail)
    w1 = pf.random_bits_torch(n, seed, pf.stream_id(0x1A7A, tag, 0), off, device=device)
    w2 = pf.random_bits_torch(n, seed, pf.stream_id(0x1A7A, tag, 1), off, device=device)
    u1 = (w1.to(torch.float64) + 0.5) * 2.0**-32
    u2 = w2.to(torch.float64) * 2.0**-32
    z = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)
    return z.reshape(t1 - t0, *tail)


class CounterInputs:
    """``chunk(t0, t1)`` → dict of float64 device tensors (Mamba-2 B/C per group: (n,S,G,N))."""

    def __init__(self, cfg, params: dict, device, fused: bool | None = None):
        if cfg.workload.kind not in ("synthetic", "seed_article"):
            raise PrecsimError(f"inputs='device' needs workload.kind synthetic or seed_article, "
                               f"got {cfg.workload.kind!r}; use inputs='host'")
        m = cfg.model
        self.family, self.style = m.family, cfg.workload.kind
        self.S, self.H, self.P, self.N, self.G = cfg.run.seqs, m.heads, m.head_dim, m.state_dim, \
            m.groups
        self.seed, self.noise = cfg.run.seed, cfg.workload.dt_noise
        self.dev = torch.device(device)
        self.fused = fused
        self.p = {k: torch.as_tensor(v, dtype=torch.float64, device=self.dev)
                  for k, v in params.items()}

    def _z(self, key: str, tail: tuple, t0: int, t1: int) -> torch.Tensor:
        return normals(self.seed, TAGS[key], tail, t0, t1, self.dev, self.fused)

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
