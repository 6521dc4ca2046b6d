"""Reads: home timeline pages and live streams."""
