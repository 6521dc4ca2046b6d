"""``make loadtest``: the whole stack on free ports, seeded, under Locust; one JSON line.

``python -m loadtest.run`` (``__main__``) runs the phases in order: ``stack`` (start
``timeline run`` with its own Azurite, seed the graph), the Locust load, then ``report``
(Locust's CSV into percentiles, the PNG plot). See loadtest/README.md for every key.
"""
