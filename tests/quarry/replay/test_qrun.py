"""The .qrun file's pieces: streamed in chunks of a bounded size and read back as whole lines."""

from __future__ import annotations

from collections.abc import AsyncIterator

from quarry.replay import qrun


async def test_lines_cut_into_bounded_pieces_come_back_whole() -> None:
    lines = [qrun.line("blob", sha256="a", text="x" * 10), qrun.line("event", event={}), b'{"record":"run"}\n']
    pieces = list(qrun.chunked(lines, size=7))
    assert all(len(piece) <= 7 for piece in pieces) and b"".join(pieces) == b"".join(lines)

    async def arriving() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    assert [text async for text in qrun.lines_of(arriving())] == lines

    async def lines_arriving() -> AsyncIterator[bytes]:
        for text in lines:
            yield text

    assert [piece async for piece in qrun.chunked_async(lines_arriving(), size=7)] == pieces


def test_a_body_is_kept_as_text_when_it_is_utf8_and_base64_otherwise() -> None:
    text, binary = "café".encode(), b"\xff\x00\xfe"
    read = qrun.parse(
        [
            qrun.header_line("run-x", {}),
            qrun.blob_line(qrun.sha256(text), text),
            qrun.blob_line(qrun.sha256(binary), binary),
        ]
    )
    assert b'"text":"caf' in qrun.blob_line(qrun.sha256(text), text)
    assert b'"base64"' in qrun.blob_line(qrun.sha256(binary), binary)
    assert read.blob(qrun.sha256(text)) == text and read.blob(qrun.sha256(binary)) == binary
