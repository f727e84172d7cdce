"""Random names, paths, headers and bodies against every route: never a 5xx (issue 9).

The routes come from `app.url_map`, so a route added later is covered without a change
here. Each example picks a rule and a method, fills the URL's variables with hostile or
ordinary values, and sends random headers and a JSON, form, multipart or raw body. After
every example the app must still answer a plain request.
"""

from __future__ import annotations

import io
import re
from typing import Any
from urllib.parse import quote

from flask.testing import FlaskClient
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from tests.helpers import AUTH_ON
from tests.helpers import USER_ID
from tests.helpers import UploadActions

RULE_VARIABLE = re.compile(r"<(?:(?P<converter>\w+):)?(?P<name>\w+)>")
SKIPPED_METHODS = frozenset({"HEAD", "OPTIONS"})

NASTY_NAMES = [
    "keep.txt",
    "a.txt",
    "report.pdf",
    "",
    ".",
    "..",
    "../..",
    "a\x00b",
    "\x00",
    "a" * 256,
    "文" * 86,
    "%00",
    "%2e%2e",
    "a\nb",
    "a\r\nX-Injected: 1",
    "evil\u202etxt.exe",
    "\ud7ff",
    "con",
    "a" * 4096,
    "mnt/user-data/uploads/keep.txt",
    "mnt/user-data/../../etc/passwd",
    "mnt/user-data/uploads/" + "b" * 300,
    "mnt/user-data/outputs/x\x00y",
    "uploads",
    "outputs",
    "workspace",
]
texts = st.text(max_size=80)
nasty = st.sampled_from(NASTY_NAMES)
names = st.one_of(nasty, st.builds("/".join, st.lists(nasty, min_size=2, max_size=3)), texts)
# Mostly a valid thread, so requests get past the id check to the names.
thread_ids = st.one_of(
    st.just("T"), st.just("T"), st.sampled_from(["other", "x" * 64, "x" * 65, "a b", ""]), texts
)
AREA_PREFIXES = ["mnt/user-data/uploads", "mnt/user-data/outputs", "mnt/user-data/workspace"]
paths = st.one_of(
    st.builds(
        lambda prefix, name: f"{prefix}/{name}",
        st.sampled_from([*AREA_PREFIXES, "uploads", "outputs", "workspace"]),
        names,
    ),
    names,
)
header_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=60)
headers = st.dictionaries(
    st.sampled_from(
        [
            "Range",
            "If-Range",
            "If-None-Match",
            "If-Modified-Since",
            "Origin",
            "Sec-Fetch-Site",
            "Accept-Language",
            "Accept",
            "Cookie",
            "Content-Type",
            "X-CSRFToken",
            "Referer",
        ]
    ),
    st.one_of(
        header_text,
        st.sampled_from(
            [
                "bytes=0-1",
                "bytes=-5",
                "bytes=99999999999999999999-",
                "bytes=1-0",
                "http://localhost",
                "null",
                "cross-site",
                "multipart/form-data; boundary=",
                "application/json",
                "zh-CN,zh;q=0.9",
            ]
        ),
    ),
    max_size=4,
)
# Header values a tus route reads as numbers (or as the protocol's other fields): the
# decimal forms a parser may choke on, the 5,000-digit one among them. Every tus example
# speaks the protocol's version, so it gets past the version check to the numbers.
numbers = st.one_of(
    st.sampled_from(["9" * 5000, "9" * 4301, "9" * 20, str(2**63)]),
    st.sampled_from(["-1", "", "1.5", "0x10", " 7", "+3", "1_000", "1e3", "\u0663"]),
    st.integers(min_value=0, max_value=2**64).map(str),
)
tus_headers = st.fixed_dictionaries(
    {"Tus-Resumable": st.just("1.0.0"), "Upload-Length": numbers, "Upload-Offset": numbers},
    optional={
        "Upload-Defer-Length": numbers,
        "Upload-Metadata": st.one_of(header_text, st.just("filename eC5iaW4=")),
        "Upload-Checksum": st.one_of(header_text, st.just("sha1 AAAA")),
        "Content-Type": st.just("application/offset+octet-stream"),
    },
)

json_values = st.recursive(
    # integers as the test client can encode them (orjson: 64 bits)
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | texts,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["new_name", "name", "on_conflict", "x"]) | texts, children
        )
    ),
    max_leaves=12,
)
form_fields = st.dictionaries(
    st.sampled_from(
        ["new_name", "name", "on_conflict", "filename", "filenames", "message", "attach", "mode"]
    )
    | texts,
    names,
    max_size=4,
)
query = st.dictionaries(
    st.sampled_from(["download", "on_conflict", "view", "next", "q", "sort", "turn"]) | texts,
    st.one_of(names, st.sampled_from(["true", "perhaps", "//evil.example", "source"])),
    max_size=3,
)
bodies = st.one_of(
    st.none(),
    st.builds(lambda value: {"json": value}, json_values),
    st.builds(lambda fields: {"data": fields}, form_fields),
    st.builds(
        lambda files, fields: {
            "data": {**fields, "files": [(io.BytesIO(data), name) for name, data in files]},
            "content_type": "multipart/form-data",
        },
        st.lists(st.tuples(names, st.binary(max_size=64)), max_size=3),
        form_fields,
    ),
    st.builds(
        lambda data, kind: {"data": data, "content_type": kind},
        st.binary(max_size=200),
        st.sampled_from(["application/json", "multipart/form-data; boundary=x", "text/plain"]),
    ),
)


def _fill(rule: str, data: st.DataObject) -> str:
    """The rule's URL with every variable replaced by a drawn, percent-encoded value."""

    def value(match: re.Match[str]) -> str:
        if match["name"] == "thread_id":
            return quote(data.draw(thread_ids), safe="")
        if match["converter"] == "path":
            return quote(data.draw(paths), safe="/")
        return quote(data.draw(names), safe="")

    return RULE_VARIABLE.sub(value, rule)


def test_no_route_answers_a_server_error(make_app) -> None:
    app = make_app()
    client = app.test_client()
    seeded = UploadActions(client)
    assert seeded.upload("T", (b"keep", "keep.txt")).status_code == 200
    routes = sorted(
        (rule.rule, method)
        for rule in app.url_map.iter_rules()
        for method in rule.methods or ()
        if method not in SKIPPED_METHODS
    )
    assert len(routes) >= 20  # the walk found the app's routes

    for route in routes:
        check_route(client, route)


@settings(
    max_examples=15,
    deadline=None,
    derandomize=True,  # the same examples on every run: a failure is reproducible
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data(), sent_headers=headers, args=query, body=bodies)
def check_route(
    client: FlaskClient,
    route: tuple[str, str],
    data: st.DataObject,
    sent_headers: dict[str, str],
    args: dict[str, str],
    body: dict[str, Any] | None,
) -> None:
    """Fifteen examples per route, so every route is reached, however many there are."""
    rule, method = route
    url = _fill(rule, data)
    if "/uploads/tus" in rule:  # past the version check, into the protocol's numbers
        sent_headers = {**sent_headers, **data.draw(tus_headers)}
    kwargs: dict[str, Any] = dict(body or {}) if method != "GET" else {}
    response = client.open(url, method=method, headers=sent_headers, query_string=args, **kwargs)
    status = response.status_code
    response.close()
    assert status < 500, (method, url, sent_headers, args, body, status)
    if AUTH_ON and client.get("/api/v1/auth/me").status_code == 401:
        client.sign_in(USER_ID)  # the walk reached sign-out: carry on as the same user
    with client.get("/api/threads/T/uploads/limits") as alive:
        assert alive.status_code == 200  # the app keeps answering
