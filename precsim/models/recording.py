"""Traces of a real model's SSM layers over a whole document (``python -m precsim.record``).

The document goes through the model in chunks of positions, each one parallel forward pass that
carries the model's own cache (conv and recurrent states) to the next, so memory is bounded by
the chunk, not the document. Every recorded layer's scan inputs stream to disk as they come: one
folder per layer, ``layer_XX/``, one ``.npy`` per input (``KEY.npy`` float32, or ``KEY.bf16.npy``
raw bfloat16 bits under ``--dtype bf16``), B/C (Mamba-2) and q/k (GDN) per group, not per head.
A layer's folder is written under a ``.partial`` name and renamed when complete; ``record.json``
is written last. A recording that stops before it (an error, an interrupt) is removed
(:func:`discard`), so a folder with layers and no ``record.json`` is never one this module left.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from ..errors import PrecsimError
from ..families import FAMILIES
from ..rundir import RECORD_FILE, layer_dir_name
from .hook import Hook
from .load import cache_io, devices_of, first_cache, input_device, ssm_layers

DTYPES = ("fp32", "bf16")


class _Staging:
    """Device-to-host copies of the recorded inputs through page-locked (pinned) buffers, one
    per input shape, reused by every layer and chunk: a copy from CUDA into pageable memory ran
    at ~1.5 GB/s on an H200 (0.8 s of a 16,384-token, 8-layer recording), a pinned one at the
    link's speed. On the CPU a plain view."""

    def __init__(self):
        self.bufs: dict = {}

    def host(self, t: torch.Tensor, dtype: str) -> np.ndarray:
        t = t.to(torch.bfloat16).view(torch.int16) if dtype == "bf16" else t.to(torch.float32)
        if t.device.type == "cpu":
            a = t.numpy()
        else:
            key = (tuple(t.shape[1:]), t.dtype)
            buf = self.bufs.get(key)
            if buf is None or buf.shape[0] < t.shape[0]:
                buf = self.bufs[key] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            a = buf[:t.shape[0]].copy_(t).numpy()
        return a.view(np.uint16) if dtype == "bf16" else a


class _Writer:
    """One layer's trace files, filled chunk by chunk (memory-mapped ``.npy``)."""

    def __init__(self, folder: Path, n: int, dtype: str, staging: _Staging):
        self.folder, self.n, self.dtype, self.staging = folder, n, dtype, staging
        self.arrays: dict[str, np.ndarray] = {}
        self.pos = 0

    def write(self, step) -> None:
        T = step.shape[0]
        if self.pos + T > self.n:
            raise PrecsimError(f"layer {step.layer}: {self.pos + T} tokens recorded, more than "
                               f"the document's {self.n}")
        for k, v in step.inp.items():
            rows = self.staging.host(v[:, 0], self.dtype)  # (T, ...): batch row 0
            if k not in self.arrays:
                name = f"{k}.bf16.npy" if self.dtype == "bf16" else f"{k}.npy"
                self.arrays[k] = np.lib.format.open_memmap(
                    self.folder / name, mode="w+", dtype=rows.dtype,
                    shape=(self.n, *rows.shape[1:]))
            self.arrays[k][self.pos:self.pos + T] = rows
        if self.pos == 0:
            for k, v in step.const.items():
                np.save(self.folder / f"{k}.npy", v.detach().cpu().numpy().astype(np.float32))
        self.pos += T

    def close(self) -> dict:
        # unmapped without msync: the pages are in the page cache, complete for every reader,
        # and the kernel writes them back in the background (as with np.save's files). A forced
        # sync waits for the disk (2 GiB took 2.2 s on the H200 machine; a 131,072-token,
        # 8-layer recording writes 9.3 GB).
        shapes = {k: list(a.shape) for k, a in self.arrays.items()}
        self.arrays.clear()
        return shapes


class _Recorder:
    """Hook handler: streams the chosen layers' inputs, and scans every layer with precsim's
    float64 reference (the state carried
    from chunk to chunk through the model's cache), not
    the model's own scan: transformers' PyTorch fallback of the chunked scan holds a
    (chunks x chunk x chunk) tensor per head and is slow without the optional CUDA kernels."""

    def __init__(self, writers: dict[int, _Writer], backend: str):
        from ..config import to_config
        from .scan import REFERENCE, Group

        self.writers, self.backend = writers, backend
        # the float64 reference in segments of 256 tokens on the CPU (the torch engine's
        # truth), the kernels' float64 slot on a GPU: for 8 of 48 layers over 131,072 tokens of
        # a 1.3B-shape model the slot took 62 s in the loop, the torch truth 74 s (segments of
        # 256) and 103 s (2,048)
        self.cfg = to_config({"schemes": {"reference": {"kind": "shared", "fmt": "fp64"}},
                              "run": {"progress": False}, "replay": {"buffer_len": 256}})
        self.groups = [Group("reference", REFERENCE, reference=True)]

    def __call__(self, step, run_own):
        from .scan import scan

        w = self.writers.get(step.layer)
        if w is not None:
            w.write(step)
        y, state = scan(step, self.groups, step.shape[1], self.cfg, torch.float64, self.backend,
                        carry=True)
        return y.to(step.inp[FAMILIES[step.family].VALUE].dtype), state


