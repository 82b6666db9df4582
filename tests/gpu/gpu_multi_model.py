"""Whole-model KL across the GPUs of one host (issue 27, criterion 1): ``model.device_map``.

    python tests/gpu/gpu_multi_model.py --smoke                  # CPU, tiny, ~1 min
    python tests/gpu/gpu_multi_model.py --stage build  [--work DIR]   # GPU host: the
    python tests/gpu/gpu_multi_model.py --stage fit    [--work DIR]   # three stages,
    python tests/gpu/gpu_multi_model.py --stage large  [--work DIR]   # each < 10 min

Two random-weight checkpoints of Qwen3-Next-80B-A3B's shape (hidden 2048; GDN 32 value heads
x 128, 16 key heads x 128; 3 GDN : 1 attention layer; 512 experts, 10 a token), bf16, written
layer by layer from the model's own initialisation (no download, no whole model in memory):

* ``large``: all 48 layers, about 159 GB of weights: more than one H200 (141 GB). Run with
  ``model.device_map=auto`` over 8,192 tokens: the plan must spread the layers.
* ``fit``: the same shape with ``--fit-layers`` (12) layers, about 40 GB: fits one GPU. Run on
  one GPU (no map), with ``model.device_map=balanced`` (the layers across every GPU) and with
  ``auto`` (the plan must pick one GPU); the per-token KL of every scheme across GPUs is
  compared with the one-GPU run's.

Each run is a whole process (``python -m precsim experiment=model_kl ...``, start-up and load
included) through this script's ``--child`` wrapper, which adds each GPU's peak allocated bytes
to ``peak.json`` beside the run's ``summary.json``. Printed: a table (plan, wall seconds, peak
per GPU, the plan's estimate of the run's bytes) and the KL comparison; written:
``DIR/gpu_multi_model.json``. ``--smoke``: the same code at a tiny size on the CPU (the "GPUs"
are the CPU; ``balanced`` and ``auto`` go through accelerate and the plan as on GPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

PY = sys.executable
GB = 1e9


def qwen3_next_config(layers: int, tiny: bool):
    """Qwen3-Next-80B-A3B's shape with ``layers`` layers (3 GDN : 1 attention), bf16; ``tiny``:
    the same pattern at widths of tens, float32."""
    import transformers as tf

    dims = dict(vocab_size=151936, hidden_size=2048, num_attention_heads=16,
                num_key_value_heads=2, head_dim=256, intermediate_size=5120,
                moe_intermediate_size=512, shared_expert_intermediate_size=512, num_experts=512,
                num_experts_per_tok=10, linear_num_value_heads=32, linear_num_key_heads=16,
                linear_key_head_dim=128, linear_value_head_dim=128, dtype="bfloat16")
    if tiny:
        dims.update(vocab_size=256, hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
                    head_dim=16, intermediate_size=32, moe_intermediate_size=16,
                    shared_expert_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
                    linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
                    linear_value_head_dim=8, dtype="float32")
    pattern = (["linear_attention"] * 3 + ["full_attention"]) * (layers // 4 + 1)
    return tf.Qwen3NextConfig(num_hidden_layers=layers, linear_conv_kernel_dim=4,
                              layer_types=pattern[:layers], **dims)


def write_checkpoint(config, path: Path) -> int:
    """A random-weight checkpoint of ``config`` written one decoder layer at a time (each
    initialised by the model's own ``_init_weights`` on the CPU, cast to the config's dtype,
    saved as its own safetensors shard, freed); returns its bytes. A shard already there is
    kept (an interrupted build goes on from its last whole shard)."""
    import torch
    import transformers as tf
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    dtype = config.dtype if isinstance(config.dtype, torch.dtype) else getattr(torch, config.dtype)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = tf.Qwen3NextForCausalLM(config)
    parts = [(f"model.layers.{i}", layer) for i, layer in enumerate(model.model.layers)]
    parts += [(f"model.{n}", m) for n, m in model.model.named_children() if n != "layers"]
    parts += [("lm_head", model.lm_head)]
    index, total = {}, 0
    for k, (name, mod) in enumerate(parts):
        shard = f"model-{k:05d}.safetensors"
        keys = {f"{name}.{key}": t for key, t in mod.state_dict().items()}  # (meta: shapes)
        if not keys:
            continue
        index.update(dict.fromkeys(keys, shard))
        total += sum(t.numel() * (dtype.itemsize if t.is_floating_point() else t.element_size())
                     for t in keys.values())
        if (path / shard).is_file():
            continue
        mod.to_empty(device="cpu")
        with torch.no_grad():
            for sub in mod.modules():
                model._init_weights(sub)
        sd = {f"{name}.{key}": (t.detach().to(dtype) if t.is_floating_point() else t.detach())
              .contiguous() for key, t in mod.state_dict().items()}
        save_file(sd, str(path / (shard + ".tmp")), metadata={"format": "pt"})
        os.replace(path / (shard + ".tmp"), path / shard)
        mod.to("meta")
    config.architectures = ["Qwen3NextForCausalLM"]
    config.save_pretrained(path)
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": index}, indent=1))
    return total


def check_loads(path: Path) -> None:
    """The written keys are the model's own: nothing missing or unexpected on load (tiny only:
    a full load of the large checkpoint is the run itself)."""
    import transformers as tf

    _, info = tf.Qwen3NextForCausalLM.from_pretrained(path, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    assert not bad, f"{path}: {bad}"


def run(args: list[str], label: str, out: Path, rows: list, timeout: int = 3600) -> dict:
    """One ``python -m precsim`` process (through ``--child``) into ``out``; its row."""
    t0 = time.perf_counter()
    p = subprocess.run([PY, __file__, "--child", *args, f"hydra.run.dir={out}"],
                       capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    row = {"what": label, "rc": p.returncode, "wall_s": round(wall, 1), "dir": str(out),
           "cmd": "python -m precsim " + " ".join(args)}
    if p.returncode:
        row["tail"] = (p.stdout + p.stderr).strip().splitlines()[-8:]
        print("\n".join(row["tail"]), flush=True)
    else:
        s = json.loads((out / "summary.json").read_text())
        pl = s["info"].get("placement") or {}
        row.update(placement=pl.get("line", "none (one device, run.device)"),
                   estimate_gb=round((pl.get("bytes", {}).get("weights", 0)
                                      + pl.get("bytes", {}).get("run", 0)) / GB, 2) or None,
                   peak_gb=json.loads((out / "peak.json").read_text()),
                   model_s=s["info"].get("model_s"))
    rows.append(row)
    print(f"{label:<48} rc={p.returncode} {wall:8.1f} s  {row.get('placement', '')[:110]}",
          flush=True)
    return row


def child(argv: list[str]) -> int:
    """``precsim.cli.main(argv)`` in this process, then each GPU's peak allocated GB."""
    import torch

    from precsim.cli import main

    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    out = next(a.split("=", 1)[1] for a in argv if a.startswith("hydra.run.dir="))
    peaks = {f"cuda:{i}": round(torch.cuda.max_memory_allocated(i) / GB, 2)
             for i in range(torch.cuda.device_count())} if torch.cuda.is_available() else {}
    if Path(out).is_dir():
        (Path(out) / "peak.json").write_text(json.dumps(peaks))
    return rc or 0


