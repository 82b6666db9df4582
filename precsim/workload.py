"""Workloads: the input streams every scheme and the float64 truth consume in lockstep.

A workload yields inputs for steps ``[t0, t1)`` as float64 arrays with a leading time axis and a
sequence axis: Mamba-2 ``dt (m,S,H)``, ``x (m,S,H,P)``, ``B``/``C (m,S,H,N)``; GDN ``g``/``beta
(m,S,H)``, ``q``/``k (m,S,H,K)``, ``v (m,S,H,V)``; plus per-head constants (``A``, ``D``).
Random inputs come from a counter-based generator keyed by (seed, input, element index), the same
on every engine and device, so the stream never depends on how an engine chunks time, and memory
stays flat over the horizon. ``chunk`` returns torch float64 tensors on the workload's device.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from precsim import formats as pf

from .config import Config
from .errors import PrecsimError
from .families import FAMILIES, family_of, grouped_keys
from .families.base import inv_softplus  # noqa: F401 - its former home (re-exported)

# the synthetic inputs' random streams (normals' tag), every family's
TAGS = {k: t for f in FAMILIES.values() for k, t in f.TAGS.items()}


class Workload:
    """Base class: ``params`` (per-head constants) and ``chunk(t0, t1)`` (inputs)."""

    family: str
    params: dict
    max_steps: int | None = None

    def chunk(self, t0: int, t1: int) -> dict:
        raise NotImplementedError


class RandomWorkload(Workload):
    """Synthetic streams with real initialisation distributions (``workload=synthetic``: mamba_ssm's
    and fla's initialisations; ``seed_article``: the article's slow-decay layer).

    Per-head constants come from NumPy's PCG64 keyed by the seed; the per-step normals from the
    counter-based generator (:func:`normals`), so every engine and device sees the same inputs.
    """

    def __init__(self, cfg: Config, style: str, device="cpu"):
        m = cfg.model
        self.family, self.style = m.family, style
        self.H, self.P, self.N, self.G = m.heads, m.head_dim, m.state_dim, m.groups
        self.S = cfg.run.seqs
        self.seed = cfg.run.seed
        self.dt_noise = cfg.workload.dt_noise
        rng = np.random.default_rng([self.seed, 0xC0FFEE])
        H = self.H
        n_long = int(round(cfg.workload.long_memory_frac * H)) if style == "seed_article" else 0
        # the family's initialisation (seed_article: the article's slow decays)
        self.params = FAMILIES[self.family].random_params(rng, H, style, n_long)
        self.device = torch.device(device)
        self.p = {k: torch.as_tensor(v, dtype=torch.float64, device=self.device)
                  for k, v in self.params.items()}

    def _z(self, key: str, tail: tuple, t0: int, t1: int):
        z = normals(self.seed, TAGS[key], tail, t0, t1, self.device)
        return z.numpy() if self.device.type == "cpu" else z

    def chunk(self, t0: int, t1: int) -> dict:
        """Inputs of steps ``[t0, t1)``: float64 tensors on ``self.device`` (B/C per group).

        The transforms run in NumPy on the CPU (its elementwise functions give the same bits at
        every position, so chunking never changes a value; torch's vectorised CPU kernels do
        not) and in torch on CUDA, with the same formulas."""
        cpu = self.device.type == "cpu"
        xp = np if cpu else torch
        p = self.params if cpu else self.p
        out = FAMILIES[self.family].random_inputs(
            self, lambda key, tail: self._z(key, tail, t0, t1), p, xp)
        return {k: torch.from_numpy(v) for k, v in out.items()} if cpu else out

    def trace(self, t0: int, t1: int, seq: int = 0) -> dict:
        """One sequence's inputs as a trace dict (``precsim.oracle.decode``), NumPy float64."""
        c = {k: v[:, seq].cpu().numpy() for k, v in expand_groups(self.chunk(t0, t1),
                                                                   self.H).items()}
        for k in FAMILIES[self.family].PARAMS:  # the per-head constants the step takes
            c[k] = np.asarray(self.params[k], dtype=np.float64)
        return c


