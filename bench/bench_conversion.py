"""Time document → Markdown conversion through the real, isolated worker.

Run it with `.venv/bin/python bench/bench_conversion.py`. It generates .docx, .xlsx, .pptx and
.pdf files of a few sizes in a temporary folder (nothing is written into the repository),
converts each with `convert_to_markdown` under the default limits, and prints one row per
file: input size, seconds, seconds per MB and the worker's peak resident memory. The "tiny"
row is the fixed cost of every conversion (starting Python and loading markitdown), which
dominates small files. Takes about a minute.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from deerflow_web.services.conversion.runner import convert_to_markdown
from deerflow_web.settings import ConversionSettings

PROJECT_ROOT = Path(__file__).resolve().parents[1]

# (label, file name, maker in tests/documents.py, its size arguments)
CASES: tuple[tuple[str, str, str, dict[str, Any]], ...] = (
    ("docx tiny", "tiny.docx", "make_docx", {}),
    ("docx", "small.docx", "make_docx", {"filler_paragraphs": 100}),
    ("docx", "large.docx", "make_docx", {"filler_paragraphs": 3000}),
    ("xlsx", "small.xlsx", "make_xlsx", {"filler_rows": 1500}),
    ("xlsx", "large.xlsx", "make_xlsx", {"filler_rows": 25000}),
    ("pptx", "small.pptx", "make_pptx", {"filler_slides": 40}),
    ("pptx", "large.pptx", "make_pptx", {"filler_slides": 1000}),
    ("pdf 11 pages", "small.pdf", "make_pdf", {"filler_pages": 10}),
    ("pdf 101 pages", "large.pdf", "make_pdf", {"filler_pages": 100}),
)
HEADER = ("type", "input MB", "output chars", "seconds", "s per MB", "peak RSS MB")


def main() -> int:
    """Generate, convert and print the table."""
    sys.path.insert(0, str(PROJECT_ROOT))  # the generators live with the tests
    from tests.support import documents

    settings = ConversionSettings()
    started = time.monotonic()
    print(
        f"limits: {settings.timeout_seconds:g} s, {settings.memory_limit_mb} MB; "
        f"Python {sys.version.split()[0]}"
    )
    print("  ".join(f"{title:>13}" for title in HEADER))
    with tempfile.TemporaryDirectory(prefix="deerflow-bench-") as folder:
        for label, name, maker, arguments in CASES:
            source = getattr(documents, maker)(Path(folder) / name, **arguments)
            megabytes = source.stat().st_size / 1_000_000
            result = convert_to_markdown(
                source,
                source.with_suffix(".md"),
                timeout_seconds=settings.timeout_seconds,
                memory_limit_mb=settings.memory_limit_mb,
            )
            peak = f"{result.peak_rss_mb:.0f}" if result.peak_rss_mb is not None else "?"
            row = (
                label,
                f"{megabytes:.3f}",
                f"{result.characters or 0:,}",
                f"{result.seconds:.2f}",
                f"{result.seconds / megabytes:.1f}",
                peak,
            )
            print("  ".join(f"{cell:>13}" for cell in row), flush=True)
    print(f"total {time.monotonic() - started:.0f} s (generation included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
