"""Local PostgreSQL, pgBouncer and a Patroni cluster for the tests, the benchmark and
``scripts/demo``.

Not part of the product: the wheel, the .deb and the .rpm ship ``exporter/``
only (``tests/packaging/test_contents.py`` checks it). Run from the repository
root, e.g. ``python -m rigs.demo``.
"""
