"""The API's operations, one part per concern: accounts, posts, reposts and replies, follows,
relations, timelines, markers and lists."""

from __future__ import annotations

from timeline.model.idempotency import DEFAULT_WINDOW_S, IdempotencyKeys
from timeline.model.tokens import TokenSigner
from timeline.reads.home import HomeTimeline
from timeline.service.accounts import Accounts
from timeline.service.credentials import Credentials, RingLoader
from timeline.service.follows import Follows
from timeline.service.lists import Lists
from timeline.service.markers import Markers
from timeline.service.outbox import Outbox
from timeline.service.paging import Pager
from timeline.service.posts import Posts
from timeline.service.relations import Relations
from timeline.service.reposts import Reposts
from timeline.service.timelines import Timelines
from timeline.storage.queue import Reserving
from timeline.tables.markers import MarkersRepository
from timeline.tables.ratelimits import RateLimits
from timeline.tables.repositories import Repositories


class TimelineService:
    """What the API does. A write that starts a fan-out reserves its message hidden, changes
    storage, then releases the message (``timeline.service.outbox``), so the worker never
    meets a message before its fact, and a lost release only delays it; a delete or an undo
    queues its message first (the worker completes it if the request dies). A request
    repeated after a lost answer changes nothing twice: facts and their counters change
    together in one transaction, and no message is sent unless the state really changes."""

    def __init__(
        self,
        repositories: Repositories,
        queue: Reserving,
        signer: TokenSigner,
        *,
        page_size: int,
        max_post_chars: int,
        limits: RateLimits,
        home: HomeTimeline,
        timeline_cap: int = 0,
        credentials_cache_s: float = 5.0,
        load_ring: RingLoader | None = None,
        idempotency_window_s: float = DEFAULT_WINDOW_S,
        outbox: Outbox | None = None,
        max_lists: int = 100,
    ) -> None:
        outbox = outbox or Outbox(queue)
        self.outbox = outbox
        users, pager = repositories.users, Pager(signer, page_size)
        keys = IdempotencyKeys(signer.ring.data_key, idempotency_window_s)
        credentials = Credentials(
            signer, repositories.credentials, cache_s=credentials_cache_s, load_ring=load_ring
        )
        self.accounts = Accounts(
            users,
            credentials,
            limits.registrations,
            keys,
            home,
            writes=limits.writes,
            outbox=outbox,
        )
        self.posts = Posts(
            repositories.posts,
            outbox,
            max_post_chars=max_post_chars,
            posting=limits.posts,
            writes=limits.writes,
            keys=keys,
            replies=repositories.reposts,
            relations=repositories.relations,
            follows=repositories.follows,
            users=repositories.users,
        )
        self.reposts = Reposts(
            repositories.posts,
            repositories.reposts,
            outbox,
            pager,
            writes=limits.writes,
            relations=repositories.relations,
            follows=repositories.follows,
        )
        self.follows = Follows(
            users,
            repositories.follows,
            outbox,
            pager,
            relations=repositories.relations,
            writes=limits.writes,
        )
        self.relations = Relations(
            users, repositories.relations, self.follows, outbox, pager, writes=limits.writes
        )
        self.timelines = Timelines(
            users,
            repositories.posts,
            home,
            signer,
            pager,
            timeline_cap=timeline_cap,
            relations=repositories.relations,
            follows=repositories.follows,
        )
        self.markers = Markers(MarkersRepository(home.storage), signer)
        self.lists = Lists(
            users,
            repositories.lists,
            repositories.follows,
            repositories.relations,
            outbox,
            pager,
            self.timelines,
            writes=limits.writes,
            max_lists=max_lists,
        )
