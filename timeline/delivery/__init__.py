"""The fan-out protocol: what the worker does with each kind of message, and why it ends right."""
