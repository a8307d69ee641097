"""pg_exporter for Python: a Prometheus exporter for PostgreSQL and pgBouncer.

The package is in layers, each a sub-package that imports only those before it
(``tests/test_layout.py`` holds it): :mod:`exporter.errors` (stands on nothing),
:mod:`exporter.config` (what the operator asked for), :mod:`exporter.pg` (talking to
PostgreSQL), :mod:`exporter.health` (the health probe), :mod:`exporter.expose` (series
and their bytes), :mod:`exporter.collect` (collecting within bounds),
:mod:`exporter.report` (what the exporter tells about itself), :mod:`exporter.fleet`
(targets), :mod:`exporter.web` (HTTP), then the process: :mod:`exporter.cli`,
:mod:`exporter.signals`, :mod:`exporter.serve`, :mod:`exporter.systemd` and
``__main__``.
"""

__version__ = "0.1.0"
