"""The states an engine holds at the end of a run, per scheme (cross-engine checks: the tests
and ``experiments/bench/gpu_check_ef.py``).

:func:`held_states` runs an engine with :class:`Capture` in place of its checkpoint: engines hand
a checkpoint their whole state at every span's end where it says a save is due
(:meth:`precsim.engines.base.Engine.run`; :class:`Capture` always does), so the last one is the
state after the last step, on any number of threads.
"""

from __future__ import annotations

import numpy as np
import torch

from ..config import Config, ef_fmt


class Capture:
    """A checkpoint stand-in: keeps a host copy of the held states at every window."""

    def __init__(self):
        self.last: dict = {}

    def start(self, *a) -> None:
        pass

    def resume(self, device=None):
        return None

    def due(self, pos: int) -> bool:
        return True

    def info(self) -> dict:
        return {}

    def window(self, pos: int, get) -> None:
        st = get()
        keep: dict = {}
        for k in ("st", "rd", "ef", "state", "resid"):  # fused engines; the NumPy engine
            v = st.get(k)
            if isinstance(v, dict):
                keep[k] = {n: np.array(a, copy=True) for n, a in v.items()}
            elif v is not None:
                keep[k] = v.cpu().numpy().copy() if torch.is_tensor(v) else np.array(v, copy=True)
        if "schemes" in st:  # the torch engine
            keep["schemes"] = [{k: d[k].cpu().numpy().copy() for k in ("state", "resid", "read")
                                if torch.is_tensor(d.get(k))} for d in st["schemes"]]
        self.last = keep


def held_states(engine: str, cfg: Config, device: str = "cpu") -> dict:
    """Run ``cfg`` on ``engine``; per scheme ``(state, residual)`` float32 ``(S, H, P, N)`` at
    the last step (the residual zeros without error feedback)."""
    cap = Capture()
    from . import engine_module

    engine_module(engine).run(cfg, device, progress=False, ckpt=cap)
    shape = (cfg.run.seqs, cfg.model.heads, -1, cfg.model.state_dim)
    names = list(cfg.schemes)
    order = list(range(len(names)))
    if engine == "triton":  # storage slots: launch groups contiguous
        from .triton_codes import launch_groups, scheme_block, scheme_code

        sc = list(cfg.schemes.values())
        order = [i for _, idx in launch_groups([scheme_code(c) for c in sc],
                                               [scheme_block(c) for c in sc]) for i in idx]
    out = {}
    for i, n in enumerate(names):
        if engine == "torch":
            d = cap.last["schemes"][i]
            out[n] = (d["state"], d["resid"] if "resid" in d else np.zeros_like(d["state"]))
        elif engine == "numpy":
            out[n] = (cap.last["state"][n], cap.last["resid"][n])
        else:
            j = order.index(i)
            st = cap.last["st"][j].reshape(shape)
            ef = cap.last.get("ef")
            live = ef is not None and ef.size and ef_fmt(cfg.schemes[n])
            out[n] = (st, ef[j].reshape(shape) if live else np.zeros_like(st))
    return out


def compare(a: dict, b: dict, cfg: Config) -> dict:
    """Per scheme of two :func:`held_states`: whether the states and the residuals are
    bit-equal, the share of state elements that differ, the largest
    ``|(Q + E)_a - (Q + E)_b|`` and ``max |E_a|`` (both relative to ``max |Q_a|``), and ``ok``:
    a conventional scheme (no reduction in the update: the engines round the same numbers) is
    bit-equal in state and residual; a ReplaySSM fold is a sum whose order differs between
    engines (its last bits, and with them a row's block scale, may differ: measured up to 48% of
    the elements, each by a few float32 ulps, or a rounding flipped): then ``Q + E`` agrees
    within an eighth of the largest residual (E's own rounding) plus 1e-6 of the state."""
    out = {}
    for n, sc in cfg.schemes.items():
        (qa, ea), (qb, eb) = a[n], b[n]
        qa, qb = np.asarray(qa, np.float32), np.asarray(qb, np.float32)
        bits = [np.array_equal(x.view(np.int32), np.asarray(y, np.float32).view(np.int32))
                for x, y in ((qa, qb), (np.asarray(ea, np.float32), eb))]
        scale = float(np.abs(qa).max()) or 1.0
        r = {"state_bits": bits[0], "resid_bits": bits[1],
             "state_diff": float((qa.view(np.int32) != qb.view(np.int32)).mean()),
             "sum_dev": float(np.abs((qa + ea) - (qb + eb)).max()) / scale,
             "resid_max": float(np.abs(ea).max()) / scale}
        r["ok"] = (all(bits) if sc.kind == "conventional" else
                   r["sum_dev"] <= r["resid_max"] / 8 + 1e-6)
        out[n] = r
    return out
