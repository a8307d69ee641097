"""TLS, basic auth and extra headers served by aiohttp, checked with a real HTTPS client.

A tiny application stands in for the exporter's: what is under test is the
web config's part (``install`` and ``ssl_context``), wired the way the CLI
wires it (the rig is ``webrig``). Certificates come from a throw-away CA made
with ``openssl``.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import aiohttp
import bcrypt
import pytest
from aiohttp import web

from exporter.config.loading import load_for_settings
from exporter.config.settings import Settings
from exporter.web.app import create_app, make_runner
from exporter.web.reloading import RELOADER
from exporter.web.webconfig import TlsConfig, WebConfig, load_web_config, ssl_context
from rigs.localpg import free_port
from tests.fixtures.helpers import REPO
from tests.fixtures.webrig import basic, client_context, get, issue, make_ca, serving

USER, PASSWORD = "prometheus", "correct horse battery staple"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4))
HEADERS = (("X-Frame-Options", "deny"), ("Strict-Transport-Security", "max-age=60"))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA with two server certificates and two client ones, plus a rogue CA's client."""
    directory = tmp_path_factory.mktemp("pki")
    make_ca(directory, "ca")
    make_ca(directory, "rogue")
    issue(directory, "server", "IP:127.0.0.1,DNS:localhost")
    issue(directory, "server2", "IP:127.0.0.1,DNS:localhost")
    issue(directory, "client", "DNS:scraper.example")
    issue(directory, "client2", "DNS:intruder.example")
    issue(directory, "outsider", "DNS:scraper.example", ca="rogue")
    return directory


def tls_for(pki: Path, **changes: object) -> TlsConfig:
    """The server certificate from ``pki`` with ``changes``."""
    base = TlsConfig(cert_file=str(pki / "server.crt"), key_file=str(pki / "server.key"))
    return replace(base, **changes)  # type: ignore[arg-type]


RIGHT = basic(USER, PASSWORD)


async def test_right_credentials_over_tls(pki: Path) -> None:
    """HTTPS with the right user and password answers 200 on every path."""
    config = WebConfig(tls=tls_for(pki), users={USER: HASH})
    async with serving(config) as url:
        assert url.startswith("https://")
        status, _, body = await get(f"{url}/", client_context(pki), RIGHT)
        assert (status, body) == (200, "hello\n")
        assert (await get(f"{url}/stream", client_context(pki), RIGHT))[0] == 200
        assert (await get(f"{url}/nowhere", client_context(pki), RIGHT))[0] == 404


@pytest.mark.parametrize(
    "auth",
    [
        None,
        basic(USER, "wrong"),
        basic("nobody", PASSWORD),
        basic(USER.upper(), PASSWORD),
        {"Authorization": f"Bearer {PASSWORD}"},
    ],
    ids=["missing", "wrong-password", "unknown-user", "user-case", "not-basic"],
)
async def test_missing_or_wrong_credentials_get_401(
    pki: Path, auth: dict[str, str] | None, caplog: pytest.LogCaptureFixture
) -> None:
    """Every path answers 401 with a Basic challenge; the handler never runs; nothing is logged."""
    config = WebConfig(tls=tls_for(pki), users={USER: HASH})
    with caplog.at_level(logging.DEBUG):
        async with serving(config) as url:
            for path in ("/", "/stream", "/nowhere"):
                status, headers, body = await get(f"{url}{path}", client_context(pki), auth)
                assert status == 401
                assert headers["WWW-Authenticate"] == 'Basic realm="pg_exporter"'
                assert "hello" not in body
                assert "streamed" not in body
    assert PASSWORD not in caplog.text


async def test_basic_auth_without_tls(pki: Path) -> None:
    """basic_auth_users alone protects a plain HTTP listener."""
    async with serving(WebConfig(users={USER: HASH})) as url:
        assert url.startswith("http://")
        assert (await get(f"{url}/", auth=RIGHT))[0] == 200
        assert (await get(f"{url}/"))[0] == 401


async def test_configured_headers_on_every_response(pki: Path) -> None:
    """The extra headers reach plain, streamed, 404 and 401 responses alike."""
    config = WebConfig(tls=tls_for(pki), users={USER: HASH}, headers=HEADERS)
    async with serving(config) as url:
        answers = [
            await get(f"{url}/", client_context(pki), RIGHT),
            await get(f"{url}/stream", client_context(pki), RIGHT),
            await get(f"{url}/nowhere", client_context(pki), RIGHT),
            await get(f"{url}/", client_context(pki)),
        ]
    assert [status for status, _, _ in answers] == [200, 200, 404, 401]
    for _, headers, _ in answers:
        assert headers["X-Frame-Options"] == "deny"
        assert headers["Strict-Transport-Security"] == "max-age=60"


async def test_handshake_below_min_version_is_refused(pki: Path) -> None:
    """With min_version TLS13 a client capped at TLS 1.2 cannot connect; a TLS 1.3 one can."""
    config = WebConfig(tls=tls_for(pki, min_version=ssl.TLSVersion.TLSv1_3))
    async with serving(config) as url:
        old = client_context(pki, maximum_version=ssl.TLSVersion.TLSv1_2)
        with pytest.raises(aiohttp.ClientError):
            await get(f"{url}/", old)
        assert (await get(f"{url}/", client_context(pki)))[0] == 200


