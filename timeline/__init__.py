"""Core library of the timeline fan-out service: no web framework, no process wiring."""
