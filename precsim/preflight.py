"""Checks before any work: the memory (host and, on CUDA, device) and time a run needs against
what this machine has, and that every output path can be written (and every input read).

Each refusal is one :class:`~precsim.errors.PrecsimError` line: the key, its value, the figures
(needed against available) and what to change. The memory model follows what the engines
allocate (``precsim.engines.*``, ``precsim.metrics``, ``precsim.result``):

* the process itself (the interpreter, torch, numba: ~0.5-0.8 GiB measured),
* the states: the float64 truth and per scheme a float32 state, read copy and residual,
* per step for the whole run: each scheme's per-step ``rel_err`` (float64, copied when the run
  ends and written), and for the fused engines (numba, Triton) the step-indexed
  event keys, flush events and segment phases the engine builds up front,
* per metrics window: the inputs (float64 and float32), the outputs of the truth and every
  scheme, and the KL's logits (``rows x metrics.vocab`` per scheme), twice where the engine
  prepares the next window while the current one runs.

It is an estimate within about a factor of 2 (tests/app/test_preflight.py measures it against
peak RSS); a run is refused only when even the estimate does not fit.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import PrecsimError

GiB = 1 << 30
# the process before any array: interpreter, torch, numba's compiled code (peak RSS of a
# 4,096-step card run: 0.51 GiB on the torch engine, 0.79 GiB on numba's; a 262,144-step run
# of a 1 x 4 x 16 layer: 0.40 and 0.48 GiB; 2-core VM, 2026-12-03)
BASE_HOST = {"numba": 0.6 * GiB, "triton": 0.8 * GiB}
BASE_OTHER = 0.4 * GiB
WINDOW_RECORD = 2048  # bytes per metrics window and scheme: its figures (small arrays, a dict)
# state elements x steps x (schemes + 1) per second, the order of magnitude (docs/performance.md:
# the card's shape over 32K steps in 3.9 s of numba on 2 cores, the 128-head 32K study in 0.79 s
# on one H200), and seconds per step of each engine's own overhead
SPEED = {"numba": 1.0e10, "torch": 1.5e9, "numpy": 3.0e7, "triton": 1.0e12}
PER_STEP_S = {"numba": 1.5e-5, "torch": 1.0e-3, "numpy": 1.0e-3, "triton": 1.0e-6}


@dataclass
class Estimate:
    """What a run needs: bytes of host and device memory (by part) and seconds of engine."""

    host: dict[str, float] = field(default_factory=dict)
    device: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    engine: str = "torch"
    device_kind: str = "cpu"

    @property
    def host_total(self) -> float:
        return sum(self.host.values())

    @property
    def device_total(self) -> float:
        return sum(self.device.values())


def _shapes(cfg) -> tuple[str, int, int, int]:
    """``(family, heads, Dv, Dk)`` of the layer: the config's, or a trace's (read from its
    headers, memory-mapped: nothing is loaded)."""
    m = cfg.model
    fam, H, P, N = m.family, m.heads, m.head_dim, m.state_dim
    w = cfg.workload
    if w.kind == "trace" and w.path:
        try:
            from .families import family_of
            from .workload import load_trace_arrays, record_layer, recorded_layers, trace_dims

            p = Path(w.path)
            if (p / "record.json").is_file():
                layers = recorded_layers(p)
                p = record_layer(p, w.layer if w.layer is not None else min(layers))
            d = load_trace_arrays(p)
            fam = family_of(d)
            H, P, N = trace_dims(d, fam)
        except Exception:  # noqa: BLE001 - the trace's own checks report a bad file
            pass
    return fam, H, P, N


def estimate(cfg, device: str = "cpu", engine: str = "torch") -> Estimate:
    """The memory and time a layer-level run of ``cfg`` needs on ``device`` with ``engine``."""
    fam, H, P, N = _shapes(cfg)
    Sq, steps = cfg.run.seqs, cfg.run.steps
    ns = len(cfg.schemes)
    L = cfg.replay.buffer_len
    n = min(cfg.metrics.window, steps)  # steps per metrics window
    SH, rows, W = Sq * H, n * Sq, H * P
    V = cfg.metrics.vocab if cfg.metrics.kl else 0
    state = SH * P * N
    e = Estimate(engine=engine, device_kind=device)
    fused = engine in ("numba", "triton")
    # states: truth float64, per scheme state + read copy + residual (float32), and a copy
    # of them all while a drift sample or checkpoint is taken
    states = 2 * state * (8 + 12 * ns)
    # per step for the whole run: each scheme's rel_err (float64, the sequences' mean) kept,
    # concatenated and written as float32; the fused engines' step-indexed arrays (event
    # numbers, flush events, segment phases and their temporaries, a key per scheme); per
    # segment its end, per window each scheme's figures
    per_step = steps * (ns * 20 + ((96 + 4 * ns) if fused else 0))
    per_step += steps / max(1, L) * 8 + steps / n * ns * (WINDOW_RECORD + 40 * Sq)
    # per window: inputs (float64 + float32 + contiguous copies), the buffer terms of its
    # segments (numba: a state-size matrix per segment), outputs, the metrics' stacked
    # differences, the KL's logits (per scheme float32, then float64 temporaries)
    inputs = n * SH * (P + 2 * N + 4) * 24
    from .families import FAMILIES

    # numba: a plain (not delta-rule) family's host builds a state-size matrix per segment
    fold = fam in FAMILIES and not FAMILIES[fam].DELTA_RULE
    segs = (n / max(1, L)) * state * 4 if engine == "numba" and fold else \
        L * state * 8 if engine in ("torch", "numpy") else 0
    outputs = n * SH * P * (8 + 4 * ns) + rows * W * (ns + 1) * 20
    kl = rows * V * (4 * ns + 48)
    window = (inputs + segs + outputs + kl) * (2 if fused else 1)
    base = BASE_HOST.get(engine, BASE_OTHER)
    if device == "cuda":  # (the host keeps the per-step figures and the states' copies)
        e.host = {"process": base, "per-step figures": per_step, "states": state * 8}
        e.device = {"states": states, "per-step keys": steps * 4 * (ns + 1),
                    "windows": 8 * window}  # a batch of up to 8 launch windows in flight
    else:
        e.host = {"process": base, "states": states, "per-step figures": per_step,
                  "windows": window}
    e.seconds = steps * (state * (ns + 1) / SPEED.get(engine, 1e9)
                         + PER_STEP_S.get(engine, 1e-4))
    return e


# -- what this machine has ---------------------------------------------------------------------
def _meminfo(key: str) -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _vm_size() -> float:
    """This process's virtual size (what RLIMIT_AS counts)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return 0.0


