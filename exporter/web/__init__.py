"""The HTTP layer: the aiohttp application and everything it serves.

``app`` (factory and runner), ``routes`` (the route table and landing page),
``metrics`` (the telemetry path), ``pages`` (/version, /explain, /stat, /reload),
``health`` (the probe and the routing endpoints), ``auth`` and ``config`` (the
exporter-toolkit web config: TLS and basic auth), ``reloading`` and ``state``
(what the handlers share). :mod:`exporter.serve` runs it.
"""
