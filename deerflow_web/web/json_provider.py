"""JSON responses through orjson, and request bodies parsed without surprises.

A listing of a thousand uploads is about 640 KB of JSON; the standard library encoder
spent a quarter of the request on it, orjson a tenth of that.
"""

from __future__ import annotations

from typing import Any

import orjson
from flask import Request
from flask import Response
from flask.json.provider import DefaultJSONProvider
from werkzeug.exceptions import BadRequest


class OrjsonProvider(DefaultJSONProvider):
    """Flask's JSON provider with orjson doing the encoding."""

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        """Encode compactly; types orjson lacks fall back to Flask's own rules."""
        return orjson.dumps(obj, default=self.default).decode()

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        """Parse a request body; one nested too deeply is malformed, not a crash.

        The standard library parser recurses once per level and raises RecursionError
        (not ValueError) for a body such as 1,000 `[`; Flask turns ValueError into 400.
        """
        try:
            return super().loads(s, **kwargs)
        except RecursionError:
            raise ValueError("JSON nested too deeply") from None

    def response(self, *args: Any, **kwargs: Any) -> Response:
        """Build the response from orjson's bytes directly, without a str round trip."""
        obj = self._prepare_response_obj(args, kwargs)
        body = orjson.dumps(obj, default=self.default, option=orjson.OPT_APPEND_NEWLINE)
        return self._app.response_class(body, mimetype=self.mimetype)


class AppRequest(Request):
    """Flask's request, saying why a JSON body was refused (Flask hides it unless debugging)."""

    def on_json_loading_failed(self, e: ValueError | None) -> Any:
        """A body that does not parse is 400 with the parser's reason."""
        if e is None:
            return super().on_json_loading_failed(e)  # 415: not JSON at all
        raise BadRequest(f"Malformed JSON body: {e}")
