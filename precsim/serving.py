"""What the serving engines ship for the recurrent SSM state, in precsim's scheme terms.

Each :data:`SETTINGS` row is one user-facing setting of vLLM, SGLang or TensorRT-LLM that selects
an SSM (Mamba / linear-attention) state format, read from the engine's own source or docs at the
version named, with the precsim scheme it stores (``kind``, ``fmt``, ``rounding``; see
:class:`precsim.config.SchemeConfig`). ``status`` says how far the setting is confirmed:

* ``"release"``: seen in the engine's docs or source at that released version;
* ``"main"``: merged and read on the engine's main branch, the first release carrying it not
  pinned down.

:data:`OPEN` lists formats that exist only as open pull requests or RFCs (nothing a user can
turn on). Nothing here is inferred beyond what the named source shows: NVFP4 states, split
(master + read copy) states and INT8/FP8 block-scaled states are shipped by none of the three.

:func:`settings_for` gives one line per engine setting that ships a scheme;
:func:`next_step_line` the one line a verdict ends with.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EngineSetting", "OpenWork", "SETTINGS", "OPEN", "CHECKED", "settings_for",
           "next_step_line", "closest_shipped"]


@dataclass(frozen=True)
class EngineSetting:
    engine: str  # vLLM | SGLang | TensorRT-LLM
    version: str  # the version the setting was read at
    setting: str  # the exact CLI flags / config keys and values
    kind: str
    fmt: str
    rounding: str
    source: str  # URL or repo path@version
    status: str = "release"  # release | main (merged; first release not pinned)
    note: str = ""

    @property
    def scheme(self) -> dict:
        return {"kind": self.kind, "fmt": self.fmt, "rounding": self.rounding}

    def line(self) -> str:
        where = self.version if self.status == "release" else f"{self.version}, release not pinned"
        tail = f" ({self.note})" if self.note else ""
        return f"{self.engine} {where}: {self.setting}{tail}"


@dataclass(frozen=True)
class OpenWork:
    engine: str
    ref: str  # the open PR / RFC
    what: str
    kind: str
    fmt: str
    rounding: str  # "rne", "sr" or "any"
    error_feedback: str = "none"


_VLLM_CACHE = "vllm-project/vllm vllm/config/cache.py@002f10e0 (CacheConfig, MambaDType)"
_VLLM_MAMBA = ("https://docs.vllm.ai/en/v0.23.0/api/vllm/config/mamba/ (MambaConfig."
               "enable_stochastic_rounding, stochastic_rounding_philox_rounds); "
               "vllm/engine/arg_utils.py EngineArgs; PR #35753")
_VLLM_REPLAY = (_VLLM_CACHE + " (use_replayssm, replayssm_buffer_len=16); PR #48018 (merged "
                "2026-07); ReplaySSM kernels listed in https://docs.vllm.ai/en/v0.27.0/api/vllm/"
                "model_executor/layers/mamba/ops/")
_VLLM_REPLAY_NOTE = ("ReplaySSM, Mamba-2 only: the SSM cache is written only at a flush, every "
                     "--replayssm-buffer-len (default 16) tokens; --mamba-cache-mode none|align, "
                     "non-speculative decode")
_SGL = ("sgl-project/sglang python/sglang/srt/server_args.py@001067ff "
        "(ServerArgs.mamba_ssm_dtype choices float32|bfloat16|float16)")
_SGL_SR = (_SGL + "; enable_mamba_cache_stochastic_rounding, mamba_cache_philox_rounds=0; "
           "PR #26929 (merged 2026-06)")
_TRT = ("https://nvidia.github.io/TensorRT-LLM/1.3.0rc27/llm-api/reference/KvCacheConfig.html "
        "(mamba_ssm_cache_dtype: Literal['auto','float16','bfloat16','float32']='auto', "
        "mamba_ssm_stochastic_rounding: bool=False, mamba_ssm_philox_rounds: int>=1=10)")
_TRT_SR = _TRT + "; PR #11972"

SETTINGS: tuple[EngineSetting, ...] = (
    # vLLM: --mamba-ssm-cache-dtype {auto,float32,float16,bfloat16} (the SSM state; auto follows
    # --mamba-cache-dtype, which sets conv + SSM state and whose auto is the model dtype)
    EngineSetting("vLLM", "v0.10.2", "--mamba-ssm-cache-dtype float32",
                  "conventional", "fp32", "rne",
                  "https://docs.vllm.ai/en/v0.10.2/api/vllm/config/cache.html "
                  "(MambaDType = Literal['auto', 'float32']); PR #22928"),
    EngineSetting("vLLM", "v0.16.0", "--mamba-ssm-cache-dtype float16",
                  "conventional", "fp16", "rne",
                  "https://docs.vllm.ai/en/v0.16.0/api/vllm/config/cache/ "
                  "(MambaDType = Literal['auto', 'float32', 'float16'])"),
    EngineSetting("vLLM", "main@002f10e0", "--mamba-ssm-cache-dtype bfloat16",
                  "conventional", "bf16", "rne", _VLLM_CACHE, status="main",
                  note="v0.16.0 lists no bfloat16 value; its auto gives the model dtype"),
    EngineSetting("vLLM", "v0.23.0",
                  "--mamba-ssm-cache-dtype float16 --enable-mamba-cache-stochastic-rounding "
                  "[--mamba-cache-philox-rounds N, default 0 = the Triton default]",
                  "conventional", "fp16", "sr", _VLLM_MAMBA,
                  note="CUDA only; --mamba-backend triton needs SM100 (Blackwell), else "
                       "--mamba-backend flashinfer"),
    EngineSetting("vLLM", "main@002f10e0", "--use-replayssm --mamba-ssm-cache-dtype float32",
                  "shared", "fp32", "rne", _VLLM_REPLAY, status="main", note=_VLLM_REPLAY_NOTE),
    EngineSetting("vLLM", "main@002f10e0", "--use-replayssm --mamba-ssm-cache-dtype float16",
                  "shared", "fp16", "rne", _VLLM_REPLAY, status="main", note=_VLLM_REPLAY_NOTE),
    EngineSetting("vLLM", "main@002f10e0", "--use-replayssm --mamba-ssm-cache-dtype bfloat16",
                  "shared", "bf16", "rne", _VLLM_REPLAY, status="main", note=_VLLM_REPLAY_NOTE),
    # SGLang: --mamba-ssm-dtype {float32,bfloat16,float16} (unset: the model config's
    # mamba_ssm_dtype); float32/bfloat16 since PR #10258, float16 since PR #18444
    EngineSetting("SGLang", "main@001067ff", "--mamba-ssm-dtype float32",
                  "conventional", "fp32", "rne", _SGL + "; PR #10258", status="main"),
    EngineSetting("SGLang", "main@001067ff", "--mamba-ssm-dtype bfloat16",
                  "conventional", "bf16", "rne", _SGL + "; PR #10258", status="main"),
    EngineSetting("SGLang", "main@001067ff", "--mamba-ssm-dtype float16",
                  "conventional", "fp16", "rne", _SGL + "; PR #18444", status="main"),
    EngineSetting("SGLang", "main@001067ff",
                  "--mamba-ssm-dtype float16 --enable-mamba-cache-stochastic-rounding "
                  "[--mamba-cache-philox-rounds N, default 0]",
                  "conventional", "fp16", "sr", _SGL_SR, status="main",
                  note="CUDA only; --mamba-backend triton needs SM100"),
    # TensorRT-LLM: KvCacheConfig (LLM API / --extra_llm_api_options YAML kv_cache_config:)
    EngineSetting("TensorRT-LLM", "1.3.0rc27", "kv_cache_config.mamba_ssm_cache_dtype: float32",
                  "conventional", "fp32", "rne", _TRT),
    EngineSetting("TensorRT-LLM", "1.3.0rc27", "kv_cache_config.mamba_ssm_cache_dtype: float16",
                  "conventional", "fp16", "rne", _TRT),
    EngineSetting("TensorRT-LLM", "1.3.0rc27", "kv_cache_config.mamba_ssm_cache_dtype: bfloat16",
                  "conventional", "bf16", "rne", _TRT),
    EngineSetting("TensorRT-LLM", "1.3.0rc27",
                  "kv_cache_config.mamba_ssm_cache_dtype: float16, "
                  "mamba_ssm_stochastic_rounding: true [mamba_ssm_philox_rounds: N, default 10]",
                  "conventional", "fp16", "sr", _TRT_SR,
                  note="FlashInfer selective-state-update path only; ignored with a warning "
                       "otherwise"),
)

# Formats no engine ships, with the open work that proposes them (nothing to turn on).
OPEN: tuple[OpenWork, ...] = (
    OpenWork("vLLM", "PR #40012 (open)", "INT8 / INT16 / FP8 E4M3 SSM cache, one FP32 scale per "
             "(head, dim) row, SR on the quantized store", "conventional", "int8_b128", "any"),
    OpenWork("vLLM", "PR #40012 (open)", "INT8 / INT16 / FP8 E4M3 SSM cache, one FP32 scale per "
             "(head, dim) row, SR on the quantized store", "conventional", "fp8_e4m3_b128", "any"),
    OpenWork("vLLM", "PR #52962 (open)", "INT8 and FP8 E4M3 SSM cache for FlashInfer ReplaySSM, "
             "one FP32 scale per (head, head_dim), SR for FP8", "shared", "int8_b128", "any"),
    OpenWork("vLLM", "PR #52962 (open)", "INT8 and FP8 E4M3 SSM cache for FlashInfer ReplaySSM, "
             "one FP32 scale per (head, head_dim), SR for FP8", "shared", "fp8_e4m3_b128", "any"),
    OpenWork("vLLM", "RFC #55196 (open)", "Mamba/GDN state quantization, INT8 + error feedback",
             "conventional", "int8_b128", "any", error_feedback="any"),
)

CHECKED = {"vLLM": "v0.23.0 + main@002f10e0", "SGLang": "main@001067ff",
           "TensorRT-LLM": "1.3.0rc27"}

_LABEL = {"fp32": "FP32", "fp16": "FP16", "bf16": "BF16", "fp64": "FP64", "nvfp4": "NVFP4",
          "int8_b128": "INT8 block 128", "fp8_e4m3_b128": "FP8 E4M3 block 128",
          "fp8_e4m3": "FP8 E4M3"}
_PREFER = ("fp16", "bf16", "fp32")  # ties: the finer 16-bit format first


def _fmt(name) -> str:
    """precsim's canonical name for a format (its aliases: float16 → fp16, ...)."""
    if name is None:
        return None
    try:
        from precsim import formats as pf

        obj = pf.get(str(name))
        return getattr(obj, "name", str(name))
    except Exception:  # noqa: BLE001 - an unknown name stays as given (it matches nothing)
        return str(name)


