"""Idempotency keys as Stripe uses them: bound to the request that first used them, for a
limited window, stored only as HMACs under the server's data key.

A client's key is a retry handle, not a secret (clients log them), so nothing is granted on
the key alone: a replay must repeat the first request (its body, and for a registration the
client's address too) within the window. What is stored is three HMAC-SHA256 digests (of the
key, of the request, of the client) and when the record expires; never the key, the body or
the address themselves, and a digest cannot be checked against a guess without the data key.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from timeline.errors import UnprocessableError

DEFAULT_WINDOW_S = 24 * 3600
KEY, REQUEST, CLIENT, EXPIRES = "idem_key", "idem_request", "idem_client", "idem_expires"
"""The fields a record is stored as (on a profile row, or on a post's key row)."""


def key_reused() -> UnprocessableError:
    return UnprocessableError(
        "this Idempotency-Key was used for a different request in the last 24 hours; "
        "use a new key for a new request",
        code="idempotency_key_reused",
    )


@dataclass(frozen=True, slots=True)
class IdempotencyRecord:
    """One request's record: digests of its key, its body and its client, and its expiry."""

    key: str
    request: str
    client: str
    expires_at: float

    def fields(self) -> dict[str, Any]:
        return {KEY: self.key, REQUEST: self.request, CLIENT: self.client, EXPIRES: self.expires_at}

    def replays(self, stored: Mapping[str, Any]) -> bool:
        """Whether ``stored`` (a record's fields, or a row without one) is this request's
        live record: True for a replay by the same client; False when it is another key's,
        has expired (the key is free again) or is another client's; a live record of this
        key for a different request raises ``UnprocessableError`` (422)."""
        if stored.get(KEY) != self.key or not is_live(stored):
            return False
        if not hmac.compare_digest(str(stored.get(REQUEST, "")), self.request):
            raise key_reused()
        return hmac.compare_digest(str(stored.get(CLIENT, "")), self.client)


def is_live(stored: Mapping[str, Any], now: float | None = None) -> bool:
    """Whether a stored record is within its window."""
    expires = stored.get(EXPIRES)
    moment = time.time() if now is None else now
    return isinstance(expires, int | float) and expires > moment


class IdempotencyKeys:
    """Makes a request's record with the data key (``KeyRing.data_key``)."""

    def __init__(self, data_key: bytes, window_s: float = DEFAULT_WINDOW_S) -> None:
        self._data_key = data_key
        self.window_s = window_s

    def _digest(self, purpose: bytes, text: str) -> str:
        payload = purpose + b"\x00" + text.encode("utf-8", "surrogateescape")
        return hmac.new(self._data_key, payload, hashlib.sha256).hexdigest()

    def digest(self, key: str) -> str:
        """What identifies a key in storage (a row key's suffix): its HMAC, hex."""
        return self._digest(b"idempotency-key", key)

    def record(
        self, key: str, request: Sequence[str], *, client: str = "", now: float | None = None
    ) -> IdempotencyRecord:
        """The record of ``request`` (the fields that define it, in a fixed order) sent by
        ``client`` (an address, or empty where the request is not bound to one)."""
        moment = time.time() if now is None else now
        return IdempotencyRecord(
            key=self.digest(key),
            request=self._digest(b"idempotency-request", "\x00".join(request)),
            client=self._digest(b"idempotency-client", client),
            expires_at=moment + self.window_s,
        )
