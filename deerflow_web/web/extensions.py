"""Flask extensions, created unbound so the factory can attach them to any app."""

from __future__ import annotations

from flask_wtf.csrf import CSRFProtect

csrf = CSRFProtect()
