"""Tests of the fan-out worker process."""
