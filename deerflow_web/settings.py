"""Settings from built-in defaults, an optional config.yaml and the environment (SPEC D2/D3, 1.8).

Plain Python, shared by the web app and the agent side: both must agree on where the data
lives and which limits apply, and neither may need Flask to find out.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from deerflow_web.errors import ConfigError
from deerflow_web.models import ImageLimits
from deerflow_web.models import UploadLimits
from deerflow_web.models import positive_setting
from deerflow_web.storage.paths import resolve_base_dir

logger = logging.getLogger(__name__)

# The words for yes and no, for settings (SPEC 1.8) and query flags (SPEC 2.5) alike; flags
# also take the single letters.
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})
_FLAG_LETTERS = {"t": True, "y": True, "f": False, "n": False}
# The names a browser on this machine uses for a server bound to loopback.
DEFAULT_ALLOWED_HOSTS = ("localhost", "127.0.0.1", "[::1]")
BIND_HOST_ENV = "DEER_FLOW_BIND_HOST"  # set by `make run` to the address it binds
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})


@dataclass(frozen=True)
class ConversionSettings:
    """How document conversion runs: opt-in at upload, always bounded in time and memory."""

    auto_convert_documents: bool = False
    timeout_seconds: float = 300.0
    memory_limit_mb: int = 2048
    wait_seconds: float = 3.0
    workers: int = 2
    max_output_bytes: int = UploadLimits.max_file_size
    max_queued: int = 20
    # Jobs one user may have queued or running in one server process (fair share).
    max_per_user: int = 5
    # CPU seconds one conversion may use (RLIMIT_CPU), kept below `timeout_seconds`: a
    # document that spins the CPU is stopped sooner than the wall clock would stop it.
    cpu_limit_seconds: float = 120.0
    # A job's worker renews its lease every `lease_renew_seconds`; a job whose lease ran
    # out (its instance died) is claimed again by any instance (SPEC 9).
    lease_seconds: float = 60.0
    lease_renew_seconds: float = 15.0


@dataclass(frozen=True)
class ArchiveLimits:
    """What one archive may hold before it is refused (`archives.*`; issue 26).

    Every limit is checked against what is really read, never only against what the
    archive declares: a member that inflates past its declared size, the whole archive past
    `max_uncompressed_size`, or a member past `max_ratio` times its compressed size is
    stopped while it is being read.
    """

    # A source tree or a photo export has hundreds to a few thousand files; 42.zip-style
    # bombs and "million empty files" archives have far more.
    max_members: int = 10_000
    # Everything one archive may unpack to, read or extracted: five times the largest
    # upload request, so a legitimate 100 MiB zip of text still fits.
    max_uncompressed_size: int = 512 * 1024 * 1024
    # Deflate tops out near 1,032:1; ordinary documents and logs compress 2-20:1, very
    # repetitive CSV up to about 100:1. Bombs are thousands to millions to one.
    max_ratio: int = 200
    # Below this many bytes a member's ratio is not judged: a tiny file of one repeated
    # character compresses beyond any ratio, harmlessly.
    ratio_floor: int = 1024 * 1024
    # The outer archive is level 1; `a.zip/b.zip/c.txt` reads at level 2.
    max_depth: int = 3
    # The whole member path, in characters; one segment is also limited to the 255 bytes
    # every common file system allows.
    max_name_length: int = 1024
    # `uploads.extract_archives`: extract an uploaded archive into a folder of the thread
    # as soon as it is stored.
    extract_on_upload: bool = False

    @classmethod
    def from_mapping(cls, archives: Mapping[str, Any], uploads: Mapping[str, Any]) -> ArchiveLimits:
        """Read `archives.*` and `uploads.extract_archives`; bad values fall back."""

        def positive(key: str, default: int) -> int:
            return positive_setting(archives, key, default, section_name="archives")

        return cls(
            max_members=positive("max_members", cls.max_members),
            max_uncompressed_size=positive("max_uncompressed_size", cls.max_uncompressed_size),
            max_ratio=positive("max_ratio", cls.max_ratio),
            ratio_floor=positive("ratio_floor", cls.ratio_floor),
            max_depth=positive("max_depth", cls.max_depth),
            max_name_length=positive("max_name_length", cls.max_name_length),
            extract_on_upload=parse_bool(uploads.get("extract_archives", False)),
        )


@dataclass(frozen=True)
class AgentSettings:
    """How the agent's file tools behave, and whether its model is shown pictures.

    `vision`: True or False as configured; None (`auto`, the default) asks the model's
    LangChain profile (`image_inputs`), and without a model to ask means no pictures.
    """

    read_conversion_wait_seconds: float = 20.0
    vision: bool | None = None
    images: ImageLimits = field(default_factory=ImageLimits)


@dataclass(frozen=True)
class ResumableSettings:
    """Resumable (tus) uploads: how long an unfinished one is kept, from which size the
    file manager sends a file that way, how many unfinished ones a user may hold, and (on
    the S3 backend) how long a writer's lease on one lasts."""

    expiry_hours: float = 24.0
    threshold_bytes: int = 8 * 1024 * 1024
    # Per user, unfinished uploads only: how many at once, and their declared bytes in all
    # (20 uploads of the default 50 MiB file limit fit).
    max_pending: int = 20
    max_pending_bytes: int = 1024 * 1024 * 1024
    # On the S3 backend a PATCH holds a lease on its upload's row, renewed as its bytes
    # arrive: a writer killed mid-chunk blocks the upload (409) until it runs out. Shorter
    # frees such an upload sooner, but it must stay well above the longest a live PATCH may
    # take to bring one MiB and send one part to the bucket, or a slow client's lease can
    # lapse under it and another request take the upload over.
    lease_seconds: float = 120.0

    @classmethod
    def from_mapping(cls, uploads: Mapping[str, Any]) -> ResumableSettings:
        """Read `uploads.resumable_*`; invalid values fall back with a warning."""
        return cls(
            expiry_hours=positive_setting(uploads, "resumable_expiry_hours", cls.expiry_hours),
            threshold_bytes=positive_setting(
                uploads, "resumable_threshold_bytes", cls.threshold_bytes
            ),
            max_pending=positive_setting(uploads, "resumable_max_pending", cls.max_pending),
            max_pending_bytes=positive_setting(
                uploads, "resumable_max_pending_bytes", cls.max_pending_bytes
            ),
            lease_seconds=positive_setting(uploads, "resumable_lease_seconds", cls.lease_seconds),
        )