class TraceWorkload(Workload):
    """Inputs recorded from a real model (``.npz`` or a folder of ``.npy``; docs/workloads.md)."""

    def __init__(self, cfg: Config, device="cpu"):
        self.device = torch.device(device)
        path = Path(cfg.workload.path)
        record = (path / "record.json").is_file()
        if record:  # a precsim.record directory: one layer's trace
            path = record_layer(path, cfg.workload.layer)
        if not path.exists():
            raise PrecsimError(f"workload.path={str(path)!r} does not exist; allowed: an .npz "
                               "trace file, a layer folder or a precsim.record directory")
        if cfg.workload.layer is not None and not record:
            raise PrecsimError(f"workload.layer={cfg.workload.layer} with workload.path="
                               f"{str(path)!r}, one layer's trace (no record.json); allowed: "
                               "null, or the precsim.record directory as workload.path")
        try:
            data = load_trace_arrays(path)
        except Exception as e:  # noqa: BLE001 - any unreadable file is a user error
            raise PrecsimError(f"workload.path={str(path)!r} is not a readable trace "
                               f"({type(e).__name__}: an .npz file or a folder of .npy files)"
                               ) from None
        self.data = validate_trace(data, where=f"trace {path.name}")
        self.family = family_of(self.data)
        fam = FAMILIES[self.family]
        unused = sorted(set(self.data) - set(fam.TRACE_AXES) - {fam.SKIP})
        if unused:  # (a raw dt beside a dt_bias, say: the run would not apply it)
            import logging

            logging.getLogger("precsim").warning(
                f"trace {path.name}: keys {', '.join(map(repr, unused))} are not read (not "
                f"{fam.LABEL} inputs); the inputs: {', '.join(fam.TRACE_AXES)}"
                + (f" (+{fam.SKIP})" if fam.SKIP else ""))
        self.keys = FAMILIES[self.family].KEYS
        self.max_steps = self.data[self.keys[0]].shape[0]
        # the trace fixes the layer: its family and shape replace model.* (then re-validated)
        m = cfg.model
        m.family = self.family
        m.heads, m.head_dim, m.state_dim = trace_dims(self.data, self.family)
        fam = FAMILIES[self.family]
        m.groups = self.data[fam.GROUPED[0]].shape[1] if fam.KERNEL_GROUPS else 1
        from .config import validate

        validate(cfg)
        if cfg.run.seqs != 1:
            raise PrecsimError(f"run.seqs={cfg.run.seqs} with workload=trace; allowed: 1 "
                               "(a trace is one sequence)")
        if cfg.run.steps > self.max_steps:
            raise PrecsimError(f"run.steps={cfg.run.steps} exceeds the trace length "
                               f"T={self.max_steps}; allowed: 1..{self.max_steps}")
        self.params = {k: self.data[k].astype(np.float64)
                       for k in (*fam.PARAMS, *([fam.SKIP] if fam.SKIP else ()))
                       if k in self.data}  # (PARAMS are required: validate_trace)

    def chunk(self, t0: int, t1: int) -> dict:
        """Steps ``[t0, t1)`` as float64 tensors ``(m, 1, ...)`` on the device. From a
        memory-mapped file the rows are read once into a pinned staging buffer and copied to the
        GPU asynchronously (on the caller's stream), so the file is never held twice in host
        memory and the copy overlaps the kernels already queued."""
        out = {}
        for k in self.keys:
            rows = self.data[k][t0:t1, None]
            if self.device.type == "cuda":
                # (the dtype from an empty writable array: a read-only memory map's own slice
                # made torch warn that it does not support non-writable tensors)
                stage = torch.empty(rows.shape, pin_memory=True,
                                    dtype=torch.from_numpy(np.empty(0, rows.dtype)).dtype)
                stage.numpy()[...] = rows
                out[k] = stage.to(self.device, non_blocking=True).to(torch.float64)
            else:
                out[k] = torch.from_numpy(np.array(rows, dtype=np.float64))
        return out


def recorded_layers(root: Path) -> dict[int, Path]:
    """The layer traces of a precsim.record directory: ``layer_XX/`` folders (or the older
    ``layer_XX.npz`` files)."""
    out = {}
    for p in sorted(root.glob("layer_*")):
        stem = p.name[6:].removesuffix(".npz")
        if stem.isdigit() and (p.suffix == ".npz" or (p.is_dir() and not p.suffix)):
            out[int(stem)] = p
    return out


