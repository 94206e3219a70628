"""The import graph of the source tree, read statically (``ast``, nothing imported): the layers keep to their
places, and no modules import each other in a circle.

Every ``.py`` file under shared/ and services/ is a module, ``embedfleet.shared.X`` being shared/X and
``embedfleet.services.X`` services/X (setup.py's package-dir). An import names the deepest module it reaches:
``from embedfleet.shared.jobs import ids`` is the module shared/jobs/ids.py, ``from embedfleet.shared.errors
import ErrorCode`` the module shared/errors.py.

The rules, each counting every import, at module level or inside a function, type-only ones included:

1. nothing under shared/ imports ``embedfleet.services``: shared/ is below every service;
2. the roles (gateway, tokenizer, gpu_worker, scorer) never import each other: they meet on the wire;
3. nothing under services/gpu_worker/engine/ imports ``nats`` (or ``embedfleet.shared.nats``): the engine
   knows nothing of queues.

And no circle: no module reaches itself again through the imports that run when modules load, which are
those at module level (in a class body, a ``try`` or an ``if`` too) except the ones under ``if TYPE_CHECKING:``
(never run). An import inside a function runs when the function is first called, after every module has
loaded: it is how a module takes what would otherwise close a circle, so it does not count here.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREES = {"embedfleet.shared": ROOT / "shared", "embedfleet.services": ROOT / "services"}
ROLES = ("gateway", "tokenizer", "gpu_worker", "scorer")


@dataclass(frozen=True, slots=True)
class Import:
    target: str  # the module imported: a module of the tree, or an outside one (``nats.js``, ``numpy``)
    line: int
    loads: bool  # run when the module loads: at module level, not under ``if TYPE_CHECKING:``


def _modules() -> dict[str, Path]:
    """Every module of the tree by its dotted name (a package by its ``__init__.py``)."""
    found = {}
    for prefix, folder in TREES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((prefix, *parts))] = path
    return found


MODULES = _modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _deepest(name: str) -> str:
    """``name``, or the longest module of the tree it starts with (a name imported from a module)."""
    probe = name
    while probe and probe not in MODULES:
        probe = probe.rpartition(".")[0]
    return probe or name


def _imports(module: str, path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, loads: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(child, False)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for part in child.body:
                    visit_one(part, False)
                for part in child.orelse:
                    visit_one(part, loads)
            else:
                visit_one(child, loads)

    def visit_one(node: ast.AST, loads: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(_deepest(alias.name), node.lineno, loads) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, up level - 1 packages
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.append(Import(full if full in MODULES else _deepest(base), node.lineno, loads))
        else:
            visit(node, loads)

    visit(tree, True)
    return found


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def _where(module: str, imp: Import) -> str:
    return f"{MODULES[module].relative_to(ROOT)}:{imp.line} imports {imp.target}"


def _breaches(source: str, refused: tuple[str, ...]) -> list[str]:
    """Each import by a module under ``source`` of a module under one of ``refused``, as file:line."""
    return [
        _where(module, imp)
        for module, imports in GRAPH.items()
        if module == source or module.startswith(source + ".")
        for imp in imports
        if any(imp.target == r or imp.target.startswith(r + ".") for r in refused)
    ]


def test_the_graph_is_read():
    """The walk sees the tree: modules on both sides, and imports that name modules of the tree."""
    assert "embedfleet.shared.errors" in MODULES and "embedfleet.services.gateway.app" in MODULES
    edges = {imp.target for imp in GRAPH["embedfleet.services.gateway.app"]}
    assert "embedfleet.shared.errors" in edges and "embedfleet.services.gateway.config" in edges


def test_shared_imports_no_service():
    breaches = _breaches("embedfleet.shared", ("embedfleet.services",))
    assert not breaches, "shared/ imports services/ (shared/ is below every service):\n" + "\n".join(breaches)


def test_roles_import_no_other_role():
    breaches = [
        f"{role}: {breach}"
        for role in ROLES
        for breach in _breaches(
            f"embedfleet.services.{role}", tuple(f"embedfleet.services.{other}" for other in ROLES if other != role)
        )
    ]
    assert not breaches, "a role imports another (they meet only over NATS):\n" + "\n".join(breaches)


def test_the_engine_imports_no_nats():
    breaches = _breaches("embedfleet.services.gpu_worker.engine", ("nats", "embedfleet.shared.nats"))
    assert not breaches, "the engine imports NATS (it knows nothing of queues):\n" + "\n".join(breaches)


def _circles() -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing itself) among the
    tree's load-time imports (Tarjan's algorithm, iterative), each as one circle through it."""
    edges = {
        module: sorted({imp.target for imp in imports if imp.loads and imp.target in MODULES})
        for module, imports in GRAPH.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in edges:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, at = work.pop()
            if at == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if at < len(edges[node]):
                work.append((node, at + 1))
                nxt = edges[node][at]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges[node]:
                    components.append(sorted(component))
    return [_circle_in(component, edges) for component in components]


def _circle_in(component: list[str], edges: dict[str, list[str]]) -> list[str]:
    """One circle through the component's first module, by breadth-first search back to it."""
    members = set(component)
    start = component[0]
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in edges[node]:
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if nxt in members and nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no circle in the component {component}")


def _describe(circle: list[str]) -> str:
    steps = []
    for module, target in pairwise(circle):
        line = next(imp.line for imp in GRAPH[module] if imp.target == target and imp.loads)
        steps.append(f"  {MODULES[module].relative_to(ROOT)}:{line} imports {target}")
    return "\n".join(steps)


def test_no_import_circle():
    circles = _circles()
    assert not circles, "modules import each other in a circle when they load:\n" + "\n\n".join(
        _describe(circle) for circle in circles
    )