@dataclass(frozen=True)
class HistorySettings:
    """Versions of replaced files and the trash of deleted ones (`versions.*`, `trash.*`).

    `max_quota_share`: the share of the user's quota versions may take at most (the budget
    given to thinning, once a quota applies).
    """

    versions_enabled: bool = True
    keep_last: int = 10
    max_quota_share: float = 0.5
    trash_enabled: bool = True
    trash_days: float = 30.0

    @classmethod
    def from_mapping(cls, versions: Mapping[str, Any], trash: Mapping[str, Any]) -> HistorySettings:
        """Read `versions.*` and `trash.*`; invalid values fall back with a warning."""
        share = positive_setting(
            versions, "max_quota_share", cls.max_quota_share, section_name="versions"
        )
        if share > 1:
            logger.warning("versions.max_quota_share=%r is over 1; using 1", share)
            share = 1.0
        return cls(
            versions_enabled=parse_bool(versions.get("enabled", True)),
            keep_last=positive_setting(
                versions, "keep_last", cls.keep_last, section_name="versions"
            ),
            max_quota_share=share,
            trash_enabled=parse_bool(trash.get("enabled", True)),
            trash_days=positive_setting(trash, "days", cls.trash_days, section_name="trash"),
        )


# 10 GiB: enough for a person's documents many times over (two hundred files at the
# default 50 MiB limit), and a bound on what one account can put on a shared disk.
DEFAULT_QUOTA_BYTES = 10 * 1024**3
QUOTA_ENV = "DEER_FLOW_QUOTAS_DEFAULT_BYTES"


@dataclass(frozen=True)
class QuotaSettings:
    """Per-user storage quotas: the default every account (and the single-user mode's one
    owner) has unless an admin gives it its own; None: unlimited."""

    default_bytes: int | None = DEFAULT_QUOTA_BYTES


