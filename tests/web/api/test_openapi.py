"""/openapi.json and /api/docs: a valid document that names every route, and the checker's teeth."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask import Response
from flask.testing import FlaskClient
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate
from referencing import Registry
from referencing import Resource
from referencing.jsonschema import DRAFT202012

from deerflow_web.web.api.docs import build_document
from deerflow_web.web.api.docs import openapi_document
from deerflow_web.web.wiring import get_services
from tests.support.openapi_check import ResponseChecker
from tests.support.openapi_check import openapi_path

ROOT = Path(__file__).resolve().parents[3]
VENDOR = ROOT / "static" / "vendor" / "swagger-ui"
HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def _in_scope(rule: str) -> bool:
    return rule.startswith("/api/") or rule in ("/healthz", "/readyz", "/openapi.json")


def _routes(app: Flask) -> set[tuple[str, str]]:
    """(METHOD, openapi path) for every API route; Flask's automatic HEAD/OPTIONS left out."""
    found = set()
    for rule in app.url_map.iter_rules():
        if not _in_scope(rule.rule):
            continue
        methods = set(rule.methods or ())
        if "GET" in methods:
            methods.discard("HEAD")  # Werkzeug adds HEAD to every GET rule
        if rule.provide_automatic_options:
            methods.discard("OPTIONS")
        found |= {(method, openapi_path(rule.rule)) for method in methods}
    return found


def _operations(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method in item
        if method in HTTP_METHODS
    }


def test_document_is_served_and_valid(client: FlaskClient) -> None:
    response = client.get("/openapi.json")
    assert response.status_code == 200
    assert response.mimetype == "application/json"
    document = response.get_json()
    assert document["openapi"].startswith("3.1.")
    validate(document)  # raises on an invalid OpenAPI 3.1 document


def test_every_route_is_documented_and_nothing_else(app: Flask) -> None:
    routes = _routes(app)
    with app.app_context():
        documented = _operations(build_document(get_services().settings))
    assert routes - documented == set(), "routes missing from openapi.yaml"
    assert documented - routes == set(), "openapi.yaml documents routes the app does not have"


def test_every_path_parameter_is_declared() -> None:
    for path, item in openapi_document()["paths"].items():
        in_path = set(re.findall(r"{([^}]+)}", path))
        for method, operation in item.items():
            if method not in HTTP_METHODS:
                continue
            declared = {
                _parameter(p)["name"]
                for p in operation.get("parameters", [])
                if _parameter(p)["in"] == "path"
            }
            assert declared == in_path, f"{method.upper()} {path}"


def _parameter(node: dict[str, Any]) -> dict[str, Any]:
    if "$ref" not in node:
        return node
    name = node["$ref"].rsplit("/", 1)[-1]
    return openapi_document()["components"]["parameters"][name]


def _examples(document: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(where, schema, example) for every example given beside a media type's schema."""
    found = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method not in HTTP_METHODS:
                continue
            bodies = [("request", operation.get("requestBody", {}))]
            bodies += list(operation.get("responses", {}).items())
            for label, body in bodies:
                for media, content in body.get("content", {}).items():
                    where = f"{method.upper()} {path} {label} {media}"
                    if "example" in content:
                        found.append((where, content["schema"], content["example"]))
                    for name, example in content.get("examples", {}).items():
                        if "$ref" in example:
                            ref = example["$ref"].rsplit("/", 1)[-1]
                            example = document["components"]["examples"][ref]
                        found.append((f"{where} {name}", content["schema"], example["value"]))
    return found


def test_examples_fit_their_schemas() -> None:
    document = openapi_document()
    resource = Resource.from_contents(document, default_specification=DRAFT202012)
    registry = Registry().with_resource("urn:doc", resource)
    examples = _examples(document)
    assert len(examples) >= 8
    for where, schema, example in examples:
        if "$ref" in schema:
            schema = {"$ref": "urn:doc" + schema["$ref"]}
        errors = [
            e.message for e in Draft202012Validator(schema, registry=registry).iter_errors(example)
        ]
        assert errors == [], where


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    (
        (200, {"max_files": 1, "max_file_size": 1, "max_total_size": 1}, []),
        (200, {"max_files": "ten", "max_file_size": 1, "max_total_size": 1}, ["/max_files"]),
        (418, {"detail": "teapot"}, ["answered 418, which is not documented"]),
        (422, {"detail": "a string where a list belongs"}, ["body at /detail"]),
    ),
)
def test_checker_refuses_what_the_document_does_not_say(
    status: int, body: dict[str, Any], expected: list[str]
) -> None:
    checker = ResponseChecker(openapi_document())
    response = Response(_json(body), status=status, mimetype="application/json")
    problems = checker.problems("/api/threads/<thread_id>/uploads/limits", "GET", response)
    assert len(problems) == len(expected)
    for problem, part in zip(problems, expected, strict=True):
        assert part in problem


