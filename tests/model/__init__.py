"""Tests of value types."""
