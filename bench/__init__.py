"""Benchmark harness: our exporter against two peers on one throw-away PostgreSQL."""
