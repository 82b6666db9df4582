"""Real models (README, "Real models"): precsim's hooks into the SSM mixers of ``transformers``
checkpoints, shared by recording (``python -m precsim.record``: traces the layer-level engines
replay) and whole-model mode (:func:`run_model_kl`: every SSM layer's decode step replaced by a
precsim scheme, teacher-forced on the reference's tokens).

How the hook works: the Mamba-2-family mixers call the module-level functions
``mamba2_selective_state_update`` (decode) / ``mamba2_chunk_scan`` (first token, no state yet),
the GDN mixers ``torch_recurrent_gated_delta_rule`` / ``torch_chunk_gated_delta_rule``. While a
:class:`Hook` is active those names in the mixer's modeling module point to a dispatcher, and each
mixer instance's ``forward`` is wrapped to say which layer is calling. The dispatcher turns the
function's arguments into precsim's per-head inputs (softplus + dt bias + clamping as the function
applies them; grouped B/C and q/k expanded per head; GDN q/k L2-normalised, q scaled by 1/sqrt(K))
and hands them to a handler, which either runs the model's own function (recording, reference) or
a precsim scheme step. The model is always run one token at a time (the prompt included), so every
trace starts from a zero state and every step is a decode step.

``transformers`` is an optional dependency (``pip install precsim[models]``).
"""

from __future__ import annotations

import inspect
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .errors import PrecsimError

# mixer class name -> family; model class name -> family (tested ones listed in the README)
MIXERS = {
    "Mamba2Mixer": "mamba2", "NemotronHMamba2Mixer": "mamba2", "BambaMixer": "mamba2",
    "FalconH1Mixer": "mamba2", "Zamba2MambaMixer": "mamba2", "GraniteMoeHybridMambaLayer": "mamba2",
    "Qwen3NextGatedDeltaNet": "gdn", "Qwen3_5GatedDeltaNet": "gdn",
    "Qwen3_5MoeGatedDeltaNet": "gdn",
}
ARCHITECTURES = {
    "Mamba2ForCausalLM": "mamba2", "NemotronHForCausalLM": "mamba2", "BambaForCausalLM": "mamba2",
    "FalconH1ForCausalLM": "mamba2", "Zamba2ForCausalLM": "mamba2",
    "GraniteMoeHybridForCausalLM": "mamba2",
    "Qwen3NextForCausalLM": "gdn", "Qwen3_5ForCausalLM": "gdn", "Qwen3_5MoeForCausalLM": "gdn",
}
HOOKED = {"mamba2": ("mamba2_selective_state_update", "mamba2_chunk_scan"),
          "gdn": ("torch_recurrent_gated_delta_rule", "torch_chunk_gated_delta_rule")}
# prompt ids used when the checkpoint has no tokenizer (and no ids are given)
FIXED_PROMPT_IDS = [1, 7, 3, 11, 5, 2, 13, 4]
DEFAULT_PROMPT = "The recurrent state of a state space model"


# ---------------------------------------------------------------------------------------------
# loading


def require_transformers():
    try:
        import transformers
    except ImportError:
        raise PrecsimError("model.path needs the optional dependency transformers; allowed: "
                           "pip install 'precsim[models]'") from None
    return transformers


