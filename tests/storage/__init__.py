"""Tests of storage plumbing: accounts, placement, queues, the writer, the limiter, rebalance."""
