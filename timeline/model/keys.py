"""Identifiers and row keys: .NET ticks, reversed ticks, post ids, and their validation."""

from __future__ import annotations

import re
import secrets
import time
import unicodedata
from datetime import UTC, datetime, timedelta
from functools import cache, lru_cache

from timeline.errors import InvalidInputError

MAX_TICKS = 3_155_378_975_999_999_999
"""``DateTime.MaxValue.Ticks``: reversing against it sorts newest first."""

UNIX_EPOCH_TICKS = 621_355_968_000_000_000
TICKS_PER_SECOND = 10_000_000
_DOTNET_EPOCH = datetime(1, 1, 1, tzinfo=UTC)

USER_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
POST_ID_PATTERN = r"^[0-9a-f]{26}$"
IDEMPOTENCY_KEY_PATTERN = r"^[!-~]{1,255}$"
LIST_ID_PATTERN = r"^[0-9a-f]{19}$"
READER_ID_PATTERN = r"^([A-Za-z0-9_-]{1,64}|\|[A-Za-z0-9_-]{1,64}~[0-9a-f]{19})$"
"""Whose timeline partition: a user's (its id) or a list's (``|{owner}~{list_id}``)."""
LIST_PREFIX = "|"
"""A list's reader id starts with it: after every user id and before ``~`` (metadata), so a
followers listing stops before its members' list rows and fan-out reads them."""
_USER_ID = re.compile(USER_ID_PATTERN.replace("$", r"\Z"))
_POST_ID = re.compile(POST_ID_PATTERN.replace("$", r"\Z"))
_LIST_ID = re.compile(LIST_ID_PATTERN.replace("$", r"\Z"))
_IDEMPOTENCY_KEY = re.compile(IDEMPOTENCY_KEY_PATTERN.replace("$", r"\Z"))
_CONTROL_CHARS = r"\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f"
_CONTROL = re.compile(f"[{_CONTROL_CHARS}]")
POST_FORMAT_CHARACTERS = frozenset({0x200C, 0x200D, *range(0xE0020, 0xE0080)})
"""The invisible format characters (category Cf) a post may hold: the zero-width non-joiner
and joiner, which Persian, Indic scripts and emoji sequences (family, profession) need, and
the tag characters of subdivision flags (England, Scotland, Wales). Every other one (bidi
embeddings, overrides and isolates, zero-width spaces, the BOM, the soft hyphen) is refused
in posts, and every one of them in display names."""


