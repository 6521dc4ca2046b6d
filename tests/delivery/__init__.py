"""Tests of the fan-out protocol and its guarantees."""
