"""Collecting a target within bounds: the request's budget, each collector's runtime on
each database, the breaker, the caps, and the passes that walk the databases.

- ``budget``: how long one request may spend, and when to stop (B7–B10).
- ``admission``: at most two telemetry requests rendered at once.
- ``gate``: a fleet's ceiling on targets collected at once.
- ``cache``: a collector's cached result and how its run ended.
- ``backoff``: per-collector back-off with bounded jitter.
- ``runtime``: one collector on one database: its state, statistics and rules.
- ``breaker``: shedding the least important collectors in distress.
- ``seriescap``: the ceiling on series.
- ``planning``: which branches run on one server, and why the others do not.
- ``ranking``: which keys of a ``top`` collector are named; the remainder's counters.
- ``topn``: a ``top`` collector's rows ranked into named rows and remainder rows.
- ``probed``: a ``top`` collector with a probe: every key ranked, the named ones read.
- ``account``: a probed collector's counters: what the named series and remainder show.
- ``session``: a collector's run on one connection: deadline, limits, predicates.
- ``server``: one scraped database.
- ``databases``: the main database and those discovered from it.
- ``passes``: one pass over every database under one budget.
- ``exporter``: the target's :class:`exporter.Exporter`, one pass at a time.
- ``servertime``: the server-time budget, measured.
- ``stretch``: which collectors to refresh less often to keep within it.

May import: :mod:`exporter.expose`, :mod:`exporter.pg`, :mod:`exporter.config`,
:mod:`exporter.errors`.
"""
