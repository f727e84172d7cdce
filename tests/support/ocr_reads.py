"""Reading a document through the real conversion worker, and judging what OCR read.

The OCR tests of images, scanned PDFs and multi-page TIFFs share these: one conversion
with the limits jobs use, the page markers it writes, and the accuracy floor.
"""

from __future__ import annotations

import re
from pathlib import Path

from deerflow_web.services.conversion.runner import convert_to_markdown
from tests.support.images import character_accuracy

MIN_ACCURACY = 0.9
_MARKER = re.compile(r"^<!-- page (\d+) of (\d+): (.*) -->$", re.MULTILINE)


def convert(source: Path) -> str:
    """Convert in the real worker, with the limits jobs use, and return the Markdown."""
    destination = source.with_name(source.name + ".md")
    convert_to_markdown(
        source, destination, timeout_seconds=240, memory_limit_mb=2048, cpu_limit_seconds=120
    )
    return destination.read_text(encoding="utf-8")


def pages_of(markdown: str) -> dict[int, tuple[str, str]]:
    """Page number -> (how it was read, its text), from the markers."""
    found = list(_MARKER.finditer(markdown))
    pages = {}
    for index, match in enumerate(found):
        end = found[index + 1].start() if index + 1 < len(found) else len(markdown)
        pages[int(match[1])] = (match[3], markdown[match.end() : end].strip())
    return pages


def assert_reads(expected: tuple[str, ...], found: str, what: str) -> None:
    """At least `MIN_ACCURACY` of the expected characters were read (printed with `-s`)."""
    right, total = character_accuracy("\n".join(expected), found)
    print(f"{what}: {right}/{total} characters right")
    assert right / total >= MIN_ACCURACY, (what, found)
