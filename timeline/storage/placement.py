"""Which storage account holds which partition, and the record every process agrees on.

A partition's home is ``jump_hash(hash64(PartitionKey), accounts)``: adding an account at the
end moves only about 1/N of the partitions, and nothing moves between the old accounts.
Every table uses the same rule, so all of one user's partitions share an account.

The placement itself (the accounts in order, the queue shards, a version and the state of
a rebalance) is one row in the ``placement`` table of the first account, the *placement
home*. Every process reads it at start and refuses a configuration that does not match, and
re-reads it every ``lease / 3`` seconds. A process routes a request only while its last
successful read *started* less than ``lease`` seconds ago, so once a rebalance has changed
the row and waited ``lease`` plus one storage call, no process routes by the old row.

A rebalance works in steps of hash *slots* (``hash64 % SLOTS``). For a slot being moved:
``frozen`` means its moving partitions take reads (from the old home) but no writes;
``moved`` means they live on the new home. See ``timeline/storage/rebalance.py``.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from timeline.errors import ConfigurationError

SLOTS = 4096
"""Units in which a rebalance freezes and moves partitions (a 512-byte bitmap per state)."""
PLACEMENT_TABLE = "placement"
PLACEMENT_KEYS = ("placement", "current")


def hash64(partition_key: str) -> int:
    """A stable 64-bit hash of a partition key (the same in every process and version)."""
    return int.from_bytes(hashlib.blake2b(partition_key.encode(), digest_size=8).digest(), "big")


def jump_hash(key: int, buckets: int) -> int:
    """Lamping and Veach's jump consistent hash: a bucket in ``[0, buckets)`` for ``key``
    that changes for only ``1/buckets`` of keys when one bucket is added."""
    bucket, candidate = -1, 0
    while candidate < buckets:
        bucket = candidate
        key = (key * 2862933555777941757 + 1) % (1 << 64)
        candidate = int((bucket + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return bucket


def slot_of(key_hash: int) -> int:
    return key_hash % SLOTS


@dataclass(frozen=True, slots=True)
class Placement:
    """The agreed placement; ``previous`` is the account count a rebalance moves away from."""

    version: int
    accounts: tuple[str, ...]
    queue_accounts: tuple[int, ...]
    """Queue shard ``k`` lives on account ``queue_accounts[k]``; shards never move."""
    previous: int | None = None
    moved: frozenset[int] = field(default_factory=frozenset)
    frozen: frozenset[int] = field(default_factory=frozenset)

    @classmethod
    def initial(cls, accounts: tuple[str, ...], queue_shards: int) -> Placement:
        """Shards spread round-robin over the accounts."""
        return cls(1, accounts, tuple(k % len(accounts) for k in range(queue_shards)))

    @property
    def settled(self) -> bool:
        return self.previous is None

    @property
    def queue_shards(self) -> int:
        return len(self.queue_accounts)

    def old_home(self, key_hash: int) -> int:
        return jump_hash(key_hash, self.previous or len(self.accounts))

    def new_home(self, key_hash: int) -> int:
        return jump_hash(key_hash, len(self.accounts))

    def moving(self, key_hash: int) -> bool:
        return self.previous is not None and self.old_home(key_hash) != self.new_home(key_hash)

    def home(self, key_hash: int) -> int:
        """The account index that holds this partition now."""
        if self.moving(key_hash) and slot_of(key_hash) not in self.moved:
            return self.old_home(key_hash)
        return self.new_home(key_hash)

    def writable(self, key_hash: int) -> bool:
        return not (self.moving(key_hash) and slot_of(key_hash) in self.frozen)

    def next_version(self, **changes: Any) -> Placement:
        return replace(self, version=self.version + 1, **changes)

    def check_configured(self, configured: tuple[str, ...], queue_shards: int | None) -> None:
        """Raise ``ConfigurationError`` unless a process with these accounts may serve."""
        if queue_shards is not None and queue_shards != self.queue_shards:
            raise ConfigurationError(
                f"TIMELINE_QUEUE_SHARDS is {queue_shards} but the stored placement has "
                f"{self.queue_shards} queue shards"
            )
        if configured == self.accounts:
            return
        if self.settled and configured[: len(self.accounts)] == self.accounts:
            return  # accounts added, waiting for `timeline rebalance`
        raise ConfigurationError(
            "the configured storage accounts do not match the stored placement "
            f"(version {self.version}): configured {list(configured)}, stored "
            f"{list(self.accounts)}. List the accounts in the stored order; a new account "
            "goes at the end, then run `timeline rebalance`."
        )

    def to_entity(self) -> dict[str, Any]:
        partition_key, row_key = PLACEMENT_KEYS
        return {
            "PartitionKey": partition_key,
            "RowKey": row_key,
            "version": self.version,
            "accounts": orjson.dumps(self.accounts).decode(),
            "queue_accounts": orjson.dumps(self.queue_accounts).decode(),
            "previous": -1 if self.previous is None else self.previous,
            "moved": _bitmap(self.moved),
            "frozen": _bitmap(self.frozen),
        }

    @classmethod
    def from_entity(cls, entity: dict[str, Any]) -> Placement:
        previous = int(entity["previous"])
        return cls(
            version=int(entity["version"]),
            accounts=tuple(orjson.loads(entity["accounts"])),
            queue_accounts=tuple(orjson.loads(entity["queue_accounts"])),
            previous=None if previous < 0 else previous,
            moved=_slots(entity["moved"]),
            frozen=_slots(entity["frozen"]),
        )


def _bitmap(slots: frozenset[int]) -> str:
    bits = bytearray(SLOTS // 8)
    for slot in slots:
        bits[slot // 8] |= 1 << (slot % 8)
    return base64.b64encode(bytes(bits)).decode()


def _slots(text: str) -> frozenset[int]:
    bits = base64.b64decode(text)
    return frozenset(i for i in range(SLOTS) if bits[i // 8] >> (i % 8) & 1)
