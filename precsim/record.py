"""``python -m precsim.record --model PATH --out DIR``: traces of a real model's SSM layers.

The document: ``--text-file F`` (a ``.txt`` file, or the first line of a ``.jsonl`` file with a
``text`` field; needs the checkpoint's tokenizer), ``--ids-file F.npy`` (token ids), or greedy
tokens the model generates after ``--prompt TEXT`` (default prompt without). ``--tokens N``: the
first N tokens (default: the whole document; required with a prompt). Writes ``DIR/layer_XX/``
per recorded layer (docs/real-models.md, "Traces") and ``DIR/record.json``. ``--device-map
auto|balanced|MAP.yaml``: a checkpoint on several GPUs (docs/real-models.md, "Across several
GPUs"). User errors: one line on stderr, exit status 2. A recording is written whole or not at
all: ``DIR`` holding one already (its ``record.json``) is an error, and an interrupted or failed
recording removes the layer folders it wrote (SIGINT / SIGTERM: one line, exit 130 / 143).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from .errors import PrecsimError, argument_parser, print_error
from .rundir import RECORD_FILE


def record_model(model_path, out, *, tokens: int | None = None, text_file=None, ids_file=None,
                 prompt: str | None = None, layers: str | None = None, dtype: str = "fp32",
                 device: str | None = None, chunk: int = 8192, progress: bool = False,
                 device_map=None) -> dict:
    """Record the checkpoint at ``model_path`` into ``out``; returns the ``record.json`` dict.
    ``device`` None: the CPU, or with ``device_map`` (``--device-map``, as ``model.device_map``)
    the visible GPUs (auto: one device when the model fits one, else the layers across them)."""
    import torch

    from .models import load, recording

    if tokens is not None and (not isinstance(tokens, int) or tokens < 1):
        raise PrecsimError(f"--tokens={tokens!r} is invalid; allowed: an integer >= 1")
    if text_file is None and ids_file is None and tokens is None:
        raise PrecsimError("--tokens is required with a prompt (greedy tokens are generated); "
                           "allowed: --tokens N, or --text-file / --ids-file")
    if dtype not in recording.DTYPES:
        raise PrecsimError(f"--dtype={dtype!r} is unknown; allowed: "
                           f"{', '.join(recording.DTYPES)}")
    if not isinstance(chunk, int) or chunk < 1:
        raise PrecsimError(f"--chunk={chunk!r} is invalid; allowed: an integer >= 1")
    out = Path(out)
    if (out / RECORD_FILE).exists():  # a finished recording is never replaced
        raise PrecsimError(f"--out={str(out)!r} already holds a recording (record.json); "
                           "allowed: another --out, or delete that directory first")
    if out.exists() and not out.is_dir():
        raise PrecsimError(f"--out={str(out)!r} is not a directory; allowed: a new or existing "
                           "directory")
    from .preflight import writable_dir

    writable_dir("--out", out, "a new or existing directory it can write")  # before the model
    from .config import parse_device_map

    device_map = parse_device_map(device_map, "--device-map")
    device = device or ("auto" if device_map is not None else "cpu")
    if not (device in ("cpu", "cuda") or (device == "auto" and device_map is not None)
            or (device.startswith("cuda:") and device[5:].isdigit())):
        raise PrecsimError(f"--device={device!r} is unknown; allowed: cpu, cuda or cuda:N")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise PrecsimError(f"--device={device!r} but no CUDA device is visible; allowed: cpu")
    if device.startswith("cuda:") and int(device[5:]) >= torch.cuda.device_count():
        raise PrecsimError(f"--device={device!r} but {torch.cuda.device_count()} CUDA device(s) "
                           f"are visible; allowed: cpu, cuda:0..cuda:"
                           f"{torch.cuda.device_count() - 1}")
    t0 = time.perf_counter()
    plan = None
    if device_map is not None:
        from .models.placement import plan_run

        load.read_config(model_path, "--model")  # (one-line errors before the plan reads it)
        load.check_weights(model_path, "--model")
        plan = plan_run(model_path, None, device_map, device, docs=1, schemes=[],
                        tokens=tokens or chunk, chunk=min(chunk, tokens or chunk),
                        split_ok=False)
        print(plan.line(), file=sys.stderr)
    if plan is None or plan.kind == "single":
        device = device if plan is None else plan.devices[0]
        model, tok = load.load_model(model_path, device, key="--model")
    else:
        model, tok = load.load_model(model_path, device, None, plan.device_map, plan.max_memory,
                                     key="--model")
        device = ",".join(dict.fromkeys(str(d) for d in load.devices_of(model)))
    want = recording.parse_layers(layers, model)
    ids, source = load.documents(model, tok, n_docs=1, n_tokens=tokens, text=text_file,
                                 ids=ids_file, prompt=prompt,
                                 keys=load.RECORD_KEYS)
    made = not out.exists()
    before = ({p.name for p in out.iterdir() if not p.name.endswith(".partial")}
              if out.is_dir() else set())  # folders there before: not ours to remove
    try:
        rec = recording.record_document(model, ids[0], out, want, dtype=dtype, chunk=chunk,
                                        progress=progress)
        n = int(ids.shape[1])
        size = recording.trace_bytes(out)
        meta = {
            "model_class": type(model).__name__, "model_path": str(model_path),
            "model_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            "trace_dtype": dtype, "layers": rec["layers"], "source": source, "tokens": n,
            "steps": n, "token_ids": ids[0].tolist() if n <= 65536 else None,
            "start": "zero state at token 0; the document in parallel chunks of "
                     f"{chunk} tokens, the model's cache carried between them",
            "wall_s": round(rec["wall_s"], 3), "process_s": round(time.perf_counter() - t0, 3),
            "bytes": size, "bytes_per_token_layer": size / max(1, n * len(want)),
            "device": device, **({"placement": plan.info()} if plan is not None else {}),
        }
        recording.write_meta(out, meta)
    except BaseException:  # an error or an interrupt: no half-written recording is left
        recording.discard(out, want, made, keep=before)
        raise
    return meta


def main(argv=None) -> int:
    ap = argument_parser("precsim.record", prog="python -m precsim.record",
                         description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="local checkpoint directory")
    ap.add_argument("--out", required=True, help="output directory")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--text-file", default=None, help=".txt or .jsonl document (tokenizer)")
    src.add_argument("--ids-file", default=None, help=".npy token ids (N,) or (K, N): row 0")
    src.add_argument("--prompt", default=None, help="prompt text; greedy tokens follow")
    src.add_argument("--prompt-file", default=None, help="file holding the prompt text")
    ap.add_argument("--tokens", type=int, default=None, help="tokens to record (>= 1)")
    ap.add_argument("--layers", default=None, help="SSM layers, e.g. 0,5 (default: all)")
    ap.add_argument("--dtype", default="fp32", help="trace storage: fp32 (default) or bf16")
    ap.add_argument("--device", default=None, help="torch device (default cpu; with "
                    "--device-map the visible GPUs)")
    ap.add_argument("--device-map", default=None,
                    help="auto, balanced, or a .yaml/.json {module: device} map: the layers "
                         "across the GPUs (default: all on --device)")
    ap.add_argument("--chunk", type=int, default=8192, help="tokens per forward pass")
    a = ap.parse_args(argv)
    from .checkpoint import Interrupted, install_handlers, restore_handlers

    old_handlers = install_handlers()  # SIGINT / SIGTERM raise Interrupted: one line below
    try:
        prompt = a.prompt
        if a.prompt_file is not None:
            pf = Path(a.prompt_file)
            if not pf.is_file():
                raise PrecsimError(f"--prompt-file={str(pf)!r} "
                                   f"{'is a directory' if pf.is_dir() else 'does not exist'}; "
                                   "allowed: a text file")
            prompt = pf.read_text()
        meta = record_model(a.model, a.out, tokens=a.tokens, text_file=a.text_file,
                            ids_file=a.ids_file, prompt=prompt, layers=a.layers, dtype=a.dtype,
                            device=a.device, chunk=a.chunk, progress=sys.stderr.isatty(),
                            device_map=a.device_map)
    except PrecsimError as e:
        return print_error("precsim.record", e)
    except (Interrupted, KeyboardInterrupt) as e:
        import signal

        e = e if isinstance(e, Interrupted) else Interrupted(signal.SIGINT)
        print(f"precsim.record: interrupted ({e}); nothing recorded in {a.out} (its unfinished "
              "layer folders removed; a recording is written whole or not at all): record "
              "again", file=sys.stderr, flush=True)
        return e.exit_code
    finally:
        restore_handlers(old_handlers)
    print(f"recorded {len(meta['layers'])} SSM layers of {meta['model_class']}, "
          f"{meta['tokens']:,} tokens ({meta['source']}) in {meta['wall_s']:.1f} s, "
          f"{meta['bytes'] / 2**20:,.1f} MiB -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
