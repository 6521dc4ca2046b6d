"""How big each phase is: the defaults (a full ``make bench``) and ``--quick`` (a smoke run)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sizes:
    ceiling_entities: int = 8000
    live_authors: int = 200
    live_followers: int = 100
    live_seconds: float = 20.0
    lag_seconds: float = 15.0
    burst_users: int = 2000
    burst_authors: int = 100
    burst_posts: int = 500
    backfill_posts: int = 1000
    backfill_follows: int = 24
    bigfanout_followers: int = 20_000
    bigfanout_cap_s: float = 30.0
    same_rowkey_per_round: int = 1000
    balance_users: int = 10_000
    balance_graph_users: int = 400
    scaling_users: int = 2000
    scaling_authors: int = 50
    scaling_followers: int = 100
    scaling_posts: int = 40
    scaling_rounds: int = 2
    api_users: int = 20
    api_requests: int = 500
    large_author_followers: int = 100_000
    hybrid_reads: int = 200
    regrade_followers: int = 2000
    cap_items: int = 800
    cap_authors: int = 10
    cap_posts_per_author: int = 100
    cap_followers: int = 10
    stream_clients: int = 50
    stream_seconds: float = 30.0
    stream_events: int = 50
    backlog_follows: int = 5000
    backlog_subject_posts: int = 20
    backlog_writes: int = 200
    backlog_posts: int = 3
    backlog_window_s: float = 60.0
    late_pages_followers: int = 3000
    late_pages_kill_after_s: float = 2.0
    late_pages_cap_s: float = 600.0
    crashloop_seconds: float = 20.0
    follow_storm_follows: int = 1500
    follow_storm_point_writes: int = 200
    idle_seconds: float = 20.0
    inactive_readers: int = 1000
    inactive_authors: int = 20
    inactive_followers: int = 100
    inactive_posts: int = 200
    inactive_period_s: float = 16.0
    inactive_returning: int = 3
    inactive_library_posts: int = 3
    inactive_tries: int = 5
    mute_reads: int = 200
    list_followers: int = 100
    list_count: int = 20
    list_posts: int = 20
    list_reads: int = 200
    delete_followers: int = 2000
    delete_follows: int = 2000
    delete_posts: int = 500
    delete_reposts: int = 50
    delete_copies_each: int = 20
    """Of its posts, the newest this many are in each follower's timeline (all 500 would be a
    million rows, past what an in-memory Azurite seeds in minutes)."""


QUICK = Sizes(
    ceiling_entities=600, live_authors=20, live_followers=20, live_seconds=3, lag_seconds=3,
    burst_users=200, burst_authors=10, burst_posts=50, backfill_posts=300, backfill_follows=2,
    bigfanout_followers=3000, bigfanout_cap_s=60, same_rowkey_per_round=500,
    balance_users=10_000, balance_graph_users=200, scaling_users=200, scaling_authors=10,
    scaling_followers=20, scaling_posts=10, scaling_rounds=1, api_users=5, api_requests=100,
    large_author_followers=2000, hybrid_reads=20, regrade_followers=200, cap_items=64,
    cap_authors=4, cap_posts_per_author=20, cap_followers=4, stream_clients=4, stream_seconds=5,
    stream_events=5, backlog_follows=300, backlog_subject_posts=5, backlog_writes=40,
    backlog_posts=2, backlog_window_s=5, late_pages_followers=300, late_pages_cap_s=120,
    crashloop_seconds=6, follow_storm_follows=200,
    follow_storm_point_writes=50, idle_seconds=5,
    inactive_readers=100, inactive_authors=5,
    inactive_followers=40, inactive_posts=20, inactive_period_s=8, inactive_returning=2,
    inactive_library_posts=2, inactive_tries=2, mute_reads=20,
    list_followers=10, list_count=4, list_posts=4, list_reads=20,
    delete_followers=20, delete_follows=20, delete_posts=10, delete_reposts=5,
    delete_copies_each=10,
)  # fmt: skip
