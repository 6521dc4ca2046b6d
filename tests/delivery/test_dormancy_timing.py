"""When dormancy starts: a reader's dormancy check is swept within a second of its due time
(plus the sweep interval), not at the end of its minute, so a short inactive period starts
dormancy on time; and registration stamps a new user, so one who never reads goes dormant."""

from __future__ import annotations

from fanout_worker.sweeper import Sweeper
from tests.conftest import unique
from tests.delivery.helpers import add_follow, add_posts, add_users, unlimited_service
from timeline.delivery.dormancy import Dormancy
from timeline.reads.activity import Attendance
from timeline.reads.home import HomeTimeline
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.storage.queue import FanoutQueue
from timeline.tables.activity import MARKER_ROW, STATE, ActivityRepository, Inactivity
from timeline.tables.repositories import Repositories
from timeline.tables.rows import get_entity

INACTIVITY = Inactivity(8.0)
"""An inactive period of 8 s: stamps of 1 s."""
LATER = 10**10


async def test_a_check_is_swept_a_second_after_it_is_due_not_a_minute(storage: Storage) -> None:
    """A stamp whose check falls due 10 s into a minute: a sweep 1.5 s after that starts
    dormancy (with minute buckets it waited for the minute to end)."""
    repos = Repositories.on(storage)
    reader = unique("reader")
    await add_users(repos, reader)
    stamp = INACTIVITY.stamp() - 600
    stamp -= int(INACTIVITY.due(stamp)) % 60 - 10  # due 10 s past a minute
    due = INACTIVITY.due(stamp)
    assert due % 60 == 10
    await repos.activity.stamp(reader, stamp, INACTIVITY, first=True)
    dormancy = Dormancy(storage, INACTIVITY, flag_window_s=10)
    sweeper = Sweeper(storage, dormancy=dormancy)
    await sweeper.sweep(now=due + 1.5)
    marker = await get_entity(storage, TIMELINES, reader, MARKER_ROW)
    assert marker is not None, "the due check was not swept"
    assert marker[STATE] == "dormant"


async def test_a_user_who_registers_and_never_reads_goes_dormant(storage: Storage) -> None:
    """Registration stamps the new user and files its check: the sweep once the check is
    due starts dormancy without the user ever reading (unstamped, it counted as active)."""
    queue = FanoutQueue(storage)
    attendance = Attendance(ActivityRepository(storage), queue, INACTIVITY, resend_after_s=60)
    home = HomeTimeline(storage, max_merged=20, attendance=attendance)
    service = unlimited_service(storage, queue, home=home)
    user = unique("newcomer")
    await service.accounts.register(user, None, client="test", idempotency_key=None)
    head = await ActivityRepository(storage).head(user)
    assert head.stamp == INACTIVITY.stamp() or head.stamp == INACTIVITY.stamp() - 1
    dormancy = Dormancy(storage, INACTIVITY, flag_window_s=10)
    sweeper = Sweeper(storage, dormancy=dormancy)
    await sweeper.sweep(now=INACTIVITY.due(head.stamp) + 1.5)
    marker = await get_entity(storage, TIMELINES, user, MARKER_ROW)
    assert marker is not None, "never stamped: counted as active"
    assert marker[STATE] == "dormant"


async def test_a_short_period_stamp_past_int32_is_stored(storage: Storage) -> None:
    """A period of seconds makes stamp numbers past 2**31 (a 0.375 s stamp today): the stamp
    is stored and read back all the same (as Int32 the write failed, a 500 on registration)."""
    short = Inactivity(3.0)
    repos = Repositories.on(storage)
    reader = unique("reader")
    await add_users(repos, reader)
    stamp = short.stamp()
    assert stamp > 2**31
    await repos.activity.stamp(reader, stamp, short, first=True)
    assert (await repos.activity.head(reader)).stamp == stamp


async def test_a_dormant_readers_later_pages_through_the_service(storage: Storage) -> None:
    """A dormant reader's continuation carries ``d``: the service accepts it back, so the
    second page is served (it was refused as malformed, a 400 on every later page)."""
    queue = FanoutQueue(storage)
    repos = Repositories.on(storage)
    attendance = Attendance(repos.activity, queue, INACTIVITY, resend_after_s=60)
    home = HomeTimeline(storage, max_merged=20, attendance=attendance)
    service = unlimited_service(storage, queue, home=home)
    reader, author = unique("reader"), unique("author")
    await add_users(repos, reader, author)
    await add_follow(repos, reader, author)
    posts = await add_posts(repos, author, 3)
    await repos.activity.stamp(reader, INACTIVITY.stamp() - 100, INACTIVITY, first=True)
    assert await Dormancy(storage, INACTIVITY, flag_window_s=10).check(reader, LATER)
    ids: list[str] = []
    continuation = None
    while True:
        page = await service.timelines.home(reader, reader, 2, continuation)
        ids += [item["post_id"] for item in page.items]
        continuation = page.continuation
        if continuation is None:
            break
    assert sorted(ids) == sorted(post.post_id for post in posts)
