"""Every table's repository over one ``Storage``: the only code that knows table layouts and
OData filters, one module per table (``rows`` holds the helpers they share).

Each fact has one home, and every change of a fact and of the counter that counts it is one
Entity Group Transaction in that home's partition, so counters are exact after any crash:

- a user's profile lives in ``users`` (``timeline.tables.users``);
- a post lives in ``posts`` (its author's partition) with the author's count
  (``timeline.tables.posts``);
- a follow lives in ``subjectFollowers`` (the subject's partition, the one fan-out reads)
  with the subject's follower count: this row is the truth about who follows whom;
  ``subjectFollowing`` is an index derived from it (``timeline.tables.follows``);
- a delivered copy of a post lives in ``timelines`` (``timeline.tables.timelines``);
- hybrid fan-out's state lives beside them (``timeline.tables.audience``);
- a user's token revocations live in the user's ``users`` partition
  (``timeline.tables.credentials``);
- blocks, mutes and keyword filters live in ``relations`` (``timeline.tables.relations``).

A count is spread over several counter rows summed on read (``timeline.tables.counters``), so the
writers of one hot partition do not queue on one row's ETag.
"""

from __future__ import annotations

from dataclasses import dataclass

from timeline.storage.accounts import Storage
from timeline.tables.activity import ActivityRepository
from timeline.tables.audience import AudienceRepository
from timeline.tables.credentials import CredentialsRepository
from timeline.tables.follows import FollowsRepository
from timeline.tables.lists import ListsRepository
from timeline.tables.posts import PostsRepository
from timeline.tables.relations import RelationsRepository
from timeline.tables.reposts import RepostsRepository
from timeline.tables.timelines import TimelinesRepository
from timeline.tables.users import UsersRepository


@dataclass(frozen=True, slots=True)
class Repositories:
    """Every repository over one ``Storage``."""

    users: UsersRepository
    posts: PostsRepository
    timelines: TimelinesRepository
    follows: FollowsRepository
    audience: AudienceRepository
    credentials: CredentialsRepository
    activity: ActivityRepository
    reposts: RepostsRepository
    relations: RelationsRepository
    lists: ListsRepository

    @classmethod
    def on(cls, storage: Storage) -> Repositories:
        return cls(
            UsersRepository(storage),
            PostsRepository(storage),
            TimelinesRepository(storage),
            FollowsRepository(storage),
            AudienceRepository(storage),
            CredentialsRepository(storage),
            ActivityRepository(storage),
            RepostsRepository(storage),
            RelationsRepository(storage),
            ListsRepository(storage),
        )