def compare(a: Path, b: Path) -> dict:
    """Per-token KL of every scheme in run ``b`` against run ``a``: the largest absolute
    difference, it relative to the largest KL, and the top-1 agreement of the two runs."""
    x, y = np.load(a / "per_step.npz"), np.load(b / "per_step.npz")
    out = {}
    for k in sorted(f for f in x.files if f.endswith(":kl")):
        d = np.abs(x[k] - y[k])
        top = k[:-3] + ":top1"
        out[k[:-3]] = {"max_abs": float(np.nanmax(d)), "max_kl": float(np.nanmax(x[k])),
                       "rel": float(np.nanmax(d) / max(np.nanmax(x[k]), 1e-300)),
                       "top1_same": float(np.mean(x[top] == y[top])),
                       "bit_equal": bool(np.array_equal(x[k], y[k], equal_nan=True))}
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny, on the CPU")
    ap.add_argument("--stage", choices=("build", "fit", "large", "all"), default="all")
    ap.add_argument("--work", default=None, help="checkpoints and runs (default /tmp/...)")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--fit-layers", type=int, default=12)
    ap.add_argument("--large-layers", type=int, default=48)
    a = ap.parse_args(argv)
    import torch
    import transformers

    work = Path(a.work or ("/tmp/gpu_multi_model_smoke" if a.smoke else "/tmp/gpu_multi_model"))
    work.mkdir(parents=True, exist_ok=True)
    res_file = work / "gpu_multi_model.json"
    res = json.loads(res_file.read_text()) if res_file.is_file() else {"rows": []}
    res["info"] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   "host": platform.node(), "torch": torch.__version__,
                   "transformers": transformers.__version__, "cpus": os.cpu_count(),
                   "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
                   if torch.cuda.is_available() else []}
    tokens = 64 if a.smoke else a.tokens
    fit_l, large_l = (2, 4) if a.smoke else (a.fit_layers, a.large_layers)
    ck = {"fit": work / f"fit_{fit_l}", "large": work / f"large_{large_l}"}
    if a.stage in ("build", "all"):
        for name, layers in (("fit", fit_l), ("large", large_l)):
            t0 = time.perf_counter()
            size = write_checkpoint(qwen3_next_config(layers, a.smoke), ck[name])
            res[f"{name}_bytes"] = size
            print(f"{name}: {layers} layers, {size / GB:,.2f} GB of weights "
                  f"({time.perf_counter() - t0:.0f} s) -> {ck[name]}", flush=True)
            if a.smoke:
                check_loads(ck[name])
        np.save(work / "ids.npy", np.random.default_rng(0).integers(0, 256, (1, tokens)))
    dev = "cpu" if a.smoke else "cuda"
    base = ["experiment=model_kl", f"model.ids={work / 'ids.npy'}", f"run.steps={tokens}",
            f"run.device={dev}", "run.progress=false", "metrics.window=" + str(min(1024, tokens)),
            "replay.buffer_len=16"]
    rows = res["rows"]
    stamp = time.strftime("%H%M%S")
    if a.stage in ("fit", "all"):
        runs = {}
        for label, extra in (("one", []), ("balanced", ["model.device_map=balanced"]),
                             ("auto", ["model.device_map=auto"])):
            out = work / f"run_fit_{label}_{stamp}"
            run([f"model.path={ck['fit']}", *base, *extra],
                f"fit ({fit_l} layers), {label}", out, rows)
            runs[label] = out
        cmp = {k: compare(runs["one"], runs[k]) for k in ("balanced", "auto")
               if (runs[k] / "per_step.npz").is_file() and (runs["one"] / "per_step.npz").is_file()}
        res["fit_compare"] = cmp
        for k, per in cmp.items():
            print(f"\nper-token KL, fit checkpoint, {k} against one device:")
            print(f"  {'scheme':<22} {'max |dKL|':>11} {'max KL':>11} {'rel':>9} {'top1 same':>9}"
                  " bit-equal")
            for s, v in per.items():
                print(f"  {s:<22} {v['max_abs']:11.3e} {v['max_kl']:11.3e} {v['rel']:9.2e} "
                      f"{v['top1_same']:9.4f} {v['bit_equal']}")
    if a.stage in ("large", "all"):
        run([f"model.path={ck['large']}", *base, "model.device_map=auto"],
            f"large ({large_l} layers), auto", work / f"run_large_auto_{stamp}", rows,
            timeout=7200)
    res_file.write_text(json.dumps(res, indent=1))
    print(f"\n{'run':<36} {'rc':>3} {'wall s':>8} {'est GB':>8}  peak GB per GPU")
    for r in rows:
        print(f"{r['what']:<36} {r['rc']:>3} {r['wall_s']:8.1f} {r.get('estimate_gb') or 0:8.2f}"
              f"  {r.get('peak_gb')}")
    print(f"-> {res_file}")
    return int(any(r["rc"] for r in rows))


if __name__ == "__main__":
    sys.exit(main())
