"""Read markers (``GET/PUT /users/{id}/markers/home``): where the owner stopped reading its home
timeline, shared by its devices, versioned as Mastodon's markers are.

A client sends back the version it read (0 when there is no marker yet). Of two writes from
the same version exactly one wins; the other is a 409 ``stale_marker``. A write repeated
after its answer was lost finds its own result stored (the position it sent, one version
on) and is answered as it was the first time, so a retry never conflicts with itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from timeline.errors import ConflictError
from timeline.model.tokens import TokenSigner
from timeline.service.accounts import require_self
from timeline.tables.markers import MarkersRepository, StoredMarker


@dataclass(frozen=True, slots=True)
class Marker:
    """A marker as the API shows it: a signed position (a page's ``newest``) and a version."""

    position: str | None
    version: int


def stale(version: int) -> ConflictError:
    return ConflictError(
        f"the marker is no longer at version {version}: read it again, then write",
        code="stale_marker",
    )


class Markers:
    """The home timeline's read marker of each user; only its owner reads or writes it."""

    def __init__(self, repository: MarkersRepository, signer: TokenSigner) -> None:
        self._repository = repository
        self._signer = signer

    async def get(self, actor: str, owner: str) -> Marker:
        """The owner's marker (position null, version 0 before the first write): one read."""
        require_self(actor, owner)
        stored = await self._repository.get(owner)
        return self._shown(owner, stored)

    async def put(self, actor: str, owner: str, position: str, version: int) -> Marker:
        """Move the marker to ``position`` from ``version``: one conditional write for the
        first marker; a point read and one conditional write after that."""
        require_self(actor, owner)
        row_key = self._signer.decode_position(_scope(owner), position, name="position")
        if version == 0 and await self._repository.create(owner, row_key):
            return Marker(position, 1)
        stored = await self._repository.get(owner)
        if version > 0 and stored is not None and stored.version == version:
            if await self._repository.replace(owner, row_key, stored):
                return Marker(position, version + 1)
            stored = await self._repository.get(owner)
        if stored is not None and stored.version == version + 1 and stored.position == row_key:
            return Marker(position, stored.version)  # this write, repeated: its first answer
        raise stale(version)

    def _shown(self, owner: str, stored: StoredMarker | None) -> Marker:
        if stored is None:
            return Marker(None, 0)
        return Marker(self._signer.encode_position(_scope(owner), stored.position), stored.version)


def _scope(owner: str) -> str:
    """The scope home timeline positions are signed for (``Timelines``)."""
    return f"timeline:{owner}"
