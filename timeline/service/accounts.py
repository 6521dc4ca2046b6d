"""Accounts: registration, profiles, and who a bearer token acts as."""

from __future__ import annotations

from datetime import UTC, datetime

from timeline.errors import NotFoundError, PermissionDeniedError
from timeline.model.entities import User
from timeline.model.keys import clean_text, validate_idempotency_key, validate_user_id
from timeline.model.tokens import TokenSigner
from timeline.tables.ratelimits import RateLimiter
from timeline.tables.users import UsersRepository

MAX_DISPLAY_NAME_CHARS = 64


class Accounts:
    """Registers users and mints their bearer tokens; verifying one reads no storage."""

    def __init__(
        self, users: UsersRepository, signer: TokenSigner, registrations: RateLimiter
    ) -> None:
        self._users = users
        self._signer = signer
        self._registrations = registrations

    def authenticate(self, token: str) -> str:
        """The user id a bearer token acts as (no storage read)."""
        return self._signer.verify_bearer(token)

    def token_expiry(self, token: str) -> int:
        """When a verified bearer token expires (Unix seconds): a stream ends then."""
        return self._signer.bearer_expiry(token)

    async def register(
        self, user_id: str, display_name: str | None, *, client: str, idempotency_key: str | None
    ) -> tuple[User, str]:
        """Create the user; a retry with the first request's idempotency key gets a token too."""
        validate_user_id(user_id)
        validate_idempotency_key(idempotency_key)
        name = (
            user_id
            if display_name is None
            else clean_text(display_name, max_chars=MAX_DISPLAY_NAME_CHARS, field="display_name")
        )
        await self._registrations.check(client)
        user = User(user_id=user_id, display_name=name, created_at=datetime.now(UTC))
        if not await self._users.create(user, idempotency_key):
            user = await self.profile(user_id)
        return user, self._signer.mint_bearer(user_id)

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
