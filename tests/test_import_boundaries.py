"""The core never drags in Flask; the web layer never drags in LangChain (STYLE R2).

Each check runs in a fresh interpreter: module X is imported, and module Y must not be in
`sys.modules` afterwards (directly or through anything X imports).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _loaded_after_import(module: str, candidates: tuple[str, ...]) -> list[str]:
    code = (
        f"import importlib, json, sys; importlib.import_module({module!r}); "
        f"print(json.dumps([name for name in {candidates!r} if name in sys.modules]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("deerflow_web.services.uploads", "flask"),
        ("deerflow_web.services.artifacts", "flask"),
        ("deerflow_web.services.upload_info", "flask"),
        ("deerflow_web.storage.records", "flask"),
        ("deerflow_web.settings", "flask"),
        ("deerflow_web.services.uploads", "langchain_core"),
        ("deerflow_web.web", "langchain_core"),
        ("deerflow_web.web", "deerflow_web.agent"),
        ("deerflow_web.services.upload_turn", "langchain_core"),
        ("deerflow_web.services.upload_turn", "flask"),
        ("deerflow_web.services.upload_listing", "langchain_core"),
        ("deerflow_web.services.upload_listing", "flask"),
        ("deerflow_web.services.chat_preview", "flask"),
        ("deerflow_web.services.chat_preview", "langchain_core"),
        ("deerflow_web.storage.previews", "flask"),
        ("deerflow_web.web.chat", "deerflow_web.agent"),
        ("deerflow_web.web.chat", "langchain_core"),
        ("deerflow_web.services.accounts.service", "flask"),
        ("deerflow_web.services.accounts.owners", "flask"),
        ("deerflow_web.services.accounts.adopt", "flask"),
        ("deerflow_web.storage.database", "flask"),
        ("deerflow_web.agent.tools", "sqlalchemy"),
    ],
)
def test_module_does_not_import(module: str, forbidden: str) -> None:
    assert _loaded_after_import(module, (forbidden,)) == []


def test_no_web_module_imports_the_agent_side() -> None:
    """`deerflow_web.web` loads its blueprints lazily, so walk every module of the package."""
    code = (
        "import sys, importlib, pkgutil, deerflow_web.web as web; "
        "[importlib.import_module(m.name) for m in pkgutil.walk_packages(web.__path__, "
        "'deerflow_web.web.')]; "
        "print(sorted(n for n in ('deerflow_web.agent', 'langchain_core') if n in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
