"""OCR speed, memory and quality through the real, isolated conversion worker.

Run it with `make bench-ocr` (or `.venv/bin/python bench/bench_ocr.py [--rounds N]`). It
generates, in a temporary folder, a text PDF, a scanned PDF (pages that are images only),
a PDF mixing both, a multi-page fax TIFF, a PNG screenshot and a JPEG photo of text
(tests/support/images.py),
converts each with `convert_to_markdown` under the default limits, and prints per file:
the wall-clock seconds of the whole conversion (what a user waits: starting Python, loading
the parsers and the models, then the pages), the worker's CPU seconds, its OCR seconds per
page as the worker timed them, its peak resident memory, and the characters OCR read right
out of those drawn. Seconds per text-layer page come from a 41-page text PDF against the
1-page one (the fixed cost cancels). Medians over the rounds. Takes one to three minutes.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT))  # the generators live with the tests

from deerflow_web.services.conversion.runner import convert_to_markdown  # noqa: E402
from deerflow_web.settings import ConversionSettings  # noqa: E402
from tests.support import documents  # noqa: E402
from tests.support import images  # noqa: E402

_MARKER = re.compile(r"^<!-- (page \d+ of \d+|image): .* -->$", re.MULTILINE)
Maker = Callable[[Path], Path]

# (label, file name, maker, the text drawn in it for the quality column, or None)
CASES: tuple[tuple[str, str, Maker, str | None], ...] = (
    ("text PDF, 1 page", "text1.pdf", lambda p: documents.make_pdf(p), None),
    ("text PDF, 41 pages", "text41.pdf", lambda p: documents.make_pdf(p, filler_pages=40), None),
    (
        "scanned PDF, 2 pages",
        "scan.pdf",
        images.make_scanned_pdf,
        "\n".join("\n".join(page) for page in images.SCAN_PAGES),
    ),
    (
        "mixed PDF, 3 pages (1 scanned)",
        "mixed.pdf",
        images.make_mixed_pdf,
        None,
    ),
    (
        "fax TIFF, 3 pages (1-bit, Group 4)",
        "fax.tif",
        images.make_fax_tiff,
        "\n".join("\n".join(page) for page in images.FAX_PAGES),
    ),
    ("PNG screenshot", "shot.png", images.make_text_png, "\n".join(images.SCREENSHOT_LINES)),
    ("JPEG photo", "photo.jpg", images.make_photo_jpeg, "\n".join(images.PHOTO_LINES)),
)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _ocr_text(markdown: str) -> str:
    return _MARKER.sub("", markdown)


def main() -> int:
    """Generate, convert and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    settings = ConversionSettings()
    print(
        f"limits: {settings.timeout_seconds:g} s wall, {settings.cpu_limit_seconds:g} s CPU, "
        f"{settings.memory_limit_mb} MB; {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}; Python {sys.version.split()[0]}; {args.rounds} round(s)"
    )
    rows: dict[str, dict[str, list[float]]] = {}
    quality: dict[str, tuple[int, int]] = {}
    with tempfile.TemporaryDirectory(prefix="deerflow-bench-ocr-") as folder:
        for _ in range(args.rounds):
            for label, name, maker, drawn in CASES:
                source = maker(Path(folder) / name)
                destination = source.with_name(source.name + ".md")
                cpu = _children_cpu()
                started = time.monotonic()
                result = convert_to_markdown(
                    source,
                    destination,
                    timeout_seconds=settings.timeout_seconds,
                    memory_limit_mb=settings.memory_limit_mb,
                    cpu_limit_seconds=settings.cpu_limit_seconds,
                )
                row = rows.setdefault(
                    label, {"wall": [], "cpu": [], "ocr": [], "ocr_cpu": [], "rss": []}
                )
                row["wall"].append(time.monotonic() - started)
                row["cpu"].append(_children_cpu() - cpu)
                row["ocr"].extend(result.ocr_seconds)
                row["ocr_cpu"].extend(result.ocr_cpu_seconds)
                row["rss"].append(result.peak_rss_mb or 0.0)
                row.setdefault("pages", []).append(float(result.pages or 0))
                if drawn is not None:
                    quality[label] = images.character_accuracy(
                        drawn, _ocr_text(destination.read_text(encoding="utf-8"))
                    )
    header = (
        "file",
        "pages",
        "wall s",
        "worker CPU s",
        "OCR s/page",
        "OCR CPU s/page",
        "peak RSS MB",
        "OCR chars",
    )
    widths = (32, 5, 7, 12, 10, 14, 11, 10)
    print("  ".join(title.rjust(width) for title, width in zip(header, widths, strict=True)))
    for label, row in rows.items():
        ocr = f"{statistics.median(row['ocr']):.2f}" if row["ocr"] else "-"
        ocr_cpu = f"{statistics.median(row['ocr_cpu']):.2f}" if row["ocr_cpu"] else "-"
        right, total = quality.get(label, (0, 0))
        cells = (
            label,
            f"{statistics.median(row['pages']):.0f}",
            f"{statistics.median(row['wall']):.2f}",
            f"{statistics.median(row['cpu']):.2f}",
            ocr,
            ocr_cpu,
            f"{max(row['rss']):.0f}",
            f"{right}/{total}" if total else "-",
        )
        print("  ".join(cell.rjust(width) for cell, width in zip(cells, widths, strict=True)))
    one, many = rows["text PDF, 1 page"], rows["text PDF, 41 pages"]
    per_page = (statistics.median(many["wall"]) - statistics.median(one["wall"])) / 40
    per_page_cpu = (statistics.median(many["cpu"]) - statistics.median(one["cpu"])) / 40
    print(f"text-layer page: {per_page:.3f} s wall, {per_page_cpu:.3f} s CPU (41 pages vs 1)")
    for what, labels in (
        ("scanned page", ("scanned PDF, 2 pages", "mixed PDF, 3 pages (1 scanned)")),
        ("photo", ("JPEG photo",)),
        ("screenshot", ("PNG screenshot",)),
    ):
        wall = [value for label in labels for value in rows[label]["ocr"]]
        cpu = [value for label in labels for value in rows[label]["ocr_cpu"]]
        print(
            f"{what}: {statistics.median(wall):.2f} s OCR wall, {statistics.median(cpu):.2f} s "
            f"CPU (median of {len(wall)})"
        )
    print(f"peak RSS of any worker: {max(max(row['rss']) for row in rows.values()):.0f} MB")
    right = sum(pair[0] for pair in quality.values())
    total = sum(pair[1] for pair in quality.values())
    print(f"OCR quality: {right}/{total} characters right ({right / total:.1%}), spaces ignored")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
