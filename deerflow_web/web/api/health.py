"""`/healthz` and `/readyz` for load balancers and process supervisors (SPEC D20).

Both are public and answer JSON whatever the client asks for: a probe has no session and
no language. `/healthz` only says the process serves requests; `/readyz` also checks the
records database, the data dir and on the S3 backend the bucket (`bucket`: `off` on the
local disk, `ok`, `failed`), and answers 503 naming what failed; it also reports the
virus scanner (`off`, `ok`, `failed`) and whether this instance runs the background jobs
(`jobs`: `on`, or `off` with `jobs.run_in_web: false`).
"""

from __future__ import annotations

from flask import Blueprint
from flask.typing import ResponseReturnValue

from deerflow_web.services.health import FAILED
from deerflow_web.services.health import check_readiness
from deerflow_web.services.health import scanner_state
from deerflow_web.web.marks import probe
from deerflow_web.web.wiring import get_services

bp = Blueprint("health", __name__)

NO_STORE = {"Cache-Control": "no-store"}


@bp.get("/healthz")
@probe
def healthz() -> ResponseReturnValue:
    """The process is up and answering."""
    return {"status": "ok"}, 200, NO_STORE


@bp.get("/readyz")
@probe
def readyz() -> ResponseReturnValue:
    """Ready when the records database answers, the data dir takes a file and (on S3)
    the bucket answers."""
    services = get_services()
    copies = services.uploads.paths.copies
    # On S3 the store is an S3ObjectStore, whose `ping` is one HeadBucket.
    ping_bucket = getattr(copies.store, "ping", None) if copies is not None else None
    # Not ready either while start-up still waits for the database (web/startup.py).
    readiness = check_readiness(
        services.ping_database, services.uploads.paths.base_dir, ping_bucket
    )
    body: dict[str, str] = {
        "status": "ok" if readiness.ready else "unavailable",
        "database": readiness.database,
        "storage": readiness.storage,
        "bucket": readiness.bucket,
    }
    problems = list(readiness.problems)
    # The scanner is reported, and does not take the instance out of rotation: every
    # instance shares it, and listing and downloading work without it (uploads are
    # refused one by one with 503 while it is down, unless accepted unscanned).
    body["scanner"] = scanner_state(services.scanner)
    # `off`: this instance runs no conversions, rescans or sweeps (`jobs.run_in_web`);
    # workers must, or jobs stay queued. Reported, never a reason to leave rotation.
    body["jobs"] = "on" if services.conversions.runs_jobs else "off"
    if body["scanner"] == FAILED:
        problems.append("scanner: clamd does not answer; uploads are refused (fail-closed)")
        if readiness.ready:
            body["status"] = "degraded"
    if problems:
        body["detail"] = "; ".join(problems)
    return body, 200 if readiness.ready else 503, NO_STORE
