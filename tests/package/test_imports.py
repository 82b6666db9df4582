"""The package's import graph: no circles; every import points down the layers that
docs/design.md ("Layers") writes down, lazy imports inside functions included; the kernels
import nothing of the core; and no module uses another module's ``_private`` name."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# installed names of the repository folders (pyproject's package-dir)
DIRS = {"precsim": "precsim", "formats": "precsim.formats", "kernels": "precsim.kernels",
        "conf": "precsim.conf"}
# docs/design.md's layers, lowest first: a module imports only from its own layer or lower ones
# (a module belongs to the layer of the longest prefix that names it; "precsim" is the
# package's __init__ alone)
LAYERS = [
    ("errors", ("precsim.errors", "precsim.conf", "precsim.shadow")),
    ("formats", ("precsim.formats",)),
    ("kernels", ("precsim.kernels",)),
    ("config", ("precsim.config",)),
    ("model", ("precsim.families", "precsim.schemes", "precsim.schedule", "precsim.workload",
               "precsim.oracle", "precsim.cost", "precsim.metrics", "precsim.plots",
               "precsim.tasks", "precsim.serving")),
    ("run directory", ("precsim.rundir", "precsim.result", "precsim.checkpoint")),
    ("engines", ("precsim.engines",)),
    # (a package's prefix names every module in it: precsim.report is report/'s runs, groups,
    # ranking, verdict, table, sweep_plots and command)
    ("models, reports", ("precsim.models", "precsim.floor", "precsim.taskstats",
                         "precsim.report", "precsim.preflight")),
    ("api", ("precsim.api", "precsim.layers")),
    ("command line", ("precsim.cli", "precsim.compose", "precsim.hydra_patches",
                      "precsim.process", "precsim.callbacks", "precsim.record",
                      "precsim.lm_eval_adapter", "precsim.__main__", "precsim")),
]


def _modules() -> dict[str, Path]:
    mods = {}
    for folder, pkg in DIRS.items():
        for p in (ROOT / folder).rglob("*.py"):
            rel = p.relative_to(ROOT / folder).with_suffix("")
            parts = [x for x in rel.parts if x != "__init__"]
            mods[".".join([pkg, *parts])] = p
    return mods


def _import_nodes(name: str, path: Path):
    """``(node, module, names)`` of every import in ``path`` (module ``name``), at any level
    (lazy imports included), relative imports resolved."""
    is_pkg = path.name == "__init__.py"
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node, a.name, []
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                up = base[:len(base) - node.level + 1]
                mod = ".".join([*up, mod] if mod else up)
            yield node, mod, [a.name for a in node.names]


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module of the package ``name`` imports. ``from pkg import mod`` is an edge to
    ``pkg.mod`` (not to ``pkg``'s __init__ as well, whose contents it does not use)."""
    out = set()
    for _, mod, names in _import_nodes(name, path):
        subs = [f"{mod}.{n}" for n in names if f"{mod}.{n}" in known]
        targets = subs if names and len(subs) == len(names) else [mod, *subs]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def _graph():
    mods = _modules()
    return {n: _imports(n, p, set(mods)) for n, p in mods.items()}


def layer_of(module: str) -> int:
    best, layer = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            hit = module == p if p == "precsim" else (module == p or module.startswith(p + "."))
            if hit and len(p) > best:
                best, layer = len(p), i
    assert layer is not None, f"{module} is in no layer: add it to LAYERS and docs/design.md"
    return layer


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


def test_imports_point_down_the_layers():
    bad = [f"{n} ({LAYERS[layer_of(n)][0]}) imports {m} ({LAYERS[layer_of(m)][0]})"
           for n, deps in sorted(_graph().items()) for m in sorted(deps)
           if layer_of(m) > layer_of(n)]
    assert not bad, "imports from a higher layer:\n" + "\n".join(bad)


def test_kernels_import_no_core():
    banned = ("precsim.config", "precsim.schemes", "precsim.workload", "precsim.engines",
              "precsim.api", "precsim.cli", "precsim.metrics", "precsim.families")
    for n, deps in _graph().items():
        if n.startswith("precsim.kernels"):
            bad = [d for d in deps if d.startswith(banned)]
            assert not bad, f"{n} imports {bad}"


def _private(n: str) -> bool:
    return n.startswith("_") and not (n.startswith("__") and n.endswith("__"))


def private_uses(name: str, path: Path, known: set[str]) -> list[str]:
    """Where module ``name`` uses another module's ``_private`` name: ``from m import _x``, or
    ``m._x`` (read or written) through a name bound to a module of the package."""
    bound, out = {}, []
    for node, mod, _names in _import_nodes(name, path):
        if not mod.startswith("precsim"):
            continue
        if isinstance(node, ast.Import):
            a = node.names[[x.name for x in node.names].index(mod)]
            bound[a.asname or mod.split(".")[0]] = mod if a.asname else mod.split(".")[0]
            continue
        for a in node.names:
            if f"{mod}.{a.name}" in known:
                bound[a.asname or a.name] = f"{mod}.{a.name}"
            if _private(a.name) and mod != name:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {mod} import {a.name}")
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            chain, v = [], node.value
            while isinstance(v, ast.Attribute):
                chain.append(v.attr)
                v = v.value
            if isinstance(v, ast.Name) and v.id in bound:
                target = ".".join([bound[v.id], *reversed(chain)])
                if target != name:
                    out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {target}.{node.attr}")
    return out


def test_no_module_uses_another_modules_private_names():
    """A ``_name`` is its module's own: another module (the tests included) that needs it
    needs a public name (issue 43)."""
    mods = _modules()
    files = dict(mods)
    for p in sorted((ROOT / "tests").rglob("*.py")):
        files["tests." + ".".join(p.relative_to(ROOT / "tests").with_suffix("").parts)] = p
    bad = [u for n, p in files.items() for u in private_uses(n, p, set(mods))]
    assert not bad, "another module's private names:\n" + "\n".join(bad)


def test_the_graph_is_read():
    """The walkers see real edges (a test of the tests)."""
    graph = _graph()
    assert "precsim.config" in graph["precsim.engines.torch"]
    assert "precsim.kernels.quant" in graph["precsim.kernels.mamba2"]
    assert "precsim.formats" in graph["precsim.schemes"]
    assert "precsim" not in graph["precsim.schemes"]
    assert layer_of("precsim.engines.numba_host") > layer_of("precsim.result")
    assert {"precsim.report.runs", "precsim.report.groups"} <= graph["precsim.report.ranking"]
    assert layer_of("precsim.report.command") == layer_of("precsim.report")
    src = "from precsim.engines import numba as ne\nimport precsim.cli as c\nne._EL\nc._x = 1\n"
    p = ROOT / "tests" / "app" / "_probe_private.py"
    try:
        p.write_text(src)
        uses = private_uses("tests.app._probe_private", p, set(_modules()))
    finally:
        p.unlink()
    assert [u.split(": ")[1] for u in uses] == ["precsim.engines.numba._EL", "precsim.cli._x"]