def load_model(path, device: str = "cpu", dtype: str | None = None):
    """Load a local causal-LM checkpoint; one-line PrecsimError for a missing path, an
    unsupported class or a checkpoint without SSM layers. Returns ``(model, tokenizer|None)``."""
    tf = require_transformers()
    tf.utils.logging.disable_progress_bar()  # stderr stays for one-line errors
    tf.utils.logging.set_verbosity_error()  # (the "falling back to PyTorch" notices included)
    p = Path(path)
    if not p.is_dir() or not (p / "config.json").is_file():
        raise PrecsimError(f"model path {str(p)!r} is not a checkpoint directory (no "
                           "config.json); allowed: a local save_pretrained directory")
    try:
        config = tf.AutoConfig.from_pretrained(p)
    except Exception as e:  # noqa: BLE001 - any unreadable config is a user error
        raise PrecsimError(f"model path {str(p)!r}: config.json is unreadable "
                           f"({type(e).__name__})") from None
    arch = (getattr(config, "architectures", None) or [type(config).__name__])[0]
    if arch not in ARCHITECTURES or not hasattr(tf, arch):
        raise PrecsimError(f"model class {arch!r} (from {str(p)!r}) is unsupported; allowed: "
                           f"{', '.join(a for a in ARCHITECTURES if hasattr(tf, a))}")
    kw = {"dtype": getattr(torch, dtype)} if dtype else {}
    model = getattr(tf, arch).from_pretrained(p, **kw).to(device).eval()
    if not ssm_layers(model):
        raise PrecsimError(f"model class {arch!r} at {str(p)!r} has no SSM layers (layer types "
                           f"{getattr(config, 'layer_types', '?')}); allowed: a checkpoint with "
                           "Mamba-2 or GatedDeltaNet layers")
    tok = None
    if any((p / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json",
                                       "tokenizer.model")):
        try:
            tok = tf.AutoTokenizer.from_pretrained(p)
        except Exception:  # noqa: BLE001 - a broken tokenizer: fall back to fixed ids
            tok = None
    return model, tok


def prompt_ids(tokenizer, prompt: str | None, vocab: int) -> tuple[list[int], str]:
    """Prompt token ids and where they came from (``tokenizer`` or ``fixed ids``)."""
    if tokenizer is not None:
        ids = tokenizer(prompt or DEFAULT_PROMPT)["input_ids"]
        if ids:
            return [int(i) for i in ids], "tokenizer"
    if prompt:
        raise PrecsimError(f"prompt {prompt!r} given but the checkpoint has no tokenizer; "
                           "allowed: omit the prompt (fixed ids are used)")
    return [i % vocab for i in FIXED_PROMPT_IDS], "fixed ids"


def ssm_layers(model) -> list[tuple[int, torch.nn.Module, str]]:
    """``(layer index, mixer, family)`` of every SSM layer, in model order."""
    out = []
    for mod in model.modules():
        fam = MIXERS.get(type(mod).__name__)
        if fam is not None:
            out.append((int(getattr(mod, "layer_idx", len(out))), mod, fam))
    return out


# ---------------------------------------------------------------------------------------------
# the hook


@dataclass
class Step:
    """One decode step of one SSM layer (batch row 0), in precsim's per-head layout.

    ``inp``: Mamba-2 ``dt (H,)`` ``x (H,P)`` ``B``/``C (H,N)``; GDN ``g``/``beta (H,)``
    ``q``/``k (H,K)`` ``v (H,V)``. ``const``: ``A (H,)``, ``D (H,)`` (Mamba-2; D may be absent).
    ``state``: the state before the step ``(H, Dv, Dk)`` or None (zero).
    """

    layer: int
    family: str
    inp: dict
    const: dict
    state: torch.Tensor | None


Handler = Callable[[Step, Callable[[], tuple]], tuple]


