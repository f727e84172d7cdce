"""Server-rendered pages for people: the thread file manager."""

from __future__ import annotations

from flask import Blueprint
from flask import render_template

bp = Blueprint("pages", __name__)


@bp.get("/")
def index() -> str:
    """The threads index."""
    return render_template("pages/index.html")