def test_checker_refuses_an_undocumented_route_and_content_type() -> None:
    checker = ResponseChecker(openapi_document())
    plain = Response("hi", mimetype="text/plain")
    assert checker.problems("/api/nothing/<x>", "GET", plain) == [
        "/api/nothing/{x} is not documented"
    ]
    assert (
        "not documented"
        in checker.problems("/api/threads/<thread_id>/uploads/list", "PUT", plain)[0]
    )
    assert (
        "sent text/plain"
        in checker.problems("/api/threads/<thread_id>/uploads/list", "GET", plain)[0]
    )


def test_checker_requires_documented_headers() -> None:
    checker = ResponseChecker(openapi_document())
    rule = "/api/threads/<thread_id>/artifacts/<path:virtual_path>"
    response = Response(_json({"detail": "Requested Range Not Satisfiable"}), 416)
    response.mimetype = "application/json"
    assert checker.problems(rule, "GET", response) == [
        f"GET {openapi_path(rule)} 416 lacks header Content-Range"
    ]
    response.headers["Content-Range"] = "bytes */0"
    assert checker.problems(rule, "GET", response) == []


def _json(body: Any) -> str:
    return json.dumps(body)


def test_docs_page_keeps_the_strict_csp(client: FlaskClient) -> None:
    response = client.get("/api/docs")
    assert response.status_code == 200
    csp = response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe" not in csp
    html = response.get_data(as_text=True)
    assert "/static/vendor/swagger-ui/swagger-ui-bundle.js" in html
    assert "<script>" not in html  # no inline script: the CSP would block it
    assert 'data-spec-url="/openapi.json"' in html
    assert "http://" not in html and "https://" not in html  # nothing from a CDN


def test_only_the_docs_page_under_api_may_run_script(client: FlaskClient) -> None:
    api = client.get("/api/threads/t/uploads/limits").headers["Content-Security-Policy"]
    page = client.get("/api/docs").headers["Content-Security-Policy"]
    assert "sandbox" in api and "script-src" not in api
    assert "sandbox" not in page and "script-src 'self'" in page


def test_swagger_ui_is_vendored_with_its_licence(client: FlaskClient) -> None:
    pinned = re.search(
        r'VERSION="\$\{1:-([0-9.]+)\}"', (ROOT / "scripts/vendor-swagger-ui.sh").read_text()
    )
    assert pinned is not None
    assert (VENDOR / "VERSION").read_text().split() == ["swagger-ui-dist", pinned.group(1)]
    assert "Apache License" in (VENDOR / "LICENSE").read_text()
    for name in ("swagger-ui-bundle.js", "swagger-ui.css", "NOTICE"):
        with client.get(f"/static/vendor/swagger-ui/{name}") as response:
            assert response.status_code == 200, name


def test_every_page_footer_links_the_docs(client: FlaskClient) -> None:
    for url in ("/", "/threads/t1", "/api/docs"):
        html = client.get(url).get_data(as_text=True)
        assert re.search(r'<footer[^>]*>\s*<a href="/api/docs">', html), url


def test_without_accounts_the_document_asks_for_no_credentials(make_app: Any) -> None:
    served = make_app(auth={"enabled": False}).test_client().get("/openapi.json").get_json()
    validate(served)
    assert "security" not in served and "securitySchemes" not in served["components"]
    for path, item in served["paths"].items():
        for method, operation in item.items():
            assert "security" not in operation, (method, path)
            assert "401" not in operation["responses"], (method, path)


def test_as_written_the_document_describes_accounts_on() -> None:
    document = openapi_document()
    validate(document)
    schemes = document["components"]["securitySchemes"]
    assert schemes["bearerAuth"] == {**schemes["bearerAuth"], "type": "http", "scheme": "bearer"}
    assert schemes["csrfToken"]["in"] == "header" and schemes["csrfToken"]["name"] == "X-CSRF-Token"
    for path, item in document["paths"].items():
        for method, operation in item.items():
            public = operation.get("security") == []
            assert public or "401" in operation["responses"], (method, path)
            if method in ("post", "put", "patch", "delete") and not public:
                schemes_used = [set(req) for req in operation.get("security", [])]
                assert {"sessionCookie", "csrfToken"} in schemes_used, (method, path)


def test_every_app_in_the_suite_is_held_to_the_document(make_app) -> None:
    app = make_app()

    @app.after_request
    def _drift(response: Response) -> Response:  # the kind of change the document must catch
        response.status_code = 418
        return response

    with pytest.raises(AssertionError, match="answered 418, which is not documented"):
        app.test_client().get("/api/threads/t/uploads/limits")
    assert app.test_client().get("/").status_code == 418  # pages are not the API's business