async def test_handshake_above_max_version_is_refused(pki: Path) -> None:
    """With max_version TLS12 a client requiring TLS 1.3 cannot connect."""
    config = WebConfig(tls=tls_for(pki, max_version=ssl.TLSVersion.TLSv1_2))
    async with serving(config) as url:
        with pytest.raises(aiohttp.ClientError):
            await get(f"{url}/", client_context(pki, minimum_version=ssl.TLSVersion.TLSv1_3))
        assert (await get(f"{url}/", client_context(pki)))[0] == 200


async def test_client_certificate_required_and_verified(pki: Path) -> None:
    """RequireAndVerifyClientCert: no certificate or one from another CA is refused."""
    tls = tls_for(pki, client_auth="RequireAndVerifyClientCert", client_ca_file=str(pki / "ca.crt"))
    async with serving(WebConfig(tls=tls)) as url:
        assert (await get(f"{url}/", client_context(pki, "client")))[0] == 200
        with pytest.raises(aiohttp.ClientError):
            await get(f"{url}/", client_context(pki))
        with pytest.raises(aiohttp.ClientError):
            await get(f"{url}/", client_context(pki, "outsider"))


async def test_client_certificate_optional_but_verified_if_given(pki: Path) -> None:
    """VerifyClientCertIfGiven: no certificate is fine, a foreign one is refused."""
    tls = tls_for(pki, client_auth="VerifyClientCertIfGiven", client_ca_file=str(pki / "ca.crt"))
    async with serving(WebConfig(tls=tls)) as url:
        assert (await get(f"{url}/", client_context(pki)))[0] == 200
        assert (await get(f"{url}/", client_context(pki, "client")))[0] == 200
        with pytest.raises(aiohttp.ClientError):
            await get(f"{url}/", client_context(pki, "outsider"))


async def test_client_allowed_sans(pki: Path) -> None:
    """A verified client certificate without an allowed SAN gets 403."""
    tls = tls_for(
        pki,
        client_auth="RequireAndVerifyClientCert",
        client_ca_file=str(pki / "ca.crt"),
        client_allowed_sans=("scraper.example",),
    )
    async with serving(WebConfig(tls=tls)) as url:
        assert (await get(f"{url}/", client_context(pki, "client")))[0] == 200
        assert (await get(f"{url}/", client_context(pki, "client2")))[0] == 403


async def peer_common_name(port: int, client: ssl.SSLContext) -> str:
    """The CN of the certificate the server presents on a new connection."""
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
    cert = writer.get_extra_info("peercert")
    writer.close()
    await writer.wait_closed()
    return dict(pair[0] for pair in cert["subject"])["commonName"]  # type: ignore[no-any-return]


@asynccontextmanager
async def exporter_over_tls(web_yml: Path) -> AsyncIterator[tuple[web.Application, int]]:
    """The exporter app served as production serves it with this web config file."""
    settings = Settings(
        url=f"postgresql://127.0.0.1:{free_port()}/postgres",  # nothing there: no database needed
        config=str(REPO / "collectors"),
        web_config_file=str(web_yml),
    )
    web_config = load_web_config(str(web_yml))
    assert web_config.tls is not None
    app = create_app(settings, load_for_settings(settings), web_config)
    app[RELOADER].tls_context = ssl_context(web_config.tls)
    app[RELOADER].rebase()  # as production does once TLS is on
    runner = make_runner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=app[RELOADER].tls_context).start()
    try:
        yield app, runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def test_reload_picks_up_a_renewed_certificate(pki: Path, tmp_path: Path) -> None:
    """/reload (and SIGHUP) re-read the certificate and key: new connections get the
    renewed pair without a restart. A pair that does not match is refused, and the
    running one keeps serving."""
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes((pki / "server.crt").read_bytes())
    key.write_bytes((pki / "server.key").read_bytes())
    web_yml = tmp_path / "web.yml"
    web_yml.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    async with exporter_over_tls(web_yml) as (app, port):
        assert await peer_common_name(port, client_context(pki)) == "server"
        cert.write_bytes((pki / "server2.crt").read_bytes())  # renewed, key not yet
        ok, message = await app[RELOADER].reload()
        assert not ok, message
        assert "certificate" in message
        assert await peer_common_name(port, client_context(pki)) == "server"
        key.write_bytes((pki / "server2.key").read_bytes())
        ok, message = await app[RELOADER].reload()
        assert ok, message
        assert await peer_common_name(port, client_context(pki)) == "server2"


async def test_web_config_file_end_to_end(pki: Path) -> None:
    """A file with relative paths, mutual TLS, a user and headers, loaded and served."""
    path = pki / "web.yml"
    path.write_text(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"
        "  min_version: TLS12\n"
        f"basic_auth_users:\n  {USER}: {HASH.decode()}\n"
        "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n"
    )
    config = load_web_config(str(path))
    async with serving(config) as url:
        status, headers, _ = await get(f"{url}/", client_context(pki, "client"), RIGHT)
        assert (status, headers["X-Content-Type-Options"]) == (200, "nosniff")
        assert (await get(f"{url}/", client_context(pki, "client")))[0] == 401
        with pytest.raises(aiohttp.ClientError):
            await get(f"{url}/", client_context(pki), RIGHT)
