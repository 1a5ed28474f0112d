"""The package structure: no two modules import each other, directly or through others (module-level imports,
those under TYPE_CHECKING included: a circle means two concepts without one home)."""

import ast
import os

from conftest import ROOT


def _imports(path: str, package_modules: set[str]) -> set[str]:
    tree = ast.parse(open(path, encoding="utf-8").read())
    out = set()
    for node in tree.body:  # module level only (a function-local import is deliberate laziness)
        nodes = [node]
        if isinstance(node, ast.If):  # `if TYPE_CHECKING:`
            nodes = node.body
        for n in nodes:
            names = []
            if isinstance(n, ast.Import):
                names = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
                names = [n.module] + [f"{n.module}.{a.name}" for a in n.names]
            out |= {m for m in names if m in package_modules}
    return out


def test_no_import_cycles():
    modules: dict[str, str] = {}
    for pkg in ("tank_log", "tank_spark"):
        for d, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(d, f), ROOT)[:-3].replace(os.sep, ".")
                    modules[rel.removesuffix(".__init__")] = os.path.join(d, f)
    graph = {m: _imports(p, set(modules)) - {m} for m, p in modules.items()}
    cycles = []
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append(" → ".join([*stack[stack.index(n) :], n]))
            elif n not in state:
                visit(n, [*stack, n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == []
