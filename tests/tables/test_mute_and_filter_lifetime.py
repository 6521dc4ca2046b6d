"""A mute or keyword filter with an expiry ends twice: reads ignore it from its expiry on (no
sweep needed), and the worker's sweep deletes its row afterwards; a mute made again without
an expiry stays."""

from __future__ import annotations

import time

from fanout_worker.sweeper import GRACE_S, Sweeper
from tests.conftest import unique
from timeline.storage.accounts import Storage
from timeline.tables.relations import RelationsRepository

LATER = 60 + GRACE_S + 120
"""A sweep this far in the future finds a mute expiring within a minute due."""


async def test_an_expired_mute_is_swept_and_a_lasting_one_stays(own: Storage) -> None:
    relations = RelationsRepository(own)
    reader, brief, lasting = unique("reader"), unique("brief"), unique("lasting")
    ends = time.time() + 60
    await relations.mute(reader, brief, ends, True)
    await relations.mute(reader, lasting, ends, True)
    await relations.mute(reader, lasting, None, True)  # made again, with no end
    sweeper = Sweeper(own)
    await sweeper.sweep(now=time.time())  # not due yet: both stay
    assert await relations.mute_of(reader, brief) is not None
    await sweeper.sweep(now=time.time() + LATER)
    assert await relations.mute_of(reader, brief) is None
    kept = await relations.mute_of(reader, lasting)
    assert kept is not None
    assert kept.expires_at is None


async def test_an_expired_filter_is_swept_and_a_lasting_one_stays(own: Storage) -> None:
    relations = RelationsRepository(own)
    reader = unique("reader")
    brief = await relations.add_filter(reader, "brief", time.time() + 60)
    lasting = await relations.add_filter(reader, "lasting", None)
    assert brief is not None
    assert lasting is not None
    sweeper = Sweeper(own)
    await sweeper.sweep(now=time.time())
    assert brief in (await relations.filters_page(reader, 10, None)).items
    await sweeper.sweep(now=time.time() + LATER)
    left = (await relations.filters_page(reader, 10, None)).items  # expired ones too
    assert brief not in left
    assert lasting in left
