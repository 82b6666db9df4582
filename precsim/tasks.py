"""Task items for ``experiment=task_eval`` (docs/tasks.md): a local ``.jsonl`` file, or a built-in
long-context task generated from a seed (``task.name=passkey`` / ``mqar``).

Every item becomes token-id rows before the model runs:

* multiple choice (``context``, ``choices``, ``gold``): one row per choice, the context's tokens
  then the choice's; the choice is scored by the summed log-likelihood of its tokens (lm-eval's
  ``acc``), also per token (``acc_token``) and per UTF-8 byte of its text (``acc_byte``);
* generative (``prompt``, ``answer``): one row, the prompt's tokens then the answer's; correct iff
  greedy decoding after the prompt produces the answer's tokens, i.e. (teacher-forced along the
  answer) the argmax at each answer position is the answer's next token.

Text goes through the checkpoint's tokenizer the way lm-evaluation-harness splits a request:
whitespace at the end of the context moves onto the continuation, the pair is encoded whole
(no special tokens) and the continuation's tokens are what follows the context's own encoding;
an empty context is the tokenizer's end-of-text token. A generative answer is compared as the
token ids of the answer with its trailing whitespace stripped (its leading whitespace, which
the model must generate, is kept). Token-id items (lists of integers) need no tokenizer.

Errors name the file, the line and the field, in one line (:class:`~precsim.errors.PrecsimError`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import PrecsimError

BUILTIN = ("passkey", "mqar")
METRICS = ("acc", "acc_token", "acc_byte")


@dataclass
class Item:
    """One task item as token ids: ``choices[j]`` is continued after ``context`` (a generative
    item has one choice, its answer, and ``gold`` 0)."""

    kind: str  # "mc" | "gen"
    context: list[int]
    choices: list[list[int]]
    gold: int
    line: int = 0  # the file's line (1-based), or the item's index in a built-in task
    nbytes: list[int] | None = None  # each choice's UTF-8 bytes (text items)
    length: int | None = None  # a built-in item's length group (prompt tokens)


def _where(path, line: int, field: str | None = None) -> str:
    return f"{path}:{line}: " + (f"field {field!r}: " if field else "")


def encode_pair(tok, context: str, cont: str) -> tuple[list[int], list[int]]:
    """lm-evaluation-harness's split of a (context, continuation) request into token ids."""
    n = len(context) - len(context.rstrip())
    if n:
        context, cont = context[:-n], context[-n:] + cont
    enc = (lambda s: [int(i) for i in tok(s, add_special_tokens=False)["input_ids"]])  # noqa: E731
    if not context:
        eot = tok.eos_token_id if tok.eos_token_id is not None else tok.bos_token_id
        if eot is None:
            raise PrecsimError("an empty context needs the tokenizer's end-of-text token, and "
                               "it has none; allowed: a non-empty context")
        return [int(eot)], enc(cont)
    whole, ctx = enc(context + cont), enc(context)
    return ctx, whole[len(ctx):]


def _ids(v, where: str, vocab: int) -> list[int]:
    if not v or not all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        raise PrecsimError(f"{where}{v!r:.60} is not a non-empty list of token ids; allowed: "
                           "text, or a list of integers")
    bad = [i for i in v if not 0 <= i < vocab]
    if bad:
        raise PrecsimError(f"{where}token id {bad[0]} is outside the vocabulary; allowed: "
                           f"0..{vocab - 1}")
    return [int(i) for i in v]


def _is_text(v) -> bool:
    return isinstance(v, str)


def read_items(path, tok, vocab: int, model_path=None, limit: int | None = None) -> list[Item]:
    """The items of a local ``.jsonl`` task file (one JSON object a line; blank lines skipped),
    as token ids; ``limit``: the first items only. One-line errors name the file, the line and
    the field."""
    p = Path(path)
    if not p.is_file():
        raise PrecsimError(f"task.path={str(path)!r} is not a file; allowed: a local .jsonl "
                           "file (one item a line: context/choices/gold or prompt/answer)")
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise PrecsimError(f"task.path={str(path)!r} cannot be read as UTF-8 text ({e}); "
                           "allowed: a .jsonl file") from None
    items: list[Item] = []
    for n, text in enumerate(lines, 1):
        if not text.strip():
            continue
        if limit is not None and len(items) >= limit:
            break
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise PrecsimError(f"{_where(p, n)}not valid JSON ({e.msg}, column {e.colno}); "
                               "allowed: one JSON object a line") from None
        if not isinstance(d, dict):
            raise PrecsimError(f"{_where(p, n)}a JSON {type(d).__name__}, not an object; "
                               "allowed: {\"context\", \"choices\", \"gold\"} or "
                               "{\"prompt\", \"answer\"}")
        items.append(_item(d, p, n, tok, vocab, model_path))
    if not items:
        raise PrecsimError(f"task.path={str(path)!r} holds no items; allowed: one JSON object "
                           "a line")
    return items


