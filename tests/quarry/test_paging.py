from __future__ import annotations

import pytest

from quarry import paging


@pytest.mark.parametrize("cursor", ["", "v1:t-1:7", "v1|running|2024-01-01T00:00:00+00:00|r-1", "é|ü"])
def test_a_cursor_comes_back_from_its_token(cursor: str) -> None:
    token = paging.encode_token(cursor)
    assert "=" not in token and "+" not in token and "/" not in token
    assert paging.decode_token(token) == cursor


@pytest.mark.parametrize("token", ["a", "abcde", "_w"])  # impossible lengths; bytes that are not UTF-8
def test_a_string_that_is_no_token_decodes_to_none(token: str) -> None:
    assert paging.decode_token(token) is None


@pytest.mark.parametrize("suffix", ["=", "==", "!", "\n", " "])
def test_only_the_exact_token_decodes(suffix: str) -> None:
    token = paging.encode_token("v1:t-1:7")
    assert paging.decode_token(token + suffix) is None
    assert paging.decode_token(token[:2] + suffix + token[2:]) is None
