"""schemathesis hooks for tests/system/test_api_fuzz.py: the client does what the document says."""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.hook
def before_call(context: Any, case: Any, **kwargs: Any) -> None:
    """Send an upload's `on_conflict` field before its files, as the document requires.

    The server stores each file while the body streams, so a rule sent after the files would
    come too late and is refused with 400; a generated body lists its fields in any order.
    """
    body = case.body
    if isinstance(body, dict) and "on_conflict" in body:
        case.body = {"on_conflict": body["on_conflict"]} | {
            key: value for key, value in body.items() if key != "on_conflict"
        }


# A tus PATCH body is raw bytes, sent as application/offset+octet-stream.
schemathesis.serializer.alias("application/offset+octet-stream", "application/octet-stream")
