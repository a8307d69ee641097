"""Series and their bytes: a collector's rows as rendered samples, and families as the
text format 0.0.4 or OpenMetrics.

- ``samples``: result rows into rendered series.
- ``exposition``: metric families as bytes.
- ``uniqueness``: no series served twice when sources' families are merged.

May import: :mod:`exporter.pg` (casting), :mod:`exporter.config`, :mod:`exporter.errors`.
"""
