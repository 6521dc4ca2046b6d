"""Storage plumbing: accounts and placement, queues, the partition writer, rebalance and the
embedded Azurite."""
