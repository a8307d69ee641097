"""Basic auth and extra response headers from the web config, as aiohttp hooks.

Every path is protected: a scrape, a health check and ``/reload`` alike. Passwords
are checked with bcrypt at a constant cost whether or not the user exists, and a
verified pair is remembered under a keyed hash so a 15 s scrape does not pay bcrypt.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Awaitable, Callable, Mapping

import bcrypt
from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware

from exporter.webconfig import BCRYPT_MAX_PASSWORD, REALM, WebConfig


def install(app: web.Application, config: WebConfig) -> None:
    """Auth in front of every route, and the headers on every response."""
    app.middlewares.insert(0, auth_middleware(config))
    if config.headers:
        app.on_response_prepare.append(headers_hook(config))


def headers_hook(config: WebConfig) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """An ``on_response_prepare`` hook: unlike a middleware it reaches streamed responses."""

    async def add_headers(request: web.Request, response: web.StreamResponse) -> None:
        response.headers.update(config.headers)

    return add_headers


def auth_middleware(config: WebConfig) -> Middleware:
    """Basic auth when users are configured; the client-certificate SAN allow-list."""
    checker = Credentials(config.users) if config.users else None
    sans = config.tls.client_allowed_sans if config.tls else ()

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if sans and not peer_has_allowed_san(request, sans):
            return web.Response(status=403, text="client certificate not allowed\n")
        if checker and not await checker.check(request.headers.get(hdrs.AUTHORIZATION)):
            challenge = {hdrs.WWW_AUTHENTICATE: f'Basic realm="{REALM}"'}
            return web.Response(status=401, text="Unauthorized\n", headers=challenge)
        return await handler(request)

    return authenticate


class Credentials:
    """Checks Basic credentials against bcrypt hashes without revealing which part failed."""

    def __init__(self, users: Mapping[str, bytes], cache_limit: int = 1024) -> None:
        self.users = users
        # Unknown users are checked against a hash as costly as the costliest in use,
        # so they take as long as known ones; its salt matches no password.
        self.decoy = b"$2b$%s$" % max(hashed[4:6] for hashed in users.values()) + b"." * 53
        self.key = secrets.token_bytes(32)  # cache keys are useless outside this process
        self.verified: set[bytes] = set()
        self.cache_limit = cache_limit
        self.lock = asyncio.Lock()  # one bcrypt at a time: a password flood costs one core
        self.bcrypt_runs = 0

    async def check(self, header: str | None) -> bool:
        """True for a known user with the right password; cached, since bcrypt is slow."""
        given = basic_credentials(header)
        if given is None:
            return False
        user, password = given
        tag = hmac.new(self.key, b"%s:%s" % (user.encode(), password), hashlib.sha256).digest()
        if tag in self.verified:
            return True
        hashed = self.users.get(user)
        async with self.lock:
            self.bcrypt_runs += 1
            matched = await asyncio.to_thread(
                bcrypt.checkpw, password[:BCRYPT_MAX_PASSWORD], hashed or self.decoy
            )
        if not (matched and hashed):
            return False
        if len(self.verified) >= self.cache_limit:
            self.verified.clear()
        self.verified.add(tag)
        return True


def basic_credentials(header: str | None) -> tuple[str, bytes] | None:
    """(user, password) from an ``Authorization: Basic`` value; the password stays bytes."""
    scheme, _, encoded = (header or "").strip().partition(" ")
    try:
        user, colon, password = base64.b64decode(encoded.strip(), validate=True).partition(b":")
        return (user.decode("utf-8"), password) if scheme.lower() == "basic" and colon else None
    except (ValueError, UnicodeDecodeError):  # binascii.Error is a ValueError
        return None


def peer_has_allowed_san(request: web.Request, allowed: tuple[str, ...]) -> bool:
    """True when the client's verified certificate names one of ``allowed``."""
    transport = request.transport
    cert = transport.get_extra_info("peercert") if transport is not None else None
    names = {_normal(value) for _, value in (cert or {}).get("subjectAltName", ())}
    return any(_normal(name) in names for name in allowed)


def _normal(name: str) -> str:
    """IP addresses compare by value (Python spells IPv6 SANs in full)."""
    try:
        return str(ipaddress.ip_address(name.strip()))
    except ValueError:
        return name.strip()
