"""The modules of nnapi import one another in one direction: the import graph (every
import statement, at module level or inside functions, except those only for type
checkers) has no cycle.

An import of a module's own parent package does not count: Python always initializes a
package before its submodules, so that edge exists for every submodule anyway."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src" / "nnapi"


def _module_names() -> dict[str, Path]:
    names = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()

    def add(node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            return
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            parts = parts[:len(parts) - node.level + 1]
            base = ".".join(parts + ([base] if base else []))
        for alias in node.names:
            full = f"{base}.{alias.name}"
            found.add(full if full in modules else base)

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                add(child)
            else:
                walk(child)

    walk(ast.parse(path.read_text()))
    return {m for m in found if m in modules and m != name and not name.startswith(m + ".")}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph, or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_import_graph_of_nnapi_has_no_cycle():
    modules = _module_names()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert sum(len(targets) for targets in graph.values()) > 100  # the graph was really read
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_a_cycle_is_found_when_there_is_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_drivers_and_operations_do_not_import_the_package_front_door():
    """A driver or an operation imports what it uses from its module (nnapi._version, not
    ``from nnapi import __version__``): the front door imports the whole public API."""
    modules = _module_names()
    offenders = []
    for name, path in modules.items():
        if not name.startswith(("nnapi.drivers", "nnapi.operations")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import) and any(alias.name == "nnapi" for alias in node.names):
                offenders.append(f"{name}: import nnapi")
            elif isinstance(node, ast.ImportFrom) and node.module == "nnapi" and not node.level:
                offenders += [f"{name}: from nnapi import {alias.name}" for alias in node.names
                              if f"nnapi.{alias.name}" not in modules]
    assert offenders == []
