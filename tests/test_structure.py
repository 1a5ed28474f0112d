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


# docs/ARCHITECTURE.md's layers, bottom to top: a module imports only from its own layer or those below
LAYERS = {
    "tank_log.errors": 0,
    "tank_log.problems": 0,
    "tank_log.format": 1,
    "tank_log.values": 1,  # the value codecs: bytes to typed columns, beside the segment format
    "tank_log.storage": 2,
    "tank_log.maintenance": 3,
    "tank_log.lakehouse": 3,
    "tank_log.jobs": 4,
    "tank_log.tools": 5,
    "tank_log.metrics": 5,
    "tank_log": 5,  # the package's curated API (its names load lazily)
    "tank_spark": 6,
}


def _layer(module: str) -> int | None:
    owners = [k for k in LAYERS if module == k or module.startswith(k + ".")]
    return LAYERS[max(owners, key=len)] if owners else None


def layer_violations(path: str, module: str) -> list[str]:
    """Every import in the file, at any depth (function-local and TYPE_CHECKING ones too), of a higher layer."""
    own = _layer(module)
    out = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [node.module]
        else:
            continue
        for target in targets:
            theirs = _layer(target)
            if own is not None and theirs is not None and theirs > own:
                out.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: {module} imports {target}")
    return out


def package_modules() -> list[tuple[str, str]]:
    """Every module of tank_log and tank_spark: (file path, dotted module name)."""
    out = []
    for pkg in ("tank_log", "tank_spark"):
        for d, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(d, f)
                    out.append((path, os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".").removesuffix(".__init__")))
    return out


def test_every_import_respects_the_layers():
    assert [v for path, module in package_modules() for v in layer_violations(path, module)] == []


def test_the_layer_check_sees_a_function_local_import(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from tank_spark.entry_points import job_path\n    return job_path\n")
    assert layer_violations(str(path), "tank_log.tools.cli") == [
        f"{os.path.relpath(path, ROOT)}:2: tank_log.tools.cli imports tank_spark.entry_points"
    ]
    assert layer_violations(str(path), "tank_spark.runner") == []


# each table format's library, and the one module that implements the format with it (docs/ARCHITECTURE.md)
FORMAT_LIBRARIES = {"deltalake": "tank_log.lakehouse.delta", "pyiceberg": "tank_log.lakehouse.iceberg"}


def format_library_imports(path: str, module: str) -> list[str]:
    """Every import in the file, at any depth, of a table format's library outside that format's own module."""
    out = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [node.module]
        else:
            continue
        for target in targets:
            library = target.partition(".")[0]
            if library in FORMAT_LIBRARIES and FORMAT_LIBRARIES[library] != module:
                out.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: {module} imports {target}")
    return out


def test_only_a_formats_own_module_imports_its_library():
    assert [v for path, module in package_modules() for v in format_library_imports(path, module)] == []


def test_the_format_library_check_sees_any_import(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from deltalake import DeltaTable\n"
        "def f():\n    import pyiceberg.catalog\n    return DeltaTable, pyiceberg\n"
    )
    where = os.path.relpath(path, ROOT)
    assert format_library_imports(str(path), "tank_spark.export.commit") == [
        f"{where}:3: tank_spark.export.commit imports deltalake",
        f"{where}:5: tank_spark.export.commit imports pyiceberg.catalog",
    ]
    assert format_library_imports(str(path), "tank_log.lakehouse.delta") == [
        f"{where}:5: tank_log.lakehouse.delta imports pyiceberg.catalog"
    ]


# flags that mean something of their own in each command, so each command declares them (with its own help):
# `--format` is the output's format in `tank-log` and the table's format in the export
PER_COMMAND_FLAGS = {"--config", "--dry-run", "--topics", "--version", "--table", "--format"}


def test_each_shared_flag_is_declared_once():
    """A flag several commands share is declared in one place (tank_log/jobs/flags.py), so its help cannot drift."""
    where: dict[str, set[str]] = {}
    for pkg in ("tank_log", "tank_spark"):
        for d, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                if not f.endswith(".py"):
                    continue
                path = os.path.join(d, f)
                for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                    if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                        for arg in node.args:
                            if isinstance(arg, ast.Constant) and str(arg.value).startswith("--"):
                                where.setdefault(arg.value, set()).add(os.path.relpath(path, ROOT))
    twice = {flag: sorted(paths) for flag, paths in where.items() if len(paths) > 1 and flag not in PER_COMMAND_FLAGS}
    assert twice == {}
