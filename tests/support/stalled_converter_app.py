"""`flask --app tests.support.stalled_converter_app worker`: the app of `app.py` whose
conversions start a real, limited converter process (runner.py) that never finishes, so a
test can kill a worker in the middle of a conversion at a moment it chooses."""

from __future__ import annotations

import functools
import sys

from app import app
from deerflow_web.services.conversion.runner import convert_to_markdown
from deerflow_web.web.wiring import EXTENSION_KEY

# Takes the worker protocol's arguments and ignores them; the time limit still applies.
STALLED = (sys.executable, "-c", "import time; time.sleep(3600)")

app.extensions[EXTENSION_KEY].conversions.converter = functools.partial(
    convert_to_markdown, worker_command=STALLED
)
