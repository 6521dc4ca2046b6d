"""Tests of repositories and the counters they keep."""