class Hook:
    """Context manager: while active, every SSM decode step of ``model`` goes to ``handler``
    (settable between forward calls), as ``handler(step, run_own) -> (y (H,Dv), state (H,Dv,Dk))``
    where ``run_own()`` runs the model's own function and returns its ``(y, state)``.
    ``y`` includes Mamba-2's ``D x`` skip (the function's output before the gate and norm)."""

    def __init__(self, model, handler: Handler | None = None):
        self.layers = ssm_layers(model)
        self.handler = handler
        self.current: tuple[int, str] | None = None
        self._saved: list[tuple] = []

    def __enter__(self):
        mods = {}
        for idx, mixer, fam in self.layers:
            mods[type(mixer).__module__] = fam
            own = mixer.forward

            def fwd(*a, _own=own, _idx=idx, _fam=fam, **k):
                self.current = (_idx, _fam)
                try:
                    return _own(*a, **k)
                finally:
                    self.current = None

            self._saved.append((mixer, "forward", None))
            mixer.forward = fwd
        for modname, fam in mods.items():
            mod = sys.modules[modname]
            rec_name, chunk_name = HOOKED[fam]
            for name, recurrent in ((rec_name, True), (chunk_name, False)):
                orig = getattr(mod, name)
                self._saved.append((mod, name, orig))
                setattr(mod, name, self._dispatcher(orig, fam, recurrent, mod))
        return self

    def __exit__(self, *exc):
        for obj, name, orig in reversed(self._saved):
            if orig is None:
                del obj.__dict__[name]  # the instance attribute: forward reverts to the class's
            else:
                setattr(obj, name, orig)
        self._saved.clear()
        return False

    def _dispatcher(self, orig, fam: str, recurrent: bool, mod):
        sig = inspect.signature(orig)
        l2norm = getattr(mod, "l2norm", None)

        def dispatch(*args, **kwargs):
            if self.current is None or self.handler is None:
                return orig(*args, **kwargs)
            b = sig.bind(*args, **kwargs)
            b.apply_defaults()
            a = dict(b.arguments)
            a.update(a.pop("kwargs", {}) or {})
            layer = self.current[0]
            if fam == "mamba2":
                step = _mamba2_step(a, recurrent, layer)
            else:
                step = _gdn_step(a, layer, l2norm)
            own: list = []  # [raw result, parsed y] once the model's own function ran

            def run_own():
                raw = orig(*args, **kwargs)
                y, state = _parse(fam, recurrent, a, raw)
                own[:] = [raw, y]
                return y, state

            y, state = self.handler(step, run_own)
            if own and y is own[1]:  # passed through untouched: the model's own return value
                return own[0]
            return _build(fam, recurrent, a, y, state)

        return dispatch


def _mamba2_step(a: dict, recurrent: bool, layer: int) -> Step:
    """The per-head inputs the Mamba-2 function is about to use (its own dt arithmetic)."""
    bias, D = a.get("dt_bias"), a.get("D")
    if recurrent:  # state (b,H,P,N), hidden_states (b,H,P), dt (b,H,P), A (H,P,N), B/C (b,G,N)
        x, dt, A = a["hidden_states"][0], a["dt"][0, :, 0], a["A"][:, 0, 0]
        bias, D = (None if t is None else t[:, 0] for t in (bias, D))
        Bg, Cg = a["B"][0], a["C"][0]
        state = a["state"][0]
    else:  # hidden_states (b,l,H,P), dt (b,l,H), A (H,), B/C (b,l,G,N), initial_states (b,H,P,N)
        if a["hidden_states"].shape[1] != 1:
            raise PrecsimError(f"layer {layer}: the Mamba-2 hook saw {a['hidden_states'].shape[1]}"
                               " tokens in one call; allowed: 1 (run token by token)")
        x, dt, A = a["hidden_states"][0, 0], a["dt"][0, 0], a["A"]
        Bg, Cg = a["B"][0, 0], a["C"][0, 0]
        st = a.get("initial_states")
        state = st[0] if st is not None else None
    if bias is not None:
        dt = dt + bias.to(dt.dtype)
    if a.get("dt_softplus"):
        dt = F.softplus(dt)
    if not recurrent:  # the chunked function also clamps dt to dt_limit
        lim = a.get("dt_limit", (0.0, float("inf")))
        dt = torch.clamp(dt, min=lim[0], max=lim[1])
    H = x.shape[0]
    rep = H // Bg.shape[0]
    inp = {"dt": dt.float() if dt.dtype != torch.float64 else dt,
           "x": x, "B": Bg.repeat_interleave(rep, 0), "C": Cg.repeat_interleave(rep, 0)}
    if x.dtype not in (torch.float32, torch.float64):
        inp = {k: v.float() for k, v in inp.items()}
    const = {"A": A.float() if A.dtype != torch.float64 else A}
    if D is not None:
        const["D"] = D.to(inp["x"].dtype)
    return Step(layer, "mamba2", inp, const, None if state is None else state.clone())


