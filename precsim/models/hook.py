"""The hook into ``transformers``' SSM mixers: every scan a mixer runs goes to a handler.

The Mamba-2-family mixers call the module-level functions ``mamba2_selective_state_update``
(one decode token) and ``mamba2_chunk_scan`` (a whole sequence or chunk), the GDN mixers
``torch_recurrent_gated_delta_rule`` / ``torch_chunk_gated_delta_rule``. While a :class:`Hook` is
active those names in the mixer's modeling module point to a dispatcher, and each mixer
instance's ``forward`` is wrapped to say which layer is calling. The dispatcher turns the call's
arguments into precsim's per-head inputs with a time axis (:class:`Step`: softplus + dt bias +
clamping as the function applies them; GDN q/k expanded to the value heads, L2-normalised when
the model asks, q scaled by 1/sqrt(K)) and hands them to a handler, which either runs the model's
own function (recording, reference) or a precsim scheme. What is per family (the functions'
names, their arguments, their return values) is the family module's (``HF_HOOKED``,
``hf_inputs``, ``hf_parse``, ``hf_build``: :mod:`precsim.families`).
"""

from __future__ import annotations

import inspect
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import PrecsimError
from ..families import FAMILIES
from .load import HOOKED, ssm_layers


@dataclass
class Step:
    """One scan call of one SSM layer, in precsim's layout with leading ``(T, b)`` axes.

    ``inp``: Mamba-2 ``dt (T,b,H)`` ``x (T,b,H,P)`` ``B``/``C (T,b,G,N)`` (per group);
    GDN ``g``/``beta (T,b,H)`` ``q``/``k (T,b,G,K)`` (per key head) ``v (T,b,H,V)``.
    ``const``: ``A (H,)``, ``D (H,)`` (Mamba-2; D may be absent). ``state``: the state before
    the call ``(b, H, Dv, Dk)`` or None (zero). ``recurrent``: a one-token decode call.
    """

    layer: int
    family: str
    inp: dict
    const: dict
    state: torch.Tensor | None
    recurrent: bool

    @property
    def shape(self) -> tuple[int, int]:
        """``(T, b)``."""
        return tuple(self.inp[FAMILIES[self.family].DECAY_INPUT].shape[:2])


Handler = Callable[[Step, Callable[[], tuple]], tuple]


class Hook:
    """Context manager: while active, every SSM scan of ``model`` goes to ``handler`` (settable
    between forward calls), as ``handler(step, run_own) -> (y (T,b,H,Dv), state (b,H,Dv,Dk) or
    None)`` where ``run_own()`` runs the model's own function and returns its ``(y, state)``.
    ``y`` includes Mamba-2's ``D x`` skip (the function's output before the gate and norm).

    Several hooks may be active at once, on several models in several threads (a whole-model run
    split across GPUs, one model copy per GPU and thread): the modeling module's functions are
    replaced once while any hook needs them, and a call goes to the hook of the mixer that the
    calling thread is running. A mixer's ``forward`` that something else wrapped already (an
    ``accelerate`` device hook) is wrapped in turn and put back on exit."""

    def __init__(self, model, handler: Handler | None = None):
        self.layers = ssm_layers(model)
        self.handler = handler
        self._mixers: list[tuple] = []
        self._funcs: list[tuple[str, str]] = []

    def __enter__(self):
        with _LOCK:
            mods = {}
            for idx, mixer, fam in self.layers:
                mods[type(mixer).__module__] = fam
                own = mixer.forward

                def fwd(*a, _own=own, _idx=idx, _fam=fam, **k):
                    prev = getattr(_LOCAL, "current", None)
                    _LOCAL.current = (self, _idx, _fam)
                    try:
                        return _own(*a, **k)
                    finally:
                        _LOCAL.current = prev

                self._mixers.append((mixer, mixer.__dict__.get("forward")))
                mixer.forward = fwd
            for modname, fam in mods.items():
                mod = sys.modules[modname]
                for name, recurrent in zip(HOOKED[fam], (True, False), strict=True):
                    key = (modname, name)
                    if key not in _INSTALLED:
                        orig = getattr(mod, name)
                        _INSTALLED[key] = [orig, 0]
                        setattr(mod, name, _dispatcher(orig, fam, recurrent, mod))
                    _INSTALLED[key][1] += 1
                    self._funcs.append(key)
        return self

    def __exit__(self, *exc):
        with _LOCK:
            for mixer, prior in reversed(self._mixers):
                if prior is None:
                    del mixer.__dict__["forward"]  # forward reverts to the class's
                else:
                    mixer.forward = prior
            for key in self._funcs:
                _INSTALLED[key][1] -= 1
                if _INSTALLED[key][1] == 0:
                    setattr(sys.modules[key[0]], key[1], _INSTALLED.pop(key)[0])
            self._mixers.clear()
            self._funcs.clear()
        return False


