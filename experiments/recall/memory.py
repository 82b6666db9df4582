"""Per-head memory of recall checkpoints: each SSM head's decay half-life in tokens (the median
over the measured tokens), by ``experiments/trained/train.py``'s ``half_lives`` (imported), on
MQAR and passkey items of precsim's built-in tasks, over all tokens and over the filler only
(the tokens between the planted pairs and the query, where a head that keeps the pairs must
hardly decay).

    python experiments/recall/memory.py CKPT [CKPT ...] [--length 512] [--items 8] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import train_recall as TR  # noqa: E402


def load(path: Path):
    import transformers as tf

    cfg = json.loads((path / "config.json").read_text())
    cls = getattr(tf, cfg["architectures"][0])
    return cls.from_pretrained(str(path), torch_dtype=torch.float32).eval()


def measure(path: Path, length: int, items: int, seed: int) -> dict:
    R = TR.recipe()
    import transformers.models.mamba2.modeling_mamba2 as mm

    R.check_ssd_scan(mm)
    mm.mamba2_chunk_scan = R.ssd_scan  # the einsum form (memory): the same scan
    model = load(path)
    vocab = model.config.vocab_size
    alph = TR.alphabets(vocab)
    fill = set(alph["filler"].tolist())
    out = {"checkpoint": str(path), "class": type(model).__name__, "length": length,
           "items": items}
    amp = torch.autocast("cpu", enabled=False)
    for task in ("mqar", "passkey"):
        its = TR.eval_items(task, [length], items, vocab, seed)
        w = torch.tensor([it.context + it.choices[0] for it in its])
        mask = np.isin(w.numpy(), list(fill))
        out[task] = {"all_tokens": R.half_lives(model, w, "cpu", amp),
                     "filler_tokens": R.half_lives(model, w, "cpu", amp, mask=mask)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoints", nargs="+", type=Path)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--items", type=int, default=8)
    ap.add_argument("--seed", type=int, default=2000)
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    res = []
    for ck in args.checkpoints:
        m = measure(ck, args.length, args.items, args.seed)
        res.append(m)
        for task in ("mqar", "passkey"):
            for k in ("all_tokens", "filler_tokens"):
                s = m[task][k]["summary"]
                print(f"{ck} {task} {k}: {s['heads']} heads, half-life min {s['min']:.3g} "
                      f"median {s['median']:.3g} p90 {s['p90']:.3g} max {s['max']:.3g}; over "
                      f"100 tokens {s['frac_over_100']:.0%}, over 1000 {s['frac_over_1000']:.0%}")
            for layer, hs in m[task]["filler_tokens"]["per_layer"].items():
                print(f"    layer {layer} filler: " + " ".join(f"{v:.3g}" for v in hs))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
