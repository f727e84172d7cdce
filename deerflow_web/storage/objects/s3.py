"""The S3 backend: objects in a bucket of any S3-compatible server, under `storage.s3.prefix`.

The client is boto3, chosen for how it behaves under `make run`'s gevent worker:

- **It waits cooperatively.** boto3 is Python over urllib3 over the standard `socket`
  module, which gevent patches: a request waiting on the network parks its greenlet and
  the loop serves everyone else. obstore and opendal are Rust clients with a runtime of
  their own: their blocking calls hold the calling thread (the loop, under gevent) for a
  whole request, so every call, each part of a streaming upload included, would have to
  hop through `off_loop`'s thread pool, and their async APIs need an asyncio loop that a
  gevent worker does not run.
- **Its CPU work is small and ours to move.** Payload signing is off and boto3's own
  checksums run only where S3 requires them; the one pass over the bytes is ours, SHA-256
  of each part and of the whole object at once, on a native thread beside the loop
  (`start_beside`), and S3 checks each part (and each single PUT) against that
  SHA-256 (`x-amz-checksum-sha256`), so what is stored is what was hashed.
- **Multipart is explicit.** The writer needs CreateMultipartUpload / UploadPart /
  Complete / Abort with parts it owns (a few bounded buffers on their way at once, S3's
  5 MiB minimum part size, a single PUT below one part), and the sweep after a killed process needs
  ListMultipartUploads and AbortMultipartUpload; boto3 has each of them as one call,
  while obstore's and opendal's writers hide the upload id and neither lists unfinished
  uploads.

Failures are translated at this edge: a server that cannot be reached, times out or
answers 5xx is `ObjectStoreUnavailable` (the web layer's 503 with Retry-After); a missing
key `ObjectNotFound`; a refusal (credentials, permissions, no such bucket)
`StorageFailure` with S3's reason. The client reconnects by itself, so an outage ends
without rebuilding the store. Addressing is path-style (`endpoint/bucket/key`), which
every self-hosted server understands.
"""

from __future__ import annotations

import base64
import copy
import functools
import hashlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from typing import NamedTuple
from urllib.parse import quote

from deerflow_web.concurrency import Turn
from deerflow_web.concurrency import start_beside
from deerflow_web.errors import ConfigError
from deerflow_web.errors import InvalidObjectKey
from deerflow_web.errors import ObjectNotFound
from deerflow_web.errors import ObjectStoreUnavailable
from deerflow_web.errors import StorageFailure
from deerflow_web.storage.objects.base import READ_CHUNK
from deerflow_web.storage.objects.base import ObjectInfo
from deerflow_web.storage.objects.base import StaleUpload
from deerflow_web.storage.objects.keys import MAX_KEY_BYTES
from deerflow_web.storage.objects.keys import check_key
from deerflow_web.storage.objects.keys import check_prefix

logger = logging.getLogger(__name__)

MIN_PART_SIZE = 5 * 1024 * 1024  # S3's smallest part but the last
DEFAULT_PART_SIZE = 8 * 1024 * 1024
# Parts on their way while the writer fills the next: a writer holds at most this many
# parts plus the one filling (32 MiB with 8 MiB parts). Three kept a loopback SeaweedFS
# busy while a request's body streamed in; more only held more memory.
DEFAULT_PARTS_IN_FLIGHT = 3
MAX_PARTS = 10_000  # S3's limit: 8 MiB parts reach 78 GiB, far above any upload limit
MAX_COPY_SIZE = 5 * 1024**3  # CopyObject's limit; larger objects are copied in parts
COPY_PART_SIZE = 512 * 1024 * 1024
PROBE_TIMEOUT_SECONDS = 2.0  # a readiness probe answers within a few seconds
SHA256_METADATA = "sha256"  # x-amz-meta-sha256: the hex digest, on single-PUT objects
_MISSING = {"404", "NoSuchKey", "NotFound"}


def _folder_prefix(prefix: str) -> str:
    """`storage.s3.prefix` as the folder every key goes under: `a/b` becomes `a/b/`."""
    stripped = prefix.strip("/")
    return check_prefix(stripped + "/") if stripped else ""


