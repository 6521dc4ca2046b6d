"""Value types: identifiers and row keys, tokens, records, queue messages, priorities."""
