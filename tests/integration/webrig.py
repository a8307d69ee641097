"""A throw-away PKI made with ``openssl``, a tiny app behind the web config's hooks,
and a password-guessing attacker.

What is under test is the web config's part (``install`` and ``ssl_context``),
wired the way the CLI wires it; the app itself only says hello.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import ssl
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
from aiohttp import web

from exporter.web.auth import CREDENTIALS, install
from exporter.web.config import WebConfig, ssl_context
from tests.integration.rawhttp import poll

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
    async with serving_app(config, context) as (url, _):
        yield url


@asynccontextmanager
async def serving_app(
    config: WebConfig, context: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[str, web.Application]]:
    """Like ``serving``, yielding the application too."""
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
        yield f"{'https' if context else 'http'}://127.0.0.1:{port}", app
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


FLOOD = 20
# The attacker: FLOOD connections from SOURCES addresses (127.0.0.10 and up), each
# sending a wrong password as soon as the previous answer came; prints "ready" once
# every connection has had an answer.
SOURCES = 5
ATTACKER = """
import asyncio, base64, sys
import aiohttp

async def main(url, count, sources):
    answered = set()
    async def guess(number, session):
        for attempt in range(10**9):
            token = base64.b64encode(f"user{number}:guess{attempt}".encode()).decode()
            async with session.get(url, headers={"Authorization": "Basic " + token}) as answer:
                assert answer.status == 401, answer.status
            if number not in answered:
                answered.add(number)
                if len(answered) == count:
                    print("ready", flush=True)
    def connector(n):
        return aiohttp.TCPConnector(limit=0, local_addr=(f"127.0.0.{10 + n}", 0))
    sessions = [aiohttp.ClientSession(connector=connector(n)) for n in range(sources)]
    await asyncio.gather(*(guess(number, sessions[number % sources]) for number in range(count)))

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""


@asynccontextmanager
async def flooding(url: str, app: web.Application) -> AsyncIterator[None]:
    """FLOOD concurrent wrong-password loops from SOURCES addresses, in another process,
    in their steady state: every attacking address has had a check fail (until then a
    new address may take the thread kept for clients in good standing)."""
    attacker = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        ATTACKER,
        url,
        str(FLOOD),
        str(SOURCES),
        stdout=asyncio.subprocess.PIPE,
    )
    assert attacker.stdout is not None
    try:
        assert await asyncio.wait_for(attacker.stdout.readline(), 120) == b"ready\n"
        suspects = app[CREDENTIALS].turns.suspects
        await poll(lambda: len(suspects) == SOURCES, "every attacking address to have failed")
        yield
        assert attacker.returncode is None, "the attacker saw something other than 401"
    finally:
        if attacker.returncode is None:
            attacker.kill()
        await attacker.wait()


async def timed_login(url: str, user: str, password: str, source: str = "127.0.0.2") -> float:
    """Seconds for a right login (a GET of ``url``) from ``source``; it must succeed."""
    connector = aiohttp.TCPConnector(local_addr=(source, 0))
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        async with session.get(url, headers=basic(user, password)) as response:
            assert response.status == 200
            await response.read()
        return time.perf_counter() - started


async def median_login(url: str, users: list[str], password: str) -> float:
    """The median of right logins by ``users`` in turn, from 127.0.0.2."""
    return statistics.median([await timed_login(url, user, password) for user in users])