def parse_layers(spec: str | None, model) -> list[int]:
    """``--layers 0,5,...`` (None: every SSM layer); one-line error for a non-SSM layer."""
    have = [idx for idx, _, _ in ssm_layers(model)]
    if spec is None or str(spec).strip() in ("", "all"):
        return have
    try:
        want = [int(x) for x in str(spec).split(",") if x.strip()]
    except ValueError:
        raise PrecsimError(f"--layers={spec!r} is invalid; allowed: comma-separated SSM layer "
                           f"indices of {', '.join(map(str, have))}") from None
    bad = [i for i in want if i not in have]
    if bad or not want:
        raise PrecsimError(f"--layers={spec!r} names {bad or 'nothing'}, not SSM layers of "
                           f"{type(model).__name__}; allowed: {', '.join(map(str, have))}")
    return sorted(set(want))


def record_document(model, ids: np.ndarray, out, layers: list[int], dtype: str = "fp32",
                    chunk: int = 8192, progress: bool = False) -> dict:
    """Record the SSM layers ``layers`` of ``model`` over the token ids ``ids (N,)`` into
    ``out``; returns ``{layer: {"file", "shapes"}}`` and the wall time."""
    if dtype not in DTYPES:
        raise PrecsimError(f"--dtype={dtype!r} is unknown; allowed: {', '.join(DTYPES)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    n = int(ids.shape[-1])
    fam = {idx: f for idx, _, f in ssm_layers(model)}
    writers = {}
    staging = _Staging()
    for layer in layers:
        part = out / f"{layer_dir_name(layer)}.partial"
        shutil.rmtree(part, ignore_errors=True)
        part.mkdir()
        writers[layer] = _Writer(part, n, dtype, staging)
    dev = input_device(model)
    base = model.base_model
    kw, attr = cache_io(base)
    cache = first_cache(base)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, unit="tok", desc="recording", leave=False)
    t0 = time.perf_counter()
    from precsim.kernels import available

    backend = "triton" if dev.type == "cuda" and available("cuda") else "torch"
    # the positions passed explicitly (as the whole-model runs do): without them a model whose
    # cache holds only linear-attention layers (an all-GDN Qwen3.5) asks the cache for its
    # length, which transformers refuses for such a cache
    pos_kw = "position_ids" in inspect.signature(base.forward).parameters
    with torch.no_grad(), Hook(model, _Recorder(writers, backend)):
        for c0 in range(0, n, chunk):
            x = torch.as_tensor(ids[None, c0:c0 + chunk], device=dev)
            extra = {kw: cache} if cache is not None else {}
            if pos_kw:
                extra["position_ids"] = torch.arange(c0, c0 + x.shape[1], device=dev)[None]
            o = base(input_ids=x, use_cache=True, **extra)
            cache = getattr(o, attr)
            if bar is not None:
                bar.update(x.shape[1])
    for d in devices_of(model):
        if d.type == "cuda":
            torch.cuda.synchronize(d)
    if bar is not None:
        bar.close()
    layers_meta = []
    for layer, w in writers.items():
        shapes = w.close()
        final = out / layer_dir_name(layer)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(w.folder, final)
        layers_meta.append({"layer": layer, "file": final.name, "family": fam[layer],
                            "shapes": shapes})
    return {"layers": layers_meta, "wall_s": time.perf_counter() - t0}


def trace_bytes(out) -> int:
    """Bytes of every layer folder under ``out``."""
    return sum(f.stat().st_size for f in Path(out).glob("layer_*/*.npy"))


def write_meta(out, meta: dict) -> None:
    tmp = Path(out) / "record.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1))
    os.replace(tmp, Path(out) / RECORD_FILE)


def discard(out, layers: list[int], remove_out: bool = False, keep=()) -> None:
    """Remove an unfinished recording's layer folders from ``out`` (partial or renamed: without
    ``record.json`` none is a recording), except those in ``keep`` (folders that were there
    before this recording started: not its own), and ``out`` itself when it was made for it
    and is left empty."""
    out = Path(out)
    for layer in layers:
        for name in (f"{layer_dir_name(layer)}.partial", layer_dir_name(layer)):
            if name not in keep:
                shutil.rmtree(out / name, ignore_errors=True)
    if remove_out:
        try:
            out.rmdir()
        except OSError:  # gone already, or holding something else
            pass
