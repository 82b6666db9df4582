"""Loading a checkpoint, finding its SSM layers, and the documents a run evaluates."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ..errors import PrecsimError
from ..families import FAMILIES

# mixer class name -> family; model class name -> family; family -> the hooked functions (the
# family modules' HF_MIXERS, HF_ARCHITECTURES, HF_HOOKED; all tested, tests/models/)
MIXERS = {c: n for n, f in FAMILIES.items() for c in f.HF_MIXERS}
ARCHITECTURES = {c: n for n, f in FAMILIES.items() for c in f.HF_ARCHITECTURES}
HOOKED = {n: f.HF_HOOKED for n, f in FAMILIES.items()}
# the transformers releases CI tests (the lower bound and the latest); pyproject declares them
TRANSFORMERS_RANGE = ((5, 17), (6, 0))
# prompt ids used when the checkpoint has no tokenizer (and no ids are given)
FIXED_PROMPT_IDS = [1, 7, 3, 11, 5, 2, 13, 4]
# a checkpoint's weights, in the order transformers looks for them
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
           "pytorch_model.bin.index.json")
CHECKPOINT = "a local save_pretrained directory (config.json and its weights)"
# the keys documents() names in its errors: the config's, and precsim.record's flags
CONFIG_KEYS = {"text": "model.text", "ids": "model.ids", "tokens": "run.steps",
               "prompt": "model.prompt"}
RECORD_KEYS = {"text": "--text-file", "ids": "--ids-file", "tokens": "--tokens",
               "prompt": "--prompt"}
DEFAULT_PROMPT = "The recurrent state of a state space model"


def installed_version() -> str:
    from importlib.metadata import version

    return version("transformers")


def require_transformers(key: str = "model.path"):
    """``transformers``, of a release in :data:`TRANSFORMERS_RANGE` (one-line error if not;
    ``key``: the setting that needs it)."""
    import logging

    # transformers imports torchao when it is installed, and torchao logs a traceback for each
    # CUDA extension it cannot load on a CPU-only machine: nothing precsim uses
    logging.getLogger("torchao").setLevel(logging.ERROR)
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)  # (its enum notices)
    try:
        import transformers
    except ImportError:
        raise PrecsimError(f"{key} needs the optional dependency transformers; allowed: "
                           "pip install 'precsim[models]'") from None
    lo, hi = TRANSFORMERS_RANGE
    version = installed_version()
    have = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if not lo <= have < hi:
        raise PrecsimError(f"transformers {version} is unsupported; allowed: "
                           f">={lo[0]}.{lo[1]},<{hi[0]}.{hi[1]} (pip install "
                           "'precsim[models]')")
    return transformers


def read_config(path, key: str = "model.path"):
    """``(transformers, config, model class name)`` of the checkpoint directory ``path``;
    one-line PrecsimError naming ``key`` for a missing path or an unsupported class."""
    tf = require_transformers(key)
    tf.utils.logging.disable_progress_bar()  # stderr stays for one-line errors
    tf.utils.logging.set_verbosity_error()  # (the "falling back to PyTorch" notices included)
    p = Path(path)
    what = ("does not exist" if not p.exists() else "is not a directory" if not p.is_dir()
            else "is not a checkpoint directory (no config.json)"
            if not (p / "config.json").is_file() else None)
    if what:
        raise PrecsimError(f"{key}={str(p)!r} {what}; allowed: {CHECKPOINT}")
    try:
        config = tf.AutoConfig.from_pretrained(p)
    except Exception as e:  # noqa: BLE001 - any unreadable config is a user error
        raise PrecsimError(f"{key}={str(p)!r}: config.json is unreadable "
                           f"({type(e).__name__}); allowed: {CHECKPOINT}") from None
    arch = (getattr(config, "architectures", None) or [type(config).__name__])[0]
    if arch not in ARCHITECTURES or not hasattr(tf, arch):
        raise PrecsimError(f"model class {arch!r} (from {key}={str(p)!r}) is unsupported; "
                           f"allowed: {', '.join(a for a in ARCHITECTURES if hasattr(tf, a))}")
    return tf, config, arch


def check_weights(path, key: str = "model.path") -> None:
    """One-line PrecsimError naming ``key`` unless the checkpoint directory ``path`` holds its
    weights whole: a weights file (or a shard index and every shard it names), each
    ``.safetensors`` file's header readable and covering the file (a truncated copy fails
    here, before anything loads)."""
    from safetensors import SafetensorError, safe_open

    p = Path(path)
    name = next((f for f in WEIGHTS if (p / f).is_file()), None)
    if name is None:
        raise PrecsimError(f"{key}={str(p)!r} holds no weights (no {', '.join(WEIGHTS)}); "
                           f"allowed: {CHECKPOINT}")
    files = [p / name]
    if name.endswith(".index.json"):
        try:
            files = [p / f for f in sorted(set(json.loads(files[0].read_text())["weight_map"]
                                               .values()))]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise PrecsimError(f"{key}={str(p)!r}: {name} is unreadable (no weight_map); "
                               f"allowed: {CHECKPOINT}") from None
    for f in files:
        why = None if f.is_file() else "is missing"
        if why is None and f.suffix == ".safetensors":
            try:
                with safe_open(f, framework="pt"):
                    pass
            except (SafetensorError, OSError) as e:
                why = f"is truncated or corrupt ({(str(e) or type(e).__name__).splitlines()[0]})"
        if why:
            raise PrecsimError(f"{key}={str(p)!r}: weights file {f.name} {why}; allowed: "
                               f"{CHECKPOINT}")


def require_accelerate(key: str) -> None:
    import importlib.util

    if importlib.util.find_spec("accelerate") is None:
        raise PrecsimError(f"{key} needs the package accelerate (transformers places the layers "
                           "with it); allowed: pip install 'precsim[models]' (or pip install "
                           "accelerate), or no device map")


def load_model(path, device: str = "cpu", dtype: str | None = None, device_map=None,
               max_memory: dict | None = None, key: str = "model.path"):
    """Load a local causal-LM checkpoint; one-line PrecsimError for a missing path, an
    unsupported class, a checkpoint without SSM layers or one that does not fit the device.
    ``device_map`` (``auto``, ``balanced`` or ``{module: device}``, with ``max_memory``):
    ``transformers``/``accelerate`` place the layers instead of ``device``.
    ``key``: the setting that gave ``path`` (named in the errors). Returns
    ``(model, tokenizer|None)``."""
    tf, config, arch = read_config(path, key)
    p = Path(path)
    check_weights(p, key)
    kw = {"dtype": getattr(torch, dtype)} if dtype else {}
    if device_map is not None:
        require_accelerate("model.device_map")
        kw.update(device_map=device_map, **({"max_memory": max_memory} if max_memory else {}))
    if device_map is None:  # the weights straight to the device: no CPU copy first
        kw["device_map"] = {"": device}
    try:
        model = getattr(tf, arch).from_pretrained(p, **kw).eval()
    except torch.OutOfMemoryError:
        need = sum(f.stat().st_size for f in p.glob("*.safetensors"))
        where = device if device_map is None else f"the devices of device_map={device_map!r}"
        raise PrecsimError(f"model {str(p)!r} ({need / 2**30:.1f} GiB of weights) does not fit "
                           f"on {where}; allowed: a device with room for it") from None
    except OSError as e:  # what check_weights does not see (e.g. a corrupt .bin)
        raise PrecsimError(f"{key}={str(p)!r}: the weights do not load ({type(e).__name__}: "
                           f"{str(e).splitlines()[0][:120]}); allowed: {CHECKPOINT}") from None
    except ValueError as e:  # accelerate's placement: nothing fits, or it would offload to disk
        if device_map is None:
            raise
        raise PrecsimError(f"model.device_map={device_map!r}: transformers cannot place "
                           f"{str(p)!r} ({str(e).splitlines()[0][:160]}); allowed: devices "
                           "with room for its weights (precsim does not offload to disk)"
                           ) from None
    if device_map is not None and "disk" in set(getattr(model, "hf_device_map", {}).values()):
        raise PrecsimError(f"model.device_map={device_map!r} put part of {str(p)!r} on disk; "
                           "allowed: devices with room for its weights")
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


def ssm_layers(model) -> list[tuple[int, torch.nn.Module, str]]:
    """``(layer index, mixer, family)`` of every SSM layer, in model order."""
    out = []
    for mod in model.modules():
        fam = MIXERS.get(type(mod).__name__)
        if fam is not None:
            out.append((int(getattr(mod, "layer_idx", len(out))), mod, fam))
    return out


def layer_shape(model) -> tuple[str, int, int, int]:
    """``(family, heads, Dv, Dk)`` of the model's first SSM layer."""
    _, mixer, fam = ssm_layers(model)[0]
    H, dv, dk = (getattr(mixer, k) for k in FAMILIES[fam].HF_DIMS)
    return fam, H, dv, dk


