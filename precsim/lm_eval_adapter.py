"""lm-evaluation-harness model ``precsim``: any local lm-eval task under any state format
(docs/tasks.md, "lm-evaluation-harness").

Install the extra (``pip install 'precsim[eval]'``), then either

    precsim-lm-eval --model precsim --model_args path=DIR,scheme=conventional:fp8_e4m3:rne \\
        --tasks NAME --include_path TASKDIR

(``precsim-lm-eval``, or ``python -m precsim.lm_eval_adapter``, is lm-eval's own command line
with this model registered: lm-eval 0.4 has no plugin discovery, so a bare ``lm_eval --model
precsim`` does not know it), or in Python ``import precsim.lm_eval_adapter`` and
``lm_eval.simple_evaluate(model="precsim", model_args="path=DIR,scheme=...", ...)``.

``model_args``: ``path`` (a local checkpoint), ``scheme`` (``fp32``: the FP32 state, the
default; ``fp64``: the float64-state reference; a format name, e.g. ``fp8_e4m3``, meaning a
conventional state in it rounded to nearest; or ``KIND:FMT[:ROUNDING[:READ_FMT]]``, e.g.
``split:fp32:rne:nvfp4``), any field of a scheme (``rounding``, ``read_fmt``, ``error_feedback``,
``sr_bits``, ...), ``device``, ``dtype``, ``buffer_len`` (``replay.buffer_len``), ``seed``
(``run.seed``: the SR bits), ``batch_tokens`` (rows x positions x groups a forward pass;
``auto``, the default: as many rows as fit half a GPU's free memory, 65,536 off a GPU).

Requests run through precsim's scans (:func:`precsim.models.parallel.run_parallel`):
``loglikelihood`` and ``loglikelihood_rolling`` as teacher-forced passes (the scheme's
log-probability of the continuation, and whether it is the greedy one); ``generate_until`` by
greedy decoding, one teacher-forced pass over the whole sequence per new token (slow: quadratic
in the generated length; every request still running shares each pass). Rolling log-likelihood
scores the whole text in one pass (no windows: the model must hold its length).
"""

from __future__ import annotations

import sys

from .errors import PrecsimError, print_error

MISSING = "lm_eval is not installed; allowed: pip install 'precsim[eval]'"

try:  # the model registers itself when lm_eval is there
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError:  # pragma: no cover - exercised by the missing-extra test
    LM, register_model = None, None


def require() -> None:
    """One-line PrecsimError when lm_eval is missing."""
    if LM is None:
        raise PrecsimError(MISSING)


def parse_scheme(scheme: str, fields: dict) -> dict | None:
    """The SchemeConfig dict of ``scheme`` (see the module's docstring) with ``fields`` over it;
    None for the float64 reference (``fp64``)."""
    s = str(scheme)
    if s in ("fp64", "reference"):
        return None
    parts = s.split(":")
    if len(parts) == 1:
        d = {"kind": "conventional", "fmt": parts[0], "rounding": "rne"}
    else:
        d = {"kind": parts[0], "fmt": parts[1]}
        if len(parts) > 2:
            d["rounding"] = parts[2]
        if len(parts) > 3:
            d["read_fmt"] = parts[3]
        if len(parts) > 4:
            raise PrecsimError(f"scheme={s!r}; allowed: fp32, fp64, a format name, or "
                               "KIND:FMT[:ROUNDING[:READ_FMT]]")
    return {**d, **fields}


