"""The tus 1.0.0 requests tests make through a Flask test client (SPEC 8)."""

from __future__ import annotations

import base64
import hashlib

from flask.testing import FlaskClient
from werkzeug.test import TestResponse

TUS = {"Tus-Resumable": "1.0.0"}
CHUNK_TYPE = "application/offset+octet-stream"


def encode_metadata(**values: str) -> str:
    """`Upload-Metadata`: each key with its value in base64."""
    return ",".join(
        f"{key} {base64.b64encode(value.encode()).decode()}" for key, value in values.items()
    )


def b64digest(algorithm: str, data: bytes) -> str:
    """`Upload-Checksum`'s digest of `data`, in base64."""
    return base64.b64encode(hashlib.new(algorithm, data).digest()).decode()


class TusActions:
    """The tus requests tests make, with the protocol header unless told otherwise."""

    def __init__(self, client: FlaskClient) -> None:
        self._client = client

    def create(
        self, thread_id: str, length: int, metadata: str | None = None, **headers: str
    ) -> TestResponse:
        sent = {**TUS, "Upload-Length": str(length), **headers}
        if metadata is not None:
            sent["Upload-Metadata"] = metadata
        return self._client.post(f"/api/threads/{thread_id}/uploads/tus", headers=sent)

    def start(self, thread_id: str, length: int, filename: str = "big.bin", **meta: str) -> str:
        response = self.create(thread_id, length, encode_metadata(filename=filename, **meta))
        assert response.status_code == 201, response.get_json()
        return response.headers["Location"]

    def head(self, url: str, **headers: str) -> TestResponse:
        return self._client.head(url, headers={**TUS, **headers})

    def offset(self, url: str) -> int:
        response = self.head(url)
        assert response.status_code == 200, response.status_code
        return int(response.headers["Upload-Offset"])

    def patch(
        self,
        url: str,
        offset: int,
        data: bytes,
        *,
        checksum: str | None = None,
        content_type: str = CHUNK_TYPE,
        **headers: str,
    ) -> TestResponse:
        sent = {**TUS, "Upload-Offset": str(offset), "Content-Type": content_type, **headers}
        if checksum is not None:
            sent["Upload-Checksum"] = checksum
        return self._client.patch(url, data=data, headers=sent)

    def delete(self, url: str) -> TestResponse:
        return self._client.delete(url, headers=TUS)
