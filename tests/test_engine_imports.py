"""The engine's modules import one another in one direction: no cycle, and no import hidden in
a function to break one. Imports under `if TYPE_CHECKING:` never run and are left out."""

import ast

from conftest import ROOT

ENGINE = ROOT / "amplint" / "engine"


def _runtime_imports(tree: ast.Module) -> list[tuple[ast.ImportFrom, bool]]:
    """Each relative import that runs, and whether it sits at the module's top level."""
    found = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and getattr(child.test, "id", None) == "TYPE_CHECKING":
                continue
            if isinstance(child, ast.ImportFrom) and child.level >= 1:
                found.append((child, top))
            nested = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            visit(child, top and not nested)

    visit(tree, True)
    return found


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    modules = {path.stem: path for path in ENGINE.glob("*.py")}
    graph, hidden = {}, []
    for name, path in modules.items():
        edges = set()
        for node, top in _runtime_imports(ast.parse(path.read_text())):
            if not top:
                hidden.append(f"{name}.py:{node.lineno}")
            if node.level == 1:
                targets = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
                edges |= {t for t in targets if t in modules and t != name}
        graph[name] = edges
    return graph, hidden


def test_no_cycle_and_no_import_inside_a_function():
    graph, hidden = _graph()
    assert hidden == []
    done, path, cycles = set(), [], []

    def walk(name: str) -> None:
        if name in path:
            cycles.append(path[path.index(name):] + [name])
            return
        if name in done:
            return
        path.append(name)
        for target in sorted(graph[name]):
            walk(target)
        path.pop()
        done.add(name)

    for name in sorted(graph):
        walk(name)
    assert cycles == []
