"""Tests of the documentation: links, code paths and the configuration reference."""
