"""Storage: accounts and placement, the calls routed to them, the queues and rebalance; the
lean wire path (``wire``) and flow control (``flow``) beneath them."""