def _bits(fmt: str) -> float:
    try:
        from precsim import formats as pf

        return float(pf.get(fmt).bits_per_element)
    except Exception:  # noqa: BLE001
        return 32.0


def _norm(scheme) -> dict:
    if isinstance(scheme, dict):
        s = scheme
    else:  # a SchemeConfig
        s = {k: getattr(scheme, k, None) for k in ("kind", "fmt", "rounding", "read_fmt",
                                                    "error_feedback")}
    ef = s.get("error_feedback") or "none"
    return {"kind": s.get("kind") or "conventional", "fmt": _fmt(s.get("fmt") or "fp32"),
            "rounding": s.get("rounding") or "rne", "read_fmt": _fmt(s.get("read_fmt")),
            "error_feedback": "none" if ef == "none" else _fmt(ef)}


def label(scheme) -> str:
    s = _norm(scheme)
    name = _LABEL.get(s["fmt"], s["fmt"]) + (" SR" if s["rounding"] == "sr" else "")
    if s["kind"] == "shared":
        name = "ReplaySSM " + name
    elif s["kind"] == "split":
        name = f"split {name} + {_LABEL.get(s['read_fmt'], s['read_fmt'])} read"
    if s["error_feedback"] != "none":
        name += f" + EF {_LABEL.get(s['error_feedback'], s['error_feedback'])}"
    return name


