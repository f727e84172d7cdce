"""Compiled templates shared by every app of a test run, instead of compiled once per app.

Every app the suite builds (about one per test) has a Jinja environment of its own, and
the first render of each template parses it and compiles it to Python: half the time of
the file-manager page tests (measured: 20 s of 40 s in tests/web/files/test_pages.py).
All those environments are configured alike by `create_app` (Flask's autoescaping,
Flask-Babel's i18n extension), so the code compiled for one serves all: Jinja's own
bytecode cache hands it over, keyed by template name and checked against a checksum of the
source, so a changed template is compiled afresh.
"""

from __future__ import annotations

from flask import Flask
from jinja2 import BytecodeCache
from jinja2.bccache import Bucket


class InMemoryBytecodeCache(BytecodeCache):
    """Jinja's compiled templates, kept in this process's memory."""

    def __init__(self) -> None:
        self._compiled: dict[str, bytes] = {}

    def load_bytecode(self, bucket: Bucket) -> None:
        compiled = self._compiled.get(bucket.key)
        if compiled is not None:
            bucket.bytecode_from_string(compiled)  # ignored if the source's checksum differs

    def dump_bytecode(self, bucket: Bucket) -> None:
        self._compiled[bucket.key] = bucket.bytecode_to_string()

    def clear(self) -> None:
        self._compiled.clear()


def install() -> None:
    """Give every Flask app made from here on the one cache (`Flask.jinja_options`)."""
    Flask.jinja_options = {**Flask.jinja_options, "bytecode_cache": InMemoryBytecodeCache()}