def quotas_from(quotas: Mapping[str, Any], environ: Mapping[str, str]) -> QuotaSettings:
    """Read `quotas.default_bytes` (DEER_FLOW_QUOTAS_DEFAULT_BYTES wins): a whole number
    of bytes, `null`/0 for unlimited; anything else falls back with a warning."""
    if QUOTA_ENV in environ:
        raw: object = environ[QUOTA_ENV].strip()
        where = QUOTA_ENV
        if raw in ("", "null", "none"):
            return QuotaSettings(None)
    elif "default_bytes" in quotas:
        raw = quotas["default_bytes"]
        where = "quotas.default_bytes"
        if raw is None:
            return QuotaSettings(None)
    else:
        return QuotaSettings()
    try:
        if isinstance(raw, bool) or isinstance(raw, float) and not raw.is_integer():
            raise ValueError(raw)
        value = int(raw)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        value = -1
    if value < 0:
        logger.warning(
            "%s=%r is not a number of bytes (0 or null: unlimited); using %d",
            where,
            raw,
            DEFAULT_QUOTA_BYTES,
        )
        return QuotaSettings()
    return QuotaSettings(value or None)


@dataclass(frozen=True)
class RetentionSettings:
    """Threads nobody touched for `thread_days` are removed by a sweeper (None: never);
    the sweeper runs every `sweep_interval_minutes` on one instance at a time."""

    thread_days: float | None = None
    sweep_interval_minutes: float = 60.0

    @classmethod
    def from_mapping(cls, retention: Mapping[str, Any]) -> RetentionSettings:
        """Read `retention.*`; a missing, null or 0 `thread_days` keeps threads for ever."""
        days = retention.get("thread_days")
        thread_days = None
        if days not in (None, 0, "0", False):
            thread_days = (
                positive_setting(retention, "thread_days", 0.0, section_name="retention") or None
            )
        return cls(
            thread_days=thread_days,
            sweep_interval_minutes=positive_setting(
                retention,
                "sweep_interval_minutes",
                cls.sweep_interval_minutes,
                section_name="retention",
            ),
        )


JOBS_RUN_IN_WEB_ENV = "DEER_FLOW_JOBS_RUN_IN_WEB"


@dataclass(frozen=True)
class JobsSettings:
    """Where the background jobs run (`jobs.*`): conversions and OCR, periodic rescans,
    retention sweeps.

    `run_in_web` (default on): each web instance runs them, as one `make run` must. Off, a
    web instance only records a job in the database, and `flask --app app worker`
    processes, possibly on machines of their own, run it.
    """

    run_in_web: bool = True
    # How often a worker looks for queued jobs when it has a converter free.
    poll_seconds: float = 1.0
    # On SIGTERM a worker lets running conversions finish for this long; what is still
    # running then is released for another worker.
    stop_grace_seconds: float = 20.0

    @classmethod
    def from_mapping(cls, jobs: Mapping[str, Any], environ: Mapping[str, str]) -> JobsSettings:
        """Read `jobs.*`; `DEER_FLOW_JOBS_RUN_IN_WEB` wins over the file."""
        raw = environ.get(JOBS_RUN_IN_WEB_ENV)
        if raw is None or raw.strip() == "":
            raw = jobs.get("run_in_web", True)
        return cls(
            run_in_web=_bool_setting(raw, "jobs.run_in_web", default=True),
            poll_seconds=positive_setting(
                jobs, "poll_seconds", cls.poll_seconds, section_name="jobs"
            ),
            stop_grace_seconds=positive_setting(
                jobs, "stop_grace_seconds", cls.stop_grace_seconds, section_name="jobs"
            ),
        )


def _bool_setting(raw: object, name: str, *, default: bool) -> bool:
    """A yes/no word or boolean; anything else falls back to `default` with a warning (an
    unreadable value must not switch a default behaviour off)."""
    if isinstance(raw, bool):
        return raw
    flag = parse_flag(str(raw)) if isinstance(raw, str | int) else None
    if flag is None:
        logger.warning("%s=%r is not true or false; using %s", name, raw, default)
        return default
    return flag


SCAN_POLICIES = ("refuse", "accept_unscanned")