def input_device(model) -> torch.device:
    """Where the token ids go: the input embedding's device (under a device map the layers
    sit on several devices, and the activations move with them)."""
    return model.get_input_embeddings().weight.device


def devices_of(model) -> list[torch.device]:
    """The devices holding the model's parameters, in model order."""
    return list(dict.fromkeys(p.device for p in model.parameters()))


def vocab_size(model) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


def prompt_ids(tokenizer, prompt: str | None, vocab: int, key: str = "model.prompt"
               ) -> tuple[list[int], str]:
    """Prompt token ids and where they came from (``tokenizer`` or ``fixed ids``)."""
    if tokenizer is not None:
        ids = tokenizer(prompt or DEFAULT_PROMPT)["input_ids"]
        if ids:
            return [int(i) for i in ids], "tokenizer"
    if prompt:
        raise PrecsimError(f"{key}={prompt!r} given but the checkpoint has no tokenizer; "
                           f"allowed: no {key} (fixed ids are used)")
    return [i % vocab for i in FIXED_PROMPT_IDS], "fixed ids"


# ---------------------------------------------------------------------------------------------
# documents


def read_texts(path, key: str) -> list[str]:
    """Documents of a ``.txt`` file (one) or a ``.jsonl`` file (one per line, field ``text``)."""
    p = Path(path)
    if not p.is_file():
        what = "is a directory" if p.is_dir() else "is not a file" if p.exists() \
            else "does not exist"
        raise PrecsimError(f"{key}={str(p)!r} {what}; allowed: a .txt file (one document) or "
                           "a .jsonl file (one document per line, field 'text')")
    raw = p.read_text(encoding="utf-8", errors="replace")
    if p.suffix == ".jsonl":
        docs = []
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                text = json.loads(line)["text"]
                if not isinstance(text, str):
                    raise TypeError
            except (ValueError, KeyError, TypeError):
                raise PrecsimError(f"{key}={str(p)!r} line {n} is not a JSON object with a "
                                   "string field 'text'; allowed: one such object per line"
                                   ) from None
            docs.append(text)
    else:
        docs = [raw]
    if not any(d.strip() for d in docs):
        raise PrecsimError(f"{key}={str(p)!r} holds no text; allowed: a non-empty document")
    return docs


