"""Holds every response the test suite receives to the OpenAPI document.

`conftest.py` connects `check_response` to Flask's `request_finished` signal for the whole
run: after each request that matched an API route, the response must be one the document
lists for that route, method and status, with a documented content type, the documented
required headers, and (for JSON) a body valid against the documented schema.

The operation is found through the rule Flask matched (`request.url_rule`), not by matching
the URL against path templates again: `{virtual_path}` may hold slashes, which OpenAPI
templates cannot express but Werkzeug's `path` converter does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from flask import Flask
from flask import Response
from flask import request
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing import Resource
from referencing.jsonschema import DRAFT202012

from deerflow_web.web.api.docs import build_document
from deerflow_web.web.wiring import get_services

DOCUMENT_URI = "urn:deerflow-web:openapi"
_CONVERTER = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")
_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def openapi_path(rule: str) -> str:
    """`/api/threads/<thread_id>/artifacts/<path:virtual_path>` → `.../{virtual_path}`."""
    return _CONVERTER.sub(r"{\1}", rule)


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


class ResponseChecker:
    """Checks responses against one OpenAPI 3.1 document."""

    def __init__(self, document: Mapping[str, Any]) -> None:
        self._document = document
        resource = Resource.from_contents(document, default_specification=DRAFT202012)
        self._registry = Registry().with_resource(DOCUMENT_URI, resource)
        self._validators: dict[str, Draft202012Validator] = {}

    def _resolve(self, node: Mapping[str, Any], pointer: str) -> tuple[Mapping[str, Any], str]:
        """Follow a component `$ref` (responses, headers); return the node and its pointer."""
        while "$ref" in node:
            pointer = node["$ref"].removeprefix("#")
            node = self._document
            for token in pointer.strip("/").split("/"):
                node = node[token.replace("~1", "/").replace("~0", "~")]
        return node, pointer

    def _validator(self, pointer: str) -> Draft202012Validator:
        if pointer not in self._validators:
            schema = {"$ref": f"{DOCUMENT_URI}#{pointer}"}
            self._validators[pointer] = Draft202012Validator(schema, registry=self._registry)
        return self._validators[pointer]

    def problems(self, rule: str, method: str, response: Response) -> list[str]:
        """What is wrong with `response` as the answer of `method rule`; [] when it fits."""
        path = openapi_path(rule)
        item = self._document["paths"].get(path)
        if item is None:
            return [f"{path} is not documented"]
        verb = method.lower()
        if verb == "head" and "head" not in item:
            verb = "get"  # Flask answers HEAD with the GET view
        if verb not in item:
            return [f"{method} {path} is not documented"]
        operation = item[verb]
        status = str(response.status_code)
        responses = operation.get("responses", {})
        if status not in responses:
            return [f"{method} {path} answered {status}, which is not documented"]
        pointer = f"/paths/{_escape(path)}/{verb}/responses/{status}"
        documented, pointer = self._resolve(responses[status], pointer)
        found: list[str] = []
        for name, header in documented.get("headers", {}).items():
            header, _ = self._resolve(header, "")
            if header.get("required") and name not in response.headers:
                found.append(f"{method} {path} {status} lacks header {name}")
        content = documented.get("content")
        if not content:
            if response.is_sequence and verb != "head" and response.get_data():
                found.append(f"{method} {path} {status} has a body; none is documented")
            return found
        mimetype = response.mimetype
        media = next(
            (key for key in (mimetype, f"{mimetype.split('/')[0]}/*", "*/*") if key in content),
            None,
        )
        if media is None:
            return [
                *found,
                f"{method} {path} {status} sent {mimetype}; documented: {list(content)}",
            ]
        is_json = mimetype == "application/json" or mimetype.endswith("+json")
        if verb == "head" or not is_json or not response.is_sequence:
            return found  # files are streamed; their bytes are not the document's business
        if "schema" in content[media]:
            schema_pointer = f"{pointer}/content/{_escape(media)}/schema"
            body = response.get_json()
            for error in self._validator(schema_pointer).iter_errors(body):
                where = "/".join(str(part) for part in error.absolute_path)
                found.append(f"{method} {path} {status} body at /{where}: {error.message}")
        return found


# One checker per document an app serves (`build_document` shares equal ones), so its
# compiled validators serve every app of the run; the document is kept alive beside it.
_checkers: dict[int, tuple[Mapping[str, Any], ResponseChecker]] = {}


def check_response(sender: Flask, response: Response, **extra: Any) -> None:
    """A `request_finished` receiver: the response must fit the document `sender` serves.

    Flask sends `request_finished` after every after_request hook has run, for every app
    the tests build (through `make_app` or `create_app` itself); a mismatch raises inside
    the request, so the test that made it fails and names the route.
    """
    rule = request.url_rule
    if rule is None or not _in_scope(rule.rule):  # routing 404/405; pages; static files
        return
    document = build_document(get_services().settings)
    if id(document) not in _checkers:
        _checkers[id(document)] = (document, ResponseChecker(document))
    checker = _checkers[id(document)][1]
    found = checker.problems(rule.rule, request.method, response)
    assert not found, "response does not match openapi.yaml:\n" + "\n".join(found)


def _in_scope(rule: str) -> bool:
    """The routes the document must describe: the JSON API and the health checks."""
    return rule.startswith("/api/") or rule in ("/healthz", "/readyz", "/openapi.json")