if LM is not None:
    from dataclasses import fields as _dc_fields

    from .config import SchemeConfig

    SCHEME_FIELDS = {f.name for f in _dc_fields(SchemeConfig)}

    @register_model("precsim")
    class PrecsimLM(LM):
        """A local checkpoint whose SSM layers keep their state in one precsim scheme."""

        def __init__(self, path: str, scheme: str = "fp32", device: str = "cpu",
                     dtype: str | None = None, buffer_len: int | None = None, seed: int = 0,
                     batch_tokens="auto", batch_size=None, max_batch_size=None,
                     **kw) -> None:
            super().__init__()
            import dataclasses
            import shutil

            from .config import to_config
            from .models.run import prepare
            from .models.scan import REFERENCE, Group
            from .models.task import check_batch_tokens, load_tokenizer, task_cfg

            unknown = sorted(set(kw) - SCHEME_FIELDS)
            if unknown:
                raise PrecsimError(f"model_args {unknown[0]}=...: unknown; allowed: path, "
                                   "scheme, device, dtype, buffer_len, seed, batch_tokens, "
                                   f"{', '.join(sorted(SCHEME_FIELDS))}")
            device = lm_eval_device(device)
            sch = parse_scheme(scheme, kw)
            self.label = "reference" if sch is None else str(scheme).replace(":", "_")
            d = {"model": {"path": str(path), "dtype": dtype},
                 "schemes": {self.label: {"kind": "conventional", "fmt": "fp32"}
                             if sch is None else sch},
                 "run": {"steps": 8, "progress": False, "seed": int(seed), "device": device},
                 "metrics": {"window": 8}}
            if buffer_len is not None:
                d["replay"] = {"buffer_len": int(buffer_len)}
            self.cfg = to_config(d)
            pcfg, tmp = task_cfg(self.cfg)
            try:
                from . import engines

                self.ld = prepare(pcfg, engines.resolve_device(device))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            self.tok = load_tokenizer(path)
            bt = batch_tokens
            if bt != "auto":
                try:
                    bt = int(bt)
                except (TypeError, ValueError):
                    pass
            check_batch_tokens(bt, "model_args batch_tokens")
            self.batch_tokens = bt
            # one group: the scheme's own run (or the float64 reference) as the pass's only rows
            g = Group(self.label, REFERENCE, reference=True) if sch is None else \
                Group(self.label, self.cfg.schemes[self.label])
            self._group = lambda: [dataclasses.replace(g, drift={}, dead_at=None)]

        # -- helpers ------------------------------------------------------------------
        def _need_tok(self):
            if self.tok is None:
                raise PrecsimError(f"the checkpoint at {self.cfg.model.path} has no tokenizer; "
                                   "allowed: a checkpoint with one (lm-eval tasks are text)")

        def _score(self, pairs: list[tuple[list[int], list[int]]]):
            import numpy as np

            from .models.task import Rows, score_rows

            rows = Rows([np.asarray([*c, *x], dtype=np.int64) for c, x in pairs],
                        np.asarray([len(c) for c, _ in pairs]),
                        np.asarray([len(x) for _, x in pairs]))
            sc = score_rows(self.ld, self.cfg, rows, self._group, self.batch_tokens)
            return sc[self.label]

        # -- lm-eval's interface ------------------------------------------------------
        def loglikelihood(self, requests, disable_tqdm: bool = False):
            from .tasks import encode_pair

            self._need_tok()
            pairs = [encode_pair(self.tok, *r.args) for r in requests]
            sc = self._score(pairs)
            return [(float(lp), bool(g == 1)) for lp, g in zip(sc["lp"], sc["greedy"],
                                                               strict=True)]

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            self._need_tok()
            eot = self.tok.eos_token_id if self.tok.eos_token_id is not None else \
                self.tok.bos_token_id
            pairs = [([int(eot)], [int(i) for i in self.tok(r.args[0], add_special_tokens=False)
                                   ["input_ids"]]) for r in requests]
            return [float(v) for v in self._score(pairs)["lp"]]

        def generate_until(self, requests, disable_tqdm: bool = False):
            from .models.task import greedy

            self._need_tok()
            eos = self.tok.eos_token_id
            prompts, limits, untils = [], [], []
            for r in requests:
                ctx, kw = r.args
                kw = dict(kw or {})
                until = kw.get("until") or []
                until = [until] if isinstance(until, str) else list(until)
                ids = [int(i) for i in self.tok(ctx, add_special_tokens=False)["input_ids"]]
                prompts.append(ids or [int(eos)])
                limits.append(int(kw.get("max_gen_toks", 256)))
                untils.append(until)

            def stop(i, toks):
                if eos is not None and toks[-1] == eos:
                    return True
                text = self.tok.decode(toks)
                return any(u and u in text for u in untils[i])

            gen = greedy(self.ld, self.cfg, prompts, limits, self._group, self.label,
                         self.batch_tokens, stop)
            out = []
            for i, toks in enumerate(gen):
                if eos is not None and eos in toks:
                    toks = toks[:toks.index(eos)]
                text = self.tok.decode(toks)
                for u in untils[i]:
                    if u:
                        text = text.split(u)[0]
                out.append(text)
            return out


def lm_eval_device(device) -> str:
    """lm-eval's ``--device`` as ``run.device``: ``cuda:N`` is ``cuda``; lm-eval's CUDA default
    on a machine without CUDA runs on the CPU (said on stderr)."""
    import torch

    dev = str(device or "auto")
    if dev.startswith("cuda"):
        if not torch.cuda.is_available():
            print(f"precsim: note: --device {dev} (lm-eval's default) without a CUDA device: "
                  "running on the CPU (--device cpu says so)", file=sys.stderr)
            return "cpu"
        return "cuda"
    return dev


def main(argv: list[str] | None = None) -> int:
    """``precsim-lm-eval``: lm-eval's command line with the ``precsim`` model registered; a
    precsim error (a bad model_args value, a checkpoint it cannot run) is one line, exit 2."""
    if LM is None:
        return print_error("precsim", MISSING)
    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    try:
        cli_evaluate()
    except PrecsimError as e:
        return print_error("precsim", e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
