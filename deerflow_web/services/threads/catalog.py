"""Each user's thread records: which threads exist, their titles and metadata.

A thread of a user exists when it has a row here or a folder in that user's layout (an
agent's sandbox, or the release before this one, may have made the folder): a folder
without a row is adopted into a row the first time the threads are listed or one is
read. Only a successful create makes a thread: a committed upload or a resumable upload's
creation (they make the folder), "New thread" and `POST /api/threads` (row and folders).
A request that fails leaves neither. Keys are (user id, thread id); the single-user
layout's threads have the user id "" (`NO_ACCOUNT`).
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from functools import partial
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Engine
from sqlalchemy import delete
from sqlalchemy import insert
from sqlalchemy import select
from sqlalchemy import update
from sqlalchemy.exc import IntegrityError

from deerflow_web.errors import InvalidInput
from deerflow_web.errors import ThreadNotFound
from deerflow_web.errors import UnsafeFolder
from deerflow_web.models import SINGLE_USER
from deerflow_web.models import Area
from deerflow_web.models import ThreadRef
from deerflow_web.services.prompt.chat_preview import ChatPreviewService
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.storage.database import insert_missing_threads
from deerflow_web.storage.database import resumable_uploads
from deerflow_web.storage.database import threads
from deerflow_web.storage.database import write_transaction
from deerflow_web.storage.history import delete_scope
from deerflow_web.storage.paths import Thread
from deerflow_web.storage.paths import ref_of

NO_ACCOUNT = SINGLE_USER  # the user id of the single-user layout's threads
TITLE_MAX_CHARS = 256
NUMBER_MIN, NUMBER_MAX = -(2**63), 2**63 - 1  # what a metadata number may be
SEARCH_MAX_LIMIT = 1000
# Keys the server owns: a client cannot set them (DeerFlow strips the same two).
RESERVED_METADATA_KEYS = frozenset({"owner_id", "user_id"})
# What a metadata filter may name and compare with (DeerFlow's rule: the key is safe in a
# JSON path, the value a scalar).
_FILTER_KEY = re.compile(r"[A-Za-z0-9_-]+")
_FILTER_VALUE_TYPES = (str, int, float, bool, type(None))


@dataclass(frozen=True)
class ThreadRecord:
    """One thread of one user, as the API and the index show it."""

    thread_id: str
    title: str | None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    updated_at: float = 0.0


def _record(row: Any) -> ThreadRecord:
    return ThreadRecord(
        thread_id=row.thread_id,
        title=row.title,
        metadata=orjson.loads(row.metadata),
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def folder_time(paths: Any, ref: ThreadRef) -> float:
    """The newest mtime among the thread folder and its user-data areas (0 when none).

    A folder that is a link is left out (never followed), so one planted link does not
    take a whole listing down; the thread's own pages refuse it with a clear error.
    """
    folders: list[Callable[[], Path]] = [lambda: paths.thread_dir(ref)]
    folders.extend(partial(paths.area_dir, ref, area) for area in Area)
    times = []
    for folder in folders:
        try:
            times.append(os.stat(folder(), follow_symlinks=False).st_mtime)
        except (OSError, UnsafeFolder):
            continue
    return max(times, default=0.0)


def clean_metadata(value: object, location: tuple[str, ...]) -> dict[str, Any]:
    """A client's metadata object without the server's keys; 422 for anything else.

    It must also be JSON the answers can carry back: integers within 64 bits and nesting
    within the encoder's depth (DeerFlow's JSON columns refuse more too).
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInput("Input should be a valid dictionary", location, value)
    cleaned = {str(k): v for k, v in value.items() if k not in RESERVED_METADATA_KEYS}
    try:
        _check_numbers(cleaned)
        _encode(cleaned)
    except (TypeError, ValueError) as error:
        raise InvalidInput(f"Value error, metadata cannot be stored: {error}", location) from None
    return cleaned


def _check_numbers(value: object) -> None:
    """Numbers within the signed 64-bit range, as openapi.yaml states (ValueError if not)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, int | float) and not isinstance(item, bool):
            if not NUMBER_MIN <= item <= NUMBER_MAX:
                raise ValueError(f"{item} is outside the signed 64-bit range")


def _encode(metadata: Mapping[str, Any]) -> str:
    """The stored form of a metadata object (orjson, as the answers are encoded)."""
    return orjson.dumps(metadata).decode()


def clean_title(value: object, location: tuple[str, ...]) -> str | None:
    """A title: text up to 256 characters, surrounding space removed; empty means none."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput("Input should be a valid string", location, value)
    if len(value) > TITLE_MAX_CHARS:
        raise InvalidInput(
            f"String should have at most {TITLE_MAX_CHARS} characters", location, value
        )
    return " ".join(value.split()) or None  # one line: line breaks and tabs become spaces


