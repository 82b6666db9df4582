"""Checkpoints and interrupts of a run (user guide: docs/resume.md).

The protocol an engine (or any long runner, e.g. the whole-model one) follows:

* ``ckpt.start(name, device, t_start)``, then ``state = ckpt.resume()``: the state dict it saved
  last, or None (start at step 0); at the end ``info.update(ckpt.info())``;
* ``ckpt.window(pos, get_state)`` at every point where its state is whole (a window boundary:
  every step before ``pos`` is reduced or held in the accumulator, nothing after it started);
  ``get_state()`` returns a picklable dict (tensors and arrays are saved exactly) holding at
  least ``pos``, ``dead_at`` (scheme -> first non-finite step or None) and either ``acc`` (the
  ``metrics.Accumulator``; its readout is not saved) or ``rows`` and ``per_step`` (a runner
  that reduces its own rows, as :func:`precsim.result.make_result` takes them); an optional
  ``finish`` callable (not saved) readies ``acc`` for a partial result. ``get_state`` is called
  only when a checkpoint is due (``run.checkpoint_s`` seconds after the last) or a stop was
  asked for (SIGINT, SIGTERM, submitit's SIGUSR2): then the checkpoint is saved and
  :class:`Interrupted` raised, carrying the partial result (the windows reduced so far).

The random streams are counter-based (keyed by seed, scheme, event), so a run resumed from a
saved state draws exactly the numbers the uninterrupted run draws: results are bit-identical.
"""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

from .rundir import CHECKPOINT_FILE

SIGNALS = ("SIGINT", "SIGTERM", "SIGUSR2")  # SIGUSR2: submitit's preemption / time-out


class Interrupted(BaseException):
    """A run stopped by a signal (a ``BaseException``, as ``KeyboardInterrupt``: no ``except
    Exception`` on the way swallows it). ``pos``: the step whose checkpoint was saved (None:
    stopped outside the engine), ``partial``: the Result of the windows reduced so far."""

    def __init__(self, signum: int, pos: int | None = None, partial=None, path=None,
                 unit: str = "step"):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.pos, self.partial, self.path = signum, pos, partial, path
        self.unit = unit  # what ``pos`` counts (a task run: "task row")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


# the signal waiting for the next window boundary; ``process``: this is the process's own
# command (precsim.cli.entry), which may end itself hard if an interrupt gets lost
_STOP: dict = {"defer": False, "signum": None, "notice": None, "process": False,
               "said": False, "outer": False}
WATCHDOG_S = 10.0


def mark_process() -> None:
    """This process is the command line's own (``precsim.cli.entry``): a lost interrupt may end
    it hard (:func:`watchdog`)."""
    _STOP["process"] = True


def said_why() -> bool:
    """Whether the command already printed why it stops (then :func:`watchdog` prints none)."""
    return bool(_STOP["said"])


def mark_said(said: bool = True) -> None:
    """Record that the command printed (or, ``False``, has not printed) why it stops."""
    _STOP["said"] = said


def request_stop(signum: int | None) -> None:
    """Stop every engine loop of this process at its next boundary as if ``signum`` had
    arrived (``None``: withdraw the request), e.g. a whole-model run's other copies."""
    _STOP["signum"] = signum


def handlers_installed() -> bool:
    """Whether SIGINT's handler is this module's (:func:`install_handlers` ran)."""
    return signal.getsignal(signal.SIGINT) is _on_signal


def watchdog(signum: int, after: float = WATCHDOG_S, end=None):
    """End the process ``after`` seconds from now with ``128 + signum`` and one line, unless it
    ended by itself. An interrupt that lands inside an import lock's callback is printed as
    "Exception ignored" and lost, and the main thread then waits on that lock for ever (seen
    under load: SIGINT in the first second of a run, later SIGTERMs ignored); this daemon timer
    runs beside it. ``end`` (tests): called instead of ``os._exit``. (``threading`` is
    imported with this module, whole before a handler runs: a signal during its first import,
    the warm-up's, found ``threading.Timer`` missing, a traceback: tests/app/test_resume.py)"""

    def fire():
        if not _STOP.get("said"):  # the command's own line was never printed
            print(f"precsim: {signal.Signals(signum).name}: stopped (the process had not "
                  f"ended {after:g} s after the signal)", file=sys.stderr, flush=True)
        (end or os._exit)(128 + signum)

    t = threading.Timer(after, fire)
    t.daemon = True
    t.start()
    return t


