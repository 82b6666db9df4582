"""``python -m precsim.record --model PATH --tokens N --out DIR``: traces from a real model.

Writes one trace per SSM layer, ``DIR/layer_XX.npz``, plus ``DIR/record.json`` (README, "Real
models"; the hook is :mod:`precsim.models`). User errors: one line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from .errors import PrecsimError


def record_model(model_path, tokens: int, out, prompt: str | None = None,
                 device: str = "cpu") -> dict:
    """Record ``tokens`` greedy tokens of the checkpoint at ``model_path`` into ``out``;
    returns the ``record.json`` dict."""
    import torch

    from . import models

    if not isinstance(tokens, int) or tokens < 1:
        raise PrecsimError(f"--tokens={tokens!r} is invalid; allowed: an integer >= 1")
    model, tok = models.load_model(model_path, device)  # one-line error without transformers
    vocab = model.get_output_embeddings().weight.shape[0]
    ids, source = models.prompt_ids(tok, prompt, vocab)
    t0 = time.perf_counter()
    seq, rec = models.record(model, ids, tokens)
    wall = time.perf_counter() - t0
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    layers = []
    for idx, _, fam in models.ssm_layers(model):
        arrs = models.trace_arrays(rec.inputs[idx])
        np.savez(out / f"layer_{idx:02d}.npz", **arrs)
        layers.append({"layer": idx, "file": f"layer_{idx:02d}.npz", "family": fam,
                       "shapes": {k: list(v.shape) for k, v in arrs.items()}})
    meta = {
        "model_class": type(model).__name__, "model_path": str(model_path),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "trace_dtype": str(np.asarray(arrs["x" if "x" in arrs else "v"]).dtype),
        "layers": layers, "prompt": prompt, "prompt_source": source, "prompt_ids": ids,
        "tokens": seq, "generated": tokens, "steps": len(seq),
        "start": "zero state; every token (prompt included) fed one at a time as a decode step",
        "wall_s": wall, "s_per_token": wall / len(seq), "torch_threads": torch.get_num_threads(),
    }
    (out / "record.json").write_text(json.dumps(meta, indent=1))
    return meta


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m precsim.record", description=__doc__.split(
        "\n")[0])
    ap.add_argument("--model", required=True, help="local checkpoint directory")
    ap.add_argument("--tokens", type=int, required=True, help="tokens to generate (>= 1)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--prompt", default=None, help="prompt text (needs a tokenizer)")
    ap.add_argument("--prompt-file", default=None, help="file holding the prompt text")
    ap.add_argument("--device", default="cpu", help="torch device (default cpu)")
    a = ap.parse_args(argv)
    try:
        prompt = a.prompt
        if a.prompt_file is not None:
            pf = Path(a.prompt_file)
            if not pf.is_file():
                raise PrecsimError(f"--prompt-file={str(pf)!r} does not exist; allowed: a text "
                                   "file")
            prompt = pf.read_text()
        meta = record_model(a.model, a.tokens, a.out, prompt=prompt, device=a.device)
    except PrecsimError as e:
        print(f"precsim.record: error: {e}", file=sys.stderr)
        return 2
    print(f"recorded {len(meta['layers'])} SSM layers of {meta['model_class']}, "
          f"{meta['steps']} steps ({meta['prompt_source']} prompt) -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
