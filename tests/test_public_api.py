"""The library's public API: the curated names of `tank_log`, and one base for every exception raised on purpose."""

import ast
import importlib
import inspect
import os
import subprocess
import sys

from conftest import ROOT

import tank_log
from tank_log.errors import TankLogError


def _modules(package: str) -> list[str]:
    out = []
    for d, _, files in os.walk(os.path.join(ROOT, package)):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(d, f), ROOT)[:-3].replace(os.sep, ".")
                out.append(rel.removesuffix(".__init__"))
    return sorted(out)


def test_every_public_name_resolves_and_is_documented():
    for name in tank_log.__all__:
        value = getattr(tank_log, name)
        if name != "__version__":
            assert inspect.getdoc(value), f"tank_log.{name} has no docstring"
    assert sorted(dir(tank_log)) == sorted(tank_log.__all__)


def test_import_tank_log_loads_nothing_heavy():
    code = "import sys, tank_log; print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyarrow', 'tank_log')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "['tank_log']"


def test_every_exception_raised_on_purpose_derives_from_tank_log_error():
    strays = []
    for package in ("tank_log", "tank_spark"):
        for name in _modules(package):
            module = importlib.import_module(name)
            for attr, value in vars(module).items():
                if (
                    inspect.isclass(value)
                    and issubclass(value, Exception)
                    and value.__module__ == name
                    and not attr.startswith("_")
                    and not issubclass(value, TankLogError)
                ):
                    strays.append(f"{name}.{attr}")
    assert strays == []


def test_typed_package_markers_ship():
    for package in ("tank_log", "tank_spark"):
        assert os.path.isfile(os.path.join(ROOT, package, "py.typed"))


def test_type_checkers_see_what_loads_lazily():
    tree = ast.parse(open(os.path.join(ROOT, "tank_log", "__init__.py"), encoding="utf-8").read())
    typed = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom)
                typed |= {a.name: imp.module for a in imp.names}
    assert typed == tank_log._EXPORTS
