"""Tests of the load tests and benchmarks run end to end at tiny sizes."""