def _need_tok(tok, where: str, model_path) -> None:
    if tok is None:
        raise PrecsimError(f"{where}is text and the checkpoint at {model_path} has no "
                           "tokenizer; allowed: token-id lists (a list of integers)")


def _item(d: dict, p: Path, n: int, tok, vocab: int, model_path) -> Item:
    if "choices" in d or "context" in d or "gold" in d:
        for f in ("context", "choices", "gold"):
            if f not in d:
                raise PrecsimError(f"{_where(p, n, f)}missing; allowed: a multiple-choice item "
                                   "has context, choices and gold")
        ch, gold = d["choices"], d["gold"]
        if not isinstance(ch, list) or len(ch) < 2:
            raise PrecsimError(f"{_where(p, n, 'choices')}{ch!r:.60} is not a list of 2 or "
                               "more choices; allowed: a list of at least 2 texts or token-id "
                               "lists")
        if not isinstance(gold, int) or isinstance(gold, bool) or not 0 <= gold < len(ch):
            raise PrecsimError(f"{_where(p, n, 'gold')}{gold!r} is not the index of a choice; "
                               f"allowed: an integer 0..{len(ch) - 1}")
        ctx = d["context"]
        if _is_text(ctx):
            _need_tok(tok, _where(p, n, "context"), model_path)
            conts = []
            for j, c in enumerate(ch):
                if not _is_text(c) or not c:
                    raise PrecsimError(f"{_where(p, n, f'choices[{j}]')}{c!r:.60} is not a "
                                       "non-empty text; allowed: texts, as the context is")
                conts.append(c)
            pairs = [encode_pair(tok, ctx, c) for c in conts]
            for j, (_, c) in enumerate(pairs):
                if not c:
                    raise PrecsimError(f"{_where(p, n, f'choices[{j}]')}encodes to no "
                                       "tokens; allowed: a choice of at least one token")
            return Item("mc", pairs[0][0], [c for _, c in pairs], gold, n,
                        nbytes=[len(c.encode()) for c in conts])
        c_ids = _ids(ctx, _where(p, n, "context"), vocab)
        chs = [_ids(c, _where(p, n, f"choices[{j}]"), vocab) if not _is_text(c) else
               _mixed(p, n, j) for j, c in enumerate(ch)]
        return Item("mc", c_ids, chs, gold, n)
    if "prompt" in d or "answer" in d:
        for f in ("prompt", "answer"):
            if f not in d:
                raise PrecsimError(f"{_where(p, n, f)}missing; allowed: a generative item has "
                                   "prompt and answer")
        pr, ans = d["prompt"], d["answer"]
        if _is_text(pr):
            _need_tok(tok, _where(p, n, "prompt"), model_path)
            if not _is_text(ans) or not ans.strip():
                raise PrecsimError(f"{_where(p, n, 'answer')}{ans!r:.60} is not a non-empty "
                                   "text; allowed: a text, as the prompt is")
            ctx, a = encode_pair(tok, pr, ans.rstrip())
            return Item("gen", ctx, [a], 0, n, nbytes=[len(ans.rstrip().encode())])
        if _is_text(ans):
            raise PrecsimError(f"{_where(p, n, 'answer')}is text but the prompt is token ids; "
                               "allowed: a list of integers")
        return Item("gen", _ids(pr, _where(p, n, "prompt"), vocab), [_ids(ans, _where(
            p, n, "answer"), vocab)], 0, n)
    raise PrecsimError(f"{_where(p, n)}has neither context/choices/gold nor prompt/answer "
                       f"(keys: {', '.join(map(str, d)) or 'none'}); allowed: a multiple-choice "
                       "item {context, choices, gold} or a generative one {prompt, answer}")


