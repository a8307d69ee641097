#!/usr/bin/env bash
# Install the two peer exporters the benchmark compares ours with; safe to re-run.
#   - prometheus-postgres-exporter from Debian (Go; the bench runs the binary itself)
#   - query-exporter from PyPI, in its own venv (bench/.venv-peer) so that its
#     dependencies never mix with the project's
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# Pinned: query-exporter's config format changed across major versions.
qe_version=5.0.2

if ! command -v prometheus-postgres-exporter >/dev/null 2>&1; then
    apt-get update -q
    apt-get install -y -q prometheus-postgres-exporter
    # The package enables a service on :9187; the bench starts its own copy instead.
    if command -v systemctl >/dev/null 2>&1; then
        systemctl disable --now prometheus-postgres-exporter >/dev/null 2>&1 || true
    fi
fi

if [ ! -x "$here/.venv-peer/bin/query-exporter" ]; then
    python3 -m venv "$here/.venv-peer"
    "$here/.venv-peer/bin/pip" install -q "query-exporter==$qe_version" "psycopg[binary]"
fi

prometheus-postgres-exporter --version 2>&1 | head -1
"$here/.venv-peer/bin/query-exporter" --version
