"""Accounts: registration, profiles, and who a bearer token acts as."""

from __future__ import annotations

from datetime import UTC, datetime

from timeline.errors import NotFoundError, PermissionDeniedError
from timeline.model.entities import User
from timeline.model.idempotency import IdempotencyKeys
from timeline.model.keys import clean_text, validate_idempotency_key, validate_user_id
from timeline.model.messages import AccountDeleted
from timeline.reads.home import HomeTimeline
from timeline.service.credentials import Credentials
from timeline.service.outbox import Outbox
from timeline.tables.ratelimits import RateLimiter
from timeline.tables.users import UsersRepository

MAX_DISPLAY_NAME_CHARS = 64


class Accounts:
    """Registers users, mints their bearer tokens and checks and revokes them."""

    def __init__(
        self,
        users: UsersRepository,
        credentials: Credentials,
        registrations: RateLimiter,
        keys: IdempotencyKeys,
        home: HomeTimeline | None = None,
        *,
        writes: RateLimiter,
        outbox: Outbox,
    ) -> None:
        self._users = users
        self._outbox = outbox
        self._writes = writes
        self._home = home
        self._credentials = credentials
        self._registrations = registrations
        self._keys = keys

    async def authenticate(self, token: str) -> str:
        """The user id a bearer token acts as, if it is valid and not revoked."""
        return (await self._credentials.authenticate(token)).user_id

    def token_expiry(self, token: str) -> int:
        """When a verified bearer token expires (Unix seconds): a stream ends then."""
        return int(token.split(".")[1])

    async def register(
        self, user_id: str, display_name: str | None, *, client: str, idempotency_key: str | None
    ) -> tuple[User, str]:
        """Create the user. A replay of the first request (same key, same body, same client
        address, within the key's window, and no revocation since) gets a fresh token; any
        other request for a taken id is a 409, and a key reused for another body a 422."""
        validate_user_id(user_id)
        validate_idempotency_key(idempotency_key)
        name = (
            user_id
            if display_name is None
            else clean_text(display_name, max_chars=MAX_DISPLAY_NAME_CHARS, field="display_name")
        )
        await self._registrations.check(client)
        record = None
        if idempotency_key is not None:
            request = [user_id, "" if display_name is None else name]
            record = self._keys.record(idempotency_key, request, client=client)
        user = User(user_id=user_id, display_name=name, created_at=datetime.now(UTC))
        if not await self._users.create(user, record):
            user = await self.profile(user_id)
        if self._home is not None:
            await self._home.registered(user_id)  # after the row: a taken id stamps no one
        return user, await self._credentials.mint(user_id)

    async def revoke_token(self, token: str, user_id: str) -> None:
        """Sign out: revoke the presented token (it must act as ``user_id``)."""
        bearer = await self._credentials.authenticate(token)
        require_self(bearer.user_id, user_id)
        await self._credentials.revoke(bearer)

    async def revoke_all(self, actor: str, user_id: str) -> None:
        """Sign out everywhere: revoke every token of ``user_id`` minted so far."""
        require_self(actor, user_id)
        await self._credentials.revoke_all(user_id)

    async def delete(self, actor: str, user_id: str) -> None:
        """Delete the account: at once its tokens are refused, its profile is a 404 and its
        id cannot be registered again; everything else of it goes in the background
        (``timeline.delivery.accounts``)."""
        require_self(actor, user_id)
        await self._writes.check(actor)
        await require_user(self._users, user_id)
        async with self._outbox.written(AccountDeleted(user=user_id)):
            await self._users.tombstone(user_id)
            await self._users.delete_profile(user_id)
        self._credentials.forget(user_id)

    async def edit(
        self, actor: str, user_id: str, *, display_name: str | None, locked: bool | None
    ) -> User:
        """Change the display name and whether follows need approval (each only when given);
        the profile as it then is. Locking or unlocking leaves follows and requests as they
        are."""
        require_self(actor, user_id)
        changes: dict[str, object] = {}
        if display_name is not None:
            changes["display_name"] = clean_text(
                display_name, max_chars=MAX_DISPLAY_NAME_CHARS, field="display_name"
            )
        if locked is not None:
            changes["locked"] = locked
        await self._writes.check(actor)
        if changes and not await self._users.update(user_id, changes):
            raise user_not_found(user_id)
        return await self.profile(user_id)

    async def profile(self, user_id: str) -> User:
        user = await self._users.get(validate_user_id(user_id))
        if user is None:
            raise user_not_found(user_id)
        return user


def require_self(actor: str, user_id: str) -> None:
    """A user acts only on its own posts, follows and timeline."""
    validate_user_id(user_id)
    if actor != user_id:
        raise PermissionDeniedError(
            f"this token acts as {actor!r}, not {user_id!r}", code="forbidden"
        )


async def require_user(users: UsersRepository, user_id: str) -> None:
    if not await users.exists(user_id):
        raise user_not_found(user_id)


def user_not_found(user_id: str) -> NotFoundError:
    return NotFoundError(f"user {user_id!r} not found", code="user_not_found")