def _mixed(p, n, j):
    raise PrecsimError(f"{_where(p, n, f'choices[{j}]')}is text but the context is token ids; "
                       "allowed: a list of integers")


# -- built-in long-context tasks -----------------------------------------------------------------
def alphabets(vocab: int) -> dict[str, np.ndarray]:
    """The reserved token ranges of the built-in tasks (ids, so no tokenizer is needed): past
    the first eighth of the vocabulary (special and byte tokens), two markers, then three equal
    ranges: keys, values, filler."""
    base = max(2, vocab // 8)
    third = (vocab - base - 2) // 3
    if third < 4:
        raise PrecsimError(f"the vocabulary ({vocab} tokens) is too small for the built-in "
                           "tasks; allowed: a checkpoint of at least 24 tokens")
    s = base + 2
    return {"mark_key": np.array([base]), "mark_query": np.array([base + 1]),
            "keys": np.arange(s, s + third), "values": np.arange(s + third, s + 2 * third),
            "filler": np.arange(s + 2 * third, vocab)}


def check_builtin(t) -> None:
    """One-line errors for a built-in task's settings (``t``: the TaskConfig)."""
    if t.name not in BUILTIN:
        raise PrecsimError(f"task.name={t.name!r} is unknown; allowed: {', '.join(BUILTIN)} "
                           "(or task.path=FILE.jsonl)")
    if not t.lengths or not all(isinstance(n, int) and n > 0 for n in t.lengths):
        raise PrecsimError(f"task.lengths={t.lengths} is not a list of positive integers; "
                           "allowed: e.g. [1024,4096]")
    need = t.key_len + 3 if t.name == "passkey" else 2 * t.key_len + 3
    if min(t.lengths) < need + 1:
        raise PrecsimError(f"task.lengths={t.lengths}: {min(t.lengths)} tokens cannot hold a "
                           f"{t.name} item with task.key_len={t.key_len}; allowed: lengths >= "
                           f"{need + 1}")
    if not (isinstance(t.items, int) and t.items >= 1):
        raise PrecsimError(f"task.items={t.items!r}; allowed: an integer >= 1")
    if not (isinstance(t.key_len, int) and t.key_len >= 1):
        raise PrecsimError(f"task.key_len={t.key_len!r}; allowed: an integer >= 1")
    if not 0.0 <= float(t.depth) <= 1.0:
        raise PrecsimError(f"task.depth={t.depth}; allowed: 0..1 (where the key sits)")


def builtin_items(t, vocab: int) -> list[Item]:
    """``task.items`` generative items per length of ``task.lengths`` (prompt tokens), drawn from
    ``task.seed``.

    ``passkey``: a filler phrase (16 filler tokens, repeated), the key marker and ``key_len`` key
    tokens planted at ``depth`` of the filler, the query marker at the end; the answer is the
    key. ``mqar`` (multi-query associative recall): ``key_len`` distinct key-value pairs planted
    at ``depth``, then the query marker and one of the keys; the answer is its value."""
    check_builtin(t)
    a = alphabets(vocab)
    if t.name == "mqar" and t.key_len > a["keys"].size:
        raise PrecsimError(f"task.key_len={t.key_len} pairs need as many distinct keys; "
                           f"allowed: 1..{a['keys'].size} for this vocabulary")
    out = []
    for n in t.lengths:
        for i in range(t.items):
            rng = np.random.default_rng([int(t.seed), int(n), i])
            phrase = rng.choice(a["filler"], 16)
            if t.name == "passkey":
                key = rng.choice(a["keys"], t.key_len)
                planted, query, ans = [*a["mark_key"], *key], [*a["mark_query"]], key
            else:
                ks = rng.choice(a["keys"], t.key_len, replace=False)
                vs = rng.choice(a["values"], t.key_len)
                q = int(rng.integers(t.key_len))
                planted = [*a["mark_key"], *np.stack([ks, vs], 1).ravel()]
                query, ans = [*a["mark_query"], ks[q]], [vs[q]]
            fill_len = n - len(planted) - len(query)
            fill = np.resize(phrase, fill_len)
            at = int(round(float(t.depth) * fill_len))
            prompt = [*fill[:at], *planted, *fill[at:], *query]
            out.append(Item("gen", [int(x) for x in prompt], [[int(x) for x in ans]], 0,
                            line=len(out), length=int(n)))
    return out