@dataclass(frozen=True)
class ScanSettings:
    """Virus scanning with clamd (`scanning.*`): off unless `clamd` names its socket.

    Fail-closed: when the scanner cannot answer (or a file is over clamd's
    `StreamMaxLength`) the upload is refused, unless `on_unavailable` (`on_too_large`)
    is `accept_unscanned`; such a file is stored as `unscanned` and kept from the agent
    until a rescan clears it.
    """

    clamd: str | None = None  # a unix socket path, or host:port
    on_unavailable: str = "refuse"
    on_too_large: str = "refuse"
    timeout_seconds: float = 60.0
    retry_after_seconds: int = 30
    # The periodic rescan (one instance at a time, leased in the database); 0: off, and
    # `flask files rescan` is the way to rescan.
    rescan_interval_seconds: float = 3600.0
    quarantine_days: float = 30.0

    @property
    def enabled(self) -> bool:
        """Whether uploads are scanned at all."""
        return self.clamd is not None

    @classmethod
    def from_mapping(cls, scanning: Mapping[str, Any]) -> ScanSettings:
        """Read `scanning.*`; an unknown policy stops start-up (a typo must not open the
        gate), bad numbers fall back with a warning."""

        def policy(key: str) -> str:
            value = str(scanning.get(key) or "refuse").strip().lower()
            if value not in SCAN_POLICIES:
                raise ConfigError(
                    f"scanning.{key} must be one of: {', '.join(SCAN_POLICIES)} (got {value!r})"
                )
            return value

        def number(key: str, default: Any) -> Any:
            return positive_setting(scanning, key, default, section_name="scanning")

        interval = scanning.get("rescan_interval_seconds")
        off = interval is not None and str(interval).strip() in {"0", "0.0"}
        return cls(
            clamd=_optional_string(scanning.get("clamd")),
            on_unavailable=policy("on_unavailable"),
            on_too_large=policy("on_too_large"),
            timeout_seconds=number("timeout_seconds", cls.timeout_seconds),
            retry_after_seconds=number("retry_after_seconds", cls.retry_after_seconds),
            rescan_interval_seconds=(
                0.0 if off else number("rescan_interval_seconds", cls.rescan_interval_seconds)
            ),
            quarantine_days=number("quarantine_days", cls.quarantine_days),
        )


@dataclass(frozen=True)
class ConnectionLimits:
    """How much of a worker one slow or greedy client may hold (`server.*`,
    web/transport/server.py).

    The idle timeout only catches silence; a body sent a byte at a time never is. These
    bound the rest: a minimum body rate, a short deadline and a small body for the routes
    reached before signing in, and a cap on one client address's connections.
    """

    # After `min_body_rate_grace_seconds`, a request body must have brought at least this
    # many bytes per second over the last `min_body_rate_window_seconds` (or since the
    # request began, when that is shorter); 0 switches the check off.
    min_body_rate_bytes: int = 1024
    min_body_rate_window_seconds: float = 30.0
    min_body_rate_grace_seconds: float = 10.0
    # The routes reached without signing in (sign-in, setup, registration): headers and
    # body within this many seconds, a body of at most this many bytes.
    unauthenticated_request_seconds: float = 10.0
    unauthenticated_max_body_bytes: int = 64 * 1024
    # Connections one client address may hold open in one worker process (behind trusted
    # proxies: requests of one forwarded client); 0 means no cap.
    max_connections_per_address: int = 100

    @classmethod
    def from_mapping(cls, server: Mapping[str, Any]) -> ConnectionLimits:
        """Read the `server.*` keys; invalid values fall back with a warning."""

        def positive(key: str, default: float) -> Any:
            return positive_setting(server, key, default, section_name="server")

        return cls(
            min_body_rate_bytes=_count_or_off(
                server, "min_body_rate_bytes", cls.min_body_rate_bytes
            ),
            min_body_rate_window_seconds=positive(
                "min_body_rate_window_seconds", cls.min_body_rate_window_seconds
            ),
            min_body_rate_grace_seconds=positive(
                "min_body_rate_grace_seconds", cls.min_body_rate_grace_seconds
            ),
            unauthenticated_request_seconds=positive(
                "unauthenticated_request_seconds", cls.unauthenticated_request_seconds
            ),
            unauthenticated_max_body_bytes=positive(
                "unauthenticated_max_body_bytes", cls.unauthenticated_max_body_bytes
            ),
            max_connections_per_address=_count_or_off(
                server, "max_connections_per_address", cls.max_connections_per_address
            ),
        )


def _count_or_off(section: Mapping[str, Any], key: str, default: int) -> int:
    """A whole number >= 0 (0: off); anything else falls back to `default` with a warning."""
    raw = section.get(key)
    if raw is None:
        return default
    if raw is False or str(raw).strip() == "0":
        return 0
    return positive_setting(section, key, default, section_name="server")


STORAGE_BACKENDS = ("local", "s3")
STORAGE_ENV_PREFIX = "DEER_FLOW_STORAGE_"


