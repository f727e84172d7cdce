"""The core never drags in Flask; the web layer never drags in LangChain (STYLE R2)."""

from __future__ import annotations

import subprocess
import sys

import pytest


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
    ],
)
def test_module_does_not_import(module: str, forbidden: str) -> None:
    code = f"import sys, {module}; print({forbidden!r} in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