def rows_for(scheme) -> list[EngineSetting]:
    """The table rows that store exactly this scheme (a split or error-feedback scheme: none)."""
    s = _norm(scheme)
    if s["kind"] == "split" or s["read_fmt"] is not None or s["error_feedback"] != "none":
        return []
    return [r for r in SETTINGS
            if (r.kind, r.fmt, r.rounding) == (s["kind"], s["fmt"], s["rounding"])]


def settings_for(scheme) -> list[str]:
    """One readable line per engine setting that ships this scheme, e.g.
    ``"vLLM v0.10.2: --mamba-ssm-cache-dtype float32"``; [] when none does."""
    return [r.line() for r in rows_for(scheme)]


def closest_shipped(scheme, rounding: str | None = None) -> list[EngineSetting]:
    """The rows of the nearest scheme some engine ships: a split scheme's master alone, a scheme
    without its error feedback, else the same format (other kind or rounding), else the
    narrowest wider format (same kind, then same rounding first). ``rounding``: only rows
    with that rounding."""
    s = _norm(scheme)
    target = {"kind": "conventional" if s["kind"] == "split" else s["kind"],
              "fmt": s["fmt"], "rounding": s["rounding"]}
    if rounding is None and rows_for(target):
        return rows_for(target)
    tb = _bits(target["fmt"])
    pool = [r for r in SETTINGS if rounding is None or r.rounding == rounding]

    def key(r: EngineSetting):
        b = _bits(r.fmt)
        return (r.fmt != target["fmt"], b < tb, abs(b - tb), r.kind != target["kind"],
                r.rounding != target["rounding"],
                _PREFER.index(r.fmt) if r.fmt in _PREFER else len(_PREFER))

    best = min(pool, key=key)
    return [r for r in SETTINGS if (r.kind, r.fmt, r.rounding) == (best.kind, best.fmt,
                                                                     best.rounding)]