@dataclass(frozen=True)
class S3Settings:
    """Where the S3 backend keeps files (`storage.s3.*`). Credentials are never settings:
    boto3 reads AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the rest of the AWS chain."""

    endpoint_url: str | None = None  # None: AWS itself; a self-hosted server's URL otherwise
    bucket: str | None = None
    region: str | None = None
    prefix: str = ""  # every key goes under it: one bucket may serve several installs
    # Downloads redirect to a short-lived presigned URL (after the same authorisation)
    # instead of streaming through the app.
    presigned_downloads: bool = False
    # An unfinished multipart upload older than this is a killed process's, and swept.
    # S3 cannot tell a live upload of another instance from a dead one: the age is the
    # whole rule, so it must be longer than any push of a file may take.
    stale_upload_hours: float = 24.0
    # This instance's working copy of the bucket (its data dir) is kept under this many
    # bytes by evicting the threads used longest ago (storage/objects/eviction.py); 0:
    # unbounded.
    working_copy_max_bytes: int = 0
    # Parts of one writer on their way to the bucket while it fills the next (parts of
    # 8 MiB): more may keep a distant bucket busier, each holding 8 MiB more per upload.
    parts_in_flight: int = 3


@dataclass(frozen=True)
class StorageSettings:
    """Where file bytes live (`storage.backend`): the data dir (`local`) or a bucket (`s3`)."""

    backend: str = "local"
    s3: S3Settings = field(default_factory=S3Settings)

    @classmethod
    def from_mapping(
        cls, storage: Mapping[str, Any], environ: Mapping[str, str]
    ) -> StorageSettings:
        """Read `storage.backend` and `storage.s3.*`; `DEER_FLOW_STORAGE_BACKEND` and
        `DEER_FLOW_STORAGE_S3_<KEY>` win over the file. An unknown backend, or `s3`
        without a bucket, stops start-up: files must never land somewhere unintended."""
        s3 = storage.get("s3")
        s3 = s3 if isinstance(s3, Mapping) else {}

        def value(section: Mapping[str, Any], key: str, env_key: str) -> Any:
            from_env = environ.get(STORAGE_ENV_PREFIX + env_key)
            return from_env if from_env not in (None, "") else section.get(key)

        def s3_number(key: str) -> Any:
            """`storage.s3.<key>` (`$DEER_FLOW_STORAGE_S3_<KEY>` first), a positive number
            of its default's type, else that default (with one warning)."""
            configured = {key: value(s3, key, "S3_" + key.upper())}
            default = getattr(S3Settings, key)
            return positive_setting(configured, key, default, section_name="storage.s3")

        backend = str(value(storage, "backend", "BACKEND") or "local").strip().lower()
        if backend not in STORAGE_BACKENDS:
            raise ConfigError(
                f"storage.backend must be one of: {', '.join(STORAGE_BACKENDS)} (got {backend!r})"
            )
        settings = S3Settings(
            endpoint_url=_optional_string(value(s3, "endpoint_url", "S3_ENDPOINT_URL")),
            bucket=_optional_string(value(s3, "bucket", "S3_BUCKET")),
            region=_optional_string(value(s3, "region", "S3_REGION")),
            prefix=(_optional_string(value(s3, "prefix", "S3_PREFIX")) or "").strip("/"),
            presigned_downloads=parse_bool(
                value(s3, "presigned_downloads", "S3_PRESIGNED_DOWNLOADS") or False
            ),
            stale_upload_hours=s3_number("stale_upload_hours"),
            working_copy_max_bytes=s3_number("working_copy_max_bytes"),
            parts_in_flight=s3_number("parts_in_flight"),
        )
        if settings.prefix and any(part in ("", ".", "..") for part in settings.prefix.split("/")):
            raise ConfigError(
                f"storage.s3.prefix {settings.prefix!r} must be folder names separated by '/', "
                "without empty, '.' or '..' parts"
            )
        if backend == "s3" and settings.bucket is None:
            raise ConfigError(
                "storage.backend: s3 needs storage.s3.bucket (or DEER_FLOW_STORAGE_S3_BUCKET)"
            )
        endpoint = settings.endpoint_url
        if endpoint is not None:
            parts = urlsplit(endpoint)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError(
                    f"storage.s3.endpoint_url {endpoint!r} must be an http:// or https:// URL "
                    "with a host (e.g. http://127.0.0.1:8333)"
                )
        return cls(backend=backend, s3=settings)


