"""One truth for a follow, exact counters, and no message without a change."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import unique
from tests.delivery.helpers import add_users, unlimited_service
from tests.faults import StorageFront
from tests.helpers import Api, bearer
from timeline.errors import StorageUnavailableError
from timeline.metrics import MESSAGES_SENT
from timeline.storage.accounts import Storage
from timeline.storage.names import SUBJECT_FOLLOWERS, SUBJECT_FOLLOWING
from timeline.tables.repositories import Repositories

Client = TestClient[Any, Any]


def _sent(kind: str) -> float:
    return float(MESSAGES_SENT.labels(kind)._value.get())


@pytest.mark.parametrize("failing", [SUBJECT_FOLLOWERS, SUBJECT_FOLLOWING])
async def test_follow_half_written_then_retried_is_whole_and_counted(
    front: StorageFront, fronted: Storage, failing: str
) -> None:
    repos = Repositories.on(fronted)
    follower, subject = unique("f"), unique("s")
    await add_users(repos, follower, subject)
    service = unlimited_service(fronted)
    front.lose_writes.add(failing)
    with pytest.raises(StorageUnavailableError):
        await service.follows.follow(follower, follower, subject)
    front.lose_writes.clear()
    await service.follows.follow(follower, follower, subject)
    await _assert_follow(repos, follower, subject, following=True)
    front.lose_writes.add(failing)
    with pytest.raises(StorageUnavailableError):
        await service.follows.unfollow(follower, follower, subject)
    front.lose_writes.clear()
    await service.follows.unfollow(follower, follower, subject)
    await _assert_follow(repos, follower, subject, following=False)


async def _assert_follow(
    repos: Repositories, follower: str, subject: str, *, following: bool
) -> None:
    followers = [
        edge.user_id for edge in (await repos.follows.followers_page(subject, 10, None)).items
    ]
    followed = [
        edge.user_id for edge in (await repos.follows.following_page(follower, 10, None)).items
    ]
    assert followers == ([follower] if following else [])
    assert followed == ([subject] if following else [])
    assert await repos.follows.is_following(follower, subject) is following
    follower_user, subject_user = await repos.users.get(follower), await repos.users.get(subject)
    assert follower_user is not None
    assert subject_user is not None
    assert (follower_user.following, subject_user.followers) == (int(following), int(following))


# --- no message without a change; every write is rate limited


async def test_repeated_follow_and_unfollow_queue_one_message_each(client: Client) -> None:
    api = Api(client)
    follower, subject = unique("f"), unique("s")
    token = await api.register(follower)
    await api.register(subject)
    follows, unfollows = _sent("follow"), _sent("unfollow")
    for _ in range(3):
        await api.follow(follower, token, subject)
    for _ in range(3):
        await api.unfollow(follower, token, subject)
    never = await client.delete(
        f"/users/{follower}/following/{unique('never-registered')}", headers=bearer(token)
    )
    assert never.status == 404
    assert (_sent("follow") - follows, _sent("unfollow") - unfollows) == (1, 1)