def _cgroup_free() -> float | None:
    """The room left under this process's cgroup memory limit (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``), None without one."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, ctrl, path = line.split(":", 2)
        for base, lim, cur in ((("/sys/fs/cgroup", "memory.max", "memory.current") if ctrl == ""
                                else ("/sys/fs/cgroup/memory", "memory.limit_in_bytes",
                                      "memory.usage_in_bytes") if "memory" in ctrl.split(",")
                                else (None, None, None)),):
            if base is None:
                continue
            d = Path(base + path)
            try:
                limit = (d / lim).read_text().strip()
                used = float((d / cur).read_text().strip())
            except (OSError, ValueError):
                continue
            if limit != "max" and float(limit) < 1 << 60:
                return max(0.0, float(limit) - used)
    return None


def host_available() -> tuple[float, str]:
    """Bytes this process may still allocate, and where the figure comes from."""
    import resource

    cands = []
    avail = _meminfo("MemAvailable")
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            avail = None
    if avail is not None:
        cands.append((avail, "MemAvailable"))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        cands.append((max(0.0, soft - _vm_size()), f"RLIMIT_AS {_size(soft)}"))
    cg = _cgroup_free()
    if cg is not None:
        cands.append((cg, "the cgroup's memory limit"))
    if not cands:
        return math.inf, "unknown"
    return min(cands)


def _size(b: float) -> str:
    for unit, k in (("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", GiB), ("MiB", 1 << 20)):
        if b >= k:
            return f"{b / k:,.1f} {unit}"
    return f"{b / 1024:,.0f} KiB"


def _duration(s: float) -> str:
    for unit, k in (("years", 365 * 86400), ("days", 86400), ("h", 3600), ("min", 60)):
        if s >= k:
            return f"{s / k:,.0f} {unit}" if s / k >= 10 else f"{s / k:.1f} {unit}"
    return f"{s:.0f} s"


def _knob(cfg, e: Estimate, parts: dict, room: float) -> tuple[str, str]:
    """The key to turn for the largest part, and how far (``run.steps`` at most N ...)."""
    big = max(parts, key=parts.get)
    steps = cfg.run.steps
    if big == "per-step figures" or (big == "per-step keys"):
        per = parts[big] / steps
        most = int(max(0.0, room - (sum(parts.values()) - parts[big])) / per)
        most = max(1, most // 1024 * 1024) if most >= 1024 else max(1, most)
        return (f"run.steps={steps}", f"run.steps <= ~{most:,} here (or fewer schemes, "
                f"{len(cfg.schemes)} now)")
    if big == "windows":
        return (f"metrics.window={cfg.metrics.window}", "a shorter metrics.window, fewer "
                f"run.seqs ({cfg.run.seqs}), a smaller metrics.vocab ({cfg.metrics.vocab}) or "
                "metrics.kl=false")
    return (f"run.seqs={cfg.run.seqs}", f"fewer run.seqs or model.heads ({cfg.model.heads}), or "
            f"fewer schemes ({len(cfg.schemes)})")


def check_fits(cfg, device: str | None = None, engine: str | None = None) -> Estimate:
    """Raise a one-line PrecsimError when the run of ``cfg`` cannot fit in this machine's
    memory (host, and the GPU's on CUDA); returns the estimate otherwise."""
    if device is None or engine is None:
        device, engine = _device_engine(cfg)
    e = estimate(cfg, device, engine)
    avail, src = host_available()
    for where, parts, room, source in (("host", e.host, avail, src),
                                       *((("GPU", e.device, *_device_free()),)
                                         if device == "cuda" else ())):
        need = sum(parts.values())
        if need <= room:
            continue
        key, allowed = _knob(cfg, e, parts, room)
        detail = ", ".join(f"{k} {_size(v)}" for k, v in sorted(parts.items(),
                                                               key=lambda kv: -kv[1]))
        raise PrecsimError(f"{key} needs about {_size(need)} of {where} memory ({detail}; "
                           f"~{_duration(e.seconds)} on {engine}/{device}); available: "
                           f"{_size(room)} ({source}); allowed: {allowed}")
    return e


def long_run_note(e: Estimate, over_s: float = 3600.0) -> str | None:
    """A line saying what a run over ``over_s`` seconds (estimated) will take, else None."""
    if e.seconds < over_s:
        return None
    dev = f", {_size(e.device_total)} of GPU memory" if e.device else ""
    return (f"precsim: this run takes ~{_duration(e.seconds)} on {e.engine}/{e.device_kind} and "
            f"about {_size(e.host_total)} of host memory{dev} (an estimate; run.steps, run.seqs, "
            "model.heads and the schemes set it; it checkpoints: docs/resume.md)")


def _device_free() -> tuple[float, str]:
    import torch

    free, _ = torch.cuda.mem_get_info()
    return float(free), "free on the GPU"


def _device_engine(cfg) -> tuple[str, str]:
    """The device and engine the run will use, as far as known without importing them (the
    engine's own choice may still fall back: torch's needs are the smaller)."""
    import importlib.util

    from .engines import resolve_device

    device = resolve_device(cfg.run.device)  # (cuda without one: its own one-line error)
    engine = cfg.run.engine
    if engine == "auto":
        if device == "cuda":
            engine = "triton" if importlib.util.find_spec("triton") else "torch"
        else:
            engine = "numba" if importlib.util.find_spec("numba") else "torch"
    return device, engine


# -- paths -------------------------------------------------------------------------------------
def writable_dir(key: str, path, what: str = "a directory (new, or one holding this "
                 "config's result) that this user can write", shown=None) -> None:
    """One-line PrecsimError unless ``path`` is (or can be made as) a writable directory: not
    a file, not under a file, its nearest existing ancestor writable (``os.access``: the
    permission bits, which root passes, and a read-only file system, which it does not), and a
    directory can really be made there (a probe, removed at once: ``/proc`` passes os.access
    for root, yet refuses every new directory)."""
    p = Path(os.path.abspath(os.fspath(path)))
    probe = p
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        where = "is an existing file" if probe == p else f"is under a file ({probe})"
        raise PrecsimError(f"{key}={str(shown or path)!r} {where}; allowed: {what}")
    if not os.access(probe, os.W_OK | os.X_OK):
        where = "is read-only" if probe == p else f"is under a read-only directory ({probe})"
        raise PrecsimError(f"{key}={str(shown or path)!r} {where}; allowed: {what}")
    if probe.is_dir():
        import tempfile

        try:
            os.rmdir(tempfile.mkdtemp(prefix=".precsim-probe-", dir=probe))
        except OSError as e:
            where = "takes no new entry" if probe == p else f"cannot be made under {probe}"
            raise PrecsimError(f"{key}={str(shown or path)!r} {where} ({e.strerror}); "
                               f"allowed: {what}") from None


def readable_dir(key: str, path) -> None:
    """One-line PrecsimError unless ``path`` is a directory this process can list and read."""
    p = Path(path)
    if not p.exists():
        raise PrecsimError(f"{key}={str(path)!r} does not exist; allowed: a directory of runs")
    if not p.is_dir():
        raise PrecsimError(f"{key}={str(path)!r} is not a directory; allowed: a directory of "
                           "runs")
    if not os.access(p, os.R_OK | os.X_OK):
        raise PrecsimError(f"{key}={str(path)!r} is not readable (permission denied); allowed: "
                           "a directory you can read")


def inverted_split_notes(c) -> list[str]:
    """One note per split scheme whose master is narrower than its read copy (``fmt=nvfp4
    read_fmt=fp32``): the read copy is rounded from the master, so it holds nothing the master
    does not, at more bytes; the master's rounding sets the error."""
    from precsim import formats as pf

    out = []
    for name, s in c.schemes.items():
        if s.kind != "split" or not s.read_fmt:
            continue
        try:
            bm, br = pf.get(s.fmt).bits_per_element, pf.get(s.read_fmt).bits_per_element
        except Exception:  # noqa: BLE001 - the config's checks name a bad format
            continue
        if br > bm:
            out.append(f"precsim: note: schemes.{name} is an inverted split: its master "
                       f"(fmt={s.fmt}, {bm:g} bits/element) is narrower than its read copy "
                       f"(read_fmt={s.read_fmt}, {br:g}), which is rounded from the master and "
                       f"so holds no more than it; the usual split is a wide master and a "
                       f"narrow read copy (fmt={s.read_fmt} read_fmt={s.fmt})")
    return out
