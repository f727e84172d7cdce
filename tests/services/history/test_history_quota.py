"""Versions and the trash under a quota (issue 27): kept bytes are the owner's, so they
count; versions hold at most `versions.max_quota_share` of the quota; what the trash
purges or thinning drops is free again. Each test runs on SQLite and PostgreSQL."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from deerflow_web.errors import QuotaExceeded
from deerflow_web.models import IncomingFile
from deerflow_web.models import OnConflict
from deerflow_web.models import ThreadRef
from deerflow_web.services.history.hooks import make_history
from deerflow_web.services.quotas.policy import QuotaPolicy
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.services.uploads.service import make_upload_service
from deerflow_web.settings import HistorySettings
from deerflow_web.storage.history import history_bytes
from deerflow_web.storage.migrate import open_database

pytestmark = pytest.mark.same_in_both_modes  # services with an explicit owner

OWNER = "u1"
THREAD = ThreadRef("T", OWNER)


@pytest.fixture
def engine(base_dir: Path, database_url: str) -> Iterator[Engine]:
    engine = open_database(base_dir, database_url)
    yield engine
    engine.dispose()


def build(
    base_dir: Path, engine: Engine, quota: int, share: float = 1.0
) -> tuple[UploadService, QuotaPolicy]:
    policy = QuotaPolicy(engine, quota)
    service = make_upload_service(base_dir, engine=engine, quotas=policy)
    make_history(service, HistorySettings(max_quota_share=share), quotas=policy)
    return service, policy


def put(service: UploadService, name: str, body: bytes) -> None:
    service.save_uploads(
        THREAD, [IncomingFile(name, io.BytesIO(body))], on_conflict=OnConflict.REPLACE
    )


def test_versions_and_the_trash_count_until_they_are_gone(base_dir, engine) -> None:
    service, policy = build(base_dir, engine, quota=100)
    put(service, "a.txt", b"1" * 40)
    put(service, "a.txt", b"2" * 40)  # the first 40 bytes stay, as a version
    assert policy.usage(OWNER).bytes == 80
    with pytest.raises(QuotaExceeded):
        put(service, "b.txt", b"3" * 30)
    assert [r.filename for r in service.list_uploads(THREAD)] == ["a.txt"]

    service.delete_upload(THREAD, "a.txt")  # into the trash: still the owner's bytes
    assert policy.usage(OWNER).bytes == 80
    service.history.trash_bin.purge_expired_trash(now=float("inf"))  # expiry, as swept
    with engine.connect() as db:
        assert history_bytes(db, f"users/{OWNER}/threads/")[1] == 0
    assert policy.usage(OWNER).bytes == 40  # the version is left
    put(service, "b.txt", b"3" * 60)
    assert policy.usage(OWNER).bytes == 100


def test_versions_hold_at_most_their_share_of_the_quota(base_dir, engine) -> None:
    service, policy = build(base_dir, engine, quota=1000, share=0.5)
    for n in range(6):
        put(service, "a.txt", bytes([65 + n]) * 200)
    with engine.connect() as db:
        versions, trash = history_bytes(db, f"users/{OWNER}/threads/")
    assert versions <= 500 and trash == 0
    assert versions == 400  # the two newest of the five replaced bytes: all the budget holds
    assert policy.usage(OWNER).bytes == 200 + versions  # thinning's drops are free again
