"""The layers import one way (STYLE R2): `web` and `agent` on top, `services` below,
`storage` below that; the core never drags in Flask and the web layer never LangChain.

Every module of each package is found with pkgutil, so a new module is checked without
anyone adding it to a list. Two views of the same rule: the imports each module writes
(anywhere in it, lazy ones included), followed through the project's own modules; and
what importing the whole package really loads, in a fresh interpreter.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import pkgutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

# Real processes, signed in: the mode changes only the gate, which tests/web covers in
# both modes; the single-user pass skips this module.
pytestmark = pytest.mark.same_in_both_modes


FLASK = ("flask", "flask_babel", "flask_login", "flask_wtf", "werkzeug", "wtforms", "jinja2")
LANGCHAIN = ("langchain", "langchain_core", "langgraph")

# package -> top-level modules that no module of it may import, directly or through others
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "deerflow_web.storage": (
        *FLASK,
        *LANGCHAIN,
        "deerflow_web.services",
        "deerflow_web.agent",
        "deerflow_web.web",
    ),
    "deerflow_web.services": (*FLASK, *LANGCHAIN, "deerflow_web.agent", "deerflow_web.web"),
    "deerflow_web.agent": (*FLASK, "deerflow_web.web"),
    "deerflow_web.web": (*LANGCHAIN, "deerflow_web.agent"),
}


# Alembic's entry point runs only inside a migration (it reads the migration's connection).
RUN_BY_ALEMBIC = {"deerflow_web.storage.migrations.env"}


def package_modules(package: str) -> list[str]:
    """The package and every module under it, as pkgutil finds them."""
    path = importlib.util.find_spec(package).submodule_search_locations
    found = [package] + [m.name for m in pkgutil.walk_packages(path, package + ".")]
    return sorted(name for name in found if name not in RUN_BY_ALEMBIC)


@cache
def direct_imports(module: str) -> frozenset[str]:
    """Every module named by an import statement anywhere in `module`'s source."""
    spec = importlib.util.find_spec(module)
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return frozenset(names)


@cache
def is_project_module(name: str) -> bool:
    """Whether `name` is a module of this project (not a class or function in one)."""
    if not name.startswith("deerflow_web."):
        return False
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def reachable_imports(module: str) -> set[str]:
    """`module`'s imports, followed through the project's own modules."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        for name in direct_imports(todo.pop()):
            if name not in seen:
                seen.add(name)
                if is_project_module(name):
                    todo.append(name)
    return seen


def _violates(name: str, forbidden: str) -> bool:
    return name == forbidden or name.startswith(forbidden + ".")


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_every_module_imports_only_downwards(package: str) -> None:
    modules = package_modules(package)
    assert len(modules) > 1, f"pkgutil found no modules under {package}"
    problems = {
        module: sorted(
            name
            for name in reachable_imports(module)
            if any(_violates(name, f) for f in FORBIDDEN[package])
        )
        for module in modules
    }
    assert {module: names for module, names in problems.items() if names} == {}

    # What importing every module really loads (third-party packages included).
    code = (
        "import importlib, json, sys; "
        f"[importlib.import_module(m) for m in {modules!r}]; "
        f"print(json.dumps(sorted(n for n in {FORBIDDEN[package]!r} if n in sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout) == []
