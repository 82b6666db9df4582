"""The flush schedule: when a ReplaySSM scheme folds its replay buffer into its state.

Every ``replay.buffer_len`` committed steps, or with speculative decoding (``replay.drafts``)
when the committed tokens plus two drafts would overflow the buffer. The engines run it, the
cost model averages over it (``precsim.cost``); it depends on the config alone.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .config import Config


def acceptance_profile(r) -> np.ndarray:
    """The per-position acceptance probabilities of ``replay.drafts = T`` drafts: ``p[i]`` is the
    probability that draft ``i + 1`` is accepted once drafts ``1..i`` were (an MTP head's
    per-position acceptance); a scalar ``replay.acceptance`` is the same for every position, a
    list shorter than T repeats its last entry."""
    acc = r.acceptance
    p = [float(acc)] if isinstance(acc, (int, float)) else [float(a) for a in acc]
    T = max(r.drafts, 1)
    return np.array((p + [p[-1]] * T)[:T])


def mean_accepted(r) -> float:
    """The expected accepted drafts per verification, ``sum_k prod_{i<=k} p_i``, of
    :func:`acceptance_profile` (with ``accept_seq``: its mean)."""
    if r.accept_seq:
        return float(np.mean(r.accept_seq))
    return float(np.cumprod(acceptance_profile(r)).sum())


def accepted_counts(cfg: Config, block: int = 4096) -> Iterator[int]:
    """The accepted drafts of each verification, forever: the run of leading successes of the
    per-position draws (:func:`acceptance_profile`, one ``[seed, 0xACCE]`` stream of ``T``
    uniforms per verification, drawn ``block`` verifications at a time), or ``accept_seq``
    cycled."""
    r = cfg.replay
    if r.accept_seq:
        seq = [int(a) for a in r.accept_seq]
        while True:
            yield from seq
    T = r.drafts
    p = acceptance_profile(r)
    rng = np.random.default_rng([cfg.run.seed, 0xACCE])
    while True:
        ok = rng.random((block, T)) < p
        yield from np.where(ok.all(axis=1), T, np.argmin(ok, axis=1)).tolist()


def flush_schedule(cfg: Config) -> Iterator[int]:
    """Lengths of the segments between flushes, in committed tokens, until ``run.steps``.

    Without drafts: ``buffer_len`` each. With ``drafts = T``: each verification appends T drafts
    and commits ``a`` of them (:func:`accepted_counts`); a flush follows when
    ``committed + 2T > buffer_len`` (or at the last step).
    """
    r = cfg.replay
    steps, L, T = cfg.run.steps, r.buffer_len, r.drafts
    done = 0
    if T == 0:
        while done < steps:
            m = min(L, steps - done)
            done += m
            yield m
        return
    committed = 0
    for a in accepted_counts(cfg):
        a = min(a, steps - done - committed)
        committed += a
        if committed and (committed + 2 * T > L or done + committed >= steps):
            done += committed
            yield committed
            committed = 0
            if done >= steps:
                return


def segment_ends(cfg: Config) -> np.ndarray:
    """The steps at which the flushes of :func:`flush_schedule` happen (cumulative ends)."""
    return np.cumsum(np.fromiter(flush_schedule(cfg), dtype=np.int64))


def flush_events(seg_ends: np.ndarray, steps: int) -> np.ndarray:
    """Per step, the index of its segment (a ReplaySSM scheme's SR event at that segment's
    flush: the torch engine counts one event per flush)."""
    return np.searchsorted(seg_ends, np.arange(steps), side="right")


def segment_phase(seg_ends: np.ndarray, steps: int, fold_output: bool) -> np.ndarray:
    """Per step, the fused kernels' int32 code of where it sits in its segment:
    ``4 j + flush + 2 (flush and fold_output)`` with ``j`` its position since the last flush;
    ``fold_output`` (no drafts): a flush step's output comes from the folded state, else (drafts:
    verification reads before the flush) from the checkpoint plus the buffer."""
    t = np.arange(steps)
    starts = np.concatenate(([0], seg_ends[:-1]))
    j = t - starts[flush_events(seg_ends, steps)]
    flush = np.zeros(steps, dtype=np.int32)
    flush[seg_ends - 1] = 1
    return (4 * j + flush * (3 if fold_output else 1)).astype(np.int32)


def skip_to(segments: Iterator[int], pos: int) -> Iterator[int]:
    """The segments of ``segments`` after the first ``pos`` steps (a resumed run: a checkpoint
    is saved where a segment ends)."""
    done = 0
    for m in segments:
        if done >= pos:
            yield m
        done += m
        if done > pos and done - m < pos:
            raise ValueError(f"step {pos} is inside a segment")
