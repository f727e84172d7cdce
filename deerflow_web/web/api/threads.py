"""Thread records as DeerFlow's gateway answers them (`/api/threads`): thin views over the
thread catalog.

Create, search, read, merge metadata into, and delete the caller's threads, with
DeerFlow's request and answer shapes: a thread is `{"thread_id", "status": "idle",
"created_at", "updated_at", "metadata", "values", "interrupts"}`, times in ISO 8601 UTC,
the title in `values.title`. Runs, state and history are an agent server's business, not
this app's: those routes do not exist here and answer 404. As an addition, a create or a
PATCH may carry `{"values": {"title": ...}}` to set the title (DeerFlow's own UI renames
through the state route).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC
from datetime import datetime
from typing import Any

from flask import Blueprint
from flask import request
from flask.typing import ResponseReturnValue

from deerflow_web.errors import InvalidInput
from deerflow_web.errors import InvalidThreadId
from deerflow_web.models import validate_thread_id
from deerflow_web.services.threads.catalog import SEARCH_MAX_LIMIT
from deerflow_web.services.threads.catalog import ThreadCatalog
from deerflow_web.services.threads.catalog import ThreadRecord
from deerflow_web.services.threads.catalog import clean_filter
from deerflow_web.services.threads.catalog import clean_metadata
from deerflow_web.services.threads.catalog import clean_title
from deerflow_web.web.thread_access import current_thread
from deerflow_web.web.wiring import current_owner
from deerflow_web.web.wiring import get_services

bp = Blueprint("threads_api", __name__)

BODY_LIMIT = 256 * 1024  # a thread's metadata is small; larger bodies are refused (413)


@bp.before_request
def limit_body() -> None:
    """Thread records are small JSON objects: refuse a large body before reading it."""
    request.max_content_length = BODY_LIMIT


def _catalog() -> ThreadCatalog:
    return get_services().threads


def _iso(stamp: float) -> str:
    """DeerFlow's timestamps: ISO 8601 in UTC, e.g. `2026-04-27T03:19:46.511479+00:00`."""
    return datetime.fromtimestamp(stamp, UTC).isoformat()


def thread_answer(record: ThreadRecord) -> dict[str, Any]:
    """DeerFlow's ThreadResponse for one record."""
    return {
        "thread_id": record.thread_id,
        "status": "idle",  # no runs here: a thread is never busy
        "created_at": _iso(record.created_at),
        "updated_at": _iso(record.updated_at),
        "metadata": dict(record.metadata),
        "values": {"title": record.title} if record.title else {},
        "interrupts": {},
    }


def _body() -> Mapping[str, Any]:
    """The JSON object sent (an empty body is an empty object); 422 for anything else."""
    if not request.get_data(cache=True):
        return {}
    body = request.get_json(force=True)  # a malformed body is answered 400
    if not isinstance(body, Mapping):
        raise InvalidInput("Input should be a valid dictionary", ("body",), body)
    return body


def _title(body: Mapping[str, Any]) -> tuple[bool, str | None]:
    """(whether the body sets a title, the title) from `values.title`."""
    values = body.get("values")
    if values is None:
        return False, None
    if not isinstance(values, Mapping):
        raise InvalidInput("Input should be a valid dictionary", ("body", "values"), values)
    if "title" not in values:
        return False, None
    return True, clean_title(values["title"], ("body", "values", "title"))


def _bounded_int(body: Mapping[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = body.get(name, default)
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 5.0 is an integer to JSON Schema, and to DeerFlow's pydantic
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput("Input should be a valid integer", ("body", name), value)
    if value < low:
        raise InvalidInput(f"Input should be greater than or equal to {low}", ("body", name), value)
    if value > high:
        raise InvalidInput(f"Input should be less than or equal to {high}", ("body", name), value)
    return value


@bp.post("/threads")
def create_thread() -> ResponseReturnValue:
    """Create a thread (a new UUID unless `thread_id` is given); an id the caller already
    has answers its record unchanged, as DeerFlow's create does."""
    body = _body()
    thread_id = body.get("thread_id")
    if thread_id is not None:
        try:
            validate_thread_id(thread_id)
        except InvalidThreadId as error:  # DeerFlow's message, located in the body
            raise InvalidInput(str(error), ("body", "thread_id"), thread_id) from None
    metadata = clean_metadata(body.get("metadata"), ("body", "metadata"))
    _sets_title, title = _title(body)
    record, _created = _catalog().create(current_owner(), thread_id, title=title, metadata=metadata)
    return thread_answer(record)


@bp.post("/threads/search")
def search_threads() -> ResponseReturnValue:
    """The caller's threads matching every `metadata` pair, most recently updated first."""
    body = _body()
    wanted = clean_filter(body.get("metadata"), ("body", "metadata"))
    limit = _bounded_int(body, "limit", 100, 1, SEARCH_MAX_LIMIT)
    offset = _bounded_int(body, "offset", 0, 0, 2**63 - 1)
    status = body.get("status")
    if status is not None and not isinstance(status, str):
        raise InvalidInput("Input should be a valid string", ("body", "status"), status)
    if status is not None and status != "idle":
        return []  # every thread here is idle
    records = _catalog().search(current_owner(), metadata=wanted, limit=limit, offset=offset)
    return [thread_answer(record) for record in records]


@bp.get("/threads/<thread_id>")
def get_thread() -> ResponseReturnValue:
    """One of the caller's threads."""
    return thread_answer(_catalog().get(current_thread()))


@bp.patch("/threads/<thread_id>")
def patch_thread() -> ResponseReturnValue:
    """Merge `metadata` into the thread's (and set the title given in `values.title`)."""
    body = _body()
    metadata = clean_metadata(body.get("metadata"), ("body", "metadata"))
    sets_title, title = _title(body)
    record = _catalog().update(
        current_thread(), metadata=metadata, title=title, set_title=sets_title
    )
    return thread_answer(record)


@bp.delete("/threads/<thread_id>")
def delete_thread() -> ResponseReturnValue:
    """Delete the thread with its files, upload records and unfinished uploads."""
    thread = current_thread()
    _catalog().delete(thread)
    return {"success": True, "message": f"Deleted local thread data for {thread.thread_id}"}
