"""Tests of ``make run`` and the admin CLI."""
