"""The multipart framing alone (web/transport/multipart_scanner.py): bytes in, events out.

No body, no buffers: each test feeds bytes cut wherever it likes and reads the events back.
"""

from __future__ import annotations

import pytest

from deerflow_web.errors import MalformedUpload
from deerflow_web.web.transport.multipart_scanner import END
from deerflow_web.web.transport.multipart_scanner import NEED_DATA
from deerflow_web.web.transport.multipart_scanner import Data
from deerflow_web.web.transport.multipart_scanner import MultipartScanner
from deerflow_web.web.transport.multipart_scanner import PartStart
from deerflow_web.web.transport.multipart_scanner import parse_part_headers

BOUNDARY = b"XyZ-7"
DELIMITER = b"\r\n--" + BOUNDARY


def part(name: str, data: bytes, filename: str | None = None) -> bytes:
    disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    return b"--" + BOUNDARY + f"\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + data


def body(*parts: bytes, preamble: bytes = b"", epilogue: bytes = b"") -> bytes:
    prefix = preamble + b"\r\n" if preamble else b""
    return prefix + b"\r\n".join(parts) + DELIMITER + b"--\r\n" + epilogue


def scan(pieces: list[bytes]) -> list[tuple[dict[str, str], bytes]]:
    """The parts of a body fed in `pieces`, each (headers, data); checks the event order."""
    scanner = MultipartScanner(BOUNDARY)
    feeds = iter(pieces)
    parts: list[tuple[dict[str, str], bytes]] = []
    in_data = False
    while True:
        event = scanner.next_event()
        if event is NEED_DATA:
            buffer = bytearray(next(feeds))  # StopIteration: the body ended too early
            scanner.feed(buffer)
            continue
        if event is END:
            assert not in_data, "END inside a part"
            return parts
        if isinstance(event, PartStart):
            assert not in_data, "a part started inside another"
            parts.append((dict(event.headers), b""))
            in_data = True
        else:
            assert isinstance(event, Data) and in_data
            headers, data = parts[-1]
            parts[-1] = (headers, data + bytes(event.data))
            in_data = not event.last


def names_and_data(parts: list[tuple[dict[str, str], bytes]]) -> list[bytes]:
    return [data for _headers, data in parts]


TRICKY = b"\r\n-\r\n--XyZ\r\n--XyZ-\r--XyZ-7x"[:-1] + b"\r"  # near-delimiters, ends in CR
BODY = body(part("on_conflict", b"rename"), part("files", TRICKY, "a.bin"), part("files", b""))
EXPECTED = [b"rename", TRICKY, b""]


def test_a_whole_body_in_one_feed() -> None:
    parts = scan([BODY])
    assert names_and_data(parts) == EXPECTED
    assert parts[1][0] == {"Content-Disposition": 'form-data; name="files"; filename="a.bin"'}


@pytest.mark.parametrize("cut", range(1, len(BODY)))
def test_the_body_split_at_every_byte(cut: int) -> None:
    assert names_and_data(scan([BODY[:cut], BODY[cut:]])) == EXPECTED


@pytest.mark.parametrize("cut", range(1, len(BODY) - 1))
def test_the_body_split_twice_around_every_byte(cut: int) -> None:
    assert names_and_data(scan([BODY[:cut], BODY[cut : cut + 1], BODY[cut + 1 :]])) == EXPECTED


def test_the_body_fed_a_byte_at_a_time() -> None:
    assert names_and_data(scan([BODY[i : i + 1] for i in range(len(BODY))])) == EXPECTED


def test_every_split_of_each_delimiter_in_a_large_part() -> None:
    data = bytes(range(256)) * 40
    whole = body(part("files", data, "big.bin"), part("files", b"tail", "b.bin"))
    for at in range(len(whole)):
        if whole.startswith(DELIMITER, at):
            for cut in range(at, at + len(DELIMITER) + 1):
                assert names_and_data(scan([whole[:cut], whole[cut:]])) == [data, b"tail"]


def test_data_is_handed_out_without_a_copy() -> None:
    scanner = MultipartScanner(BOUNDARY)
    assert scanner.next_event() is NEED_DATA
    buffer = bytearray(body(part("files", b"x" * 1000, "a")))
    scanner.feed(buffer)
    assert isinstance(scanner.next_event(), PartStart)
    piece = scanner.next_event()
    assert isinstance(piece, Data) and piece.last and bytes(piece.data) == b"x" * 1000
    assert piece.data.obj is buffer  # a view into what was fed


def test_only_the_given_length_of_a_buffer_counts() -> None:
    scanner = MultipartScanner(BOUNDARY)
    assert scanner.next_event() is NEED_DATA
    whole = body(part("files", b"abc", "a"))
    buffer = bytearray(whole + b"garbage that is no part of the body")
    scanner.feed(buffer, len(whole))
    events = [scanner.next_event() for _ in range(3)]
    assert bytes(events[1].data) == b"abc" and events[2] is END


def test_after_need_data_the_fed_buffer_may_be_reused() -> None:
    whole = body(part("files", b"0123456789" * 10, "a"))
    scanner = MultipartScanner(BOUNDARY)
    buffer = bytearray(7)
    data = b""
    position = 0
    while (event := scanner.next_event()) is not END:
        if event is NEED_DATA:
            piece = whole[position : position + len(buffer)]
            buffer[: len(piece)] = piece  # overwrites what was fed before
            position += len(piece)
            scanner.feed(buffer, len(piece))
        elif isinstance(event, Data):
            data += bytes(event.data)  # taken before the next read, as the reader does
    assert data == b"0123456789" * 10


