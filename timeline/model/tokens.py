"""HMAC-signed tokens: bearer tokens bound to a user, and opaque continuation tokens."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import time

import orjson

from timeline.errors import AuthenticationError, InvalidInputError
from timeline.model.keys import USER_ID_PATTERN, validate_user_id

MAX_CONTINUATION_CHARS = 4096
CONTINUATION_PATTERN = r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$"
"""The shape of a continuation token (base64url payload, a dot, base64url signature)."""
_CONTINUATION_KEYS = frozenset(
    {"PartitionKey", "RowKey", "NextPartitionKey", "NextRowKey", "n", "a", "m", "u"}
)
"""A storage continuation's keys, and a home timeline's: ``n`` entries served so far, ``a``
the last row key served, ``m`` the merged authors, ``u`` the row key a newer-than read stops
at (``timeline.service.timelines``)."""
POSITION_KEY = re.compile(r"[0-9]{19}_[0-9a-f]{26}\Z")
"""A position is a post's row key: ``{reversed_ticks:019d}_{post_id}``."""
_BEARER = re.compile(USER_ID_PATTERN.removesuffix("$") + r"\.[0-9]{1,19}\.[A-Za-z0-9_-]{43}\Z")
"""The shape ``mint_bearer`` produces: user id, expiry in seconds, base64url HMAC-SHA256."""


def _b64encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenSigner:
    """Mints and checks every signed token with one secret and a purpose label per kind."""

    def __init__(self, secret: bytes, *, token_ttl_s: int) -> None:
        self._secret = secret
        self._token_ttl_s = token_ttl_s

    def _sign(self, purpose: bytes, payload: bytes) -> bytes:
        return hmac.new(self._secret, purpose + b"\x00" + payload, hashlib.sha256).digest()

    def mint_bearer(self, user_id: str, *, now: float | None = None) -> str:
        """``{user_id}.{expiry}.{signature}``; user ids never contain a dot."""
        expires = int(now if now is not None else time.time()) + self._token_ttl_s
        body = f"{validate_user_id(user_id)}.{expires}"
        return f"{body}.{_b64encode(self._sign(b'bearer', body.encode()))}"

    def verify_bearer(self, token: str, *, now: float | None = None) -> str:
        """Return the token's user id, or raise ``AuthenticationError`` and nothing else.

        The shape is checked before anything is parsed or encoded: a header aiohttp decoded
        with surrogate escapes (non-UTF-8 bytes) must be a 401, not a ``UnicodeEncodeError``.
        """
        invalid = AuthenticationError("the bearer token is not valid", code="invalid_token")
        if not _BEARER.match(token):
            raise invalid
        user_id, expires, signature = token.split(".")
        expected = _b64encode(self._sign(b"bearer", f"{user_id}.{expires}".encode("ascii")))
        if not hmac.compare_digest(signature.encode("ascii"), expected.encode("ascii")):
            raise invalid
        if int(expires) <= (now if now is not None else time.time()):
            raise AuthenticationError("the bearer token has expired", code="expired_token")
        return user_id

    def bearer_expiry(self, token: str) -> int:
        """The expiry (Unix seconds) of a token ``verify_bearer`` accepted."""
        return int(token.split(".")[1])

    def encode_continuation(self, scope: str, token: dict[str, str]) -> str:
        """Wrap a storage continuation so clients cannot forge it or reuse it elsewhere."""
        payload = orjson.dumps(token, option=orjson.OPT_SORT_KEYS)
        signature = self._sign(b"continuation:" + scope.encode(), payload)[:16]
        return f"{_b64encode(payload)}.{_b64encode(signature)}"

    def decode_continuation(self, scope: str, text: str) -> dict[str, str]:
        """Return the storage continuation wrapped in ``text``, or raise ``InvalidInputError``."""
        invalid = InvalidInputError(
            "the continuation token is malformed, tampered with or from another list",
            code="invalid_continuation",
        )
        payload = self._unwrap(b"continuation:" + scope.encode(), text, invalid)
        token = orjson.loads(payload)
        if not _is_storage_continuation(token):
            raise invalid
        return token  # type: ignore[no-any-return]

    def encode_position(self, scope: str, row_key: str) -> str:
        """A list item's position (its row key), signed for ``since`` and stream event ids."""
        payload = row_key.encode("ascii")
        signature = self._sign(b"position:" + scope.encode(), payload)[:16]
        return f"{_b64encode(payload)}.{_b64encode(signature)}"

    def decode_position(self, scope: str, text: str, *, name: str = "since") -> str:
        """The row key wrapped in ``text``, or raise ``InvalidInputError`` naming ``name``."""
        invalid = InvalidInputError(
            f"{name} is not a position from this list (use a page's 'newest' or an event id)",
            code=f"invalid_{name.lower().replace('-', '_')}",
        )
        payload = self._unwrap(b"position:" + scope.encode(), text, invalid)
        row_key = payload.decode("ascii", errors="replace")
        if not POSITION_KEY.match(row_key):
            raise invalid
        return row_key

    def _unwrap(self, purpose: bytes, text: str, invalid: InvalidInputError) -> bytes:
        """The payload of a signed ``payload.signature`` token, or raise ``invalid``."""
        if len(text) > MAX_CONTINUATION_CHARS or text.count(".") != 1:
            raise invalid
        payload_text, signature_text = text.split(".")
        try:
            payload = _b64decode(payload_text)
            signature = _b64decode(signature_text)
        except (binascii.Error, ValueError):
            raise invalid from None
        if _b64encode(payload) != payload_text or _b64encode(signature) != signature_text:
            raise invalid  # only the one canonical spelling of a token is accepted
        if not hmac.compare_digest(signature, self._sign(purpose, payload)[:16]):
            raise invalid
        return payload


def _is_storage_continuation(token: object) -> bool:
    return (
        isinstance(token, dict)
        and bool(token)
        and set(token) <= _CONTINUATION_KEYS
        and all(isinstance(value, str) for value in token.values())
    )
