"""The worker's batching: timeline writes coalesced by partition into Entity Group Transactions."""