_LOCAL = threading.local()  # .current: (hook, layer index, family) of the mixer a thread runs
_LOCK = threading.Lock()
_INSTALLED: dict[tuple[str, str], list] = {}  # (module, function) -> [original, active hooks]


def _named(sig: inspect.Signature) -> bool:
    """Whether a signature names its parameters (not only ``*args, **kwargs``)."""
    return any(p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values())


def signature_of(orig) -> inspect.Signature:
    """The parameters of transformers' scan function ``orig``. transformers >= 5.25 with
    Hugging Face's ``kernels`` installed wraps it in a module whose ``forward`` takes
    ``(*args, **kwargs)`` and calls the function it closes over: that function's signature."""
    sig = inspect.signature(orig)
    if _named(sig):
        return sig
    fwd = getattr(type(orig), "forward", None)
    for cell in getattr(fwd, "__closure__", None) or ():
        f = cell.cell_contents
        if callable(f) and not isinstance(f, type):
            try:
                inner = inspect.signature(f)
            except (TypeError, ValueError):
                continue
            if _named(inner):
                return inner
    raise PrecsimError(f"cannot read the parameters of transformers' "
                       f"{getattr(orig, '__name__', type(orig).__name__)} ({sig}); allowed: "
                       "transformers 5.17 - 5.25, whose scan functions name them")


def _dispatcher(orig, fam: str, recurrent: bool, mod):
    sig = signature_of(orig)
    l2norm = getattr(mod, "l2norm", None)

    def dispatch(*args, **kwargs):
        cur = getattr(_LOCAL, "current", None)
        if cur is None or cur[0].handler is None:
            return orig(*args, **kwargs)
        b = sig.bind(*args, **kwargs)
        b.apply_defaults()
        a = dict(b.arguments)
        a.update(a.pop("kwargs", {}) or {})
        step = _step(fam, a, recurrent, cur[1], l2norm)
        own: list = []  # [raw result, parsed y] once the model's own function ran

        def run_own():
            raw = orig(*args, **kwargs)
            y, state = _parse(fam, recurrent, a, raw)
            own[:] = [raw, y]
            return y, state

        y, state = cur[0].handler(step, run_own)
        if own and y is own[1]:  # passed through untouched: the model's own return value
            return own[0]
        return _build(fam, recurrent, a, y, state)

    return dispatch


def _step(fam: str, a: dict, recurrent: bool, layer: int, l2norm) -> Step:
    """The per-head inputs the model's function is about to use (the family's ``hf_inputs``)."""
    inp, const, state = FAMILIES[fam].hf_inputs(a, recurrent, l2norm)
    return Step(layer, fam, inp, const, state, recurrent)


def _parse(fam: str, recurrent: bool, a: dict, raw) -> tuple:
    """The model's own ``(y (T,b,H,Dv), state (b,H,Dv,Dk) or None)`` from its return value."""
    return FAMILIES[fam].hf_parse(recurrent, a, raw)


def _build(fam: str, recurrent: bool, a: dict, y: torch.Tensor, state):
    """The function's return value (and in-place cache update) from a handler's (y, state);
    ``state`` None (a handler that keeps the states itself): the cache gets zeros."""
    return FAMILIES[fam].hf_build(recurrent, a, y, state)
