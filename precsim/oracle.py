"""The float64 NumPy oracle: the families' naive steps, one token at a time, readable like fla's
``naive.py``.

It is the ground truth every engine is tested against. No chunking, no tricks: one state per head.
"""

from __future__ import annotations

import numpy as np

from .families import FAMILIES, family_of
from .workload import trace_dims, validate_trace


def decode(trace: dict, form: str = "u", return_state: bool = False):
    """Float64 outputs of a trace dict (keys as in trace files), shape (T, H, P) or (T, H, V).

    Mamba-2: ``y_t = S_t C_t (+ D x_t)``; GDN: ``o_t = S_t q_t`` (q used exactly as given).
    ``form`` picks the GDN update ("u" or "delta"); both are the same function.

    Example:
        >>> import numpy as np
        >>> T, H, P, N = 4, 2, 3, 5
        >>> rng = np.random.default_rng(0)
        >>> tr = dict(A=-np.ones(H), dt=np.full((T, H), .1), x=rng.normal(size=(T, H, P)),
        ...           B=rng.normal(size=(T, H, N)), C=rng.normal(size=(T, H, N)))
        >>> decode(tr).shape
        (4, 2, 3)
    """
    d = validate_trace({k: np.asarray(v) for k, v in trace.items()})
    d = {k: v.astype(np.float64) for k, v in d.items()}
    fam = FAMILIES[family_of(d)]
    step = getattr(fam, "step_delta", fam.step) if form == "delta" else fam.step
    T, H = d[fam.KEYS[0]].shape
    for k in fam.GROUPED:  # grouped inputs: head h reads group h // (H / G)
        if k in d and d[k].shape[1] != H:
            d[k] = np.repeat(d[k], H // d[k].shape[1], axis=1)
    _, Dv, Dk = trace_dims(d, fam.name)
    a = np.exp(fam.log_decay(d, d))
    S = np.zeros((H, Dv, Dk))
    y = np.empty((T, H, Dv))
    for t in range(T):
        S, y[t] = step(S, {"a": a[t], **{k: d[k][t] for k in fam.KEYS}})
        if "D" in d:
            y[t] += d["D"][:, None] * d["x"][t]
    return (y, S) if return_state else y
