"""What every engine shares: the run loop (:class:`Engine`), the flush schedule (from
:mod:`precsim.schedule`, below the engines: the cost model uses it too), the progress bar and the
slow-start notice, the buffer rounder.

An engine is one module in this package with ``NAME``, ``supports(cfg, device) -> str | None``
(None, or why it cannot run ``cfg`` there) and ``run(cfg, device, progress, ...) -> Result``,
which runs the module's :class:`Engine` subclass. :meth:`Engine.run` is the one loop: it makes
the workload (``make_workload``), falls back to the torch engine where the engine cannot run the
config, resumes from the checkpoint, walks the engine's spans of steps with the progress bar,
saves and stops at window boundaries (:mod:`precsim.checkpoint`), and builds the
``precsim.result.Result`` from the metrics accumulator and the dead schemes. A subclass only
does the math: it prepares its state, advances a span of steps (the float64 truth and every
scheme in lockstep, the outputs to the accumulator), exposes the states it holds (drift) and
saves/loads them for a checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time

import numpy as np

from ..checkpoint import Checkpoint, restore_acc
from ..config import Config
from ..schedule import (  # noqa: F401 - the engines' flush schedule, re-exported
    acceptance_profile,
    accepted_counts,
    flush_events,
    flush_schedule,
    mean_accepted,
    segment_ends,
    segment_phase,
    skip_to,
)


def progress_bar(cfg: Config, enabled: bool):
    """A tqdm bar over the run's steps on a terminal; when stderr is not a TTY (piped, in a
    log file) a :class:`ProgressLines` instead, one plain line every few seconds. None when
    disabled (or tqdm is missing)."""
    if not (enabled and cfg.run.progress):
        return None
    import sys

    if not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty()):
        return ProgressLines(cfg.run.steps)
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        return None
    return tqdm(total=cfg.run.steps, unit="step", desc="precsim", mininterval=0.5,
                leave=False, dynamic_ncols=True)


class ProgressLines:
    """Progress for a stream that is not a terminal (a pipe, a CI log): no bar (its carriage
    returns make one line of everything), but ``precsim: step 12,288/32,768 (38%), 31 s,
    ~51 s left`` on stderr at most every ``every`` seconds, so a long run piped to a file or
    ``tee`` shows it is alive. Nothing for a run shorter than ``every``. The tqdm methods the
    engines and whole-model runs call: ``update``, ``reset``, ``set_description``, ``close``."""

    def __init__(self, total: int, every: float = 5.0, stream=None, clock=None):
        import sys
        import time

        self.total, self.every, self.n, self.desc = int(total), float(every), 0, "step"
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock or time.monotonic
        self.t0 = self.last = self.clock()

    def update(self, n: int = 1) -> None:
        self.n += int(n)
        now = self.clock()
        if now - self.last < self.every or self.n >= self.total:
            return
        self.last = now
        el = now - self.t0
        left = f", ~{el * (self.total - self.n) / self.n:,.0f} s left" if self.n else ""
        try:
            print(f"precsim: {self.desc} {self.n:,}/{self.total:,} "
                  f"({100 * self.n / self.total:.0f}%), {el:,.0f} s{left}", file=self.stream,
                  flush=True)
        except (OSError, ValueError):  # a closed pipe: nothing more to say
            pass

    def reset(self, total: int | None = None) -> None:
        self.n = 0
        if total is not None:
            self.total = int(total)

    def set_description(self, desc: str) -> None:  # (a whole-model run: "layers x chunks")
        self.desc = str(desc)

    def close(self) -> None:
        pass


def slow_notice(what: str, enabled: bool = True, after: float = 2.0):
    """A context manager that says ``precsim: {what} ...`` on stderr if its block is still
    running after ``after`` seconds (e.g. a first run's compilation: ~15-20 s during which the
    progress bar cannot move), and nothing otherwise."""
    import contextlib
    import sys
    import threading

    if not enabled:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def notice():
        timer = threading.Timer(after, lambda: print(f"precsim: {what} ...", file=sys.stderr,
                                                     flush=True))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    return notice()


def buffer_rounder(dtype_name: str, compute_bits: int):
    """The rounding of ReplaySSM buffer entries (``replay.buffer_dtype``), NumPy or torch."""
    from precsim import formats as pf

    if dtype_name == "fp64" or (dtype_name == "fp32" and compute_bits == 32):
        return lambda x: x
    return lambda x: pf.quantize(x, dtype_name, "rne")


def launch_ends(seg_ends, window: int) -> list[int]:
    """Ends of the windows a fused engine runs at once (the Triton and numba engines): the first
    flush (of ``seg_ends``, :func:`segment_ends`) at or after each metrics window end, so the
    ReplaySSM buffers start empty in every window and state drift is sampled where the torch
    engine samples it."""
    seg_ends = np.asarray(seg_ends)
    steps = int(seg_ends[-1])
    ends = []
    k = 1
    while not ends or ends[-1] < steps:
        e = int(seg_ends[np.searchsorted(seg_ends, min(k * window, steps))])
        if not ends or e > ends[-1]:
            ends.append(e)
        k += 1
    return ends


def side_by_side_jobs() -> int:
    """How many jobs of a Hydra sweep run side by side on this machine: the joblib launcher's
    ``n_jobs`` in a multirun job (-1 = all cores, -2 all but one, ...), else 1 (a single run, the
    API, or Hydra's basic launcher, which runs the jobs in turn)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
        from omegaconf import OmegaConf
    except ImportError:  # pragma: no cover
        return 1
    if not HydraConfig.initialized():
        return 1
    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return 1
    if "joblib" not in str(OmegaConf.select(hc, "launcher._target_", default="") or "").lower():
        return 1
    n = OmegaConf.select(hc, "launcher.n_jobs", default=-1)
    cores = os.cpu_count() or 1
    n = int(n) if n is not None else -1
    return max(1, n if n > 0 else cores + 1 + n)


def cpu_threads(threads, cores: int | None = None) -> int:
    """The threads a CPU engine's own compiled code uses for ``run.threads``: ``auto`` = all
    cores for a single run, the cores shared out among the jobs of a joblib sweep that run
    side by side (1 each when ``n_jobs`` = cores); 0 = all cores; n = n (at most the cores).
    Results do not depend on it (tests/engines/test_engine_numba.py)."""
    cores = cores or os.cpu_count() or 1
    if threads == "auto":
        return max(1, cores // side_by_side_jobs())
    return cores if threads == 0 else max(1, min(int(threads), cores))


def torch_threads(threads) -> int | None:
    """torch's intra-op threads for ``run.threads`` (None: leave torch's default): ``auto`` = 1,
    because torch's OpenMP workers spin (with 2 threads on a shared 2-core machine the torch
    engine ran 3-20x slower than with one; docs/performance.md); 0 = torch's default; n = n."""
    if threads == "auto":
        return 1
    return None if threads == 0 else int(threads)


class Engine:
    """One run of a config on one engine: :meth:`run` is the loop every engine shares; a
    subclass provides the hooks below it (the math). ``record_outputs`` keeps every output in
    ``info["outputs"]`` (tests, small runs); ``ckpt`` saves and restores the engine's state
    (:mod:`precsim.checkpoint`; None: never saved, signals still stop the run)."""

    NAME = ""
    LABEL = ""  # the engine in a fallback note
    log = logging.getLogger("precsim")
    where = None  # the device its results name (None: the run's device)
    workload_device = None  # the device its inputs are drawn on (None: the run's device)
    resume_device = None  # where a resumed state's tensors go (None: the CPU)
    overlaps = False  # spans overlap (threads, streams): the state is whole only after settle()

    def __init__(self, cfg: Config, device: str = "cpu", progress: bool = True,
                 record_outputs=False, ckpt: Checkpoint | None = None):
        self.cfg, self.device, self.progress = cfg, device, progress
        self.record_outputs = record_outputs
        self.ck = ckpt or Checkpoint(cfg, None)
        self.acc = self.bar = None
        self.dead: dict[str, int | None] = {}  # scheme -> its first non-finite step
        self.recorded: dict[str, list] = {}  # name -> outputs per span (record_outputs)

    # -- the loop ---------------------------------------------------------------------------
    def run(self):
        from ..result import make_result
        from ..workload import make_workload

        cfg, ck = self.cfg, self.ck
        self.t_start = time.perf_counter()
        wl = make_workload(cfg, self.workload_device or self.device)  # first: a trace fixes
        reason = self.unsupported()  # model.family and the shape
        if reason is not None:
            return self.fallback(reason)
        ck.start(self.NAME, self.where or self.device, self.t_start)
        self.prepare(wl)
        self.bar = progress_bar(cfg, self.progress)
        pos = 0
        saved = ck.resume(self.resume_device)
        if saved is not None:
            pos = self.load(saved)
            restore_acc(self.acc, saved["acc"])
            if self.bar is not None:
                self.bar.update(pos)
        with self.session():
            for a, b in self.spans(pos):
                self.advance(a, b)
                if self.bar is not None:
                    self.bar.update(b - a)
                if not self.overlaps:  # whole at every span's end: the checkpoint decides
                    ck.window(b, self.save)
                elif ck.due(b):  # a save or a stop: the spans in flight finished first
                    self.settle()
                    ck.window(b, self.save)
            self.settle()
        self.close()
        if self.bar is not None:
            self.bar.close()
        info = {**self.info(), **ck.info()}
        if self.recorded:
            info["outputs"] = {k: np.concatenate(v) for k, v in self.recorded.items()}
        return make_result(cfg, self.acc, self.dead_at(), engine=self.NAME,
                           device=self.where or self.device, t_start=self.t_start, info=info)

    def fallback(self, reason: str):
        """The torch engine runs a config this engine does not cover, with a logged note
        (``Result.info["<engine>_fallback"]``)."""
        self.log.warning("precsim: the %s engine does not support %s; running the torch engine",
                         self.LABEL, reason)
        res = self.fallback_engine()(self.cfg, self.device, self.progress,
                                     self.fallback_records(), self.ck).run()
        res.info[f"{self.NAME}_fallback"] = reason
        return res

    def push(self, end: int, y_ref, ys: dict) -> None:
        """A span's outputs (torch tensors; ``ys[name]`` None: a dead scheme) to the
        accumulator, the outputs kept, and a drift sample of the held states if one is due."""
        self.acc.push(y_ref, ys)
        if self.record_outputs:
            self.record("truth", y_ref.cpu().numpy())
            for n, y in ys.items():
                self.record(n, np.full(y_ref.shape, np.nan) if y is None else y.cpu().numpy())
        if self.acc.want_drift(end):
            self.acc.record_drift(end, *self.held())

    def record(self, name: str, y: np.ndarray) -> None:
        self.recorded.setdefault(name, []).append(y)

    # -- what an engine provides ------------------------------------------------------------
    def unsupported(self) -> str | None:
        """Why this engine cannot run the config (after the workload is made); None: it can."""
        return None

    def fallback_engine(self) -> type:
        """The engine that runs what :meth:`unsupported` names (the torch engine's class)."""
        raise NotImplementedError

    def fallback_records(self):
        return self.record_outputs

    def prepare(self, wl) -> None:
        """Allocate the state and the accumulator (``self.acc``) for workload ``wl``."""
        raise NotImplementedError

    def spans(self, pos: int):
        """The ``(a, b)`` spans of steps the run advances by, from step ``pos``."""
        raise NotImplementedError

    def advance(self, a: int, b: int) -> None:
        """Advance the truth and every scheme over steps [a, b), the outputs to the metrics."""
        raise NotImplementedError

    def settle(self) -> None:
        """Make the state whole at the last span's end (an engine that overlaps spans)."""

    def held(self) -> tuple:
        """``(truth state, {scheme: None (dead) or {"state": ..., ["read": ...]}})``."""
        raise NotImplementedError

    def save(self) -> dict:
        """The state a checkpoint keeps (with ``pos``, ``acc`` and ``dead_at``)."""
        raise NotImplementedError

    def load(self, saved: dict) -> int:
        """Restore :meth:`save`'s state; the step it was saved at."""
        raise NotImplementedError

    def session(self):
        """A context the spans run in (threads, streams)."""
        return contextlib.nullcontext()

    def close(self) -> None:
        self.acc.finish()

    def dead_at(self) -> dict:
        return self.dead

    def info(self) -> dict:
        return {}
