"""Targets: what serves one, and a fleet of declared ones.

- ``state``: what serves one target (settings, exporter, admission, self-metrics).
- ``members``: every declared target as a member with its own state and probe.

May import: :mod:`exporter.report`, :mod:`exporter.collect`, :mod:`exporter.health` and
every layer below them; never :mod:`exporter.web`.
"""