def test_preamble_and_epilogue_are_ignored() -> None:
    whole = body(
        part("files", b"data", "a"),
        preamble=b"This is the preamble. --XyZ-7 is not a delimiter here\r\n--XyZ-",
        epilogue=b"\r\n--XyZ-7\r\nContent-Disposition: form-data; name=files\r\n\r\nlate",
    )
    assert names_and_data(scan([whole])) == [b"data"]


def test_a_body_that_starts_with_its_first_delimiter() -> None:
    assert names_and_data(scan([body(part("files", b"1", "a"))])) == [b"1"]


def test_padding_after_a_delimiter_is_skipped() -> None:
    whole = (
        b"--XyZ-7  \t\r\nContent-Disposition: form-data; name=files; filename=a\r\n\r\n1"
        + DELIMITER
        + b"--\r\n"
    )
    assert names_and_data(scan([whole])) == [b"1"]


def test_an_empty_part_written_werkzeugs_way() -> None:
    """The headers' blank line doubles as the delimiter's CRLF."""
    whole = (
        b"--XyZ-7\r\nContent-Disposition: form-data; name=files; filename=a\r\n"
        + DELIMITER
        + b"\r\nContent-Disposition: form-data; name=files; filename=b\r\n\r\nb"
        + DELIMITER
        + b"--"
    )
    for cut in range(1, len(whole)):
        assert names_and_data(scan([whole[:cut], whole[cut:]])) == [b"", b"b"]


def test_events_after_the_end_stay_the_end() -> None:
    scanner = MultipartScanner(BOUNDARY)
    scanner.next_event()
    scanner.feed(body(part("files", b"1", "a")))
    events = [scanner.next_event() for _ in range(5)]
    assert events[2:] == [END, END, END]


def test_a_body_without_any_delimiter_only_asks_for_more() -> None:
    scanner = MultipartScanner(BOUNDARY)
    for _ in range(100):
        assert scanner.next_event() is NEED_DATA
        scanner.feed(b"no delimiter, ever " * 50)
    assert scanner.next_event() is NEED_DATA


def test_a_truncated_body_only_asks_for_more() -> None:
    whole = body(part("files", b"data", "a"))
    for cut in range(1, len(whole) - 2):  # the closing `--` is what ends it
        scanner = MultipartScanner(BOUNDARY)
        scanner.next_event()
        scanner.feed(whole[:cut])
        while (event := scanner.next_event()) is not NEED_DATA:
            assert event is not END


@pytest.mark.parametrize(
    "bad",
    (
        b"--XyZ-7\r\nNo colon on this line\r\n\r\ndata\r\n--XyZ-7--",
        b"--XyZ-7\r\nContent-Disposition: form-data\r\nbroken\r\n\r\nx\r\n--XyZ-7--",
    ),
)
def test_a_malformed_header_line_is_refused(bad: bytes) -> None:
    scanner = MultipartScanner(BOUNDARY)
    scanner.next_event()
    scanner.feed(bad)
    with pytest.raises(MalformedUpload, match="malformed"):
        while scanner.next_event() is not NEED_DATA:
            pass


@pytest.mark.parametrize(
    "bad",
    (
        b"--XyZ-7\r\nH: " + b"h" * 300 + b"\r\n\r\nx\r\n--XyZ-7--",  # headers that never end
        b"--XyZ-7" + b" " * 300 + b"\r\nH: 1\r\n\r\nx\r\n--XyZ-7--",  # endless padding
    ),
)
def test_headers_past_the_limit_are_refused_in_any_feeds(bad: bytes) -> None:
    for step in (1, 13, len(bad)):
        scanner = MultipartScanner(BOUNDARY, max_header_bytes=256)
        pieces = iter(bad[i : i + step] for i in range(0, len(bad), step))
        with pytest.raises(MalformedUpload, match="too large"):
            while (event := scanner.next_event()) is not END:
                if event is NEED_DATA:
                    scanner.feed(next(pieces))


def test_headers_within_the_limit_pass() -> None:
    header = b"X-Long: " + b"v" * 200
    whole = b"--XyZ-7\r\n" + header + b"\r\n\r\nx" + DELIMITER + b"--"
    scanner = MultipartScanner(BOUNDARY, max_header_bytes=256)
    scanner.next_event()
    scanner.feed(whole)
    start = scanner.next_event()
    assert isinstance(start, PartStart) and start.headers["X-Long"] == "v" * 200


def test_an_empty_feed_changes_nothing() -> None:
    scanner = MultipartScanner(BOUNDARY)
    assert scanner.next_event() is NEED_DATA
    scanner.feed(b"")
    assert scanner.next_event() is NEED_DATA
    scanner.feed(body(part("files", b"1", "a")))
    assert isinstance(scanner.next_event(), PartStart)


def test_part_headers_keep_order_repeats_and_non_ascii() -> None:
    headers = parse_part_headers("A: 1\r\nB:  two \r\nA: 3\r\nName: 报告".encode())
    assert headers.getlist("A") == ["1", "3"] and headers["B"] == "two"
    assert headers["Name"] == "报告"
    assert parse_part_headers("Bad: \udcff".encode("utf-8", "surrogateescape"))["Bad"] == "\ufffd"