def _gdn_step(a: dict, layer: int, l2norm) -> Step:
    """GDN inputs as the function uses them: float32, q/k expanded to the value heads,
    L2-normalised when the model asks, q scaled by 1/sqrt(K). State (H,V,K) (HF keeps (H,K,V))."""
    q, k, v = a["query"], a["key"], a["value"]
    if q.shape[1] != 1:
        raise PrecsimError(f"layer {layer}: the GDN hook saw {q.shape[1]} tokens in one call; "
                           "allowed: 1 (run token by token)")
    Hk, Hv = k.shape[2], v.shape[2]
    wide = torch.float64 if v.dtype == torch.float64 else torch.float32
    q, k, v = (t[0, 0].to(wide) for t in (q, k, v))
    if Hk != Hv:
        q = q.repeat_interleave(Hv // Hk, 0)
        k = k.repeat_interleave(Hv // Hk, 0)
    if a.get("use_qk_l2norm_in_kernel"):
        norm = l2norm or (lambda x, dim, eps: x * torch.rsqrt((x * x).sum(dim, True) + eps))
        q, k = norm(q, dim=-1, eps=1e-6), norm(k, dim=-1, eps=1e-6)
    q = q / (q.shape[-1] ** 0.5)
    inp = {"g": a["g"][0, 0].to(wide), "beta": a["beta"][0, 0].to(wide), "q": q, "k": k, "v": v}
    st = a.get("initial_state")
    state = st[0].transpose(-1, -2).to(wide).clone() if st is not None else None
    return Step(layer, "gdn", inp, {}, state)


def _parse(fam: str, recurrent: bool, a: dict, raw) -> tuple:
    if fam == "mamba2":
        if recurrent:
            y, state = raw[0], a["state"][0].clone()
        elif isinstance(raw, tuple):
            y, state = raw[0][0, 0], raw[1][0]
        else:
            y, state = raw[0, 0], None
    else:
        out, st = raw
        y, state = out[0, 0], (st[0].transpose(-1, -2) if st is not None else None)
    return y, state


def _build(fam: str, recurrent: bool, a: dict, y: torch.Tensor, state: torch.Tensor):
    """The function's return value (and in-place cache update) from a handler's (y, state)."""
    if fam == "mamba2":
        if recurrent:
            a["state"].copy_(state[None].to(a["state"].dtype))
            out = y[None]
            if a.get("z") is not None:
                out = out * F.silu(a["z"])
            return out.to(a["hidden_states"].dtype)
        out = y[None, None].float()
        if a.get("return_final_states"):
            return out, state[None].float()
        return out
    out = y[None, None].to(a["query"].dtype)
    st = state.transpose(-1, -2)[None].float() if a.get("output_final_state") else None
    return out, st


# ---------------------------------------------------------------------------------------------
# running a model token by token


def forward_token(model, token: int, cache):
    """One token through the model with its cache; returns ``(logits (vocab,), cache)``."""
    dev = next(model.parameters()).device
    ids = torch.tensor([[int(token)]], device=dev)
    out = model(input_ids=ids, cache=cache, use_cache=True)
    return out.logits[0, -1], out.cache


@dataclass
class Recorder:
    """Handler that runs the model's own step and keeps its inputs, outputs and states."""

    keep_inputs: bool = True
    inputs: dict = field(default_factory=dict)  # layer -> list of Step
    outputs: dict = field(default_factory=dict)  # layer -> list of y (H,Dv)
    states: dict = field(default_factory=dict)  # layer -> latest state (H,Dv,Dk)

    def __call__(self, step: Step, run_own):
        y, state = run_own()
        if self.keep_inputs:
            self.inputs.setdefault(step.layer, []).append(step)
            self.outputs.setdefault(step.layer, []).append(y.detach().clone())
        self.states[step.layer] = state
        return y, state


def record(model, ids: list[int], n_tokens: int, progress=None) -> tuple[list[int], Recorder]:
    """Greedy decode of ``n_tokens`` after the prompt ``ids``, token by token from token 0,
    recording every SSM layer. Every token fed (prompt + generated) is one recorded step."""
    rec = Recorder()
    tokens = list(ids)
    cache = None
    with torch.no_grad(), Hook(model, rec):
        t = 0
        while t < len(tokens):
            logits, cache = forward_token(model, tokens[t], cache)
            if t == len(tokens) - 1 and len(tokens) < len(ids) + n_tokens:
                tokens.append(int(torch.argmax(logits)))
            t += 1
            if progress is not None:
                progress(t)
    return tokens, rec


def trace_arrays(steps: list[Step]) -> dict[str, np.ndarray]:
    """A layer's recorded steps as a trace dict (README schema)."""
    from .families import get_family

    keys = get_family(steps[0].family).KEYS
    out = {k: torch.stack([s.inp[k] for s in steps]).cpu().numpy() for k in keys}
    for k, v in steps[0].const.items():
        out[k] = v.detach().cpu().numpy()
    want = np.float64 if out[keys[0]].dtype == np.float64 else np.float32
    return {k: v.astype(want) for k, v in out.items()}


# ---------------------------------------------------------------------------------------------
# whole-model mode


class LayerScheme:
    """One SSM layer's state under one precsim scheme, stepped token by token.

    Conventional schemes take a one-token segment per token. Replay schemes (shared, split) keep
    the inputs since the last flush; at each token they evaluate the segment so far (``flush`` only
    when it reaches ``replay.buffer_len``) and return its last output. The segment evaluation is
    causal, so a prefix's last output is exactly the output the layer-level engine computes for
    that position over the whole segment; the state only changes at a flush (O(L^2) per segment,
    negligible next to the model).
    """

    def __init__(self, scheme, family, cfg, dtype):
        from .engines.base import buffer_rounder

        self.s, self.family, self.dtype = scheme, family, dtype
        self.L = cfg.replay.buffer_len
        self.decay_exp = cfg.model.decay_exp
        self.br = buffer_rounder(cfg.replay.buffer_dtype, 32 if dtype == torch.float32 else 64)
        self.u_master = cfg.replay.gdn_u_source == "master"
        self.buf: list[dict] = []
        self.pos = 0

    def step(self, st: Step) -> torch.Tensor:
        from .families import decays, family_params

        inp64 = {k: v.to(torch.float64)[None, None] for k, v in st.inp.items()}  # (1, 1, H, ...)
        inp = {k: v.to(self.dtype) for k, v in inp64.items()}
        p64 = family_params(st.family, st.const, inp64[next(iter(inp64))].device, torch.float64)
        inp.update(decays(st.family, inp64, p64, self.dtype, self.decay_exp))
        val, key = (inp["x"], inp["B"]) if st.family == "mamba2" else (inp["v"], inp["k"])
        if self.s.state is None:
            self.s.init((1, val.shape[2], val.shape[3], key.shape[3]), val.device, self.dtype)
        params = family_params(st.family, st.const, val.device, self.dtype)
        if self.s.dead_at is not None:
            return torch.full(val.shape[2:], math.nan, dtype=self.dtype, device=val.device)
        if not self.s.replay:
            y = self.s.run_segment(self.family, inp, params, True)[-1, 0]
        else:
            self.buf.append(inp)
            seg = {k: torch.cat([b[k] for b in self.buf]) for k in inp}
            flush = len(self.buf) == self.L
            y = self.s.run_segment(self.family, seg, params, flush, out_from_fold=flush,
                                   buffer_round=self.br, u_from_master=self.u_master)[-1, 0]
            if flush:
                self.buf.clear()
        if "D" in st.const:
            y = y + st.const["D"].to(self.dtype)[:, None] * inp["x"][0, 0]
        self.pos += 1
        if not bool(torch.isfinite(y).all()) and self.s.dead_at is None:
            self.s.dead_at = self.pos
        return y


class SchemeHandler:
    """Handler that replaces every SSM layer's step by one precsim scheme (one per layer)."""

    def __init__(self, name: str, cfg, dtype):
        from .families import get_family
        from .schemes import SCHEMES, format_options

        self.name, self.cfg, self.dtype = name, cfg, dtype
        self.sc = cfg.schemes[name]
        self.layers: dict[int, LayerScheme] = {}
        self._mk = lambda layer, fam: LayerScheme(  # noqa: E731
            SCHEMES[self.sc.kind](name=f"{name}@layer{layer}", cfg=self.sc, seed=cfg.run.seed,
                                  fmt_options=format_options(cfg),
                                  tensor_scope=cfg.formats.tensor_scope),
            get_family(fam), cfg, dtype)

    def __call__(self, step: Step, run_own):
        ls = self.layers.get(step.layer)
        if ls is None:
            ls = self.layers[step.layer] = self._mk(step.layer, step.family)
        y = ls.step(step)
        return y, ls.s.state[0]

    def held(self, layer: int) -> dict:
        return {k: v[0] for k, v in self.layers[layer].s.held().items()}


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    rn = float(torch.linalg.vector_norm(ref.double()))
    d = float(torch.linalg.vector_norm(a.double() - ref.double()))
    return d / rn if rn > 0 else (0.0 if d == 0 else math.inf)


def run_model_kl(cfg, device: str = "cpu", progress: bool = True):
    """Whole-model study (README, "Real models"): the reference and every scheme of ``cfg`` run
    the checkpoint at ``cfg.model.path`` in lockstep, token by token, on the reference's greedy
    tokens. Returns a :class:`precsim.result.Result` with the layer-level columns (``top1`` etc.
    of the model's own logits); ``info`` has per-token KL / top-1, the first flip (None: none)
    and per-layer drift.

    Reference: the model's own decode step (state in the model's dtype) for float32/float64
    models; for half-precision models a conventional FP32 state (precsim's step). Schemes compute
    in ``run.compute_dtype`` (fp64 under a float64 model).
    """
    from .config import SchemeConfig
    from .engines.base import progress_bar
    from .metrics import _bands
    from .result import make_result

    t_start = time.perf_counter()
    if cfg.replay.drafts:
        raise PrecsimError(f"replay.drafts={cfg.replay.drafts} with model.path; allowed: 0 "
                           "(whole-model mode decodes one token per step)")
    if cfg.run.seqs != 1:
        raise PrecsimError(f"run.seqs={cfg.run.seqs} with model.path; allowed: 1")
    dev = "cpu" if device in ("auto", None) and not torch.cuda.is_available() else device
    dev = "cuda" if dev == "auto" else dev
    model, tok = load_model(cfg.model.path, dev)
    mdtype = next(model.parameters()).dtype
    cdt = torch.float64 if (cfg.run.compute_dtype == "fp64" or mdtype == torch.float64) \
        else torch.float32
    vocab = model.get_output_embeddings().weight.shape[0]
    ids, source = prompt_ids(tok, getattr(cfg.model, "prompt", None), vocab)
    n_gen = cfg.run.steps
    layers = [idx for idx, _, _ in ssm_layers(model)]
    ref = Recorder(keep_inputs=False)
    if mdtype not in (torch.float32, torch.float64):
        from dataclasses import replace

        c2 = replace(cfg, schemes={"reference": SchemeConfig(kind="conventional", fmt="fp32")})
        ref_handler = SchemeHandler("reference", c2, torch.float32)
    else:
        ref_handler = ref
    runs = {n: SchemeHandler(n, cfg, cdt) for n in cfg.schemes}
    caches = {n: None for n in ["reference", *runs]}
    tokens = list(ids)
    kl = {n: [] for n in runs}
    top1 = {n: [] for n in runs}
    rel = {n: [] for n in runs}
    drift = {n: [] for n in runs}  # (generated index, per-layer state drift, read drift)
    bar = progress_bar(cfg, progress)
    with torch.no_grad(), Hook(model) as hook:
        for t in range(len(ids) + n_gen - 1):
            hook.handler = ref_handler
            lr, caches["reference"] = forward_token(model, tokens[t], caches["reference"])
            lr = lr.double()
            logp_r = torch.log_softmax(lr, -1)
            if t >= len(ids) - 1:
                ref_states = (ref.states if ref_handler is ref else
                              {k: ref_handler.held(k)["state"] for k in layers})
            for n, h in runs.items():
                hook.handler = h
                ls, caches[n] = forward_token(model, tokens[t], caches[n])
                if t < len(ids) - 1:
                    continue
                ls = ls.double()
                logp_s = torch.log_softmax(ls, -1)
                d_kl = float(torch.sum(torch.exp(logp_r) * (logp_r - logp_s)).clamp(min=0.0))
                kl[n].append(d_kl if math.isfinite(d_kl) else math.nan)
                # as precsim.metrics.kl_top1: non-finite logits (a dead scheme) disagree
                top1[n].append(float(bool(torch.argmax(ls) == torch.argmax(lr))
                                     and bool(torch.isfinite(ls).all())))
                rel[n].append(_rel(ls, lr))
                # drift where the layer-level engine samples it: after a flush (every step for
                # conventional schemes, whose state is always current)
                if h.sc.kind == "conventional" or (t + 1) % cfg.replay.buffer_len == 0:
                    held = {k: h.held(k) for k in layers}
                    drift[n].append((len(kl[n]) - 1,
                                     [_rel(held[k]["state"], ref_states[k]) for k in layers],
                                     [_rel(held[k]["read"], ref_states[k]) if "read" in held[k]
                                      else math.nan for k in layers]))
            if t >= len(ids) - 1:
                tokens.append(int(torch.argmax(lr)))
                if bar is not None:
                    bar.update(1)
    if bar is not None:
        bar.close()
    W = max(1, min(cfg.metrics.window, n_gen))
    ends = list(range(W, n_gen + 1, W))
    if not ends or ends[-1] != n_gen:
        ends.append(n_gen)
    rows, per_step = [], {}
    for n in runs:
        e, kk, t1 = np.asarray(rel[n]), np.asarray(kl[n]), np.asarray(top1[n])
        per_step[n] = e
        start = 0
        for end in ends:
            sl = slice(start, end)
            row = {"scheme": n, "step": end}
            for metric, arr in (("rel_err", e), ("kl", kk), ("top1", t1)):
                row.update({key: col[0] for key, col in
                            _bands(metric, [arr[sl].mean(keepdims=True)]).items()})
            row["rel_err_max"] = float(e[sl].max())
            flip = np.flatnonzero(t1[:end] < 0.5)  # the first flip, censored at the row's end
            row["first_flip"] = float(flip[0] + 1) if flip.size else float(end)
            row["flipped"] = int(flip.size > 0)
            last = [d for d in drift[n] if d[0] < end]
            row["state_drift"] = float(np.mean(last[-1][1])) if last else math.nan
            rd = np.asarray(last[-1][2]) if last else np.asarray([math.nan])
            row["read_drift"] = float(np.mean(rd)) if np.isfinite(rd).all() else math.nan
            rows.append(row)
            start = end
    info = {"workload": "model", "model_path": str(cfg.model.path),
            "model_class": type(model).__name__, "model_dtype": str(mdtype).replace("torch.", ""),
            "ssm_layers": layers, "prompt_source": source, "prompt_len": len(ids),
            "tokens": tokens, "kl": {n: np.asarray(v) for n, v in kl.items()},
            "top1": {n: np.asarray(v) for n, v in top1.items()},
            "first_flip": {n: (int(np.flatnonzero(np.asarray(v) < 0.5)[0]) + 1
                               if min(v, default=1.0) < 0.5 else None) for n, v in top1.items()},
            "layer_drift": {n: {"token": np.asarray([d[0] + 1 for d in v], dtype=np.int64),
                                "state": np.asarray([d[1] for d in v])}
                            for n, v in drift.items()},
            "flushes": (len(ids) + n_gen - 1) // cfg.replay.buffer_len}
    dead = {n: min([ls.s.dead_at for ls in h.layers.values() if ls.s.dead_at is not None],
                   default=None) for n, h in runs.items()}
    return make_result(cfg, None, dead, engine="model", device=dev, t_start=t_start, info=info,
                       rows=rows, per_step=per_step, steps=n_gen)
