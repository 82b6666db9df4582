"""One SSM layer's recurrence over a whole sequence, under every scheme at once.

In whole-model mode the model's batch holds one group of rows per run: the reference (a float64
state, the layer-level simulator's truth) and each scheme, ``K`` documents each. When a layer's
mixer scans the sequence, :func:`scan` advances every group's state over it, segment by segment
(ReplaySSM segments of ``replay.buffer_len`` tokens from token 0; a conventional scheme steps and
rounds every token), and returns every row's outputs. A segment left incomplete at the end is
not flushed (as in decode mode, which cannot know the run ends there).

Backends: ``torch`` (the torch engine's scheme code, CPU or CUDA, any dtype) and ``triton`` (the
fused kernels of :mod:`precsim.kernels`, CUDA, float32 schemes; one launch per group and window,
the reference in the kernels' float64 truth slot).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..config import Config, SchemeConfig, scheme_at
from ..families import FAMILIES, decays, family_params, get_family
from ..workload import expand_groups
from .metrics import rel_ratio, row_dist

REFERENCE = SchemeConfig(kind="shared", fmt="fp64")  # the truth: exact up to float64 rounding


@dataclass
class Group:
    """One run of the model's batch: rows ``[index*K, (index+1)*K)``."""

    name: str
    cfg: SchemeConfig
    reference: bool = False
    # the group whose logits this one's per-token metrics are measured against (an index into
    # the run's groups: 0 the float64 reference, or the FP32-state baseline)
    vs: int = 0
    # the model's own-arithmetic noise (the floor): every SSM output of the group is multiplied
    # by (1 + dither * u), u uniform in [-1, 1) per element: one rounding of the model dtype
    dither: float = 0.0
    # "scheme" (a row of the result), "baseline" (the FP32 state, run because no scheme is it)
    # or "noise" (the floor's dithered run): the last two are the floor's, not rows
    role: str = "scheme"
    dead_at: int | None = None  # first token (1-based) of a non-finite output, any layer
    # layer -> [(token, per-document state drift (K,), read drift (K,) or None)]
    drift: dict = field(default_factory=dict)

    def at(self, layer: int) -> SchemeConfig:
        """The uniform scheme this group runs in SSM layer ``layer`` (``schemes.NAME.layers``)."""
        return scheme_at(self.cfg, layer)


def rel_rows(a: torch.Tensor, ref: torch.Tensor) -> np.ndarray:
    """Per-row relative L2 distance ``||a - ref|| / ||ref||`` (float64)."""
    rn = torch.linalg.vector_norm(ref.reshape(ref.shape[0], -1).double(), dim=1)
    return rel_ratio(row_dist(a, ref).cpu().numpy(), rn.cpu().numpy())


@dataclass
class Chunks:
    """A whole-model run in chunks of positions: each SSM layer's per-group state (the scheme
    objects on the torch backend, the kernels' state tensors on the Triton one) lives here from
    one chunk's forward pass to the next. ``offset``: the current chunk's first position (a
    whole number of ReplaySSM segments, of launch windows on Triton); ``horizon``: the run's
    positions."""

    horizon: int
    offset: int = 0
    layers: dict = field(default_factory=dict)
    # layer -> the raw inputs of a ReplaySSM segment a chunk left unfinished (a chunk that ends
    # inside a segment, as generation's one-token steps do): the next chunk's replay schemes
    # evaluate it again with their new positions, as decode mode does
    partial: dict = field(default_factory=dict)
    # the Triton backend's drift samples and non-finite checks, still on the device: read back
    # once per forward pass (:meth:`settle`), not once per layer (a read-back waits for the
    # device, and the host could not queue the next layer's launches meanwhile)
    pending: list = field(default_factory=list)

    def settle(self) -> None:
        """Read back what the layers of the last forward pass left on the device (into each
        group's ``drift`` and ``dead_at``), in the layers' order."""
        todo, self.pending = self.pending, []
        for fn in todo:
            fn()


def drift_due(pos: int, m: int, L: int, window: int) -> bool:
    """Whether the drift is sampled after the full segment ``[pos, pos+m)``: the segment ends a
    flush and crosses a multiple of the metrics window."""
    return m == L and (pos + m) // window > pos // window


