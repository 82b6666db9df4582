"""Cost model: bytes moved per decode step per head and sequence, averaged over one buffer window
of ``L`` steps (the table is docs/sweeps.md's "Cost model"): conventional ``2·B(F)``; shared
``B(F)·(1 + 1/L)``; split ``((L-1)·B(F_read) + 2·B(F_upd) + B(F_read)) / L``; ReplaySSM schemes
add one buffer entry written per step (Mamba-2: x, B in the buffer dtype plus dt in FP32; GDN: u,
k plus the decay) and ``(L+1)/2`` entries read. ``B(F) = P·N·bits_per_element(F)/8`` plus the
4-byte tensor scale of two-level formats.

A per-layer scheme (``schemes.NAME.layers``) costs each layer at its own format: its
``bytes_per_step`` is the mean over the SSM layers (still per head, comparable with a uniform
scheme's), and ``bytes_per_token`` sums every SSM layer's heads (whole-model runs, where the
layers are known; also given for uniform schemes there).

Error feedback (a residual in F_e) adds its read and write at each rounding of the master:
``2·B(F_e)`` per step (conventional), ``2·B(F_e)/L`` (ReplaySSM, once per flush).
"""

from __future__ import annotations

from precsim import formats as pf

from .config import BUFFER_DTYPES, Config, ef_fmt

BUFFER_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp64": 8}
assert set(BUFFER_BYTES) == set(BUFFER_DTYPES)


def state_bytes(fmt: str, rows: int, cols: int) -> float:
    """Bytes of one head's state matrix stored in ``fmt`` (scales included)."""
    f = pf.get(fmt)
    return rows * cols * f.bits_per_element / 8 + f.tensor_overhead_bits / 8


def buffer_entry_bytes(family: str, head_dim: int, state_dim: int, buffer_dtype: str) -> float:
    """One replay-buffer entry: the two activation vectors plus one FP32 scalar."""
    return (head_dim + state_dim) * BUFFER_BYTES[buffer_dtype] + 4


def scheme_cost(kind: str, fmt: str, read_fmt: str | None, *, family: str, head_dim: int,
                state_dim: int, buffer_len: int, buffer_dtype: str = "fp32",
                error_feedback: str | None = None) -> dict:
    """Bytes per decode step per head for one scheme (see the module docstring);
    ``error_feedback``: the residual's format (None or ``none``: off)."""
    L = buffer_len
    b_upd = state_bytes(fmt, head_dim, state_dim)
    if kind == "conventional":
        sr, sw, br, bw, transfers = b_upd, b_upd, 0.0, 0.0, 2.0
    else:
        entry = buffer_entry_bytes(family, head_dim, state_dim, buffer_dtype)
        bw, br = entry, entry * (L + 1) / 2
        transfers = 1.0 + 1.0 / L
        if kind == "shared":
            sr, sw = b_upd, b_upd / L
        elif kind == "split":
            b_read = state_bytes(read_fmt, head_dim, state_dim)
            sr = ((L - 1) * b_read + b_upd) / L
            sw = (b_upd + b_read) / L
            transfers = 1.0 + 2.0 / L
        else:
            raise ValueError(f"kind={kind!r} is unknown; allowed: conventional, shared, split")
    rr = 0.0  # error feedback: the residual read and written at each rounding of the master
    if error_feedback not in (None, "none"):
        rr = state_bytes(error_feedback, head_dim, state_dim) / (1 if kind == "conventional" else L)
    total = sr + sw + br + bw + 2 * rr
    base = 2 * state_bytes("fp32", head_dim, state_dim)
    return {"state_read": sr, "state_write": sw, "buffer_read": br, "buffer_write": bw,
            "resid_read": rr, "resid_write": rr,
            "bytes_per_step": total, "state_transfers_per_step": transfers,
            "fraction_of_fp32": total / base, "roofline_speedup": base / total}


def scheme_costs(cfg: Config, schemes: dict | None = None, layers: list[int] | None = None,
                 mean_segment: float | None = None) -> dict[str, dict]:
    """Each scheme's cost (``schemes``: name -> SchemeConfig, default ``cfg.schemes``) over the
    SSM ``layers`` (None: a layer-level run: ``workload.layer``, else the scheme's default).
    With speculative drafts (``replay.drafts > 0``) the flushes come every ``mean_segment``
    committed steps on average (the run's flush schedule; computed from it when not given)
    instead of every ``L``, and that mean takes ``L``'s place in the formulas (one draft pass
    reading the state for several positions is not modelled: bytes per committed step, as
    without drafts)."""
    from .config import scheme_at

    m, r = cfg.model, cfg.replay
    L = r.buffer_len
    if r.drafts:
        if mean_segment is None:
            from .schedule import segment_ends

            mean_segment = cfg.run.steps / len(segment_ends(cfg))
        L = float(mean_segment)

    def one(s):
        return scheme_cost(s.kind, s.fmt, s.read_fmt, family=m.family, head_dim=m.head_dim,
                           state_dim=m.state_dim, buffer_len=L, buffer_dtype=r.buffer_dtype,
                           error_feedback=ef_fmt(s))

    out = {}
    for name, s in (cfg.schemes if schemes is None else schemes).items():
        at = layers if layers else [cfg.workload.layer]
        per = [one(scheme_at(s, la)) for la in at]
        c = {k: sum(p[k] for p in per) / len(per) for k in per[0]}
        if layers:
            c["bytes_per_token"] = sum(p["bytes_per_step"] for p in per) * m.heads
        out[name] = c
    return out
