"""Who a bearer token acts as, and whether it is still honoured: signature, key ring, expiry,
then the user's revocations, each read at most once per ``cache_s`` per process.

**The bound.** A process trusts what it read for ``cache_s`` seconds (``TIMELINE_CREDENTIALS_
CACHE_S``), timed from the moment the read was sent. A revocation is one storage write; a
read sent after it sees it, and one sent before it is trusted only until ``cache_s`` after it
was sent. So once a revocation has been answered, every API process refuses the token
within ``cache_s`` (the process that revoked it, at once), and the same holds for a retired
key (the ring is reloaded when older than ``cache_s``). A request already past its check when
the revocation lands finishes; a live stream checked its token when it opened.

**The cost.** One query (a user's profile row and revoked rows) per user per ``cache_s`` per
process, more only when a user's requests arrive together before the first read returns; one
query of the ring per ``cache_s`` per process. A token with a key id the ring lacks makes the
process reload the ring at once (a newer process may have signed it with a key just
rotated in), at most once a second whatever clients send.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from timeline.errors import AuthenticationError
from timeline.model.tokens import Bearer, KeyRing, TokenSigner, UnknownKeyError
from timeline.tables.credentials import CredentialsRepository, CredentialState

RingLoader = Callable[[], Awaitable[KeyRing]]
MAX_CACHED_USERS = 100_000
"""Users whose state a process keeps; beyond it the oldest reads are dropped first."""
FORCED_RELOAD_S = 1.0
"""The least time between two reloads of the ring for an unknown key id."""


def revoked() -> AuthenticationError:
    return AuthenticationError("the bearer token has been revoked", code="revoked_token")


class Credentials:
    """Checks tokens against the key ring and the users' revocations, and mints them."""

    def __init__(
        self,
        signer: TokenSigner,
        repository: CredentialsRepository,
        *,
        cache_s: float,
        load_ring: RingLoader | None = None,
    ) -> None:
        self._signer = signer
        self._repository = repository
        self._cache_s = cache_s
        self._load_ring = load_ring
        self._ring_read = time.monotonic()
        self._ring_lock = asyncio.Lock()
        self._states: OrderedDict[str, tuple[float, CredentialState]] = OrderedDict()

    async def authenticate(self, token: str) -> Bearer:
        """The verified, unrevoked token, or raise ``AuthenticationError``."""
        await self._fresh_ring(self._cache_s)
        try:
            bearer = self._signer.verify(token)
        except UnknownKeyError:
            if not await self._fresh_ring(FORCED_RELOAD_S):
                raise
            bearer = self._signer.verify(token)
        state = await self._state(bearer.user_id)
        if state.deleted or bearer.epoch < state.epoch or bearer.token_id in state.revoked:
            raise revoked()
        return bearer

    async def mint(self, user_id: str) -> str:
        """A new token for ``user_id`` at epoch 0, signed with the ring's newest key."""
        await self._fresh_ring(self._cache_s)
        return self._signer.mint_bearer(user_id)

    async def revoke(self, bearer: Bearer) -> None:
        """Revoke this token alone; this process forgets its cached state at once."""
        await self._repository.revoke(bearer.user_id, bearer.token_id, bearer.expires)
        self._states.pop(bearer.user_id, None)

    async def revoke_all(self, user_id: str) -> None:
        """Revoke every token of ``user_id`` minted so far."""
        await self._repository.revoke_all(user_id)
        self._states.pop(user_id, None)

    def forget(self, user_id: str) -> None:
        """Drop this process's cached state of the user (its account was just deleted)."""
        self._states.pop(user_id, None)

    async def _state(self, user_id: str) -> CredentialState:
        cached = self._states.get(user_id)
        now = time.monotonic()
        if cached is not None and now - cached[0] < self._cache_s:
            return cached[1]
        state = await self._repository.state(user_id)
        self._states[user_id] = (now, state)
        self._states.move_to_end(user_id)
        while len(self._states) > MAX_CACHED_USERS:
            self._states.popitem(last=False)
        return state

    async def _fresh_ring(self, max_age_s: float) -> bool:
        """Reload the ring if it is older than ``max_age_s``; whether it was reloaded."""
        if self._load_ring is None or time.monotonic() - self._ring_read < max_age_s:
            return False
        async with self._ring_lock:
            if time.monotonic() - self._ring_read < max_age_s:
                return True  # reloaded while this request waited
            started = time.monotonic()
            self._signer.use(await self._load_ring())
            self._ring_read = started
            return True
