"""The numba engine's on-disk cache is keyed on all of its compiled code's files
(``precsim.engines.numba_jit.cache``): a caller in one file sees a changed callee in another on
the next run (numba alone keys a function on its own file and would serve the old callee),
wherever numba keeps the cache."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba")

from numba.core.caching import NullCache  # noqa: E402
from numba.core.dispatcher import Dispatcher  # noqa: E402

from precsim.config import SchemeConfig  # noqa: E402
from precsim.engines import numba as ne  # noqa: E402
from precsim.engines.numba_jit import cache, gdn, mamba2, quant, rounding, stats  # noqa: E402

JIT = Path(cache.__file__).parent

# A package set up as precsim.engines.numba_jit is: its __init__ keys numba's cache on its folder
# (cache.py does so for numba_jit), a cached caller in one file, its cached callee in another.
PAIR = {
    "__init__.py": "from importlib import resources\n"
                   "from precsim.engines.numba_jit.cache import folder_key, keyed_njit\n"
                   "njit = keyed_njit(folder_key(resources.files(__package__)))\n",
    "callee.py": "from . import njit\n\n\n@njit(cache=True)\ndef g(x):\n    return x * 2\n",
    "caller.py": "from . import njit\nfrom .callee import g\n\n\n"
                 "@njit(cache=True)\ndef f(x):\n    return g(x) + 1\n",
}
def _run(tmp_path: Path, cache_dir: bool) -> dict[str, tuple[int, int, str]]:
    """Per package: ``f(1)`` in a new interpreter, the number of cache hits, the cache folder."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_CACHE_DIR", "NUMBA_CACHE_LOCATOR_CLASSES", "PYTHONPYCACHEPREFIX")}
    env.update(PYTHONPATH=os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")]),
               PYTHONDONTWRITEBYTECODE="1", XDG_CACHE_HOME=str(tmp_path / "user"))
    if cache_dir:
        env["NUMBA_CACHE_DIR"] = str(tmp_path / "numba_cache_dir")
    code = ("import importlib, json; print(json.dumps({p: (f(1), sum(f.stats.cache_hits.values()),"
            " f.stats.cache_path) for p in ('tree', 'user') for f in "
            "[importlib.import_module(p + '.caller').f]}))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return {p: tuple(r) for p, r in json.loads(out.stdout).items()}


@pytest.mark.parametrize("cache_dir", [False, True], ids=["default", "NUMBA_CACHE_DIR"])
def test_a_changed_callee_file_recompiles_its_callers(tmp_path, cache_dir):
    """Two such packages: ``tree``, where numba caches in ``__pycache__`` beside the sources,
    and ``user``, where it cannot (as a read-only install) and falls back to the user cache
    folder; with ``NUMBA_CACHE_DIR`` both cache there."""
    for pkg in ("tree", "user"):
        (tmp_path / pkg).mkdir()
        for name, text in PAIR.items():
            (tmp_path / pkg / name).write_text(text)
    (tmp_path / "user" / "__pycache__").write_text("")  # no cache folder can be made there
    where = {"tree": tmp_path / "tree" / "__pycache__", "user": tmp_path / "user"}
    if cache_dir:
        where = dict.fromkeys(where, tmp_path / "numba_cache_dir")

    first = _run(tmp_path, cache_dir)
    for pkg, (v, hits, path) in first.items():
        assert (v, hits) == (3, 0) and Path(path).is_relative_to(where[pkg]), (pkg, path)
    assert {p: r[:2] for p, r in _run(tmp_path, cache_dir).items()} == \
        {"tree": (3, 1), "user": (3, 1)}  # the cache serves f as long as nothing changed
    for pkg in ("tree", "user"):
        (tmp_path / pkg / "callee.py").write_text(PAIR["callee.py"].replace("x * 2", "x * 3"))
    # numba alone: (3, 1), the old callee in the caller's cached code
    assert {p: r[:2] for p, r in _run(tmp_path, cache_dir).items()} == \
        {"tree": (4, 0), "user": (4, 0)}


def test_folder_key_follows_every_python_file(tmp_path):
    (tmp_path / "a.py").write_text("A = 1\n")
    key = cache.folder_key(tmp_path)
    assert cache.folder_key(tmp_path) == key and len(key) == 64
    (tmp_path / "notes.txt").write_text("not code")
    assert cache.folder_key(tmp_path) == key
    (tmp_path / "b.py").write_text("")
    key_b = cache.folder_key(tmp_path)
    (tmp_path / "a.py").write_text("A = 2\n")
    assert len({key, key_b, cache.folder_key(tmp_path)}) == 3
    assert cache.folder_key(tmp_path / "missing") is None
    assert cache.KEY == cache.folder_key(JIT)


def test_every_cached_function_of_the_engine_is_keyed():
    """Every compiled function of ``numba_jit`` is either uncached (numba's ``inline``
    helpers) or cached under the package's key; so are the tasks built per scheme."""
    dispatchers = [v for m in (rounding, quant, mamba2, gdn, stats) for v in vars(m).values()
                   if isinstance(v, Dispatcher)]
    keyed = [d for d in dispatchers if cache.is_keyed(d, cache.KEY)]
    assert len(keyed) >= 20
    assert all(d in keyed or isinstance(d._cache, NullCache) for d in dispatchers)
    consts = ne.scheme_consts(ne.scheme_codes(SchemeConfig("split", "fp16", "sr", "nvfp4")))
    for kernel in ne.JIT:  # each family's KERNEL
        assert cache.is_keyed(ne.task_function(kernel, None), cache.KEY)
        assert cache.is_keyed(ne.task_function(kernel, consts), cache.KEY)
    assert cache.is_keyed(ne.task_function(None, None), cache.KEY)
    assert cache.is_keyed(quant.quantize_many(ne.fmt_code("nvfp4"), 8), cache.KEY)


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """``(level, module, names)`` of every import of ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            out.append((node.level, node.module or "", [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(0, a.name, []) for a in node.names]
    return out


def test_the_key_covers_all_compiled_code():
    """The compiled code is the package's alone: its modules take ``njit`` from ``.cache``
    (numba's own would cache under numba's key) and import nothing else of ``precsim.engines``,
    and no other module of precsim has numba cache a function."""
    for p in JIT.glob("*.py"):
        for level, mod, names in _imports(p):
            assert p.name == "cache.py" or not (mod.startswith("numba") and "njit" in names), p
            assert level != 2 and not (level == 0 and mod.startswith("precsim.engines")), (p, mod)
    for p in JIT.parents[1].rglob("*.py"):  # precsim/
        if JIT in p.parents or not any(m.startswith("numba") for _, m, _ in _imports(p)):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            assert not (isinstance(node, ast.keyword) and node.arg == "cache"
                        and getattr(node.value, "value", None) is True), p
