"""The dynemb package is layered: no import cycles, no import of a higher layer.

Every module of python/dynemb is read with `ast` (not imported), and each of
its imports of another dynemb module becomes an edge: module-level and
function-level imports alike, `import dynemb.x`, `from dynemb.x import y`
(y a module or a name) and relative imports. Importing `dynemb.a.b.c` also runs
the module-level code of its packages `dynemb.a` and `dynemb.a.b` first, so
their module-level imports count as edges of `dynemb.a.b.c` too. The root
package is left out of that rule: every import of a dynemb module runs it
first, and it sits on top (it is the top layer, so an explicit import of it
from below still fails).
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Optional, Set

import dynemb

PACKAGE_DIR = Path(dynemb.__file__).resolve().parent

# Module prefix -> layer; the longest prefix that matches decides. A module may
# import modules of its own layer or of lower ones, never of a higher one.
LAYERS = {
    # 0. The binding of the op library and the engine, and what needs no dynemb.
    "dynemb._lib": 0,
    "dynemb._comm": 0,
    "dynemb.util.log": 0,
    "dynemb.constants": 0,
    # 1. Process state: table registry, per-graph records, init() settings.
    "dynemb._state": 1,
    # 2. Building blocks: tables, FeatureSpec, graph tracing and rewriting,
    #    pipeline rebuilding, engine checkpoints, the exchanges of several ranks.
    "dynemb.core.tables": 2,
    "dynemb.core.asc.spec": 2,
    "dynemb.core.checkpoint": 2,
    "dynemb.core.remote": 2,
    "dynemb.core.exchange": 2,
    "dynemb.graph.trace": 2,
    "dynemb.graph.pipeline": 2,
    "dynemb.graph.rewrite": 2,
    # 3. Mechanisms built from them: lookups, the two prepared-lookup modes,
    #    eviction, warm start, sparse optimizers.
    "dynemb.core.lookup": 3,
    "dynemb.core.data_parallel": 3,
    "dynemb.core.asc.lookups": 3,
    "dynemb.core.asc.insert": 3,
    "dynemb.core.eviction": 3,
    "dynemb.core.eos": 3,
    "dynemb.core.table_stats": 3,
    "dynemb.core.warm_start": 3,
    "dynemb.core.serving": 3,
    "dynemb.graph.modification": 3,
    "dynemb.graph.slicing": 3,
    "dynemb.optimizers.base": 3,
    # 4. mxRec's module paths: thin faces that re-export.
    "dynemb.core": 4,
    "dynemb.graph": 4,
    "dynemb.util": 4,
    "dynemb.optimizers": 4,
    "dynemb.saver": 4,
    # The second generation's face (mxRec v2, ``import dynemb.v2 as mxrec``):
    # built on the first generation's faces, beside them.
    "dynemb.v2": 4,
    # 5. The package itself.
    "dynemb": 5,
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE_DIR.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> Dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def _resolve(node: ast.ImportFrom, importer: str, is_package: bool) -> Optional[str]:
    """The absolute module a `from ... import` names (relative ones resolved)."""
    if not node.level:
        return node.module
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(tree: ast.AST, importer: str, is_package: bool, modules: Set[str],
             top_level_only: bool = False) -> Set[str]:
    """The dynemb modules `tree` imports (at any depth, or only its module body)."""
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: Set[str] = set()
    for node in nodes:
        names: List[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, importer, is_package)
            if base is None:
                continue
            # `from dynemb.x import y`: y is a module, or a name of dynemb.x.
            names = [base + "." + a.name if base + "." + a.name in modules else base
                     for a in node.names]
        for name in names:
            # `import dynemb.a.b` names dynemb.a.b (and runs its packages, below).
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != importer:
                found.add(name)
    return found


def import_graph() -> Dict[str, Set[str]]:
    modules = _modules()
    names = set(modules)
    trees = {m: ast.parse(p.read_text(), str(p)) for m, p in modules.items()}
    is_pkg = {m: p.name == "__init__.py" for m, p in modules.items()}
    body_imports = {m: _imports(trees[m], m, is_pkg[m], names, top_level_only=True)
                    for m in names}
    graph = {}
    for m in names:
        edges = _imports(trees[m], m, is_pkg[m], names)
        parts = m.split(".")
        for i in range(2, len(parts)):  # packages above m, the root left out
            edges |= body_imports[".".join(parts[:i])]
        edges.discard(m)
        graph[m] = edges
    return graph


def find_cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """A cycle of `graph` as [a, b, ..., a], or None."""
    state: Dict[str, int] = {}  # 1: on the current path, 2: done
    path: List[str] = []

    def visit(m: str) -> Optional[List[str]]:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def layer_of(module: str) -> Optional[int]:
    prefixes = [p for p in LAYERS if module == p or module.startswith(p + ".")]
    return LAYERS[max(prefixes, key=len)] if prefixes else None


def upward_imports(graph: Dict[str, Set[str]]) -> List[str]:
    return sorted(f"{m} (layer {layer_of(m)}) imports {n} (layer {layer_of(n)})"
                  for m, edges in graph.items() for n in edges
                  if layer_of(n) > layer_of(m))


def test_every_module_has_a_layer():
    missing = sorted(m for m in import_graph() if layer_of(m) is None)
    assert not missing, f"modules without a layer in LAYERS: {missing}"


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle in dynemb: " + " -> ".join(cycle)


def test_no_module_imports_a_higher_layer():
    bad = upward_imports(import_graph())
    assert not bad, "imports of a higher layer:\n" + "\n".join(bad)


def test_the_graph_sees_every_kind_of_import():
    """What the checks rely on: function-level imports, both import forms,
    relative imports and package bodies all become edges."""
    source = ("import dynemb.core.tables\n"
              "from . import spec\n"
              "def f():\n"
              "    from dynemb.graph.rewrite import guard_lookup\n"
              "    from ..tables import op_name\n"
              "    import dynemb.core.lookup as lk\n")
    tree = ast.parse(source)
    got = _imports(tree, "dynemb.core.asc.lookups", False, set(_modules()))
    assert got == {"dynemb.core.tables", "dynemb.core.asc.spec", "dynemb.graph.rewrite",
                   "dynemb.core.lookup"}
    assert _imports(tree, "dynemb.core.asc.lookups", False, set(_modules()),
                    top_level_only=True) == {"dynemb.core.tables", "dynemb.core.asc.spec"}
    graph = import_graph()
    # dynemb/core/asc/__init__ loads its names inside __getattr__: an edge of
    # the package, not of the modules inside it.
    assert "dynemb.core.asc.feature_spec" in graph["dynemb.core.asc"]
    assert "dynemb.core.asc.feature_spec" not in graph["dynemb.core.asc.spec"]


def test_a_cycle_or_an_upward_import_is_reported():
    graph = {m: set(e) for m, e in import_graph().items()}
    graph["dynemb._lib"].add("dynemb.core.tables")  # binding -> tables -> binding
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1] and "dynemb._lib" in cycle
    assert ("dynemb._lib (layer 0) imports dynemb.core.tables (layer 2)"
            in upward_imports(graph))
