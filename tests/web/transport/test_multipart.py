"""The streaming multipart reader, against bodies whose parts are known (SPEC 2.1)."""

from __future__ import annotations

import io
import random

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from werkzeug.http import parse_options_header

import deerflow_web.web.transport.multipart as multipart
from deerflow_web.errors import MalformedUpload
from deerflow_web.errors import MissingFilesField
from deerflow_web.web.transport.multipart import MultipartReader

# Nothing here reads the mode: the reader alone, on bytes. The single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes


class ChunkyStream:
    """A body that arrives in reads of random, often tiny, sizes."""

    def __init__(self, data: bytes, rng: random.Random) -> None:
        self._data = data
        self._position = 0
        self._rng = rng

    def readinto(self, buffer: memoryview) -> int:
        step = min(len(buffer), self._rng.choice([1, 2, 5, 17, 300, 1 << 20]))
        piece = self._data[self._position : self._position + step]
        buffer[: len(piece)] = piece
        self._position += len(piece)
        return len(piece)


def encode(boundary: bytes, files: list[tuple[str, bytes]], fields: dict[str, str]) -> bytes:
    body = b"preamble to ignore"
    for name, value in fields.items():
        body += b"\r\n--" + boundary + f'\r\nContent-Disposition: form-data; name="{name}"'.encode()
        body += b"\r\n\r\n" + value.encode()
    for filename, data in files:
        body += b"\r\n--" + boundary + b"\r\nContent-Disposition: form-data; "
        body += f'name="files"; filename="{filename}"'.encode()
        body += b"\r\nContent-Type: application/octet-stream\r\n\r\n" + data
    return body + b"\r\n--" + boundary + b"--\r\n"


def read_all(reader: MultipartReader) -> list[tuple[str, bytes]]:
    return [(f.filename, b"".join(bytes(c) for c in iter(f.stream.read, b""))) for f in reader]


@pytest.mark.parametrize("seed", range(8))
def test_random_bodies_in_random_reads(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Data full of CRs, LFs, dashes and near-delimiters comes back byte for byte."""
    rng = random.Random(seed)
    for _ in range(60):
        boundary = b"b" + rng.randbytes(rng.randint(1, 20)).hex().encode()
        delimiter = b"\r\n--" + boundary
        alphabet = [b"\r", b"\n", b"-", b"x", b"\x00", boundary[:3], delimiter[:-1]]
        files = []
        for index in range(rng.randint(1, 4)):
            data = b"".join(rng.choice(alphabet) for _ in range(rng.choice([0, 1, 3, 80, 900])))
            # The reader takes data that begins with `--boundary` for an empty part written
            # Werkzeug's way (see BodyReader.begin_data), so such data is not generated.
            ambiguous = (b"\r\n" + data).startswith(delimiter)
            if (
                ambiguous
                or delimiter in data + delimiter[: len(delimiter) - 1]
                or data.endswith(b"\r")
            ):
                data = data.replace(b"-", b"_").replace(b"\r", b"")
            files.append((f"f{index}.bin", data))
        monkeypatch.setattr(multipart, "READ_SIZE", rng.choice([1, 7, 64, 1 << 20]))
        body = encode(boundary, files, {"on_conflict": "rename"})
        reader = MultipartReader(ChunkyStream(body, rng), boundary)
        assert read_all(reader) == files
        assert reader.fields == {"on_conflict": "rename"}


@pytest.mark.parametrize("spare", (False, True))
def test_large_bodies_through_every_buffer(spare: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Full reads move the reader to megabyte buffers (two in turn on an event loop)."""
    monkeypatch.setattr(multipart, "on_event_loop", lambda: spare)
    rng = random.Random(7)
    files = [(f"{i}.bin", rng.randbytes(size)) for i, size in enumerate((3 << 20, 70_000, 0, 1))]
    reader = MultipartReader(io.BytesIO(encode(b"B0undary", files, {})), b"B0undary")
    assert read_all(reader) == files


def test_unread_parts_are_skipped() -> None:
    body = encode(b"XYZ", [("a.txt", b"a" * 5000), ("b.txt", b"bee")], {})
    names = [f.filename for f in MultipartReader(io.BytesIO(body), b"XYZ")]
    assert names == ["a.txt", "b.txt"]


def test_backslashes_and_quotes_in_filenames() -> None:
    body = (
        b'--XYZ\r\nContent-Disposition: form-data; name="files"; filename="a\\b.txt"\r\n\r\n1'
        b'\r\n--XYZ\r\nContent-Disposition: form-data; name="files"; filename="say \\"hi\\".txt"'
        b'\r\n\r\n2\r\n--XYZ\r\nContent-Disposition: form-data; name="files"; '
        b"filename*=UTF-8''%E6%8A%A5%E5%91%8A.pdf\r\n\r\n3\r\n--XYZ--\r\n"
    )
    names = [f.filename for f in MultipartReader(io.BytesIO(body), b"XYZ")]
    assert names == ["a\\b.txt", 'say "hi".txt', "报告.pdf"]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (
            b'--XYZ\r\nContent-Disposition: form-data; name="files"; filename="a"\r\n\r\nab',
            MalformedUpload,
        ),
        (b"--XYZ\r\nX-Other: 1\r\n\r\nab\r\n--XYZ--\r\n", MalformedUpload),
        (b"--XYZ\r\n" + b"H: " + b"h" * 20000 + b"\r\n\r\n", MalformedUpload),
        (
            b'--XYZ\r\nContent-Disposition: form-data; name="x"\r\n\r\n1\r\n--XYZ--\r\n',
            MissingFilesField,
        ),
        (b"no delimiter at all", MalformedUpload),
    ],
)
def test_broken_bodies(body: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        read_all(MultipartReader(io.BytesIO(body), b"XYZ"))


_HEADER_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\r\n", exclude_categories=("Cs",)),
    max_size=20,
)


@settings(max_examples=400, deadline=None)
@given(name=_HEADER_TEXT, filename=st.none() | _HEADER_TEXT)
def test_the_plain_disposition_reads_as_the_general_parser_reads_it(name, filename):
    """The fast path (`form-data; name="..."; filename="..."` with nothing to unescape)
    gives what Werkzeug's parser and `part_filename` give, and stands aside otherwise."""
    disposition = f'form-data; name="{name}"'
    if filename is not None:
        disposition += f'; filename="{filename}"'
    expected = (
        parse_options_header(disposition)[1].get("name"),
        multipart.part_filename(disposition),
    )
    assert multipart.part_disposition(disposition) == expected


@pytest.mark.parametrize(
    "disposition",
    [
        'form-data; name="files"; filename="a\\b.txt"',
        'form-data; name="files"; filename="say \\"hi\\".txt"',
        "form-data; name=files; filename=a.txt",
        "form-data; name=\"files\"; filename*=UTF-8''%E4%B8%AD.txt",
        'form-data; name="files"; filename="a.txt"; filename*=UTF-8\'\'b.txt',
        'FORM-DATA; NAME="files"; FILENAME="a.txt"',
        'form-data; name="files" ; filename="a.txt"',
        'form-data; name="on_conflict"',
        "form-data",
    ],
)
def test_other_dispositions_take_the_general_parser(disposition):
    expected = (
        parse_options_header(disposition)[1].get("name"),
        multipart.part_filename(disposition),
    )
    assert multipart.part_disposition(disposition) == expected
