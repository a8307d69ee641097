"""pg_exporter for Python: a Prometheus exporter for PostgreSQL and pgBouncer."""

__version__ = "0.1.0"
