"""File bytes by object key, on the local disk or in an S3-compatible bucket.

- `keys`: the key of a thread's file (its path relative to the data dir), and the check
  that refuses a key leaving its prefix.
- `base`: the contract both backends keep (`ObjectStore`, writers, streams, stale uploads).
- `disk`: the data dir, with today's staging files and atomic renames.
- `s3`: a bucket through boto3 (why boto3: see its docstring), multipart while streaming.

- `working_copy`: with `storage.backend: s3`, the data dir as this instance's copy of the
  bucket: every record's bytes pushed before it is written, a thread's folder fetched up
  to date before it is read.

The upload records stay the source of truth; a store keeps bytes only.
"""

from __future__ import annotations

import os

from deerflow_web.settings import StorageSettings
from deerflow_web.storage.objects.base import ObjectInfo
from deerflow_web.storage.objects.base import ObjectStore
from deerflow_web.storage.objects.base import ObjectStream
from deerflow_web.storage.objects.base import ObjectWriter
from deerflow_web.storage.objects.base import StaleUpload
from deerflow_web.storage.objects.base import sweep_stale_uploads
from deerflow_web.storage.objects.keys import area_key
from deerflow_web.storage.objects.keys import check_key

__all__ = [
    "ObjectInfo",
    "ObjectStore",
    "ObjectStream",
    "ObjectWriter",
    "StaleUpload",
    "area_key",
    "check_key",
    "make_object_store",
    "sweep_stale_uploads",
]


def make_object_store(storage: StorageSettings, base_dir: str | os.PathLike[str]) -> ObjectStore:
    """The store `storage.backend` names: the data dir, or the bucket of `storage.s3`
    (credentials from the AWS chain: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, ...)."""
    if storage.backend == "s3":
        from deerflow_web.storage.objects.s3 import S3ObjectStore

        return S3ObjectStore(
            storage.s3.bucket or "",
            endpoint_url=storage.s3.endpoint_url,
            region=storage.s3.region,
            prefix=storage.s3.prefix,
            parts_in_flight=storage.s3.parts_in_flight,
        )
    from deerflow_web.storage.objects.disk import DiskObjectStore

    return DiskObjectStore(base_dir)