def _open_for(scheme) -> list[OpenWork]:
    s = _norm(scheme)
    return [o for o in OPEN
            if o.kind == s["kind"] and o.fmt == s["fmt"]
            and o.rounding in ("any", s["rounding"])
            and (o.error_feedback == "any") == (s["error_feedback"] != "none")]


def next_step_line(scheme) -> str:
    """The line a verdict ends with: the engines' settings that serve this scheme, or that none
    ships it yet (with the versions checked) and the nearest scheme that one does."""
    lines = settings_for(scheme)
    if lines:
        return "to serve it: " + "; ".join(lines)
    checked = ", ".join(f"{e} {v}" for e, v in CHECKED.items())
    near = closest_shipped(scheme)
    s = _norm(scheme)
    what = label(near[0].scheme)
    if s["kind"] == "split" and near[0].fmt == s["fmt"]:
        what += " (the master alone, no read copy)"
    elif s["error_feedback"] != "none" and near[0].fmt == s["fmt"]:
        what += " (without error feedback)"
    out = (f"no serving engine ships this state format yet ({checked} checked); closest "
           f"shipped: {what}: " + "; ".join(r.line() for r in near))
    if s["rounding"] == "sr" and near and near[0].rounding != "sr":
        sr = closest_shipped(scheme, rounding="sr")
        out += f"; with SR: {label(sr[0].scheme)}: " + "; ".join(r.line() for r in sr)
    pending = _open_for(scheme)
    if pending:
        out += "; proposed in " + "; ".join(f"{o.engine} {o.ref}" for o in pending)
    return out
