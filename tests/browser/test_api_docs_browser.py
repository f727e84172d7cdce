"""The API docs page in Chromium: Swagger UI renders from vendored files under the strict CSP."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Route
from playwright.sync_api import expect

from tests.browser.helpers import LiveServer
from tests.browser.helpers import Watched

pytestmark = pytest.mark.browser

# Records CSP violations as the page sees them; the console check alone would also catch
# them, this says which directive was broken.
COLLECT_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__cspViolations.push(event.violatedDirective + " " + event.blockedURI);
});
"""


def _operations(document: dict) -> int:
    methods = {"get", "post", "put", "patch", "delete", "head", "options"}
    return sum(1 for item in document["paths"].values() for method in item if method in methods)


def test_docs_page_renders_offline_under_csp(page: Watched, live: LiveServer) -> None:
    outside: list[str] = []

    def only_loopback(route: Route) -> None:
        if urlsplit(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:  # no network beyond this server: any other host is a failure
            outside.append(route.request.url)
            route.abort()

    page.context.route("**/*", only_loopback)
    page.context.add_init_script(COLLECT_VIOLATIONS)

    response = page.page.goto(live.url + "/api/docs")
    assert response is not None and response.status == 200
    assert "script-src 'self'" in response.headers["content-security-policy"]
    expect(page.page.locator(".swagger-ui .info .title")).to_contain_text("deerflow-web")
    served = page.page.request.get(live.url + "/openapi.json").json()  # fitted to the mode
    expect(page.page.locator(".swagger-ui .opblock")).to_have_count(_operations(served))

    limits = page.page.locator(".opblock-get", has_text="/api/threads/{thread_id}/uploads/limits")
    limits.locator(".opblock-summary").click()
    limits.get_by_role("button", name="Try it out").click()
    limits.locator("tr[data-param-name='thread_id'] input").fill("docs-thread")
    limits.get_by_role("button", name="Execute").click()
    live_response = limits.locator(".live-responses-table tbody .response")
    expect(live_response.locator(".response-col_status")).to_have_text("200")
    expect(live_response).to_contain_text('"max_files": 10')
    page.shoot("api-docs")

    assert page.page.evaluate("window.__cspViolations") == []
    assert outside == []


def test_every_page_links_the_docs_in_its_footer(page: Watched, live: LiveServer) -> None:
    page.page.goto(live.url + "/")
    page.page.locator("footer").get_by_role("link", name="API documentation").click()
    expect(page.page).to_have_url(live.url + "/api/docs")


def test_try_it_out_changes_data_as_the_signed_in_page(page: Watched, live: LiveServer) -> None:
    """A state-changing call from the docs page carries the page's CSRF headers, so with
    accounts on it is made as the signed-in person, like the file manager's."""
    live.seed("docs-thread", {"old.txt": b"old"})
    page.page.goto(live.url + "/api/docs")
    path = "/api/threads/{thread_id}/uploads/{filename}"
    operation = page.page.locator(".opblock-delete").filter(
        has=page.page.locator(f".opblock-summary-path[data-path='{path}']")
    )
    expect(operation).to_have_count(1)
    operation.locator(".opblock-summary").click()
    operation.get_by_role("button", name="Try it out").click()
    operation.locator("tr[data-param-name='thread_id'] input").fill("docs-thread")
    operation.locator("tr[data-param-name='filename'] input").fill("old.txt")
    operation.get_by_role("button", name="Execute").click()
    answer = operation.locator(".live-responses-table tbody .response .response-col_status")
    expect(answer).to_have_text("200")
    assert live.names("docs-thread") == []