def clean_filter(value: object, location: tuple[str, ...]) -> dict[str, Any]:
    """A metadata filter of exact matches: safe keys, scalar values (DeerFlow's rule)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInput("Input should be a valid dictionary", location, value)
    bad = [
        f"{key!r} (unsafe key)"
        if not (isinstance(key, str) and _FILTER_KEY.fullmatch(key))
        else f"{key!r} (unsupported value type {type(item).__name__})"
        for key, item in value.items()
        if not (isinstance(key, str) and _FILTER_KEY.fullmatch(key))
        or not isinstance(item, _FILTER_VALUE_TYPES)
    ]
    if bad:
        raise InvalidInput(
            f"Value error, Invalid metadata filter entries: {', '.join(bad)}", location, value
        )
    return dict(value)


def _matches(record: ThreadRecord, wanted: Mapping[str, Any], query: str) -> bool:
    for key, value in wanted.items():
        if key not in record.metadata:
            return False
        actual = record.metadata[key]
        # JSON's true is not 1: compare types as DeerFlow's JSON filter does
        if isinstance(actual, bool) != isinstance(value, bool) or actual != value:
            return False
    if query:
        haystack = f"{record.title or ''}\n{record.thread_id}".casefold()
        return query.casefold() in haystack
    return True


class ThreadCatalog:
    """The `threads` table and the folders it describes, one user at a time."""

    def __init__(self, uploads: UploadService, previews: ChatPreviewService) -> None:
        self.engine: Engine = uploads.records.engine
        self.paths = uploads.paths
        self._uploads = uploads
        self._previews = previews
        self._clock: Callable[[], float] = time.time

    # --- reading --------------------------------------------------------------------

    def _row(self, ref: ThreadRef) -> ThreadRecord | None:
        with self.engine.connect() as db:
            row = db.execute(
                select(threads).where(
                    threads.c.user_id == ref.user_id, threads.c.thread_id == ref.thread_id
                )
            ).one_or_none()
        return None if row is None else _record(row)

    def _has_folder(self, thread: Thread) -> bool:
        if self._uploads.paths.copies is not None:
            # On the S3 backend a folder is one instance's copy; the database alone says
            # which threads exist (an upload makes the row: `UploadService._commit`).
            return False
        return self._uploads.folders(thread).thread_dir().is_dir()  # a link is refused

    def exists(self, thread: Thread) -> bool:
        """Whether the owner has this thread (a row, or a folder in their layout)."""
        # The folder first: most threads have one, and a few stat calls cost less than a query.
        return self._has_folder(thread) or self._row(ref_of(thread)) is not None

    def find(self, thread: Thread) -> ThreadRecord | None:
        """The owner's thread, or None; a folder without a row is adopted first."""
        ref = ref_of(thread)
        record = self._row(ref)
        if record is not None or not self._has_folder(thread):
            return record
        self._adopt_folders(ref.user_id, [ref.thread_id])
        return self._row(ref)  # None when deleted between the two reads

    def get(self, thread: Thread) -> ThreadRecord:
        """The owner's thread (see `find`).

        Raises:
            ThreadNotFound: The owner has no such thread (whoever else may have one).
        """
        record = self.find(thread)
        if record is None:
            raise ThreadNotFound(ref_of(thread).thread_id)
        return record

    def _rows(self, user_id: str) -> list[ThreadRecord]:
        with self.engine.connect() as db:
            rows = db.execute(select(threads).where(threads.c.user_id == user_id)).all()
        return [_record(row) for row in rows]

    def all(self, user_id: str) -> list[ThreadRecord]:
        """Every thread of the user (folders adopted), most recently updated first."""
        records = self._rows(user_id)
        known = {record.thread_id for record in records}
        if self._uploads.paths.copies is not None:
            missing = []  # folders are copies there (see `_has_folder`)
        else:
            missing = [t for t in self.paths.iter_thread_ids(user_id) if t not in known]
        if missing:
            self._adopt_folders(user_id, missing)
            records = self._rows(user_id)
        records.sort(key=lambda r: r.thread_id, reverse=True)
        records.sort(key=lambda r: r.updated_at, reverse=True)
        return records

    def search(
        self,
        user_id: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        query: str = "",
        limit: int | None = 100,
        offset: int = 0,
    ) -> list[ThreadRecord]:
        """The user's threads whose metadata holds every pair of `metadata` and whose title
        or id contains `query` (any case), most recently updated first."""
        wanted = dict(metadata or {})
        found = [r for r in self.all(user_id) if _matches(r, wanted, query.strip())]
        return found[offset:] if limit is None else found[offset : offset + limit]

    # --- writing --------------------------------------------------------------------

    def _adopt_folders(self, user_id: str, thread_ids: Iterable[str]) -> None:
        """Rows for folders made without one, dated by the folder, in one transaction (the
        first listing after an upgrade may find many); a row made meanwhile by another
        request is kept as it is."""
        values = []
        for thread_id in thread_ids:
            stamp = folder_time(self.paths, ThreadRef(thread_id, user_id)) or self._clock()
            values.append(
                {
                    "user_id": user_id,
                    "thread_id": thread_id,
                    "title": None,
                    "metadata": "{}",
                    "created_at": stamp,
                    "updated_at": stamp,
                }
            )
        if not values:
            return
        with write_transaction(self.engine) as db:
            insert_missing_threads(db, values)

    def _insert(self, user_id: str, record: ThreadRecord) -> bool:
        """Insert a row; False when the user already has the thread (same key)."""
        try:
            with write_transaction(self.engine) as db:
                db.execute(
                    insert(threads).values(
                        user_id=user_id,
                        thread_id=record.thread_id,
                        title=record.title,
                        metadata=_encode(record.metadata),
                        created_at=record.created_at,
                        updated_at=record.updated_at,
                    )
                )
        except IntegrityError:
            return False
        return True

    def create(
        self,
        user_id: str,
        thread_id: str | None = None,
        *,
        title: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> tuple[ThreadRecord, bool]:
        """Make a thread (a UUID when no id is given) with its row and folders.

        Idempotent as DeerFlow's create is: for an id the user already has, the existing
        record comes back unchanged, with False. When the folders cannot be made, the row
        is removed again: a create that fails leaves nothing. `user_id` is the owner
        (`SINGLE_USER` with accounts off).
        """
        ref = ThreadRef(str(uuid.uuid4()) if thread_id is None else thread_id, user_id)
        if self.exists(ref):
            return self.get(ref), False
        now = self._clock()
        record = ThreadRecord(ref.thread_id, title, dict(metadata or {}), now, now)
        if not self._insert(user_id, record):  # created by a request racing this one
            return self.get(ref), False
        try:
            self.paths.ensure_thread_dirs(ref)
        except BaseException:
            self._delete_row(ref)
            raise
        return record, True

    def update(
        self,
        thread: Thread,
        *,
        metadata: Mapping[str, Any] | None = None,
        title: str | None = None,
        set_title: bool = False,
    ) -> ThreadRecord:
        """Merge `metadata` into the thread's (a key set to null is kept as null, as
        DeerFlow's merge does) and, when `set_title`, set its title (None: no title)."""
        ref = ref_of(thread)
        current = self.get(thread)
        merged = {**current.metadata, **(metadata or {})}
        values: dict[str, Any] = {
            "metadata": _encode(merged),
            "updated_at": max(self._clock(), current.updated_at),
        }
        if set_title:
            values["title"] = title
        with write_transaction(self.engine) as db:
            changed = db.execute(
                update(threads)
                .where(threads.c.user_id == ref.user_id, threads.c.thread_id == ref.thread_id)
                .values(**values)
            ).rowcount
        if not changed:  # deleted meanwhile
            raise ThreadNotFound(ref.thread_id)
        return self.get(thread)

    def _delete_row(self, ref: ThreadRef) -> None:
        with write_transaction(self.engine) as db:
            db.execute(
                delete(threads).where(
                    threads.c.user_id == ref.user_id, threads.c.thread_id == ref.thread_id
                )
            )

    def delete(self, thread: Thread) -> None:
        """Remove the thread with everything it holds: its folder (uploads, outputs,
        workspace, the history of versions and trash), upload records, history rows,
        unfinished resumable uploads and preview turns.

        The folder is first renamed out of the layout in one step, so from that moment
        the thread is gone for every reader, and a half-finished removal (a crash) never
        leaves a half-deleted thread behind, only a hidden folder to remove again.

        Raises:
            ThreadNotFound: The user has no such thread.
        """
        folders = self._uploads.folders(thread)
        ref = folders.ref
        if not self.exists(folders):
            raise ThreadNotFound(ref.thread_id)
        folder = folders.thread_dir()
        trash = folder.with_name(f".deleting-{ref.thread_id}-{uuid.uuid4().hex}")
        try:
            os.rename(folder, trash)
        except FileNotFoundError:
            trash = None
        with self._uploads.records.locked(folders.scope) as txn:
            for stored in txn.all():
                txn.delete(stored.record.filename)
            delete_scope(txn.connection, folders.scope)  # its versions and trash go with it
        self._previews.clear(ref)
        with write_transaction(self.engine) as db:
            condition = resumable_uploads.c.thread_id == ref.thread_id
            if ref.is_single_user:
                condition = condition & resumable_uploads.c.user_id.is_(None)
            else:
                condition = condition & (resumable_uploads.c.user_id == ref.user_id)
            db.execute(delete(resumable_uploads).where(condition))
            db.execute(
                delete(threads).where(
                    threads.c.user_id == ref.user_id, threads.c.thread_id == ref.thread_id
                )
            )
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)
        copies = self._uploads.paths.copies
        if copies is not None:  # no row names the thread's bytes any more
            copies.delete_thread(folders.scope)

    def adopt_flat(self, ref: ThreadRef) -> None:
        """Give a single-user layout thread's row (or a new one) to `ref`'s user (the
        folder has just moved into the user's layout)."""
        single = ThreadRef.single_user(ref.thread_id)
        flat = self._row(single)
        stamp = folder_time(self.paths, ref) or self._clock()
        record = flat or ThreadRecord(ref.thread_id, None, {}, stamp, stamp)
        self._insert(ref.user_id, record)
        if flat is not None:
            self._delete_row(single)
