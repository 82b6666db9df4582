"""The package's import graph: no circles, and the kernels never import the core above them."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# installed names of the repository folders (pyproject's package-dir)
DIRS = {"precsim": "precsim", "formats": "precsim.formats", "kernels": "precsim.kernels",
        "conf": "precsim.conf"}


def _modules() -> dict[str, Path]:
    mods = {}
    for folder, pkg in DIRS.items():
        for p in (ROOT / folder).rglob("*.py"):
            rel = p.relative_to(ROOT / folder).with_suffix("")
            parts = [x for x in rel.parts if x != "__init__"]
            mods[".".join([pkg, *parts])] = p
    return mods


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module of the package ``name`` imports, at any level (lazy imports included)."""
    is_pkg = path.name == "__init__.py"
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                up = base[:len(base) - node.level + 1]
                mod = ".".join([*up, mod] if mod else up)
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def _graph():
    mods = _modules()
    return {n: _imports(n, p, set(mods)) for n, p in mods.items()}


def test_no_import_circle():
    graph = _graph()
    # a package's __init__ importing its own submodules is not a circle through the package
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(n):
        state[n] = 1
        path.append(n)
        for m in graph[n]:
            if n.startswith(m + "."):  # a submodule importing its package's __init__
                continue
            if state.get(m) == 1:
                raise AssertionError("import circle: " + " -> ".join(path[path.index(m):] + [m]))
            if not state.get(m):
                visit(m)
        path.pop()
        state[n] = 2

    for n in graph:
        if not state.get(n):
            visit(n)


def test_kernels_import_no_core():
    banned = ("precsim.config", "precsim.schemes", "precsim.workload", "precsim.engines",
              "precsim.api", "precsim.cli", "precsim.metrics", "precsim.families")
    for n, deps in _graph().items():
        if n.startswith("precsim.kernels"):
            bad = [d for d in deps if d.startswith(banned)]
            assert not bad, f"{n} imports {bad}"


def test_the_graph_is_read():
    """The walker sees real edges (a test of the test)."""
    graph = _graph()
    assert "precsim.config" in graph["precsim.engines.torch"]
    assert "precsim.kernels.quant" in graph["precsim.kernels.mamba2"]