def record_layer(root: Path, layer: int | None) -> Path:
    have = recorded_layers(root)
    if layer is None or layer not in have:
        raise PrecsimError(f"workload.layer={layer!r} for record directory {str(root)!r}; "
                           f"allowed: {', '.join(map(str, have)) or '(no layer_XX there)'}")
    return have[layer]


class BF16Array:
    """A memory-mapped ``.bf16.npy`` (raw bfloat16 bits, uint16) read as float32 rows."""

    dtype = np.dtype(np.float32)

    def __init__(self, bits: np.ndarray):
        self.bits = bits
        self.shape, self.ndim = bits.shape, bits.ndim

    def __getitem__(self, idx):
        return (np.asarray(self.bits[idx]).astype(np.uint32) << 16).view(np.float32)

    def __array__(self, dtype=None, copy=None):
        a = self[...]
        return a if dtype is None else a.astype(dtype)

    def __len__(self):
        return self.shape[0]


def load_trace_arrays(path) -> dict:
    """The arrays of a trace folder (memory-mapped ``.npy`` files) or ``.npz``: members
    stored uncompressed (``np.savez``) are memory-mapped (read as the run goes, never held
    twice); compressed members (``np.savez_compressed``) are read whole. The layout that
    streams fastest: ``np.savez`` with float32 arrays, time-major (``(T, H, ...)`` as the
    schema says)."""
    import zipfile

    out = {}
    if Path(path).is_dir():  # a layer folder: one .npy per input (KEY.bf16.npy: bfloat16 bits)
        for f in sorted(Path(path).glob("*.npy")):
            a = np.load(f, mmap_mode="r", allow_pickle=False)
            if f.name.endswith(".bf16.npy"):
                out[f.name[:-9]] = BF16Array(a) if a.ndim > 2 else BF16Array(a)[...]
            else:
                out[f.stem] = a
        if not out:
            raise ValueError("no .npy files")
        return out
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            if info.compress_type == zipfile.ZIP_STORED:
                with open(path, "rb") as f:
                    f.seek(info.header_offset)
                    local = f.read(30)
                    n, m = (int.from_bytes(local[i:i + 2], "little") for i in (26, 28))
                    f.seek(info.header_offset + 30 + n + m)
                    fmt = np.lib.format
                    version = fmt.read_magic(f)
                    read_header = fmt.read_array_header_1_0 if version == (1, 0) else \
                        fmt.read_array_header_2_0  # 3.0 differs only in the header's encoding
                    shape, fortran, dtype = read_header(f)
                    offset = f.tell()
                if dtype.hasobject:
                    raise ValueError(f"{name}: object arrays are not allowed")
                out[name] = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape,
                                      order="F" if fortran else "C")
            else:
                with zf.open(info) as f:
                    out[name] = np.lib.format.read_array(f, allow_pickle=False)
    return out


def trace_dims(d: dict, family: str) -> tuple[int, int, int]:
    """``(heads, Dv, Dk)`` of a trace dict: Mamba-2 ``(H, P, N)``, GDN ``(H, V, K)``."""
    f = FAMILIES[family]
    return d[f.VALUE].shape[1], d[f.VALUE].shape[2], d[f.KEY].shape[2]