@dataclass(frozen=True)
class AuthSettings:
    """Accounts (SPEC 7.1): on unless DEER_FLOW_AUTH_DISABLED=1 or `auth.enabled: false`."""

    enabled: bool = True
    registration_enabled: bool = False
    # A session without "remember me" ends after this long without a request (SPEC 7.3)...
    session_idle_hours: float = 12.0
    # ...and every session, remembered or not, this long after signing in.
    session_lifetime_days: float = 7.0


PRODUCTION_NAMES = {"prod", "production"}


def auth_from(auth: Mapping[str, Any], environ: Mapping[str, str]) -> AuthSettings:
    """Read `auth.*` and DEER_FLOW_AUTH_DISABLED; refuse the single-user mode in production."""
    enabled = parse_bool(auth.get("enabled", True))
    if parse_bool(environ.get("DEER_FLOW_AUTH_DISABLED", "")):
        enabled = False
    if not enabled:
        for name in ("DEER_FLOW_ENV", "ENVIRONMENT"):
            if environ.get(name, "").strip().lower() in PRODUCTION_NAMES:
                raise ConfigError(
                    f"Authentication cannot be disabled (DEER_FLOW_AUTH_DISABLED or "
                    f"auth.enabled: false) when {name} is '{environ[name]}': a production "
                    "server needs accounts. Unset DEER_FLOW_AUTH_DISABLED / auth.enabled, or "
                    "DEER_FLOW_ENV / ENVIRONMENT."
                )
    return AuthSettings(
        enabled=enabled,
        registration_enabled=parse_bool(auth.get("registration_enabled", False)),
        session_idle_hours=positive_setting(
            auth, "session_idle_hours", AuthSettings.session_idle_hours, section_name="auth"
        ),
        session_lifetime_days=positive_setting(
            auth, "session_lifetime_days", AuthSettings.session_lifetime_days, section_name="auth"
        ),
    )


def _trusted_proxies(value: object) -> int:
    """How many proxies in front of the app set X-Forwarded-*: a count or a list of them."""
    if value is None or value is False:
        return 0
    if isinstance(value, list | tuple):
        return len(value)
    try:
        count = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        logger.warning("server.trusted_proxies=%r is not a count or a list; using 0", value)
        return 0
    return max(count, 0)


@dataclass(frozen=True)
class Settings:
    """Everything the app and the agent side need to know about the installation."""

    base_dir: Path
    limits: UploadLimits = field(default_factory=UploadLimits)
    conversion: ConversionSettings = field(default_factory=ConversionSettings)
    resumable: ResumableSettings = field(default_factory=ResumableSettings)
    agent: AgentSettings = field(default_factory=AgentSettings)
    archives: ArchiveLimits = field(default_factory=ArchiveLimits)
    scanning: ScanSettings = field(default_factory=ScanSettings)
    history: HistorySettings = field(default_factory=HistorySettings)
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = DEFAULT_ALLOWED_HOSTS
    config_path: Path | None = None
    auth: AuthSettings = field(default_factory=AuthSettings)
    database_url: str | None = None
    trusted_proxies: int = 0
    # A connection that sends or receives nothing for this long is dropped: a stalled
    # upload (its staging file removed), a download nobody reads, headers that never end.
    idle_timeout_seconds: float = 60.0
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
    # Signs sessions and CSRF tokens; every instance needs the same one (SPEC 9). None: the
    # key generated once into the data dir, which every instance on the volume reads.
    secret_key: str | None = None
    # A group (name or gid) that may read the data dir's thread files, for a sandbox that
    # runs as another user in it; None: everything is the service's user's only.
    storage_group: str | None = None
    quotas: QuotaSettings = field(default_factory=QuotaSettings)
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    storage: StorageSettings = field(default_factory=StorageSettings)
    jobs: JobsSettings = field(default_factory=JobsSettings)


def _optional_string(value: object) -> str | None:
    """A non-empty string setting, else None."""
    return value.strip() or None if isinstance(value, str) else None


def parse_bool(value: object) -> bool:
    """`"YES"` → True, `"false"` → False; other types by truthiness (SPEC 1.8)."""
    if isinstance(value, str):
        return value.strip().lower() in TRUE_WORDS
    return bool(value)


def parse_flag(raw: str) -> bool | None:
    """A query flag: `true/false/1/0/yes/no/on/off/t/f/y/n` in any case; None otherwise."""
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    return _FLAG_LETTERS.get(word)


