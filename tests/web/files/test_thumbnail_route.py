"""GET /threads/<id>/thumbnails/<name>: a WebP of an uploaded raster image, for its owner."""

from __future__ import annotations

from flask.testing import FlaskClient

from tests.browser.helpers import gradient_png
from tests.helpers import UploadActions

THREAD = "thumb-thread"


def fetched(client: FlaskClient, url: str):  # noqa: ANN201 - a test response
    response = client.get(url)
    response.get_data()
    response.close()
    return response


def test_an_image_gets_a_webp_thumbnail(client: FlaskClient, uploads: UploadActions) -> None:
    uploads.upload(THREAD, (gradient_png(200, 100), "photo.png"))
    response = fetched(client, f"/threads/{THREAD}/thumbnails/photo.png")
    assert response.status_code == 200
    assert response.mimetype == "image/webp"
    assert response.get_data()[8:12] == b"WEBP"
    assert response.headers["Cache-Control"] == "private, max-age=86400"
    page = client.get(f"/threads/{THREAD}").get_data(as_text=True)
    assert f"/threads/{THREAD}/thumbnails/photo.png?v=" in page


def test_svg_text_and_damaged_images_have_none(client: FlaskClient, uploads: UploadActions) -> None:
    uploads.upload(
        THREAD,
        (b"<svg xmlns='http://www.w3.org/2000/svg'/>", "logo.svg"),
        (b"hello", "a.txt"),
        (b"\x89PNG\r\n\x1a\nbroken", "broken.png"),
    )
    for name in ("logo.svg", "a.txt", "broken.png", "missing.png"):
        assert fetched(client, f"/threads/{THREAD}/thumbnails/{name}").status_code == 404, name
    page = client.get(f"/threads/{THREAD}").get_data(as_text=True)
    assert "thumbnails/logo.svg" not in page


def test_an_unknown_thread_is_404(client: FlaskClient) -> None:
    assert fetched(client, "/threads/nobody-has-it/thumbnails/photo.png").status_code == 404
