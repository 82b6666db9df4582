"""No code outside ``precsim/families/`` branches on a family's name (issue 43).

What differs between the SSM families (Mamba-2, Gated DeltaNet) is the family module's: its
attributes (``KERNEL``, ``DELTA_RULE``, ``WEIGHT``, the inputs by role, ``HF_*`` ...) and
functions (``random_inputs``, ``check_trace``, ``hf_inputs`` ...), so a third family is one
module plus its entry in ``FAMILIES``. A comparison of anything with a family's name as a string
literal (``fam == "gdn"``, ``family in ("mamba2", "gdn")``, ``case "mamba2":``) anywhere else in
``precsim/`` or ``kernels/`` fails this test: look the family up (``get_family(name).DELTA_RULE``)
or map a compiled function set through its ``KERNEL`` instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from precsim import config
from precsim.families import FAMILIES

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("precsim", "kernels")
HOME = ROOT / "precsim" / "families"  # where branching on the family is the point
# every family's name and its kernel set's name (the same strings today)
NAMES = frozenset(FAMILIES) | frozenset(f.KERNEL for f in FAMILIES.values())
# (path relative to the repository, line's source stripped) -> why it stays; none is needed
# today: the command line's choice of family is checked against config.FAMILIES (a name, not a
# literal, test_config_lists_every_family), and the engines' kernel dicts are keyed, not compared
ALLOWED: dict[tuple[str, str], str] = {}


def _names_in(node: ast.AST) -> list[str]:
    """The family-name string literals ``node`` is, or holds as a tuple/list/set element."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value] if node.value in NAMES else []
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [n for e in node.elts for n in _names_in(e)]
    return []


def family_branches(source: str) -> list[tuple[int, str]]:
    """``(line, literal)`` of every comparison against a family-name string literal in
    ``source``: ``==``, ``!=``, ``in``, ``not in``, ``is`` on either side (a literal tuple of
    names included), and ``match`` cases on one."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                out += [(node.lineno, n) for n in _names_in(operand)]
        elif isinstance(node, ast.MatchValue):
            out += [(node.lineno, n) for n in _names_in(node.value)]
    return sorted(set(out))


def _sources():
    for folder in SCANNED:
        for p in sorted((ROOT / folder).rglob("*.py")):
            if HOME not in p.parents:
                yield p


def test_no_family_name_branches_outside_the_families():
    found, used = [], set()
    for p in _sources():
        lines = p.read_text().splitlines()
        for lineno, name in family_branches(p.read_text()):
            key = (str(p.relative_to(ROOT)), lines[lineno - 1].strip())
            if key in ALLOWED:
                used.add(key)
            else:
                found.append(f"{key[0]}:{lineno}: compares with {name!r}: {key[1]}")
    assert not found, ("branches on a family's name outside precsim/families/ (use a family "
                       "attribute or method, see precsim/families/__init__.py):\n"
                       + "\n".join(found))
    assert used == set(ALLOWED), f"stale allowlist entries: {sorted(set(ALLOWED) - used)}"


@pytest.mark.parametrize("src", [
    'if cfg.model.family == "gdn":\n    pass',
    'ok = "mamba2" != fam',
    'ok = fam in ("mamba2", "gdn")',
    'ok = fam not in ["gdn"]',
    'ok = a < b == "mamba2"',
    'match fam:\n    case "gdn":\n        pass',
])
def test_the_scan_finds_a_planted_branch(src):
    assert family_branches(src), src


@pytest.mark.parametrize("src", [
    'JIT = {"mamba2": 1, "gdn": 2}',
    'x = FAMILIES["gdn"]',
    'ok = fam == other',
    'ok = get_family(fam).DELTA_RULE',
    'ok = style == "seed_article"',
    'f(family="gdn")',
])
def test_the_scan_leaves_lookups_alone(src):
    assert not family_branches(src), src


def test_config_lists_every_family():
    """``config.FAMILIES`` (the command line's choices; the config layer sits below the
    families and cannot import them) names exactly the registered families."""
    assert tuple(config.FAMILIES) == tuple(FAMILIES)


ATTRIBUTES = ("name", "LABEL", "SHORT", "KEYS", "PARAMS", "SKIP", "DECAY_INPUT", "VALUE", "KEY",
              "QUERY", "GROUPED", "KERNEL_GROUPS", "KERNEL", "DELTA_RULE", "WEIGHT", "MARKERS",
              "TRACE_AXES", "TAGS", "HF_MIXERS", "HF_ARCHITECTURES", "HF_HOOKED", "HF_DIMS",
              "state_dims", "log_decay", "step", "segment", "random_params", "random_inputs",
              "check_trace", "hf_inputs", "hf_parse", "hf_build")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_family_defines_what_the_callers_read(name):
    fam = FAMILIES[name]
    missing = [a for a in ATTRIBUTES if not hasattr(fam, a)]
    assert not missing, f"{name}: {missing}"
    assert fam.name == name
    assert fam.WEIGHT in fam.KEYS and {fam.VALUE, fam.KEY, fam.QUERY} <= set(fam.KEYS)
    assert set(fam.TAGS) == set(fam.KEYS)