def scan(step, groups: list[Group], K: int, cfg: Config, compute: torch.dtype,
         backend: str = "torch", carry: bool = False, chunks: Chunks | None = None):
    """Outputs ``(T, len(groups)*K, H, Dv)`` of one layer's scan ``step`` (``hook.Step``) under
    every group; records the state drift against the reference group into ``group.drift``.
    It runs on the device of the call's tensors (under ``model.device_map``, the device holding
    the layer; a layer the map leaves on the CPU runs the torch backend).

    On the Triton backend with ``chunks``, the drift samples and non-finite checks wait on the
    device until the caller's :meth:`Chunks.settle` (once per forward pass).

    ``carry`` (the reference group alone, recording a document in chunks): start from the
    call's state (``step.state``; None: zero), flush at the end, and return ``(outputs, final
    state (K, H, Dv, Dk) float64)``. ``chunks``: the call is the chunk of positions starting at
    ``chunks.offset``; every group's state continues from the previous chunk's."""
    dev = step.inp[FAMILIES[step.family].VALUE].device  # the layer's device
    if backend == "triton" and dev.type == "cuda":
        from .scan_triton import scan_triton

        with torch.cuda.device(dev):  # (the kernels launch on the current device)
            y = scan_triton(step, groups, K, cfg, carry, chunks)
    else:
        y = scan_torch(step, groups, K, cfg, compute, carry, chunks)
    if not carry and any(g.dither for g in groups):
        # (the scans' outputs are fresh tensors: dithered in place)
        y = dither(y, groups, K, cfg.run.seed, step.layer, chunks.offset if chunks else 0,
                   inplace=True)
    return y


def dither(y: torch.Tensor, groups, K: int, seed: int, layer: int, offset: int,
           inplace: bool = False) -> torch.Tensor:
    """``y (T, len(groups)*K, ...)`` with each dithering group's rows multiplied by
    ``1 + g.dither * u``, ``u`` uniform in [-1, 1) per element, drawn from a generator seeded by
    (``seed``, ``layer``, ``offset``): reproducible, and independent of the other groups.
    ``inplace``: into ``y`` itself (else a copy of every group's rows first; on an H100 the
    noise run's dither took ~1 us a token of a 2.7B-shape layer's ~16 with that copy)."""
    if not inplace:
        y = y.clone()
    for gi, g in enumerate(groups):
        if not g.dither:
            continue
        gen = torch.Generator(device=y.device)
        gen.manual_seed((seed * 1_000_003 + layer * 7_919 + offset * 104_729 + gi) % 2**63)
        part = y[:, gi * K:(gi + 1) * K]
        u = torch.rand(part.shape, generator=gen, device=y.device, dtype=torch.float64)
        # 1 + d (2u - 1), the same operations in the same order, in u's own memory
        f = u.mul_(2).sub_(1).mul_(g.dither).add_(1)
        part.copy_(f.mul_(part))  # (float64 product, rounded to y's dtype as before)
    return y


def _schemes(step, groups, K, cfg, compute, dev, kept=None):
    from ..engines.base import buffer_rounder
    from ..schemes import SCHEMES, format_options

    fam = get_family(step.family)
    H = step.inp[fam.DECAY_INPUT].shape[2]
    Dv = step.inp[fam.VALUE].shape[-1]
    Dk = step.inp[fam.KEY].shape[-1]
    out = []
    params: dict = {}  # dtype -> the per-head constants (one conversion per dtype, not group)
    for i, g in enumerate(groups):
        sc = g.at(step.layer)
        dt = torch.float64 if g.reference else compute
        if kept is not None:  # the previous chunk's
            s = kept[i]
        else:
            s = SCHEMES[sc.kind](name=f"{g.name}@layer{step.layer}", cfg=sc,
                                 seed=cfg.run.seed, fmt_options=format_options(cfg),
                                 tensor_scope=cfg.formats.tensor_scope)
            s.init((K, H, Dv, Dk), dev, dt)
        br = (lambda x: x) if g.reference else buffer_rounder(  # noqa: E731
            cfg.replay.buffer_dtype, 64 if dt == torch.float64 else 32)
        if dt not in params:
            params[dt] = family_params(fam.name, step.const, dev, dt)
        out.append((s, dt, br, params[dt]))
    return fam, H, out


