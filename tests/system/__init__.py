"""Tests of several processes together: flows, outages, chaos."""
