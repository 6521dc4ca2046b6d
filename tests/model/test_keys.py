from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from timeline.errors import InvalidInputError
from timeline.model.keys import (
    MAX_TICKS,
    POST_FORMAT_CHARACTERS,
    clean_text,
    format_ticks,
    format_time,
    new_post_id,
    now_ticks,
    post_id_from_row_key,
    post_id_ticks,
    post_row_key,
    reversed_ticks,
    text_pattern,
    ticks_to_datetime,
    validate_post_id,
    validate_user_id,
)

DOTNET_2000_TICKS = 630_822_816_000_000_000
"""``new DateTime(2000, 1, 1).Ticks`` in .NET."""


def test_ticks_match_dotnet() -> None:
    assert ticks_to_datetime(DOTNET_2000_TICKS) == datetime(2000, 1, 1, tzinfo=UTC)
    assert MAX_TICKS == 3_155_378_975_999_999_999
    assert reversed_ticks(DOTNET_2000_TICKS) == MAX_TICKS - DOTNET_2000_TICKS


@given(st.integers(min_value=0, max_value=MAX_TICKS))
def test_formatting_ticks_matches_formatting_their_datetime(ticks: int) -> None:
    assert format_ticks(ticks) == format_time(ticks_to_datetime(ticks))


@pytest.mark.parametrize("ticks", [0, MAX_TICKS, DOTNET_2000_TICKS - 1, DOTNET_2000_TICKS + 9])
def test_formatting_ticks_at_the_edges_of_a_minute_and_of_time(ticks: int) -> None:
    assert format_ticks(ticks) == format_time(ticks_to_datetime(ticks))


def test_now_ticks_is_current_time() -> None:
    moment = ticks_to_datetime(now_ticks())
    assert abs((datetime.now(UTC) - moment).total_seconds()) < 5


def test_row_key_is_19_digit_reversed_ticks_then_post_id() -> None:
    post_id = new_post_id(DOTNET_2000_TICKS)
    row_key = post_row_key(post_id)
    digits, sep, suffix = row_key.partition("_")
    assert len(digits) == 19
    assert digits.isdigit()
    assert int(digits) == MAX_TICKS - DOTNET_2000_TICKS
    assert sep == "_"
    assert suffix == post_id
    assert post_id_from_row_key(row_key) == post_id
    assert post_id_ticks(post_id) == DOTNET_2000_TICKS


def test_newer_posts_sort_first() -> None:
    older = post_row_key(new_post_id(DOTNET_2000_TICKS))
    newer = post_row_key(new_post_id(DOTNET_2000_TICKS + 10))
    assert sorted([older, newer]) == [newer, older]


def test_created_at_round_trips_microseconds() -> None:
    ticks = DOTNET_2000_TICKS + 1_234_560
    assert format_time(ticks_to_datetime(ticks)) == "2000-01-01T00:00:00.123456Z"


@pytest.mark.parametrize("user_id", ["a", "A_b-9", "x" * 64])
def test_valid_user_ids(user_id: str) -> None:
    assert validate_user_id(user_id) == user_id


@pytest.mark.parametrize(
    "user_id", ["", "x" * 65, "a b", "a/b", "a'b", "é", "a\n", "a#", "a?b", "a\\b", "a.b"]
)
def test_invalid_user_ids(user_id: str) -> None:
    with pytest.raises(InvalidInputError) as raised:
        validate_user_id(user_id)
    assert raised.value.code == "invalid_user_id"


def test_post_id_format() -> None:
    assert validate_post_id(new_post_id(now_ticks()))
    for bad in ["", "g" * 26, "A" * 26, "0" * 25, "0" * 27]:
        with pytest.raises(InvalidInputError):
            validate_post_id(bad)


def test_text_is_trimmed_and_counted_in_characters() -> None:
    assert clean_text("  hi\n", max_chars=280) == "hi"
    assert clean_text("🙂" * 280, max_chars=280) == "🙂" * 280
    for bad in ["", "   ", "x" * 281, "a\x00b", "a\x1bb"]:
        with pytest.raises(InvalidInputError):
            clean_text(bad, max_chars=280)


EDGE_CHARACTERS = (
    " \t\n\r\x0b\x0c\x00\x1f\x7f\x85\x9f\xa0\u2028\u3000\ufeffaé😀"
    "\u00ad\u200b\u200c\u200d\u200e\u202e\u2066\u2069\U000e0001\U000e0067\U000e007f"
)


@given(
    text=st.text(
        alphabet=st.one_of(
            st.sampled_from(EDGE_CHARACTERS), st.characters(exclude_categories=["Cs"])
        ),
        max_size=8,
    )
)
@pytest.mark.parametrize("max_chars", [1, 2, 5])
@pytest.mark.parametrize(
    "allowed", [frozenset(), POST_FORMAT_CHARACTERS], ids=["display-name", "post"]
)
def test_documented_text_pattern_accepts_exactly_what_clean_text_does(
    text: str, max_chars: int, allowed: frozenset[int]
) -> None:
    """The OpenAPI pattern and the validator must agree, or fuzzing and clients are misled."""
    try:
        clean_text(text, max_chars=max_chars, allowed_format=allowed)
        accepted = True
    except InvalidInputError:
        accepted = False
    pattern = text_pattern(max_chars, allowed_format=allowed)
    assert (re.search(pattern, text) is not None) == accepted