@functools.cache
def _service_models() -> Any:
    """botocore's loader of service models, one per process.

    Each boto3 session reads and parses S3's model and endpoint rules anew, about 0.15 s of
    CPU; an app that sets up its stores, or a process that serves several apps, pays it
    once. Sessions, and so credentials, stay one per store. The loader only ever caches
    what it read from botocore's own files."""
    from botocore.loaders import create_loader

    return create_loader()


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode("ascii")


def _content_disposition(filename: str) -> str:
    """`attachment` with the name in RFC 6266 form: an ASCII fallback and the UTF-8 name."""
    fallback = "".join(
        c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in filename
    )
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename, safe='')}"


class S3ObjectStore:
    """Objects in `bucket` under `prefix`, through one boto3 client (thread-safe, pooled)."""

    name = "s3"

    def __init__(
        self,
        bucket: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        prefix: str = "",
        access_key: str | None = None,
        secret_key: str | None = None,
        part_size: int = DEFAULT_PART_SIZE,
        parts_in_flight: int = DEFAULT_PARTS_IN_FLIGHT,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        max_attempts: int = 3,
        retry_after_seconds: int = 5,
        max_connections: int = 50,
    ) -> None:
        import boto3  # heavy: imported only when the S3 backend is used
        import botocore.session
        from botocore.config import Config

        if not bucket:
            raise ConfigError("storage.s3.bucket is required with storage.backend: s3")
        self.bucket = bucket
        self.prefix = _folder_prefix(prefix)
        self.part_size = max(int(part_size), MIN_PART_SIZE)
        self.parts_in_flight = max(int(parts_in_flight), 1)
        self.retry_after_seconds = retry_after_seconds
        config = Config(
            signature_version="s3v4",
            # Path-style: every self-hosted server understands it. No payload signing (a
            # second SHA-256 pass on the loop): the x-amz-checksum-sha256 of each request
            # is what S3 checks the bytes against.
            s3={"addressing_style": "path", "payload_signing_enabled": False},
            # boto3 1.36+ adds CRC32 trailers to every upload by default, which several
            # S3-compatible servers refuse; our own SHA-256 checksums go in headers.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"max_attempts": max(int(max_attempts), 1), "mode": "standard"},
            max_pool_connections=max_connections,
        )
        botocore_session = botocore.session.Session()
        botocore_session.register_component("data_loader", _service_models())
        session = boto3.session.Session(
            botocore_session=botocore_session,
            aws_access_key_id=access_key or None,
            aws_secret_access_key=secret_key or None,
            region_name=region or None,
        )
        self.client = session.client(
            "s3",
            endpoint_url=endpoint_url or None,
            region_name=region or "us-east-1",
            config=config,
        )
        # Readiness asks once and briefly: a probe that retried with the full timeouts
        # would take up to 15 s to say the bucket is gone, longer than a probe waits.
        self._probe = session.client(
            "s3",
            endpoint_url=endpoint_url or None,
            region_name=region or "us-east-1",
            config=config.merge(
                Config(
                    connect_timeout=min(connect_timeout, PROBE_TIMEOUT_SECONDS),
                    read_timeout=PROBE_TIMEOUT_SECONDS,
                    retries={"total_max_attempts": 1, "mode": "standard"},
                )
            ),
        )

    def with_prefix(self, prefix: str) -> S3ObjectStore:
        """The same bucket, client and connection pool under another prefix."""
        other = copy.copy(self)
        other.prefix = _folder_prefix(prefix)
        return other

    # -- keys and errors -------------------------------------------------------------

    def _full(self, key: str) -> str:
        full = self.prefix + check_key(key)
        if len(full.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
            raise InvalidObjectKey(key)  # too long once prefixed
        return full

    def _app_key(self, full: str) -> str:
        return full[len(self.prefix) :]

    @contextmanager
    def _errors(self, key: str) -> Iterator[None]:
        """Translate the client's exceptions into the app's (see the module docstring)."""
        from botocore.exceptions import ClientError
        from botocore.exceptions import ConnectionError as BotoConnectionError
        from botocore.exceptions import HTTPClientError
        from botocore.exceptions import NoCredentialsError

        try:
            yield
        except ClientError as error:
            code = str(error.response.get("Error", {}).get("Code", ""))
            status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            if code in _MISSING:
                raise ObjectNotFound(key) from error
            if status >= 500 or code in {"SlowDown", "ServiceUnavailable", "InternalError"}:
                raise self._unavailable(error) from error
            raise StorageFailure(
                f"The object store refused the request for {key}: {code}"
            ) from error
        except (BotoConnectionError, HTTPClientError) as error:
            raise self._unavailable(error) from error
        except NoCredentialsError as error:
            raise ConfigError(
                "storage.backend: s3 found no credentials: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or another source of the AWS credential chain)"
            ) from error

    def _unavailable(self, error: BaseException) -> ObjectStoreUnavailable:
        logger.warning("object store unavailable: %s", error)
        return ObjectStoreUnavailable(str(error), self.retry_after_seconds)

    # -- the store -------------------------------------------------------------------

    def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist (tests, first set-up)."""
        from botocore.exceptions import ClientError

        with self._errors(self.bucket):
            try:
                self.client.head_bucket(Bucket=self.bucket)
            except ClientError as error:
                if str(error.response.get("Error", {}).get("Code")) not in _MISSING:
                    raise
                self.client.create_bucket(Bucket=self.bucket)

    def ping(self) -> None:
        """Reach the bucket once (readiness).

        Raises:
            ObjectStoreUnavailable: The server cannot be reached or answers 5xx.
            StorageFailure: It refuses (credentials, permissions, no such bucket).
        """
        with self._errors(self.bucket):
            self._probe.head_bucket(Bucket=self.bucket)

    def open_writer(self, key: str, *, whole_sha256: bool = True) -> S3Writer:
        """A writer of `key` (see `S3Writer`; `whole_sha256=False` for a caller that
        hashes the bytes itself)."""
        return S3Writer(self, key, self._full(key), whole_sha256=whole_sha256)

    def open_read(self, key: str, start: int = 0, length: int | None = None) -> S3Stream:
        if start < 0 or (length is not None and length < 0):
            raise ValueError("a range starts at 0 or later and has a length of 0 or more")
        full = self._full(key)
        if length == 0:
            return S3Stream.empty(key, start, self.head(key).size)
        arguments: dict[str, Any] = {"Bucket": self.bucket, "Key": full}
        if start > 0 or length is not None:
            end = "" if length is None else str(start + length - 1)
            arguments["Range"] = f"bytes={start}-{end}"
        from botocore.exceptions import ClientError

        with self._errors(key):
            try:
                response = self.client.get_object(**arguments)
            except ClientError as error:
                if error.response.get("Error", {}).get("Code") != "InvalidRange":
                    raise
                size = self.head(key).size  # a range past the end: nothing to yield
                return S3Stream.empty(key, min(start, size), size)
        size = int(response["ContentLength"])
        content_range = response.get("ContentRange")
        total = int(content_range.rpartition("/")[2]) if content_range else size
        first = int(content_range.split()[1].split("-")[0]) if content_range else 0
        return S3Stream(self, key, response["Body"], first, size, total)

    def head(self, key: str) -> ObjectInfo:
        with self._errors(key):
            response = self.client.head_object(Bucket=self.bucket, Key=self._full(key))
        return ObjectInfo(
            key,
            int(response["ContentLength"]),
            response.get("Metadata", {}).get(SHA256_METADATA),
            response["LastModified"].timestamp(),
        )

    def exists(self, key: str) -> bool:
        try:
            self.head(key)
        except ObjectNotFound:
            return False
        return True

    def delete(self, key: str) -> None:
        with self._errors(key):
            self.client.delete_object(Bucket=self.bucket, Key=self._full(key))

    def copy(self, source: str, dest: str) -> ObjectInfo:
        """Server-side: no byte passes through this process (parts of 512 MiB above
        CopyObject's 5 GiB limit); the metadata, sha256 included, goes along."""
        full = self._full(dest)
        info = self.head(source)
        source_ref = {"Bucket": self.bucket, "Key": self._full(source)}
        with self._errors(source):
            if info.size <= MAX_COPY_SIZE:
                self.client.copy_object(
                    Bucket=self.bucket, Key=full, CopySource=source_ref, MetadataDirective="COPY"
                )
            else:
                self._copy_in_parts(source_ref, full, info.size)
        return ObjectInfo(dest, info.size, info.sha256, time.time())

    def _copy_in_parts(self, source_ref: dict[str, str], full: str, size: int) -> None:
        upload = self.client.create_multipart_upload(Bucket=self.bucket, Key=full)
        upload_id = upload["UploadId"]
        try:
            parts = []
            for number, offset in enumerate(range(0, size, COPY_PART_SIZE), start=1):
                last = min(offset + COPY_PART_SIZE, size) - 1
                copied = self.client.upload_part_copy(
                    Bucket=self.bucket,
                    Key=full,
                    UploadId=upload_id,
                    PartNumber=number,
                    CopySource=source_ref,
                    CopySourceRange=f"bytes={offset}-{last}",
                )
                parts.append({"PartNumber": number, "ETag": copied["CopyPartResult"]["ETag"]})
            self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=full, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
        except BaseException:
            self._abort_quietly(full, upload_id)
            raise

    def rename(self, source: str, dest: str) -> ObjectInfo:
        """A copy, then the source deleted: S3 has no rename. A crash between the two
        leaves both keys holding the bytes, never neither."""
        self._full(source), self._full(dest)
        info = self.copy(source, dest)
        self.delete(source)
        return info

    def list_keys(self, prefix: str = "") -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        paginator = self.client.get_paginator("list_objects_v2")
        with self._errors(prefix or self.bucket):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
                for item in page.get("Contents", ()):
                    yield ObjectInfo(
                        self._app_key(item["Key"]),
                        int(item["Size"]),
                        None,
                        item["LastModified"].timestamp(),
                    )

    def list_stale_uploads(self, prefix: str = "", older_than: float = 0.0) -> list[StaleUpload]:
        check_prefix(prefix)
        deadline = time.time() - older_than
        paginator = self.client.get_paginator("list_multipart_uploads")
        stale = []
        with self._errors(prefix or self.bucket):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
                for upload in page.get("Uploads", ()):
                    started = upload["Initiated"].timestamp()
                    if started <= deadline:
                        stale.append(
                            StaleUpload(self._app_key(upload["Key"]), upload["UploadId"], started)
                        )
        return stale

    def abort_stale_upload(self, upload: StaleUpload) -> None:
        from botocore.exceptions import ClientError

        with self._errors(upload.key):
            try:
                self.client.abort_multipart_upload(
                    Bucket=self.bucket, Key=self._full(upload.key), UploadId=upload.upload_id
                )
            except ClientError as error:
                if error.response.get("Error", {}).get("Code") not in {"NoSuchUpload", "404"}:
                    raise

    def _abort_quietly(self, full: str, upload_id: str) -> None:
        """Abort on a failure path: an error here must not hide the first one, and what
        is left is found by the sweep."""
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id)
        except Exception:  # noqa: BLE001 - the sweep aborts it later
            logger.warning("could not abort the upload of %s; the sweep will", full, exc_info=True)

    def presigned_url(
        self,
        key: str,
        *,
        expires_seconds: int = 300,
        filename: str | None = None,
        content_type: str | None = None,
    ) -> str | None:
        """A GET URL signed with the store's credentials, valid `expires_seconds`.
        Signing is local: no request is made."""
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": self._full(key)}
        if filename is not None:
            params["ResponseContentDisposition"] = _content_disposition(filename)
        if content_type is not None:
            params["ResponseContentType"] = content_type
        with self._errors(key):
            return self.client.generate_presigned_url(
                "get_object", Params=params, ExpiresIn=int(expires_seconds)
            )

    def part_uploads(self) -> S3PartUploads:
        """Multipart uploads whose parts the caller numbers and keeps (resumable uploads,
        whose parts come from many requests on many instances)."""
        return S3PartUploads(self)


class _CooperativeBody:
    """A part's bytes as a request body that the HTTP client reads in pieces, stepping aside
    for the loop between pieces once its turn is over (`Turn`).

    gevent's `sendall` waits only when the socket is full: handed a whole 8 MiB part and a
    server that drains as fast (loopback, a LAN), it copied the part into the kernel in one
    go and held the loop for up to 40-140 ms. Read in the client's 16 KiB pieces, a part
    holds it for one turn at most. Seekable, so the client may retry the request.
    """

    def __init__(self, data: bytearray) -> None:
        self._view = memoryview(data)
        self._position = 0
        self._turn = Turn()

    def __len__(self) -> int:
        return len(self._view)

    def read(self, size: int | None = -1) -> bytes:
        self._turn.step_aside()
        end = len(self._view) if size is None or size < 0 else self._position + size
        piece = self._view[self._position : end].tobytes()
        self._position += len(piece)
        return piece

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._position, 2: len(self._view)}[whence]
        self._position = max(0, min(base + offset, len(self._view)))
        return self._position

    def tell(self) -> int:
        return self._position


