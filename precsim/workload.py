"""Workloads: the input streams every scheme and the float64 truth consume in lockstep.

A workload yields inputs for steps ``[t0, t1)`` as float64 arrays with a leading time axis and a
sequence axis: Mamba-2 ``dt (m,S,H)``, ``x (m,S,H,P)``, ``B``/``C (m,S,H,N)``; GDN ``g``/``beta
(m,S,H)``, ``q``/``k (m,S,H,K)``, ``v (m,S,H,V)``; plus per-head constants (``A``, ``D``).
Random inputs are drawn per block of ``BLOCK`` steps from a generator keyed by (seed, block), so the
stream never depends on how the engine chunks time, and memory stays flat over the horizon.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .config import Config
from .errors import PrecsimError

BLOCK = 256

MAMBA2_KEYS = {"A": 1, "dt": 2, "x": 3, "B": 3, "C": 3}
GDN_KEYS = {"g": 2, "beta": 2, "q": 3, "k": 3, "v": 3}


def softplus(x):
    return np.logaddexp(0.0, x)


def inv_softplus(y):
    return y + np.log(-np.expm1(-y))


class Workload:
    """Base class: ``params`` (per-head constants) and ``chunk(t0, t1)`` (inputs)."""

    family: str
    params: dict
    max_steps: int | None = None

    def chunk(self, t0: int, t1: int) -> dict:
        raise NotImplementedError


class RandomWorkload(Workload):
    """Synthetic streams with real initialisation distributions (DESIGN.md §2)."""

    def __init__(self, cfg: Config, style: str):
        m = cfg.model
        self.family, self.style = m.family, style
        self.H, self.P, self.N, self.G = m.heads, m.head_dim, m.state_dim, m.groups
        self.S = cfg.run.seqs
        self.seed = cfg.run.seed
        self.dt_noise = cfg.workload.dt_noise
        rng = np.random.default_rng([self.seed, 0xC0FFEE])
        H = self.H
        n_long = int(round(cfg.workload.long_memory_frac * H)) if style == "seed_article" else 0
        if self.family == "mamba2":
            if style == "seed_article":
                # the article's experiment: slow decay everywhere, very slow on long-memory heads
                A = -np.exp(rng.uniform(np.log(1e-2), np.log(1.0), H))
                A[:n_long] = -np.exp(rng.uniform(np.log(1e-4), np.log(1e-3), n_long))
                self.params = {"A": A, "dt_bias": np.zeros(H)}
            else:
                A = -rng.uniform(1.0, 16.0, H)  # mamba_ssm: A ~ U[1,16], stored as A_log
                dt0 = np.maximum(np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), H)), 1e-4)
                self.params = {"A": A, "dt_bias": inv_softplus(dt0)}
        else:
            A = rng.uniform(1.0, 16.0, H)  # GDN: A_log = log U[1,16] (fla / HF init)
            dt0 = np.maximum(np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), H)), 1e-4)
            dt_bias = inv_softplus(dt0)
            if style == "seed_article":
                A = np.exp(rng.uniform(np.log(1e-2), np.log(1.0), H))
                A[:n_long] = np.exp(rng.uniform(np.log(1e-4), np.log(1e-3), n_long))
                dt_bias = np.zeros(H)
            self.params = {"A_log": np.log(A), "dt_bias": dt_bias}
        self._cache: tuple[int, dict] | None = None

    def _block(self, b: int) -> dict:
        if self._cache is not None and self._cache[0] == b:
            return self._cache[1]
        rng = np.random.default_rng([self.seed, 0xB10C, b])
        S, H, P, N, G, T = self.S, self.H, self.P, self.N, self.G, BLOCK
        if self.family == "mamba2":
            if self.style == "seed_article":
                dt = softplus(rng.standard_normal((T, S, H)))
                bc_scale = 1.0 / math.sqrt(N)
            else:
                dt = softplus(self.dt_noise * rng.standard_normal((T, S, H))
                              + self.params["dt_bias"])
                bc_scale = 1.0
            x = rng.standard_normal((T, S, H, P))
            Bg = rng.standard_normal((T, S, G, N)) * bc_scale
            Cg = rng.standard_normal((T, S, G, N)) * bc_scale
            rep = H // G
            out = {"dt": dt, "x": x, "B": np.repeat(Bg, rep, axis=2),
                   "C": np.repeat(Cg, rep, axis=2)}
        else:
            raw = rng.standard_normal((T, S, H))
            g = -np.exp(self.params["A_log"]) * softplus(self.dt_noise * raw
                                                         + self.params["dt_bias"])
            beta = 1.0 / (1.0 + np.exp(-rng.standard_normal((T, S, H))))
            q = rng.standard_normal((T, S, H, N))
            k = rng.standard_normal((T, S, H, N))
            q /= np.linalg.norm(q, axis=-1, keepdims=True) * math.sqrt(N)  # L2 norm, 1/sqrt(K)
            k /= np.linalg.norm(k, axis=-1, keepdims=True)
            v = rng.standard_normal((T, S, H, P))
            out = {"g": g, "beta": beta, "q": q, "k": k, "v": v}
        self._cache = (b, out)
        return out

    def chunk(self, t0: int, t1: int) -> dict:
        parts: dict[str, list] = {}
        t = t0
        while t < t1:
            b, off = divmod(t, BLOCK)
            e = min(t1 - t, BLOCK - off)
            for k, v in self._block(b).items():
                parts.setdefault(k, []).append(v[off:off + e])
            t += e
        return {k: (v[0] if len(v) == 1 else np.concatenate(v)) for k, v in parts.items()}


class TraceWorkload(Workload):
    """Inputs recorded from a real model (``.npz``; schema in the README)."""

    def __init__(self, cfg: Config):
        path = Path(cfg.workload.path)
        if path.is_dir():  # a precsim.record directory: one layer's trace
            path = _record_layer(path, cfg.workload.layer)
        if not path.is_file():
            raise PrecsimError(f"workload.path={str(path)!r} does not exist; allowed: an .npz "
                               "trace file")
        try:
            with np.load(path, allow_pickle=False) as z:
                data = {k: np.asarray(z[k]) for k in z.files}
        except Exception as e:  # noqa: BLE001 - any unreadable file is a user error
            raise PrecsimError(f"workload.path={str(path)!r} is not a readable .npz file "
                               f"({type(e).__name__})") from None
        self.data = validate_trace(data, where=f"trace {path.name}")
        self.family = "mamba2" if "dt" in self.data else "gdn"
        self.max_steps = self.data["dt" if self.family == "mamba2" else "g"].shape[0]
        # the trace fixes the layer: its family and shape replace model.* (then re-validated)
        m = cfg.model
        m.family = self.family
        m.heads, m.head_dim, m.state_dim = _trace_dims(self.data, self.family)
        m.groups = 1
        from .config import validate

        validate(cfg)
        if cfg.run.seqs != 1:
            raise PrecsimError(f"run.seqs={cfg.run.seqs} with workload=trace; allowed: 1 "
                               "(a trace is one sequence)")
        if cfg.run.steps > self.max_steps:
            raise PrecsimError(f"run.steps={cfg.run.steps} exceeds the trace length "
                               f"T={self.max_steps}; allowed: 1..{self.max_steps}")
        if self.family == "mamba2":
            self.params = {"A": self.data["A"].astype(np.float64)}
            if "D" in self.data:
                self.params["D"] = self.data["D"].astype(np.float64)
        else:
            self.params = {}

    def chunk(self, t0: int, t1: int) -> dict:
        keys = ("dt", "x", "B", "C") if self.family == "mamba2" else ("g", "beta", "q", "k", "v")
        return {k: self.data[k][t0:t1, None].astype(np.float64) for k in keys}


def _record_layer(root: Path, layer: int | None) -> Path:
    have = sorted(int(p.stem[6:]) for p in root.glob("layer_*.npz") if p.stem[6:].isdigit())
    if layer is None or layer not in have:
        raise PrecsimError(f"workload.layer={layer!r} for record directory {str(root)!r}; "
                           f"allowed: {', '.join(map(str, have)) or '(no layer_XX.npz there)'}")
    return root / f"layer_{layer:02d}.npz"


def _trace_dims(d: dict, family: str) -> tuple[int, int, int]:
    if family == "mamba2":
        return d["x"].shape[1], d["x"].shape[2], d["B"].shape[2]
    return d["v"].shape[1], d["v"].shape[2], d["k"].shape[2]


def validate_trace(data: dict, where: str = "trace") -> dict:
    """Check keys, shapes, dtypes and values of a trace dict; one-line PrecsimError on failure."""
    if "dt" in data or "A" in data:
        family, keys = "mamba2", MAMBA2_KEYS
    elif "g" in data:
        family, keys = "gdn", GDN_KEYS
    else:
        raise PrecsimError(f"{where}: keys {sorted(data)} name no family; allowed: Mamba-2 "
                           f"{sorted(MAMBA2_KEYS)} (+D) or GDN {sorted(GDN_KEYS)}")
    for k, nd in keys.items():
        if k not in data:
            raise PrecsimError(f"{where}: missing key {k!r} for {family}; required: "
                               f"{', '.join(keys)}")
        a = data[k]
        if a.dtype not in (np.float32, np.float64):
            raise PrecsimError(f"{where}: {k} has dtype {a.dtype}; allowed: float32, float64")
        if a.ndim != nd:
            raise PrecsimError(f"{where}: {k} has shape {a.shape}; expected {nd} axes")
        if not np.isfinite(a).all():
            bad = np.argwhere(~np.isfinite(a))[0]
            raise PrecsimError(f"{where}: {k} has a non-finite value at index {tuple(bad)}; "
                               "allowed: finite numbers")
    if family == "mamba2":
        T, H = data["dt"].shape
        P, N = data["x"].shape[2], data["B"].shape[2]
        expect = {"A": (H,), "dt": (T, H), "x": (T, H, P), "B": (T, H, N), "C": (T, H, N)}
        if "D" in data:
            expect["D"] = (H,)
            if data["D"].ndim != 1 or not np.isfinite(data["D"]).all():
                raise PrecsimError(f"{where}: D must be finite with shape ({H},), got "
                                   f"{data['D'].shape}")
        if not (data["A"] < 0).all():
            raise PrecsimError(f"{where}: A={data['A'].min():.3g}..{data['A'].max():.3g}; "
                               "allowed: negative values (A = -exp(A_log))")
        if not (data["dt"] > 0).all():
            raise PrecsimError(f"{where}: dt has values <= 0; allowed: positive (after softplus)")
    else:
        T, H = data["g"].shape
        K, V = data["k"].shape[2], data["v"].shape[2]
        expect = {"g": (T, H), "beta": (T, H), "q": (T, H, K), "k": (T, H, K), "v": (T, H, V)}
        if not (data["g"] <= 0).all():
            raise PrecsimError(f"{where}: g has values > 0; allowed: log-decay <= 0")
        b = data["beta"]
        if not ((b > 0) & (b < 1)).all():
            raise PrecsimError(f"{where}: beta outside (0, 1); allowed: sigmoid outputs in (0,1)")
    for k, shp in expect.items():
        if tuple(data[k].shape) != shp:
            raise PrecsimError(f"{where}: {k} has shape {tuple(data[k].shape)}; expected {shp}")
    return data


def make_workload(cfg: Config) -> Workload:
    kind = cfg.workload.kind
    if kind == "trace":
        return TraceWorkload(cfg)
    return RandomWorkload(cfg, kind)
