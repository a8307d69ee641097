"""The HTTP layer: the aiohttp application and everything it serves.

- ``app``: the application's factory and the runner production uses.
- ``routes``: the route table and the landing page.
- ``metrics``: the telemetry path.
- ``pages``: /version, /explain, /stat and /reload.
- ``healthpages``: the health and routing endpoints, answered from the probe's snapshot.
- ``auth`` and ``webconfig``: the exporter-toolkit web config (TLS, basic auth).
- ``reloading``: reading the collector config again, safely under a flood.
- ``appstate``: where a single target's handlers find its state.
- ``fleetrequests`` and ``fleetpages``: which member a request names, and the
  fleet's pages.

May import: every layer; only :mod:`exporter.cli` and :mod:`exporter.serve` import it.
:mod:`exporter.serve` runs it.

Importing this package imports aiohttp without loading the system's CA bundle into
the two client TLS contexts aiohttp makes at import time (see :func:`_import_aiohttp`).
"""

from __future__ import annotations

import os
import sys

#: OpenSSL reads the CA bundle's path from this variable whenever a context loads its
#: default locations; the certificate directory ($SSL_CERT_DIR) is searched lazily.
_CA_FILE_VARIABLE = "SSL_CERT_FILE"


def _import_aiohttp() -> None:
    """Import aiohttp with no CA bundle to load, then put the environment back.

    aiohttp builds a verifying and a non-verifying client context when imported, and
    each parses the whole system bundle (~140 certificates): 2.0 MiB of resident
    memory for a client the exporter never uses (issue 31). With the bundle's
    variable naming no file, they load none up front and would still find a CA by its
    hash in the certificate directory. The variable is restored before anything else
    runs, so libpq and the contexts the exporter makes for itself (TLS of the web
    config) read it as the operator set it. Nothing is done when aiohttp is imported
    already (by a test runner, say).
    """
    if "aiohttp" in sys.modules:
        return
    saved = os.environ.get(_CA_FILE_VARIABLE)
    os.environ[_CA_FILE_VARIABLE] = ""
    try:
        import aiohttp  # noqa: F401  (what the subpackages import next is then cached)
    finally:
        if saved is None:
            del os.environ[_CA_FILE_VARIABLE]
        else:
            os.environ[_CA_FILE_VARIABLE] = saved


_import_aiohttp()
