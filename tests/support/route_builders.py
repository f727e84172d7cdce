"""Werkzeug's URL builders, compiled once per test run instead of once per app.

Every app the suite builds (about one per test) binds its ~70 URL rules, and Werkzeug
generates each rule's two URL-building functions by assembling a Python AST and compiling
it: three quarters of `make_app`'s CPU time (measured: 75 ms per app, of which about 55 ms
in `Rule._compile_builder`). The generated function depends only on the rule's parsed
parts, its defaults and whether unknown arguments are appended; it reads the rule's own
converters through its `self` argument at call time. So one function per such key serves
every app's equal rule, and URLs are built exactly as before.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from werkzeug.routing.rules import Rule

_ORIGINAL = Rule._compile_builder
_BUILT: dict[tuple, Callable[..., Any]] = {}


def _key(rule: Rule, append_unknown: bool) -> tuple:
    defaults = tuple(sorted((name, repr(value)) for name, value in (rule.defaults or {}).items()))
    return (rule.rule, append_unknown, tuple(rule._trace), defaults)


def _cached_builder(self: Rule, append_unknown: bool = True) -> Callable[..., Any]:
    key = _key(self, append_unknown)
    built = _BUILT.get(key)
    if built is None:
        built = _BUILT[key] = _ORIGINAL(self, append_unknown)
    return built


def install() -> bool:
    """Cache the builders, if this Werkzeug compiles them as the version this was written
    for did (`Rule._compile_builder(self, append_unknown=True)`); else leave it alone."""
    parameters = list(inspect.signature(_ORIGINAL).parameters)
    if parameters != ["self", "append_unknown"]:
        return False
    Rule._compile_builder = _cached_builder  # type: ignore[method-assign]
    return True