def _on_signal(signum, frame) -> None:
    """While an engine runs, the first signal waits for its next window boundary (a whole
    state to save); a second one, or one outside the engine, stops at once."""
    if _STOP["defer"] and _STOP["signum"] is None:
        _STOP["signum"] = signum  # a window longer than 2 s: say why nothing happens yet
        _STOP["notice"] = threading.Timer(2.0, print, (
            f"precsim: {signal.Signals(signum).name}: stopping at the next window boundary "
            "(again to stop at once, without a checkpoint)",), {"file": sys.stderr,
                                                                 "flush": True})
        _STOP["notice"].daemon = True
        _STOP["notice"].start()
        return
    if _STOP["process"]:
        watchdog(signum)
    raise Interrupted(signum)


def _unraisable(info) -> None:
    """``sys.unraisablehook`` while the handlers are in: an interrupt raised where Python cannot
    propagate it (a signal landing in an import lock's or a finaliser's callback: "Exception
    ignored in ...", then the main thread may wait on that lock) is delivered again 50 ms later,
    from outside that callback, instead of being printed and lost; anything else goes to the
    hook that was there before."""
    exc = info.exc_value
    if isinstance(exc, (Interrupted, KeyboardInterrupt)):
        import threading

        signum = getattr(exc, "signum", signal.SIGINT)
        t = threading.Timer(0.05, os.kill, (os.getpid(), signum))
        t.daemon = True
        t.start()
        return
    _PREV_UNRAISABLE[-1](info)


_PREV_UNRAISABLE: list = []


def install_handlers(names=SIGNALS[:2]) -> dict:
    """Route ``names`` to :func:`_on_signal` (and lost interrupts to :func:`_unraisable`);
    returns the previous handlers (main thread only)."""
    old = {}
    if sys.unraisablehook is not _unraisable:
        _PREV_UNRAISABLE.append(sys.unraisablehook)
        sys.unraisablehook = _unraisable
        old["unraisable"] = _PREV_UNRAISABLE[-1]
    for n in names:
        s = getattr(signal, n, None)
        try:
            old[s] = signal.signal(s, _on_signal)
        except (TypeError, ValueError):  # no such signal here, or not the main thread
            pass
    return old


def restore_handlers(old: dict) -> None:
    for s, h in old.items():
        if s == "unraisable":
            sys.unraisablehook = _PREV_UNRAISABLE.pop()
        else:
            signal.signal(s, h)


def job_signals():
    """The signals that stop a job's engine at its next window boundary (a checkpoint saved) in a
    launcher's worker process, where :func:`precsim.cli.main` did not install them: SIGINT and
    SIGTERM (a joblib worker), or submitit's preemption/time-out signal, SIGUSR2, which then
    goes on to submitit's handler: it requeues the job, and the requeued job resumes from the
    checkpoint."""
    import contextlib

    submitit = bool(os.environ.get("SUBMITIT_EXECUTOR"))
    if not submitit and handlers_installed():
        return contextlib.nullcontext()  # the command line's own process: installed already

    @contextlib.contextmanager
    def chain():
        old = install_handlers(("SIGUSR2",) if submitit else ("SIGINT", "SIGTERM"))
        try:
            yield
        except Interrupted as e:
            if e.signum == signal.SIGUSR2 and callable(old.get(signal.SIGUSR2)):
                old[signal.SIGUSR2](e.signum, None)  # submitit: requeue, exit
            raise
        finally:
            restore_handlers(old)

    return chain()


