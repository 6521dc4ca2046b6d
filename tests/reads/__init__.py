"""Tests of home pages and live streams."""
