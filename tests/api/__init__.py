"""Tests of the REST API and the web client."""