def validate_trace(data: dict, where: str = "trace") -> dict:
    """Check keys, shapes, dtypes and values of a trace dict; one-line PrecsimError on failure."""
    allowed = " or ".join(f"{f.SHORT} {sorted(f.TRACE_AXES)}" + (f" (+{f.SKIP})" if f.SKIP else "")
                          for f in FAMILIES.values())
    named = [(n, f) for n, f in FAMILIES.items() if any(k in data for k in f.MARKERS)]
    if len(named) > 1:
        which = " and ".join(f"{f.SHORT}'s {'/'.join(f.MARKERS)}" for _, f in named)
        raise PrecsimError(f"{where}: keys {sorted(data)} name "
                           f"{'both' if len(named) == 2 else len(named)} families ({which}); "
                           f"allowed: {allowed}")
    if not named:
        raise PrecsimError(f"{where}: keys {sorted(data)} name no family; allowed: {allowed}")
    family, fam = named[0]
    keys = fam.TRACE_AXES
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
            raise PrecsimError(f"{where}: {k} has a non-finite value at index "
                               f"{tuple(int(i) for i in bad)}; "
                               "allowed: finite numbers")
    t_key = next(k for k, nd in keys.items() if nd > 1)  # (A, D: per head)
    if data[t_key].shape[0] == 0:  # ("run.steps=1 exceeds the trace length T=0; allowed: 1..0")
        raise PrecsimError(f"{where}: {t_key} has shape {data[t_key].shape}, no steps; allowed: "
                           "a trace of at least one step")
    expect = fam.check_trace(data, where, _groups_of)  # the family's values and shapes
    for k, shp in expect.items():
        if tuple(data[k].shape) != shp:
            raise PrecsimError(f"{where}: {k} has shape {tuple(data[k].shape)}; expected {shp}")
    return data


def _groups_of(a, H: int, where: str, key: str) -> int:
    """The group count of a grouped input ``(T, G, N)``: G divides the heads H (G = H: none)."""
    G = a.shape[1]
    if G < 1 or H % G:
        raise PrecsimError(f"{where}: {key} has {G} groups (shape {tuple(a.shape)}); allowed: a "
                           f"divisor of the {H} heads")
    return G


def make_workload(cfg: Config, device="cpu") -> Workload:
    """The run's input stream; ``chunk(t0, t1)`` gives float64 tensors on ``device``."""
    kind = cfg.workload.kind
    if kind == "trace":
        return TraceWorkload(cfg, device)
    return RandomWorkload(cfg, kind, device)


def expand_groups(inp: dict, heads: int) -> dict:
    """Grouped inputs (Mamba-2's ``B``/``C``, GDN's ``q``/``k``: ``(m, S, G, N)``) repeated per
    head ``(m, S, H, N)``: head ``h`` reads group ``h // (H / G)``."""
    out = dict(inp)
    for k in grouped_keys():
        if k in inp and inp[k].shape[2] != heads:
            out[k] = inp[k].repeat_interleave(heads // inp[k].shape[2], dim=2)
    return out


def normals(seed: int, tag: int, tail: tuple, t0: int, t1: int, device) -> torch.Tensor:
    """Standard normals (float64) of rows ``t0..t1-1`` of a ``(T, *tail)`` array.

    Box-Muller on two counter-based 32-bit words per value (``precsim.formats.random_bits_*``,
    a pure function of (seed, stream, element index)): ``z = sqrt(-2 ln u1) cos(2 pi u2)``,
    ``u1 = (w1 + 0.5) / 2^32``, ``u2 = w2 / 2^32``; the element index is the flat index in the
    whole ``(T, *tail)`` array, so chunking never changes a value. On CUDA one Triton kernel
    draws them (:func:`precsim.kernels.inputs.normals`); on the CPU NumPy does; the two agree up
    to the last ulp of log and cos.
    """
    per = math.prod(tail)
    n, off = (t1 - t0) * per, t0 * per
    ka, kb = (pf.stream_id(0x1A7A, tag, j) for j in (0, 1))
    dev = torch.device(device)
    if dev.type == "cuda":
        from precsim.kernels import available

        if available("cuda"):
            from precsim.kernels.inputs import normals as fused

            return fused(pf.stream_keys(seed, ka), pf.stream_keys(seed, kb), n, off,
                         dev).reshape(t1 - t0, *tail)
        w1 = pf.random_bits_torch(n, seed, ka, off, device=dev).to(torch.float64)
        w2 = pf.random_bits_torch(n, seed, kb, off, device=dev).to(torch.float64)
        z = torch.sqrt(-2.0 * torch.log((w1 + 0.5) * 2.0**-32)) * torch.cos(
            2.0 * math.pi * (w2 * 2.0**-32))
        return z.reshape(t1 - t0, *tail)
    u1 = (pf.random_bits_numpy(n, seed, ka, off) + 0.5) * 2.0**-32
    u2 = pf.random_bits_numpy(n, seed, kb, off) * 2.0**-32
    z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)
    return torch.from_numpy(z.reshape(t1 - t0, *tail)).to(dev)