def now_ticks() -> int:
    """Current UTC time as .NET ticks, at microsecond precision so it round-trips RFC 3339."""
    return UNIX_EPOCH_TICKS + (time.time_ns() // 1_000) * 10


def reversed_ticks(ticks: int) -> int:
    return MAX_TICKS - ticks


def ticks_to_datetime(ticks: int) -> datetime:
    return _DOTNET_EPOCH + timedelta(microseconds=ticks // 10)


def format_time(moment: datetime) -> str:
    """RFC 3339 UTC with microseconds, e.g. ``2026-11-22T05:40:00.123456Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def format_ticks(ticks: int) -> str:
    """``format_time(ticks_to_datetime(ticks))`` at a third of the cost: a page formats 250
    of them, and posts near each other in time share the minute, formatted once."""
    minute, micros = divmod(ticks // 10, 60_000_000)
    seconds, micros = divmod(micros, 1_000_000)
    return f"{_minute_prefix(minute)}{seconds:02d}.{micros:06d}Z"


@lru_cache(maxsize=4096)
def _minute_prefix(minute: int) -> str:
    return (_DOTNET_EPOCH + timedelta(minutes=minute)).strftime("%Y-%m-%dT%H:%M:")


def new_post_id(ticks: int) -> str:
    """26 hex digits: the creation ticks, then 40 random bits; the row key derives from it."""
    return f"{ticks:016x}{secrets.token_hex(5)}"


def post_id_ticks(post_id: str) -> int:
    return int(post_id[:16], 16)


def post_row_key(post_id: str) -> str:
    """``{reversed_ticks:019d}_{post_id}``: a plain partition query returns newest first."""
    return f"{reversed_ticks(post_id_ticks(post_id)):019d}_{post_id}"


def post_id_from_row_key(row_key: str) -> str:
    return row_key.partition("_")[2]


def validate_user_id(user_id: str) -> str:
    if not _USER_ID.match(user_id):
        raise InvalidInputError(
            "user ids are 1-64 characters of A-Z, a-z, 0-9, '_' and '-'", code="invalid_user_id"
        )
    return user_id


def validate_list_id(list_id: str) -> str:
    if not _LIST_ID.match(list_id):
        raise InvalidInputError("list ids are 19 lowercase hex digits", code="invalid_list_id")
    return list_id


def list_reader(owner: str, list_id: str) -> str:
    """The reader id of a list: its timeline partition, and the follower id of its members'
    membership rows. No user id holds ``|`` or ``~``, so it is never a user's."""
    return f"{LIST_PREFIX}{owner}~{list_id}"


def list_owner(reader: str) -> str | None:
    """The owner of a list's reader id; None for a user's own."""
    if not reader.startswith(LIST_PREFIX):
        return None
    return reader[len(LIST_PREFIX) :].partition("~")[0]


def list_id_of(reader: str) -> str:
    """The list id of a list's reader id."""
    return reader.rpartition("~")[2]


def fold_user_id(user_id: str) -> str:
    """The form two ids that differ only in case share (ids are ASCII, so ``lower`` is the
    case fold): one user owns it, whatever the spelling it registered with."""
    return user_id.lower()


def validate_post_id(post_id: str) -> str:
    if not _POST_ID.match(post_id):
        raise InvalidInputError("post ids are 26 lowercase hex digits", code="invalid_post_id")
    return post_id


def validate_idempotency_key(key: str | None) -> str | None:
    if key is not None and not _IDEMPOTENCY_KEY.match(key):
        raise InvalidInputError(
            "Idempotency-Key is 1-255 visible ASCII characters", code="invalid_idempotency_key"
        )
    return key


@cache
def _format_characters() -> tuple[int, ...]:
    """Every Unicode format character (category Cf), per this Python's database."""
    return tuple(code for code in range(0x110000) if unicodedata.category(chr(code)) == "Cf")


def _escaped(code: int) -> str:
    """A code point for a character class: ``\\uXXXX`` in the BMP (Python and ECMAScript
    read it alike), the character itself beyond (ECMAScript has no ``\\U``)."""
    return f"\\u{code:04x}" if code <= 0xFFFF else chr(code)


def _refused_format_class(allowed: frozenset[int]) -> str:
    """The Cf characters not in ``allowed``, as ranges inside a regular-expression class."""
    runs: list[list[int]] = []
    for code in _format_characters():
        if code in allowed:
            continue
        if runs and runs[-1][1] == code - 1:
            runs[-1][1] = code
        else:
            runs.append([code, code])
    return "".join(
        _escaped(lo) if lo == hi else f"{_escaped(lo)}-{_escaped(hi)}" for lo, hi in runs
    )


def text_pattern(max_chars: int, *, allowed_format: frozenset[int] = frozenset()) -> str:
    """The regular expression (for OpenAPI) matching exactly what ``clean_text`` accepts:
    edge whitespace, then 1..max_chars characters that start and end with a non-space and
    hold no control character and no format character outside ``allowed_format``."""
    refused = _CONTROL_CHARS + _refused_format_class(allowed_format)
    edge, inner = rf"[^\s{refused}]", f"[^{refused}]"
    between = f"|{edge}{inner}{{0,{max_chars - 2}}}{edge}" if max_chars > 1 else ""
    return rf"^\s*(?:{edge}{between})\s*$"


def clean_text(
    text: str,
    *,
    max_chars: int,
    field: str = "text",
    allowed_format: frozenset[int] = frozenset(),
) -> str:
    """Trim ``text`` and check it holds 1..max_chars characters, no control characters and
    no invisible format characters (Unicode category Cf) but those in ``allowed_format``."""
    cleaned = text.strip()
    if not 1 <= len(cleaned) <= max_chars:
        raise InvalidInputError(
            f"{field} must be 1-{max_chars} characters after trimming", code=f"invalid_{field}"
        )
    if _CONTROL.search(cleaned):
        raise InvalidInputError(
            f"{field} must not contain control characters", code=f"invalid_{field}"
        )
    for character in cleaned:
        if unicodedata.category(character) == "Cf" and ord(character) not in allowed_format:
            raise InvalidInputError(
                f"{field} must not contain invisible format characters such as bidi "
                f"controls or zero-width spaces (found U+{ord(character):04X})",
                code=f"invalid_{field}",
            )
    return cleaned
