"""A throw-away PKI made with ``openssl`` and a tiny app behind the web config's hooks.

What is under test is the web config's part (``install`` and ``ssl_context``),
wired the way the CLI wires it; the app itself only says hello.
"""

from __future__ import annotations

import base64
import secrets
import ssl
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
from aiohttp import web

from exporter.webauth import install
from exporter.webconfig import WebConfig, ssl_context

EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def openssl(directory: Path, *args: str) -> None:
    """Run the openssl command line tool in ``directory``."""
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)


def issue(directory: Path, name: str, san: str, ca: str = "ca", sections: str = "") -> None:
    """``name``.crt/.key: a leaf certificate with ``san``, signed by ``ca``.

    ``sections`` are extra extension-file sections a ``san`` may refer to (``dirName:``).
    """
    (directory / f"{name}.ext").write_text(
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth,clientAuth\nsubjectKeyIdentifier=hash\n"
        f"authorityKeyIdentifier=keyid\nsubjectAltName={san}\n{sections}"
    )
    openssl(directory, "req", "-new", *EC, "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN={name}")  # fmt: skip
    openssl(directory, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt",
            "-CAkey", f"{ca}.key", "-set_serial", str(secrets.randbits(63)), "-days", "2",
            "-extfile", f"{name}.ext", "-out", f"{name}.crt")  # fmt: skip


def make_ca(directory: Path, name: str) -> None:
    """``name``.crt/.key: a self-signed CA."""
    openssl(directory, "req", "-x509", *EC, "-keyout", f"{name}.key", "-out", f"{name}.crt",
            "-days", "2", "-subj", f"/CN={name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip


def client_context(
    pki: Path, cert: str | None = None, **versions: ssl.TLSVersion
) -> ssl.SSLContext:
    """A client trusting the test CA, optionally presenting ``cert``."""
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert is not None:
        context.load_cert_chain(str(pki / f"{cert}.crt"), str(pki / f"{cert}.key"))
    for attribute, version in versions.items():
        setattr(context, attribute, version)
    return context


async def hello(request: web.Request) -> web.Response:
    return web.Response(text="hello\n")


async def streamed(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    await response.prepare(request)
    await response.write(b"streamed\n")
    return response


@asynccontextmanager
async def serving(config: WebConfig, context: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    """Serve the tiny app on a free 127.0.0.1 port; yields its base URL."""
    app = web.Application()
    install(app, config)
    app.router.add_get("/", hello)
    app.router.add_get("/stream", streamed)
    if context is None and config.tls is not None:
        context = ssl_context(config.tls)
    runner = web.AppRunner(app, handler_cancellation=True)  # as production runs it
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"{'https' if context else 'http'}://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def get(
    url: str, client: ssl.SSLContext | None = None, auth: dict[str, str] | None = None
) -> tuple[int, dict[str, str], str]:
    """Status, headers and body of one GET."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, ssl=client or False, headers=auth) as response,
    ):
        return response.status, dict(response.headers), await response.text()


def basic(user: str, password: str) -> dict[str, str]:
    """The Authorization header for ``user`` and ``password``."""
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
