"""How long does preparing a picture for a vision model take, and what does it weigh?

Encodes generated pictures the way the uploads middleware and `view_image` do
(`services/prompt/images.py`: decode, EXIF rotation, shrink to the max edge, re-encode
without metadata) and prints the median CPU time of this process (steadier than the wall
clock on a shared machine) and the size of the block's bytes. A 12 MP camera JPEG is also
decoded at full scale and with the JPEG draft mode (decoding at 1/2..1/8 scale, which the
encoder uses), to show what the draft saves in the same run.

    .venv/bin/python bench/bench_images.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from PIL import Image  # noqa: E402
from PIL import ImageFilter  # noqa: E402

from deerflow_web.models import ImageLimits  # noqa: E402
from deerflow_web.services.prompt.images import encode_image_bytes  # noqa: E402


def camera_jpeg(width: int, height: int) -> bytes:
    """A photo-like JPEG (noise blurred into texture) with an EXIF orientation."""
    noise = Image.effect_noise((width // 8, height // 8), 60).resize((width, height))
    image = Image.merge("RGB", (noise, noise.rotate(180), noise.transpose(0)))
    image = image.filter(ImageFilter.GaussianBlur(2))
    exif = Image.Exif()
    exif[0x0112] = 6
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=90, exif=exif.tobytes())
    return out.getvalue()


def screenshot_png(width: int, height: int) -> bytes:
    """A screenshot-like PNG: flat areas and sharp edges, with transparency."""
    image = Image.new("RGBA", (width, height), (250, 250, 250, 255))
    for row in range(0, height, 40):
        image.paste((30, 60, 120, 255), (40, row + 10, width - 40, row + 24))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def measure(work: Callable[[], Any], rounds: int) -> float:
    """Median CPU seconds of this process over `rounds` runs."""
    times = []
    for _ in range(rounds):
        started = time.process_time()
        work()
        times.append(time.process_time() - started)
    return statistics.median(times)


def decode(data: bytes, *, draft: bool) -> tuple[int, int]:
    """Decode a JPEG at full scale, or at the smallest scale that still covers the edge."""
    image = Image.open(io.BytesIO(data))
    if draft:
        image.draft("RGB", (1568, 1176))  # what the encoder asks for a 4:3 picture
    image.load()
    return image.size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    limits = ImageLimits()
    cases = {
        "camera JPEG 4000x3000": camera_jpeg(4000, 3000),
        "camera JPEG 1600x1200": camera_jpeg(1600, 1200),
        "screenshot PNG 2880x1800": screenshot_png(2880, 1800),
    }
    print(f"max edge {limits.max_edge} px, median CPU time of {args.rounds} rounds")
    print(f"{'picture':28} {'in':>9} {'out':>9} {'size out':>12} {'CPU':>8}")
    for name, data in cases.items():
        encoded = encode_image_bytes(data, limits)
        seconds = measure(lambda data=data: encode_image_bytes(data, limits), args.rounds)
        print(
            f"{name:28} {len(data) / 1024:>7.0f}KB {len(encoded.data) / 1024:>7.0f}KB "
            f"{encoded.width:>5}x{encoded.height:<6} {seconds * 1000:>6.0f}ms"
        )
    big = cases["camera JPEG 4000x3000"]
    full = measure(lambda: decode(big, draft=False), args.rounds)
    drafted = measure(lambda: decode(big, draft=True), args.rounds)
    width, height = decode(big, draft=True)
    print(
        f"12 MP JPEG decode: full scale {full * 1000:.0f} ms (4000x3000, 34 MiB of RGB), "
        f"draft {drafted * 1000:.0f} ms ({width}x{height}, {width * height * 3 / 2**20:.0f} MiB);"
        f" ratio {drafted / full:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