class Checkpoint:
    """The checkpoint of one run directory (``path`` None: never saved, signals still stop)."""

    def __init__(self, cfg, out: Path | None, every_s: float | None = None):
        self.cfg, self.out = cfg, (Path(out) if out is not None else None)
        self.path = self.out / CHECKPOINT_FILE if self.out is not None else None
        self.every_s = cfg.run.checkpoint_s if every_s is None else every_s
        self.saved_s: list[tuple[float, int]] = []  # (seconds, bytes) of each save
        self._state = None
        self._last = time.perf_counter()
        self._offset = 0.0  # engine seconds of the run before this process (resumed)
        self._fp = None  # the input files' fingerprint (result.input_fingerprint), once
        # tests: PRECSIM_SIGNAL_AT=SIGINT@1024 sends SIGINT to this process at the first window
        # boundary at or after step 1,024 (an interrupt at a known step)
        name, _, at = os.environ.get("PRECSIM_SIGNAL_AT", "").partition("@")
        self._signal_at = (getattr(signal, name), int(at)) if at else None

    def _inputs(self) -> dict:
        if self._fp is None:
            from .rundir import input_fingerprint

            self._fp = input_fingerprint(self.cfg)
        return self._fp

    # -- reading --------------------------------------------------------------------------
    def load(self) -> dict | None:
        """The stored state of this config, None when there is none; a one-line PrecsimError
        when it holds another config's run. ``run.resume=false`` deletes it instead."""
        from .errors import PrecsimError
        from .rundir import config_diff, inputs_changed

        if self._state is not None:  # (read already)
            return self._state
        if self.path is None or not self.path.is_file():
            return None
        if not self.cfg.run.resume:
            self.path.unlink()
            return None
        import torch

        try:
            state = torch.load(self.path, map_location="cpu", weights_only=False)
        except Exception as e:  # noqa: BLE001 - a damaged file: say so, in one line
            raise PrecsimError(f"{self.path} is unreadable ({type(e).__name__}); allowed: "
                               "run.resume=false (start over) or delete it") from None
        diff = config_diff(state["config"], asdict(self.cfg))
        if diff:
            key, old, new = diff[0]
            raise PrecsimError(f"{self.out} holds a checkpoint of another config ({key}={old!r} "
                               f"there, {new!r} now); allowed: the same config, run.resume="
                               "false (start over), or another directory")
        changed = inputs_changed(state.get("inputs"), self.cfg)
        if changed:
            raise PrecsimError(f"{self.out} holds a checkpoint of this config made from other "
                               f"inputs ({changed} since); allowed: the same inputs, run.resume="
                               "false (start over), or another directory")
        self._state = state
        return state

    def saved(self) -> bool:
        """Whether a saved state of this config waits to be resumed (read by :meth:`load`)."""
        return self.load() is not None

    def resume(self, device=None, unit: str = "step", total: int | None = None) -> dict | None:
        """The engine's saved state (its ``acc`` without a readout), or None; says so. Tensors
        come back on the CPU, or on ``device`` (an engine whose accumulator holds tensors;
        ``"saved"``: each on the device it was saved from, a model placed on several).
        ``unit`` and ``total``: what the saved ``pos`` counts, of how many (run.steps' steps)."""
        st = self.load()
        if st is None:
            return None
        if device is not None and str(device) != "cpu":
            import torch

            st = torch.load(self.path, map_location=None if device == "saved" else device,
                            weights_only=False)
        self._offset = st["elapsed_s"]
        total = self.cfg.run.steps if total is None else total
        print(f"precsim: resuming {self.out} from its checkpoint at {unit} "
              f"{st['engine']['pos']:,} of {total:,} ({st['elapsed_s']:.1f} s of work saved; "
              "run.resume=false starts over)", file=sys.stderr, flush=True)
        return st["engine"]

    # -- the engine's hook ------------------------------------------------------------------
    def due(self, pos: int, end: int | None = None) -> bool:
        """Whether :meth:`window` at ``pos`` would save or stop (an engine that overlaps
        windows makes its state whole only then); ``end``: where the run ends (run.steps).
        Under :func:`outer` a checkpoint that saves nothing (a pass's own, inside a runner
        that checkpoints between passes) is never due: the stop waits for the runner's."""
        if self.path is None and _STOP["outer"]:
            return False
        if self._signal_at is not None and pos >= self._signal_at[1]:
            os.kill(os.getpid(), self._signal_at[0])  # the handler runs before the next line
            self._signal_at = None
        if pos >= (self.cfg.run.steps if end is None else end):
            return False  # the end: nothing left to save time for
        return _STOP["signum"] is not None or bool(
            self.every_s and self.path is not None
            and time.perf_counter() - self._last >= self.every_s)

    def window(self, pos: int, get_state, end: int | None = None, unit: str = "step",
               partial: bool = True) -> None:
        """Call where the engine's state is whole; saves when due, stops when asked to.
        ``end``, ``unit``: as :meth:`due` and :class:`Interrupted` take them; ``partial``
        False: a runner with no partial result (a task run: its rows so far are no answer)."""
        if not self.due(pos, end):
            return
        stop, state = _STOP["signum"], get_state()
        if self.path is not None:
            self.save(state)
        if stop is not None:
            _STOP["signum"] = None
            _STOP["notice"].cancel()
            raise Interrupted(stop, pos, self.partial(state) if partial else None, self.path,
                              unit)

    def save(self, state: dict) -> None:
        import torch

        from .rundir import atomic_write_bytes

        t0 = time.perf_counter()
        acc = state.get("acc")
        readout = getattr(acc, "readout", None)
        if acc is not None:
            acc.readout = None  # the readout is rebuilt from the config
        try:
            buf = io.BytesIO()
            torch.save({"config": asdict(self.cfg), "inputs": self._inputs(),
                        "engine": {k: v for k, v in state.items() if k != "finish"},
                        "elapsed_s": self._offset + t0 - self._t_start}, buf)
        finally:
            if acc is not None:
                acc.readout = readout
        atomic_write_bytes(self.path, buf.getvalue())
        self._last = time.perf_counter()
        self.saved_s.append((self._last - t0, buf.tell()))

    def start(self, engine: str, device: str, t_start: float) -> None:
        """What a partial result says of itself (the engine calls this as it starts)."""
        self._engine, self._device, self._t_start = engine, str(device), t_start
        self._last = time.perf_counter()

    def partial(self, state: dict):
        from .result import make_result

        acc = state.get("acc")
        if "finish" in state:  # e.g. statistics still on the device: to the host first
            state["finish"]()
        res = make_result(self.cfg, acc, state["dead_at"], engine=self._engine,
                          device=self._device, t_start=self._t_start, rows=state.get("rows"),
                          per_step=state.get("per_step"),
                          steps=acc.done if acc is not None else state["pos"])
        res.info["interrupted_at"] = state["pos"]
        return res

    def info(self) -> dict:
        """What to add to the result's info: the saves' count, seconds and size."""
        if not self.saved_s:
            return {"resumed_s": round(self._offset, 4)} if self._offset else {}
        return {"checkpoints": len(self.saved_s),
                "checkpoint_s": round(sum(s for s, _ in self.saved_s), 4),
                "checkpoint_bytes": self.saved_s[-1][1],
                **({"resumed_s": round(self._offset, 4)} if self._offset else {})}

    def done(self) -> None:
        """The run's result is written: its checkpoint is no longer needed."""
        if self.path is not None and self.path.exists():
            self.path.unlink()

    def __enter__(self):
        _STOP["defer"], _STOP["signum"] = True, None
        return self

    def __exit__(self, *exc) -> None:
        _STOP["defer"] = False
        if _STOP["notice"] is not None:
            _STOP["notice"].cancel()


class outer:
    """``with outer():`` a runner that checkpoints between whole passes (a task run) holds the
    stop: the passes' own checkpoints (no file) neither stop nor signal inside a pass."""

    def __enter__(self):
        self._was, _STOP["outer"] = _STOP["outer"], True
        return self

    def __exit__(self, *exc) -> None:
        _STOP["outer"] = self._was


def restore_acc(acc, saved) -> None:
    """Give the engine's fresh accumulator ``acc`` the saved one's contents (keeping ``acc``'s
    readout)."""
    readout = acc.readout
    acc.__dict__.update(saved.__dict__)
    acc.readout = readout
