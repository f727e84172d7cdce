"""The README's agent example runs as written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# Real processes, signed in: the mode changes only the gate, which tests/web covers in
# both modes; the single-user pass skips this module.
pytestmark = pytest.mark.same_in_both_modes


ROOT = Path(__file__).resolve().parents[2]


def test_agent_example_runs(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "examples/agent_with_uploads.py", "--data-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "<current_uploads>" in result.stdout
    assert "/mnt/user-data/uploads/notes.txt" in result.stdout
    assert "Revenue grew 12% in every region." in result.stdout  # read_file's answer