def _section(config: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = config.get(name)
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return value
    if hasattr(value, "__dict__"):  # the section may be an object as well as a mapping
        return vars(value)
    logger.warning("config section %r is not a mapping; using defaults", name)
    return {}


def conversion_from_mapping(
    uploads: Mapping[str, Any],
    conversion: Mapping[str, Any] | None = None,
    *,
    max_file_size: int = UploadLimits.max_file_size,
) -> ConversionSettings:
    """Read the conversion keys of `uploads.*` and `conversion.*`; invalid values fall back
    with a warning. The Markdown cap defaults to the upload size limit: a companion is a file
    of the thread like any other."""
    defaults = ConversionSettings()
    conversion = conversion or {}
    if uploads.get("pdf_converter") is not None:
        # Read once, when the app starts: PDFs always go through markitdown (pymupdf4llm is
        # AGPL, SPEC D9), so the key is only there for configs written for DeerFlow.
        logger.warning(
            "uploads.pdf_converter=%r is ignored: documents are converted with markitdown",
            uploads["pdf_converter"],
        )
    lease = positive_setting(
        conversion, "lease_seconds", defaults.lease_seconds, section_name="conversion"
    )
    renew = positive_setting(
        conversion, "lease_renew_seconds", defaults.lease_renew_seconds, section_name="conversion"
    )
    timeout = positive_setting(uploads, "conversion_timeout_seconds", defaults.timeout_seconds)
    cpu_limit = positive_setting(
        conversion, "cpu_limit_seconds", defaults.cpu_limit_seconds, section_name="conversion"
    )
    return ConversionSettings(
        auto_convert_documents=parse_bool(uploads.get("auto_convert_documents", False)),
        timeout_seconds=timeout,
        memory_limit_mb=positive_setting(
            uploads, "conversion_memory_limit_mb", defaults.memory_limit_mb
        ),
        wait_seconds=positive_setting(uploads, "conversion_wait_seconds", defaults.wait_seconds),
        workers=positive_setting(uploads, "conversion_workers", defaults.workers),
        max_output_bytes=positive_setting(
            conversion, "max_output_bytes", max_file_size, section_name="conversion"
        ),
        max_queued=positive_setting(
            conversion, "max_queued", defaults.max_queued, section_name="conversion"
        ),
        max_per_user=positive_setting(
            conversion, "max_per_user", defaults.max_per_user, section_name="conversion"
        ),
        cpu_limit_seconds=min(cpu_limit, timeout),  # never above the wall-clock limit
        lease_seconds=lease,
        lease_renew_seconds=renew if renew < lease else lease / 4,
    )


def agent_from_mapping(agent: Mapping[str, Any]) -> AgentSettings:
    """Read `agent.*`; invalid values fall back with a warning."""
    defaults = AgentSettings()
    return AgentSettings(
        read_conversion_wait_seconds=positive_setting(
            agent,
            "read_conversion_wait_seconds",
            defaults.read_conversion_wait_seconds,
            section_name="agent",
        ),
        vision=vision_setting(agent.get("vision")),
        images=ImageLimits.from_mapping(agent),
    )


def vision_setting(raw: object) -> bool | None:
    """`agent.vision`: a yes/no word or boolean, or `auto` (also unset) for None."""
    if raw is None or (isinstance(raw, str) and raw.strip().lower() in {"", "auto"}):
        return None
    if isinstance(raw, bool):
        return raw
    flag = parse_flag(raw) if isinstance(raw, str) else None
    if flag is None:
        logger.warning("agent.vision=%r is not true, false or auto; using auto", raw)
    return flag


def _string_list(value: Any) -> tuple[str, ...]:
    if not value:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(str(item) for item in value)


def normalize_host(host: str) -> str:
    """`LOCALHOST` → `localhost`, `::1` → `[::1]`: the form a Host header carries."""
    host = host.strip().lower()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # a bare IPv6 address
    return host


def allowed_hosts_from(server: Mapping[str, Any], environ: Mapping[str, str]) -> tuple[str, ...]:
    """`server.allowed_hosts` (else the loopback names) plus the address `make run` binds.

    A wildcard bind (0.0.0.0) names no host, so serving other machines needs the list.
    """
    hosts = [normalize_host(h) for h in _string_list(server.get("allowed_hosts"))]
    if not hosts:
        hosts = list(DEFAULT_ALLOWED_HOSTS)
    bind = normalize_host(environ.get(BIND_HOST_ENV, ""))
    if bind not in WILDCARD_HOSTS and bind not in hosts:
        hosts.append(bind)
    return tuple(hosts)


def find_config_file(
    environ: Mapping[str, str], cwd: Path, explicit: str | os.PathLike[str] | None = None
) -> Path | None:
    """Explicit path > DEER_FLOW_CONFIG_PATH (must exist) > {cwd}/config.yaml > none."""
    if explicit is not None:
        path = Path(explicit)
        if not path.is_file():
            raise ConfigError(f"Config file {path} does not exist")
        return path
    if environ.get("DEER_FLOW_CONFIG_PATH"):
        path = Path(environ["DEER_FLOW_CONFIG_PATH"])
        if not path.is_file():
            raise ConfigError(
                f"DEER_FLOW_CONFIG_PATH is set to '{path}', but that file does not exist"
            )
        return path
    candidate = cwd / "config.yaml"
    return candidate if candidate.is_file() else None


def _expand_env(value: Any, environ: Mapping[str, str], path: Path) -> Any:
    """Replace `$NAME` strings by the environment variable; an unset one is an error."""
    if isinstance(value, dict):
        return {k: _expand_env(v, environ, path) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, environ, path) for v in value]
    if isinstance(value, str) and value.startswith("$") and len(value) > 1:
        name = value[1:]
        if name not in environ:
            raise ConfigError(f"{path}: environment variable {name} is not set")
        return environ[name]
    return value


