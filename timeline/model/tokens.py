"""Tokens: bearer tokens bound to a user (HMAC-signed with a key ring, so the signing key can
be rotated), encrypted continuation tokens, and signed positions."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from timeline.errors import AuthenticationError, InvalidInputError
from timeline.model.keys import USER_ID_PATTERN, validate_user_id

MAX_CONTINUATION_CHARS = 4096
CONTINUATION_PATTERN = r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$"
"""The shape of a continuation token (base64url nonce, a dot, base64url sealed payload)."""
_CONTINUATION_KEYS = frozenset(
    {"PartitionKey", "RowKey", "NextPartitionKey", "NextRowKey", "n", "a", "m", "u", "d"}
)
"""A storage continuation's keys, and a home timeline's: ``n`` entries served so far, ``a``
the last row key served, ``m`` the merged authors, ``u`` the row key a newer-than read stops
at, ``d`` a dormant reader's pages (``timeline.service.timelines``)."""
POSITION_KEY = re.compile(r"[0-9]{19}_[0-9a-f]{26}\Z")
"""A position is a post's row key: ``{reversed_ticks:019d}_{post_id}``."""
_BEARER = re.compile(
    USER_ID_PATTERN.removesuffix("$")
    + r"\.[0-9]{1,19}\.[1-9][0-9]{0,8}\.[0-9]{1,9}\.[A-Za-z0-9_-]{11}\.[A-Za-z0-9_-]{43}\Z"
)
"""The shape ``mint_bearer`` produces: ``{user}.{expiry}.{key id}.{epoch}.{token id}.{mac}``."""
FIRST_KEY_ID = "1"
"""The id of a key ring's first key (a configured secret's only one)."""


@dataclass(frozen=True, slots=True)
class KeyRing:
    """The bearer-token keys a process accepts (by key id), the one it signs new tokens
    with, and the data key: the one secret continuations, positions and idempotency digests
    are signed with, never rotated (they are short-lived integrity tags, not credentials)."""

    keys: Mapping[str, bytes]
    current: str
    data_key: bytes

    @classmethod
    def single(cls, secret: bytes) -> KeyRing:
        """One key (``1``) that is also the data key: a configured ``TIMELINE_AUTH_SECRET``."""
        return cls({FIRST_KEY_ID: secret}, FIRST_KEY_ID, secret)


@dataclass(frozen=True, slots=True)
class Bearer:
    """A verified bearer token: whom it acts as and what revoking it needs."""

    user_id: str
    expires: int
    key_id: str
    epoch: int
    """The user's token epoch when it was minted: revoking all tokens raises the epoch."""
    token_id: str
    """Names this token alone, for revoking it."""


class UnknownKeyError(AuthenticationError):
    """A well-formed token signed with a key id this process does not know (yet)."""


def _b64encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, purpose: bytes, payload: bytes) -> bytes:
    return hmac.new(key, purpose + b"\x00" + payload, hashlib.sha256).digest()


class TokenSigner:
    """Mints and checks every signed token: bearer tokens with the key ring, the rest with
    its data key, with a purpose label per kind."""

    def __init__(self, secret: bytes | KeyRing, *, token_ttl_s: int) -> None:
        self.ring = secret if isinstance(secret, KeyRing) else KeyRing.single(secret)
        self._token_ttl_s = token_ttl_s
        self._sealer = AESGCM(_mac(self.ring.data_key, b"continuation-key", b""))

    def use(self, ring: KeyRing) -> None:
        """Take a reloaded key ring; its data key is the one this signer had."""
        if not hmac.compare_digest(ring.data_key, self.ring.data_key):
            raise ValueError("a key ring's data key never changes")
        self.ring = ring

    def _sign(self, purpose: bytes, payload: bytes) -> bytes:
        return _mac(self.ring.data_key, purpose, payload)

    def mint_bearer(self, user_id: str, *, epoch: int = 0, now: float | None = None) -> str:
        """``{user}.{expiry}.{key id}.{epoch}.{token id}.{mac}``; user ids never hold a dot."""
        expires = int(now if now is not None else time.time()) + self._token_ttl_s
        kid = self.ring.current
        body = f"{validate_user_id(user_id)}.{expires}.{kid}.{epoch}.{_b64encode(os.urandom(8))}"
        return f"{body}.{_b64encode(_mac(self.ring.keys[kid], b'bearer', body.encode()))}"

    def verify(self, token: str) -> Bearer:
        """The verified token, or raise ``AuthenticationError`` (``UnknownKeyError`` for a
        key id not in the ring: retired, or newer than this process's ring).

        The shape is checked before anything is parsed or encoded: a header aiohttp decoded
        with surrogate escapes (non-UTF-8 bytes) must be a 401, not a ``UnicodeEncodeError``.
        """
        invalid = AuthenticationError("the bearer token is not valid", code="invalid_token")
        if not _BEARER.match(token):
            raise invalid
        body, _, signature = token.rpartition(".")
        user_id, expires, kid, epoch, token_id = body.split(".")
        key = self.ring.keys.get(kid)
        if key is None:
            raise UnknownKeyError("the bearer token's key is not valid", code="invalid_token")
        expected = _b64encode(_mac(key, b"bearer", body.encode("ascii")))
        if not hmac.compare_digest(signature.encode("ascii"), expected.encode("ascii")):
            raise invalid
        if int(expires) <= time.time():
            raise AuthenticationError("the bearer token has expired", code="expired_token")
        return Bearer(user_id, int(expires), kid, int(epoch), token_id)

    def encode_continuation(self, scope: str, token: dict[str, str]) -> str:
        """Wrap a storage continuation so clients can neither forge it, reuse it elsewhere
        nor read it: it names the next stored row, which may be one this reader may not see
        (a followers-only post), so it is encrypted (AES-GCM, the scope as associated data)."""
        payload = orjson.dumps(token, option=orjson.OPT_SORT_KEYS)
        nonce = os.urandom(12)
        sealed = self._sealer.encrypt(nonce, payload, b"continuation:" + scope.encode())
        return f"{_b64encode(nonce)}.{_b64encode(sealed)}"

    def decode_continuation(self, scope: str, text: str) -> dict[str, str]:
        """Return the storage continuation wrapped in ``text``, or raise ``InvalidInputError``."""
        invalid = InvalidInputError(
            "the continuation token is malformed, tampered with or from another list",
            code="invalid_continuation",
        )
        if len(text) > MAX_CONTINUATION_CHARS or text.count(".") != 1:
            raise invalid
        nonce_text, sealed_text = text.split(".")
        try:
            nonce, sealed = _b64decode(nonce_text), _b64decode(sealed_text)
            if _b64encode(nonce) != nonce_text or _b64encode(sealed) != sealed_text:
                raise invalid  # only the one canonical spelling of a token is accepted
            payload = self._sealer.decrypt(nonce, sealed, b"continuation:" + scope.encode())
            token = orjson.loads(payload)
        except (binascii.Error, ValueError, InvalidTag, orjson.JSONDecodeError):
            raise invalid from None
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
