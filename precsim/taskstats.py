"""Paired statistics of task accuracy against a baseline (docs/tasks.md, "Statistics").

Every scheme answers the same items as the baseline, so its accuracy change is a paired
comparison: only the discordant items (right under one, wrong under the other) carry evidence.

* :func:`mcnemar_exact`: McNemar's exact test, a two-sided binomial test of the discordant
  items' split (p = 1/2 under no change); the same as ``scipy.stats.binomtest(down, down + up)``.
* :func:`paired_delta`: the accuracy change and its percentile-bootstrap interval, items (and SR
  seeds, two-way) resampled together, so the pairing is kept.
* :func:`mdd`: the smallest accuracy change the item count can detect, two-sided at ``alpha``
  with ``power``, for the observed discordance (Connor's sample-size formula for McNemar's test,
  solved for the change) and never below what the exact test can reach at all.
* :func:`wilson`: the Wilson score interval of an accuracy.
"""

from __future__ import annotations

import math

import numpy as np

from .models.metrics import BOOT, LEVEL, boot_ci


def mcnemar_exact(down: int, up: int) -> float:
    """Two-sided exact McNemar p-value of ``down`` items lost and ``up`` gained (1 when none
    differ): ``min(1, 2 P[X <= min(down, up)])``, X ~ Binomial(down + up, 1/2)."""
    from scipy.stats import binom

    n = int(down) + int(up)
    if n == 0:
        return 1.0
    return float(min(1.0, 2.0 * binom.cdf(min(int(down), int(up)), n, 0.5)))


def paired_delta(s: np.ndarray, b: np.ndarray, seed: int = 0, B: int = BOOT,
                 level: float = LEVEL) -> tuple[float, float, float]:
    """The accuracy change of ``s`` (correctness ``(S, I)``: S seeds of I items, or ``(I,)``)
    against ``b`` (``(I,)``) and its ``level`` percentile-bootstrap interval (items and seeds
    resampled, :func:`precsim.models.metrics.boot_ci`)."""
    s = np.atleast_2d(np.asarray(s, dtype=np.float64))
    d = s - np.asarray(b, dtype=np.float64)[None]
    lo, hi = boot_ci(d.ravel(), d.shape[0], seed=seed, B=B, level=level)
    return float(d.mean()), lo, hi


def sign_counts(s: np.ndarray, b: np.ndarray) -> tuple[int, int]:
    """Items lost (``down``) and gained (``up``) against ``b``: with several seeds, by the
    sign of each item's mean change over them (the sign test, McNemar's with one seed)."""
    m = np.atleast_2d(np.asarray(s, dtype=np.float64)).mean(axis=0) - np.asarray(b, float)
    return int((m < 0).sum()), int((m > 0).sum())


def mdd(n: int, discordant: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest accuracy change (a fraction of the items) that ``n`` paired items detect,
    two-sided at ``alpha`` with ``power``, when a fraction ``discordant`` of them disagree.

    Connor (1987)'s sample size for McNemar's test, ``n = (z_a sqrt(psi) + z_b sqrt(psi -
    d^2))^2 / d^2`` (psi: the discordant fraction, d: the change), solved for d, with psi at
    least d (a change of d makes at least d of the items discordant, so with no discordance
    observed the answer is the change the test could see were every discordant item one way);
    never below ``k/n``, where k is the fewest discordant items, all one way, that the exact test
    calls significant (6 at alpha 0.05). inf when no change up to 1 is detectable."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    if n < 1:
        return math.inf
    za, zb = norm.ppf(1 - alpha / 2), norm.ppf(power)
    k = math.ceil(math.log2(2 / alpha))

    def gap(d: float) -> float:
        psi = max(float(discordant), d)
        return math.sqrt(n) * d - za * math.sqrt(psi) - zb * math.sqrt(max(psi - d * d, 0.0))

    if gap(1.0) < 0:
        return math.inf
    d = brentq(gap, 1e-12, 1.0, xtol=1e-10)
    return float(min(1.0, max(d, k / n))) if k <= n else math.inf


def wilson(acc: float, n: int, level: float = LEVEL) -> tuple[float, float]:
    """The Wilson score interval of an accuracy ``acc`` over ``n`` items."""
    from scipy.stats import norm

    if n < 1 or not math.isfinite(acc):
        return math.nan, math.nan
    z = norm.ppf(1 - (1 - level) / 2)
    den = 1 + z * z / n
    mid = (acc + z * z / (2 * n)) / den
    half = z * math.sqrt(acc * (1 - acc) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def compare(s: np.ndarray, b: np.ndarray, alpha: float = 0.05, power: float = 0.8,
            seed: int = 0) -> dict:
    """Every paired figure of correctness ``s`` (``(S, I)``) against the baseline ``b``
    (``(I,)``): accuracy with its Wilson interval, the change with its bootstrap interval,
    items lost / gained (mean per seed, and by the sign test), the exact McNemar (sign-test)
    p-value and the minimum detectable change."""
    s = np.atleast_2d(np.asarray(s, dtype=np.float64))
    b = np.asarray(b, dtype=np.float64)
    S, n = s.shape
    acc = float(s.mean())
    lo, hi = wilson(acc, n)
    d, dlo, dhi = paired_delta(s, b, seed=seed)
    down, up = sign_counts(s, b)
    lost = float(((b[None] == 1) & (s == 0)).sum(axis=1).mean())
    gained = float(((b[None] == 0) & (s == 1)).sum(axis=1).mean())
    return {"acc": acc, "acc_lo": lo, "acc_hi": hi, "delta": d, "delta_lo": dlo,
            "delta_hi": dhi, "lost": lost, "gained": gained, "down": down, "up": up,
            "p_mcnemar": mcnemar_exact(down, up),
            "mdd": mdd(n, (down + up) / n, alpha, power), "items": n, "seeds": S}