def _sha256(data: bytes | bytearray) -> bytes:
    """A part's own digest (hashlib releases the interpreter lock on large buffers)."""
    return hashlib.sha256(data).digest()


class _Beside:
    """One call running beside its caller: a thread, which under `make run`'s gevent
    worker (threading patched) is a greenlet of the loop, so a part's request waits on its
    socket cooperatively. `wait` returns the call's result or raises its exception, there.
    """

    def __init__(self, function: Callable[..., Any], *args: Any) -> None:
        self._outcome: tuple[bool, Any] = (False, RuntimeError("the call did not finish"))
        self._thread = threading.Thread(
            target=self._run, args=(function, args), name="s3-part", daemon=True
        )
        self._thread.start()

    def _run(self, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            self._outcome = (True, function(*args))
        except BaseException as error:  # noqa: BLE001 - raised again by `wait`
            self._outcome = (False, error)

    def done(self) -> bool:
        return not self._thread.is_alive()

    def failed(self) -> bool:
        return self.done() and not self._outcome[0]

    def wait(self) -> Any:
        self._thread.join()
        returned, value = self._outcome
        if returned:
            return value
        raise value


class S3Writer:
    """A multipart upload, started only once a part is full, with a bounded number of
    parts on their way while the caller goes on writing.

    Below one part the object is a single PUT at commit. Above, each part of `part_size`
    (at least S3's 5 MiB) is handed, as it fills, to a call of its own beside the caller
    (`_Beside`: a greenlet under gevent, a thread otherwise) that hashes it beside the loop
    and sends it; the caller waits only when `parts_in_flight` parts are on their way, so
    a request's body is read while its earlier parts travel, and memory stays within one
    filling buffer plus the parts in flight. The last part, of any size, goes at commit.
    A part that failed is raised at the next `write` or `commit`, which aborts the upload
    (once every part still on its way has ended, so none lands after the abort). Nothing
    is visible before CompleteMultipartUpload (or the PUT) returns.

    With `whole_sha256=False` the object's own SHA-256 is not computed for a multipart
    upload (its caller hashes the same bytes already, see `WorkingCopies.open_incoming`):
    S3 still checks every part against the part's SHA-256, and `commit` reports None.
    """

    def __init__(
        self, store: S3ObjectStore, key: str, full: str, *, whole_sha256: bool = True
    ) -> None:
        self.key = key
        self.size = 0
        self._store = store
        self._full = full
        self._buffer = bytearray()
        self._whole_sha256 = whole_sha256
        self._hash = hashlib.sha256()
        self._hashing: Callable[[], Any] | None = None  # the whole hash's step in flight
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []
        self._in_flight: deque[_Beside] = deque()
        self._next_number = 1
        self._done = False

    @property
    def upload_id(self) -> str | None:
        """S3's id of the multipart upload once one was started (for tests and logs)."""
        return self._upload_id

    @property
    def parts_in_flight(self) -> int:
        """Parts handed off and not yet known to have arrived (for tests)."""
        return sum(1 for part in self._in_flight if not part.done())

    def write(self, data: bytes, *, hash_beside: bool = False) -> None:
        """Append `data` to the part buffer, sending each part as it fills. The bytes are
        copied into the buffer, so the caller may reuse `data` at once (`hash_beside`
        changes nothing here: parts are always hashed beside the loop).

        Raises:
            ObjectStoreUnavailable, StorageFailure: A part sent earlier failed (the
                upload is aborted).
        """
        if self._done:
            raise RuntimeError(f"{self.key}: already committed or aborted")
        self._raise_failed_part()
        view = memoryview(data)
        while view:
            room = self._store.part_size - len(self._buffer)
            self._buffer += view[:room]
            view = view[room:]
            if len(self._buffer) >= self._store.part_size:
                self._send_part()
        self.size += len(data)

    def _raise_failed_part(self) -> None:
        failed = next((part for part in self._in_flight if part.failed()), None)
        if failed is not None:
            try:
                failed.wait()
            except BaseException:
                self.abort()
                raise

    def _send_part(self) -> None:
        store = self._store
        part, self._buffer = self._buffer, bytearray()
        try:
            if self._next_number > MAX_PARTS:
                raise StorageFailure(f"{self.key} is larger than an upload in parts may be")
            if self._whole_sha256:
                self._hash_in_order(part)
            if self._upload_id is None:
                with store._errors(self.key):
                    started = store.client.create_multipart_upload(
                        Bucket=store.bucket, Key=self._full, ChecksumAlgorithm="SHA256"
                    )
                self._upload_id = started["UploadId"]
            while len(self._in_flight) >= store.parts_in_flight:
                self._parts.append(self._in_flight.popleft().wait())  # the window is full
            number, self._next_number = self._next_number, self._next_number + 1
            self._in_flight.append(_Beside(self._upload_part, self._upload_id, number, part))
        except BaseException:
            self.abort()
            raise

    def _hash_in_order(self, part: bytearray) -> None:
        """Feed the object's hash with `part` beside the loop, after the part before it."""
        if self._hashing is not None:
            self._hashing()
        self._hashing = start_beside(self._hash.update, part)

    def _upload_part(self, upload_id: str, number: int, part: bytearray) -> dict[str, Any]:
        store = self._store
        digest = _b64(start_beside(_sha256, part)())
        with store._errors(self.key):
            sent = store.client.upload_part(
                Bucket=store.bucket,
                Key=self._full,
                UploadId=upload_id,
                PartNumber=number,
                Body=_CooperativeBody(part),
                ChecksumSHA256=digest,
            )
        return {"PartNumber": number, "ETag": sent["ETag"], "ChecksumSHA256": digest}

    def commit(self) -> ObjectInfo:
        if self._done:
            raise RuntimeError(f"{self.key}: already committed or aborted")
        store = self._store
        sha256: str | None
        try:
            if self._upload_id is None:
                digest = start_beside(_sha256, self._buffer)()
                sha256 = digest.hex()  # one buffer: the part's digest is the object's
                with store._errors(self.key):
                    store.client.put_object(
                        Bucket=store.bucket,
                        Key=self._full,
                        Body=_CooperativeBody(self._buffer),
                        ChecksumSHA256=_b64(digest),
                        Metadata={SHA256_METADATA: sha256},
                    )
            else:
                if self._buffer:
                    self._send_part()
                while self._in_flight:
                    self._parts.append(self._in_flight.popleft().wait())
                sha256 = None
                if self._hashing is not None:
                    self._hashing()
                    sha256 = self._hash.hexdigest()
                with store._errors(self.key):
                    store.client.complete_multipart_upload(
                        Bucket=store.bucket,
                        Key=self._full,
                        UploadId=self._upload_id,
                        MultipartUpload={"Parts": sorted(self._parts, key=_part_number)},
                    )
        except BaseException:
            self.abort()
            raise
        self._done = True
        self._buffer = bytearray()
        return ObjectInfo(self.key, self.size, sha256, time.time())

    def abort(self) -> None:
        """Drop what was written: once every part on its way has ended (a part landing
        after the abort would start the upload's storage again), the upload is aborted."""
        if self._done:
            return
        self._done = True
        self._buffer = bytearray()
        while self._in_flight:
            try:
                self._in_flight.popleft().wait()
            except BaseException:  # noqa: BLE001, S110 - the upload is being dropped
                pass
        if self._upload_id is not None:
            self._store._abort_quietly(self._full, self._upload_id)

    def __enter__(self) -> S3Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()


def _part_number(part: dict[str, Any]) -> int:
    return int(part["PartNumber"])


class S3Stream:
    """A GetObject body read in `READ_CHUNK` pieces; an outage mid-stream is
    `ObjectStoreUnavailable`, as at the start."""

    def __init__(
        self, store: S3ObjectStore | None, key: str, body: Any, start: int, length: int, total: int
    ) -> None:
        self.key = key
        self.start = start
        self.length = length
        self.total_size = total
        self._store = store
        self._body = body

    @classmethod
    def empty(cls, key: str, start: int, total: int) -> S3Stream:
        return cls(None, key, None, start, 0, total)

    def __iter__(self) -> Iterator[bytes]:
        if self._body is None or self._store is None:
            return
        try:
            with self._store._errors(self.key):
                yield from self._body.iter_chunks(READ_CHUNK)
        finally:
            self.close()

    def close(self) -> None:
        if self._body is not None:
            self._body.close()
            self._body = None

    def __enter__(self) -> S3Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class UploadedPart(NamedTuple):
    """A part as S3 confirmed it: what CompleteMultipartUpload names."""

    number: int
    etag: str
    checksum_sha256: str  # base64
    size: int


class S3PartUploads:
    """A multipart upload driven part by part from outside: the caller keeps the upload id
    and the parts sent (in the database, for tus), so any instance may send the next part
    or complete it. A part sent again under the same number replaces the earlier one, and
    the completion names exactly the parts it wants, so parts a failed request sent are
    overwritten or dropped, never assembled."""

    def __init__(self, store: S3ObjectStore) -> None:
        self.store = store

    def start(self, key: str) -> str:
        """Start a multipart upload at `key` (SHA-256 checked per part); its UploadId."""
        store = self.store
        with store._errors(key):
            started = store.client.create_multipart_upload(
                Bucket=store.bucket, Key=store._full(key), ChecksumAlgorithm="SHA256"
            )
        return str(started["UploadId"])

    def send(self, key: str, upload_id: str, number: int, data: bytearray) -> UploadedPart:
        """Send part `number` (1 to 10,000); S3 checks it against its SHA-256."""
        if not 1 <= number <= MAX_PARTS:
            raise StorageFailure(f"{key} is larger than an upload in parts may be")
        store = self.store
        digest = _b64(start_beside(_sha256_of, data)())
        with store._errors(key):
            sent = store.client.upload_part(
                Bucket=store.bucket,
                Key=store._full(key),
                UploadId=upload_id,
                PartNumber=number,
                Body=_CooperativeBody(data),
                ChecksumSHA256=digest,
            )
        return UploadedPart(number, str(sent["ETag"]), digest, len(data))

    def complete(self, key: str, upload_id: str, parts: list[UploadedPart]) -> None:
        """Assemble the object at `key` from `parts`, in their order."""
        store = self.store
        listed = [
            {"PartNumber": p.number, "ETag": p.etag, "ChecksumSHA256": p.checksum_sha256}
            for p in parts
        ]
        with store._errors(key):
            store.client.complete_multipart_upload(
                Bucket=store.bucket,
                Key=store._full(key),
                UploadId=upload_id,
                MultipartUpload={"Parts": listed},
            )

    def abort(self, key: str, upload_id: str) -> None:
        """Drop the upload and its parts; one already gone is fine."""
        self.store.abort_stale_upload(StaleUpload(key, upload_id, 0.0))

    def put(self, key: str, data: bytearray | bytes) -> None:
        """One object of `data` in a single PUT, checked against its SHA-256."""
        store = self.store
        digest = start_beside(_sha256_of, data)()
        with store._errors(key):
            store.client.put_object(
                Bucket=store.bucket,
                Key=store._full(key),
                Body=_CooperativeBody(bytearray(data)),
                ChecksumSHA256=_b64(digest),
                Metadata={SHA256_METADATA: digest.hex()},
            )


def _sha256_of(data: bytes | bytearray) -> bytes:
    return hashlib.sha256(data).digest()
