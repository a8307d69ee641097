"""Tests for exporter.web's package import: aiohttp comes in without its client
contexts loading the CA bundle, and the environment is left as it was.

Each case runs in a fresh interpreter: the test runner has imported aiohttp already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.webrig import issue, make_ca, openssl

# Prints what the import left behind: the variable, aiohttp's client stores, and a
# context made afterwards (as the exporter makes its own).
_REPORT = """
import json, os, ssl
import exporter.web
import aiohttp.connector as connector
print(json.dumps({
    "variable": os.environ.get("SSL_CERT_FILE"),
    "aiohttp": [connector._SSL_CONTEXT_VERIFIED.cert_store_stats()["x509_ca"],
                connector._SSL_CONTEXT_UNVERIFIED.cert_store_stats()["x509_ca"]],
    "later": ssl.create_default_context().cert_store_stats()["x509_ca"],
}))
"""

# With SSL_CERT_DIR set to a directory of hashed CAs: does aiohttp's verifying context
# accept a server whose certificate one of them signed?
_HANDSHAKE = """
import asyncio, ssl, sys
import exporter.web
import aiohttp.connector as connector

async def main(cert, key):
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(cert, key)
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0, ssl=server_side)
    port = server.sockets[0].getsockname()[1]
    try:
        _, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=connector._SSL_CONTEXT_VERIFIED, server_hostname="localhost")
        writer.close()
        print("verified")
    except ssl.SSLCertVerificationError:
        print("refused")
    finally:
        server.close()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def _run(code: str, env: dict[str, str], *args: str) -> str:
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                         text=True, check=True, timeout=60)  # fmt: skip
    return out.stdout.strip()


def _environment(**variables: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    env.update({k: v for k, v in variables.items() if v is not None})
    return env


def _system_bundle() -> str:
    import ssl

    path = ssl.get_default_verify_paths().openssl_cafile
    if not Path(path).is_file():  # the image always has one: ca-certificates
        raise AssertionError(f"no system CA bundle at {path}")
    return path


@pytest.mark.parametrize("variable", [None, "bundle"])
def test_aiohttp_client_contexts_load_no_bundle(variable: str | None) -> None:
    """aiohttp's two client contexts hold no CA after the import, whether SSL_CERT_FILE
    was set or not; it is as it was afterwards, and a context made later loads the bundle."""
    value = _system_bundle() if variable else None
    report = json.loads(_run(_REPORT, _environment(SSL_CERT_FILE=value)))
    assert report["variable"] == value
    assert report["aiohttp"] == [0, 0]
    assert report["later"] > 0


def test_verification_still_finds_a_ca_in_the_certificate_directory(tmp_path: Path) -> None:
    """A CA found by hash in SSL_CERT_DIR still lets aiohttp's verifying context accept
    the server it signed, and a server signed by another CA is still refused."""
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    for ca in ("ca", "other"):
        make_ca(tmp_path, ca)
    issue(tmp_path, "server", "DNS:localhost", ca="ca")
    issue(tmp_path, "stranger", "DNS:localhost", ca="other")
    (trusted / "ca.pem").write_bytes((tmp_path / "ca.crt").read_bytes())
    openssl(trusted, "rehash", ".")
    env = _environment(SSL_CERT_DIR=str(trusted))
    for name, verdict in (("server", "verified"), ("stranger", "refused")):
        cert, key = str(tmp_path / f"{name}.crt"), str(tmp_path / f"{name}.key")
        assert _run(_HANDSHAKE, env, cert, key) == verdict, name