def scan_torch(step, groups, K, cfg, compute, carry: bool = False, chunks=None):
    T, b = step.shape
    dev = step.inp[FAMILIES[step.family].VALUE].device
    kept = chunks.layers.get(step.layer) if chunks is not None else None
    fam, H, runs = _schemes(step, groups, K, cfg, compute, dev, kept)
    if chunks is not None:
        chunks.layers[step.layer] = [r[0] for r in runs]
    off = chunks.offset if chunks is not None else 0
    if carry and step.state is not None:
        runs[0][0].state = runs[0][0].read = step.state.to(device=dev, dtype=torch.float64)
    p64 = family_params(fam.name, step.const, dev, torch.float64)
    D = step.const.get("D")
    L, W = cfg.replay.buffer_len, cfg.metrics.window
    u_master = cfg.replay.gdn_u_source == "master"
    # an unfinished segment of the previous chunk: its positions come first (replay schemes
    # evaluate the segment from its start; conventional ones stepped them already)
    prev = chunks.partial.pop(step.layer, None) if chunks is not None else None
    P = 0 if prev is None else next(iter(prev.values())).shape[0]
    inp_all = step.inp if not P else {k: torch.cat([prev[k], v]) for k, v in step.inp.items()}
    off -= P
    ys = []
    finite: list[torch.Tensor] = []  # per segment: (its output positions, groups) flags
    Ds = {dt: D.to(dt)[:, None] for dt in {r[1] for r in runs}} if D is not None else {}
    # the dtypes whose per-step decay ``a`` a conventional group reads (a replay segment reads
    # the log-decays alone)
    conv_dts = {dt for s, dt, _, _ in runs if not s.replay}
    for pos in range(0, T + P, L):
        m = min(L, T + P - pos)
        full = m == L or (carry and pos + m == T + P)
        skip = max(0, P - pos)  # positions of this segment the previous chunk returned
        whole = pos == 0 and m == T + P  # (the call's one segment: no slice to take)
        seg64 = expand_groups({k: (v if whole else v[pos:pos + m]).double()
                               for k, v in inp_all.items()}, H)
        # the segment's inputs and decays in each dtype, every row at once (elementwise: each
        # group's rows are what its own cast would give; a one-token step is mostly the host's
        # dispatch of these calls, experiments/bench/bench_floor_gen.md)
        prep: dict = {}
        out = []
        for gi, (s, dt, br, pc) in enumerate(runs):
            lo = 0 if s.replay else skip
            if (dt, lo) not in prep:
                i64 = seg64 if lo == 0 else {k: v[lo:] for k, v in seg64.items()}
                # (float64: seg64's own tensors, as .to would return them)
                every = dict(i64) if dt == torch.float64 else {k: v.to(dt) for k, v in i64.items()}
                every.update(decays(fam.name, i64, p64, dt, cfg.model.decay_exp,
                                    need_a=lo == skip and dt in conv_dts))
                prep[dt, lo] = every
            inp = {k: v[:, gi * K:(gi + 1) * K] for k, v in prep[dt, lo].items()}
            # a group whose output went non-finite runs on (as the Triton scan does): its
            # non-finite rows stay so, the other documents' rows (other task items) are not
            # made NaN with them; dead_at still marks the group from its first such token
            if s.replay:
                y = s.run_segment(fam, inp, pc, full, out_from_fold=full, buffer_round=br,
                                  u_from_master=u_master)
            else:
                y = s.run_segment(fam, inp, pc, True)
            if D is not None:
                y = y + Ds[dt] * inp["x"]
            out.append(y[skip - lo:])
        if drift_due(off + pos, m, L, W):
            ref = runs[0][0].state
            for g, (s, *_rest) in zip(groups[1:], runs[1:], strict=True):
                held = s.held()
                g.drift.setdefault(step.layer, []).append(
                    (off + pos + m, rel_rows(held["state"], ref),
                     rel_rows(held["read"], ref) if "read" in held else None))
        wide = torch.float64 if any(o.dtype == torch.float64 for o in out) else torch.float32
        ys.append(torch.cat([o.to(wide) for o in out], dim=1))
        # (each position's finiteness, per group, stays on the device until _dead_check)
        finite.append(torch.isfinite(ys[-1]).reshape(ys[-1].shape[0], len(groups), -1).all(2))
        if chunks is not None and not full:  # left unfinished: the next chunk continues it
            chunks.partial[step.layer] = {k: v[pos:pos + m] for k, v in inp_all.items()}
    check = _dead_check(groups, [r[0] for r in runs], finite, off + P)
    if chunks is not None and not carry:
        chunks.pending.append(check)  # read back after the forward pass (Chunks.settle)
    else:
        check()
    if carry:
        return torch.cat(ys), runs[0][0].state
    return torch.cat(ys)


def _dead_check(groups, schemes, finite, first_pos: int):
    """A closure marking each group's first non-finite output (``dead_at``, 1-based, the
    earliest over the layers) from ``finite`` (per segment, the call's flags ``(positions,
    groups)`` on the device, the call's first output position ``first_pos``). Its one read-back
    runs when the closure is called: once per forward pass (:meth:`Chunks.settle`), not once per
    segment and group, which would make the host wait for the device at every segment."""
    flags = torch.cat(finite).T  # (groups, positions)
    bad = ~flags
    anyb, first = bad.any(dim=1), bad.to(torch.uint8).argmax(dim=1)

    def check() -> None:
        hit = anyb.cpu().numpy()
        if not hit.any():
            return
        at = first.cpu().numpy()
        for g, s, h, i in zip(groups, schemes, hit, at, strict=True):
            if h:
                s.dead_at = first_pos + int(i) + 1
                g.dead_at = min(g.dead_at or s.dead_at, s.dead_at)
    return check