def yaml_problem(error: yaml.YAMLError) -> str:
    """The parser's complaint on one line, with where it is (PyYAML's own text spans
    several lines: the context, a copy of the line, a caret under the column)."""
    problem = getattr(error, "problem", None)
    mark = getattr(error, "problem_mark", None)
    if problem is None:
        return " ".join(str(error).split())
    if mark is None:
        return str(problem)
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"


def read_config_file(path: Path, environ: Mapping[str, str]) -> dict[str, Any]:
    """Parse the YAML file; a broken file stops start-up with a message naming it."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"Cannot read config file {path}: {error}") from error
    except yaml.YAMLError as error:
        raise ConfigError(f"Config file {path} is not valid YAML: {yaml_problem(error)}") from error
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"Config file {path} must hold a mapping at the top level")
    return _expand_env(data, environ, path)


def load_settings(
    base_dir: str | os.PathLike[str] | None = None,
    *,
    config_path: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Settings:
    """Build the settings; no config file at all means built-in defaults."""
    env = os.environ if environ is None else environ
    here = Path.cwd() if cwd is None else cwd
    path = find_config_file(env, here, config_path)
    config = read_config_file(path, env) if path is not None else {}
    uploads = _section(config, "uploads")
    server = _section(config, "server")
    database = _section(config, "database")
    origins = _string_list(server.get("allowed_origins"))
    limits = UploadLimits.from_mapping(uploads)
    return Settings(
        base_dir=resolve_base_dir(base_dir or config.get("base_dir"), env),
        limits=limits,
        conversion=conversion_from_mapping(
            uploads, _section(config, "conversion"), max_file_size=limits.max_file_size
        ),
        resumable=ResumableSettings.from_mapping(uploads),
        agent=agent_from_mapping(_section(config, "agent")),
        archives=ArchiveLimits.from_mapping(_section(config, "archives"), uploads),
        scanning=ScanSettings.from_mapping(_section(config, "scanning")),
        history=HistorySettings.from_mapping(
            _section(config, "versions"), _section(config, "trash")
        ),
        allowed_origins=tuple(o.strip().rstrip("/").lower() for o in origins),
        allowed_hosts=allowed_hosts_from(server, env),
        config_path=path,
        auth=auth_from(_section(config, "auth"), env),
        database_url=env.get("DATABASE_URL") or database.get("url") or None,
        trusted_proxies=_trusted_proxies(server.get("trusted_proxies")),
        idle_timeout_seconds=positive_setting(
            server, "idle_timeout_seconds", Settings.idle_timeout_seconds
        ),
        connections=ConnectionLimits.from_mapping(server),
        secret_key=env.get("SECRET_KEY") or _optional_string(server.get("secret_key")),
        storage_group=_optional_string(str(_section(config, "storage").get("group") or "")),
        quotas=quotas_from(_section(config, "quotas"), env),
        retention=RetentionSettings.from_mapping(_section(config, "retention")),
        storage=StorageSettings.from_mapping(_section(config, "storage"), env),
        jobs=JobsSettings.from_mapping(_section(config, "jobs"), env),
    )