def read_ids(path, key: str, vocab: int) -> np.ndarray:
    """Token ids of a ``.npy`` file: ``(N,)`` one document or ``(K, N)`` K documents."""
    p = Path(path)
    try:
        a = np.load(p, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise PrecsimError(f"{key}={str(p)!r} is not a readable .npy file "
                           f"({type(e).__name__}); allowed: integer token ids (N,) or (K, N)"
                           ) from None
    if a.ndim not in (1, 2) or not np.issubdtype(a.dtype, np.integer) or a.size == 0:
        raise PrecsimError(f"{key}={str(p)!r} holds {a.dtype} of shape {a.shape}; allowed: "
                           "integer token ids of shape (N,) or (K, N)")
    if a.min() < 0 or a.max() >= vocab:
        raise PrecsimError(f"{key}={str(p)!r} has ids {a.min()}..{a.max()}; allowed: "
                           f"0..{vocab - 1} (the model's vocabulary)")
    return a.reshape(-1, a.shape[-1]).astype(np.int64)


def documents(model, tok, *, n_docs: int, n_tokens: int | None, text=None, ids=None,
              prompt=None, keys: dict | None = None) -> tuple[np.ndarray, str]:
    """``(ids (K, N), source)``: the first ``n_tokens`` tokens (None: the shortest document's
    length) of ``n_docs`` documents, from ``text`` (needs a tokenizer), ``ids``, or else greedy
    tokens the model generates after the prompt (one document). ``keys``: the settings named in
    the errors (:data:`CONFIG_KEYS`, the default, or :data:`RECORD_KEYS`)."""
    vocab = vocab_size(model)
    keys = keys or CONFIG_KEYS
    kt, ki, kn = keys["text"], keys["ids"], keys["tokens"]
    if text is not None and ids is not None:
        raise PrecsimError(f"{kt} and {ki} both given; allowed: one of them")
    if ids is not None:
        docs, source = list(read_ids(ids, ki, vocab)), f"ids {Path(ids).name}"
    elif text is not None:
        texts = read_texts(text, kt)
        if tok is None:
            raise PrecsimError(f"{kt}={str(text)!r} needs the checkpoint's tokenizer, and "
                               f"it has none; allowed: {ki}=FILE.npy (token ids)")
        docs = [np.asarray(tok(t)["input_ids"], dtype=np.int64) for t in texts]
        source = f"text {Path(text).name}"
    else:
        if n_docs != 1:
            raise PrecsimError(f"run.seqs={n_docs} without {kt} or {ki}; allowed: "
                               "1 (greedy tokens of the model) or a text/ids file")
        p_ids, src = prompt_ids(tok, prompt, vocab, keys["prompt"])
        n = n_tokens or len(p_ids) + 64
        return (generate(model, p_ids, n, f"{kt} or {ki}")[None],
                f"greedy after a {len(p_ids)}-token prompt ({src})")
    if len(docs) < n_docs:
        raise PrecsimError(f"run.seqs={n_docs} but {source} holds {len(docs)} document(s); "
                           f"allowed: 1..{len(docs)}")
    docs = docs[:n_docs]
    short = min(range(n_docs), key=lambda i: len(docs[i]))
    if n_tokens is None:
        n_tokens = len(docs[short])
    if len(docs[short]) < n_tokens:
        raise PrecsimError(f"document {short} of {source} has {len(docs[short])} tokens, fewer "
                           f"than {kn}={n_tokens}; allowed: {kn} <= "
                           f"{len(docs[short])} or a longer document")
    return np.stack([d[:n_tokens] for d in docs]), source


def generate(model, prompt: list[int], n: int, skip: str = "model.text or model.ids"
             ) -> np.ndarray:
    """``n`` tokens: the prompt (cut to ``n``) then the model's own greedy continuation
    (``skip``: the settings that give a document instead, named in the slow notice)."""
    from ..engines.base import slow_notice

    ids = torch.tensor([prompt[:n]], device=input_device(model))
    if ids.shape[1] < n:
        with torch.no_grad(), slow_notice(f"generating {n - ids.shape[1]} greedy tokens (give "
                                          f"{skip} to skip this)"):
            ids = model.generate(ids, max_new_tokens=n - ids.shape[1],
                                 min_new_tokens=n - ids.shape[1], do_sample=False,
                                 pad_token_id=0)
    return ids[0].cpu().numpy().astype(np.int64)


# ---------------------------------------------------------------------------------------------
# the output head


def base_and_head(model):
    """``(backbone, head)``: the model without its output head, and ``h -> logits``.

    The head is the model's output embedding times the scale the model applies to it (found
    once on a few tokens, against the model's own logits; some families multiply or divide the
    logits by a constant)."""
    base = model.base_model
    lm = model.get_output_embeddings()
    ids = torch.arange(1, 5, device=input_device(model))[None] % vocab_size(model)
    with torch.no_grad():
        ref = model(input_ids=ids, use_cache=False).logits.double()
        ours = lm(base(input_ids=ids, use_cache=False).last_hidden_state.to(
            lm.weight.dtype)).double()
    scale = float((ref * ours).sum() / (ours * ours).sum()) if bool(ours.any()) else 1.0
    if not torch.allclose(ours * scale, ref, rtol=1e-3, atol=1e-3 * float(ref.abs().max())):
        raise PrecsimError(f"{type(model).__name__}: the output head is not a scaled linear map "
                           "of the backbone's last hidden state; allowed: "
                           f"{', '.join(ARCHITECTURES)}")
    if abs(scale - 1.0) < 1e-6:
        return base, lambda h: lm(h.to(lm.weight.dtype))
    return base, lambda h: lm(h.to(lm.weight.dtype)) * scale


def _no_length(*args, **kwargs) -> int:  # (module-level: a checkpoint pickles the cache)
    return 0


def _own_mask(query_length: int, *args, **kwargs) -> tuple[int, int]:
    return query_length, 0


def first_cache(model):
    """The cache to pass a model's first forward pass that keeps one: None (the model makes its
    own) unless its forward would ask transformers' cache for a length the cache cannot give:
    a Qwen3.5/Qwen3-Next-style model whose every layer is linear attention (an all-GDN
    Qwen3.5; its forward builds the causal mask of attention layers it does not have, and such
    a cache's ``get_seq_length`` raises). Then that cache with its length reading 0 and its mask
    a query's own length: harmless, since precsim always passes the positions and no layer
    attends. (Mamba-2's config also lists every layer as linear attention, but its forward never
    asks: it keeps its own cache.)"""
    cfg = getattr(model, "config", None)
    cfg = getattr(cfg, "text_config", None) or cfg
    types = getattr(cfg, "layer_types", None)
    if (not types or any(t != "linear_attention" for t in types)
            or not str(getattr(cfg, "model_type", "")).startswith("qwen3")):
        return None
    import transformers as tf

    cache = tf.DynamicCache(config=cfg)
    cache.get_seq_length = _no_length
    cache.get_mask_sizes = _own_mask
    return cache


def cache_io(model) -> tuple[str, str]:
    """The keyword a model's forward takes its cache by, and its output's attribute holding it
    (``cache`` in recent transformers releases, ``cache_params`` or ``past_key_values`` before)."""
    import inspect

    params = inspect.signature(model.forward).parameters
    for name in ("cache", "cache_params", "past_key_values"):
        if name in params:
            return name, name
    raise PrecsimError(f"{type(model).__name__}.forward takes no cache argument; allowed: "
                       f"{', '.join(ARCHITECTURES)} of transformers "
                       f">={TRANSFORMERS_RANGE[0][0]}.{TRANSFORMERS_RANGE[0][1]}")
