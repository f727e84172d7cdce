"""The API described: the OpenAPI document at /openapi.json and Swagger UI at /api/docs.

The document is a hand-written YAML file next to this module rather than one generated from
the views: the upload route streams its own multipart body and the artifact route sends
files, which generators describe poorly, and a plain file reads as the contract it is. The
test suite keeps it honest (every route documented, every response checked against it).

The file describes the server with accounts on. `build_document` fits it to one server's
settings: its `max_files`, and without accounts no account routes (but `/me` and
`/setup-status`, answered as DeerFlow's single-user mode does), no security requirements
and no 401s, because such a server never asks for credentials.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml
from flask import Blueprint
from flask import render_template
from flask.typing import ResponseReturnValue

from deerflow_web.settings import Settings
from deerflow_web.web.marks import public
from deerflow_web.web.wiring import get_services

DOCUMENT_PATH = Path(__file__).with_name("openapi.yaml")
ACCOUNT_PATHS = ("/api/v1/auth/", "/api/v1/admin/")
SINGLE_USER_PATHS = frozenset({"/api/v1/auth/me", "/api/v1/auth/setup-status"})
HTTP_METHODS = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})

bp = Blueprint("api_docs", __name__)


@functools.cache
def _load(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as file:
        return yaml.safe_load(file)


def openapi_document() -> dict[str, Any]:
    """A fresh copy of the document as written (accounts on), parsed once per process."""
    return copy.deepcopy(_load(DOCUMENT_PATH))


def accounts_enabled(settings: Settings) -> bool:
    """Whether this server asks for a session or an API token."""
    auth = getattr(settings, "auth", None)
    return bool(auth is not None and auth.enabled)


def build_document(settings: Settings) -> dict[str, Any]:
    """The document as one server answers: its file limit, its accounts mode.

    Built once per pair of those and shared by every caller: read it, never change it."""
    return _fitted_document(settings.limits.max_files, accounts_enabled(settings))


@functools.lru_cache(maxsize=8)
def _fitted_document(max_files: int, accounts: bool) -> dict[str, Any]:
    document = openapi_document()
    upload = document["paths"]["/api/threads/{thread_id}/uploads"]["post"]
    form = upload["requestBody"]["content"]["multipart/form-data"]["schema"]
    form["properties"]["files"]["maxItems"] = max_files
    if not accounts:
        _without_accounts(document)
    _database_outages(document)
    return document


def _database_outages(document: dict[str, Any]) -> None:
    """Any operation may meet the database down for a moment (503 with Retry-After) or
    unable to grow on a full disk (507)."""
    for item in document["paths"].values():
        for method, operation in item.items():
            if method in HTTP_METHODS:
                operation["responses"].setdefault(
                    "503", {"$ref": "#/components/responses/DatabaseUnavailable"}
                )
                operation["responses"].setdefault(
                    "507", {"$ref": "#/components/responses/StorageFull"}
                )


def _without_accounts(document: dict[str, Any]) -> None:
    document.pop("security", None)
    document["components"].pop("securitySchemes", None)
    paths = document["paths"]
    for path in [path for path in paths if path.startswith(ACCOUNT_PATHS)]:
        if path not in SINGLE_USER_PATHS:
            del paths[path]  # the account routes exist only with accounts on
    me = paths["/api/v1/auth/me"]["get"]
    me["summary"] = "The single local user (DeerFlow's `default@test.local`)"
    me["responses"].pop("403", None)
    for item in paths.values():
        for method, operation in item.items():
            if method in HTTP_METHODS:
                operation.pop("security", None)
                operation["responses"].pop("401", None)


@bp.get("/openapi.json")
@public
def openapi_json() -> ResponseReturnValue:
    """Serve the API's OpenAPI 3.1 description as this server answers."""
    return build_document(get_services().settings)


@bp.get("/api/docs")
@public
def api_docs() -> str:
    """Show the API description in Swagger UI, served from this app's own static files."""
    return render_template("pages/api_docs.html")
