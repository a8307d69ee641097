"""Basic auth and extra response headers from the web config, as aiohttp hooks.

Every path is protected: a scrape, a health check and ``/reload`` alike. A
verified user/password pair is remembered under a keyed hash, so a 15 s scrape
does not pay bcrypt. Other pairs are checked in a small pool of threads with no
queue (see ``Turns``): a client that may not start a check now gets 401 at once,
so a password flood cannot delay a login from elsewhere. A failed check does
the work of a check at the costliest hash in use, whatever user was named, so
response times do not tell which users exist.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import ipaddress
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware

from exporter.web.webconfig import BCRYPT_MAX_PASSWORD, REALM, WebConfig

BCRYPT_THREADS = 2  # bcrypt checks at once: what a flood of wrong passwords can cost in cores
SUSPECTS_KEPT = 16384  # client addresses remembered as having failed (a few MB at most)
_SAN_KINDS = ("DNS", "IP Address", "email", "URI")  # the toolkit compares only these


def install(app: web.Application, config: WebConfig) -> None:
    """Auth in front of every route, and the headers on every response."""
    checker = Credentials(config.users) if config.users else None
    app.middlewares.insert(0, auth_middleware(config, checker))
    if checker is not None:
        app[CREDENTIALS] = checker
        app.on_cleanup.append(checker.close)
    if config.headers:
        app.on_response_prepare.append(headers_hook(config))


def headers_hook(config: WebConfig) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """An ``on_response_prepare`` hook: unlike a middleware it reaches streamed responses."""

    async def add_headers(request: web.Request, response: web.StreamResponse) -> None:
        response.headers.update(config.headers)

    return add_headers


def auth_middleware(config: WebConfig, checker: Credentials | None) -> Middleware:
    """Basic auth when users are configured; the client-certificate SAN allow-list."""
    sans = config.tls.client_allowed_sans if config.tls else ()

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if sans and not peer_has_allowed_san(request, sans):
            return web.Response(status=403, text="client certificate not allowed\n")
        header = request.headers.get(hdrs.AUTHORIZATION)
        if checker and not await checker.check(header, client_key(request.remote)):
            challenge = {hdrs.WWW_AUTHENTICATE: f'Basic realm="{REALM}"'}
            return web.Response(status=401, text="Unauthorized\n", headers=challenge)
        return await handler(request)

    return authenticate


class Credentials:
    """Checks Basic credentials against bcrypt hashes without revealing which part failed."""

    def __init__(
        self, users: Mapping[str, bytes], cache_limit: int = 1024, threads: int = BCRYPT_THREADS
    ) -> None:
        self.users = users
        self.top_cost = max(int(hashed[4:6]) for hashed in users.values())
        self.decoy = _decoy(self.top_cost)  # what unknown users are checked against
        self.key = secrets.token_bytes(32)  # cache keys are useless outside this process
        self.verified: set[bytes] = set()
        self.cache_limit = cache_limit
        self.turns = Turns(threads)
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="bcrypt")
        self.running: dict[bytes, asyncio.Future[bool]] = {}  # by credential tag
        self.bcrypt_runs = 0
        self.refused = 0

    async def check(self, header: str | None, client: str = "") -> bool:
        """True for a known user with the right password; False at once when too busy."""
        given = basic_credentials(header)
        if given is None:
            return False
        user, password = given
        tag = hmac.new(self.key, b"%s:%s" % (user.encode(), password), hashlib.sha256).digest()
        if tag in self.verified:
            return True
        run = self.running.get(tag) or self._start(tag, user, password, client)
        if run is None:
            self.refused += 1
            return False
        return await asyncio.shield(run)  # a client hanging up does not end the check

    def _start(
        self, tag: bytes, user: str, password: bytes, client: str
    ) -> asyncio.Future[bool] | None:
        """A bcrypt run in the pool, or None when ``client`` may not start one now."""
        if not self.turns.take(client):
            return None
        loop = asyncio.get_running_loop()
        hashed = self.users.get(user)
        run: asyncio.Future[bool] = loop.create_future()
        self.running[tag] = run
        self.bcrypt_runs += 1
        given = password[:BCRYPT_MAX_PASSWORD]
        job = self.pool.submit(uniform_checkpw, given, hashed or self.decoy, self.top_cost)

        def done(job: Future[bool]) -> None:  # in the worker thread
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
                loop.call_soon_threadsafe(self._finished, tag, client, hashed, job)

        job.add_done_callback(done)
        return run

    def _finished(self, tag: bytes, client: str, hashed: bytes | None, job: Future[bool]) -> None:
        """Free the thread and the client's turn, remember a success, answer the waiters."""
        run = self.running.pop(tag)
        success = job.result() and hashed is not None
        self.turns.give_back(client, failed=not success)
        if success:
            if len(self.verified) >= self.cache_limit:
                self.verified.clear()
            self.verified.add(tag)
        run.set_result(success)

    async def close(self, app: web.Application | None = None) -> None:
        """Let the threads go; a check still running finishes on its own."""
        self.pool.shutdown(wait=False)


CREDENTIALS = web.AppKey("credentials", Credentials)  # set when basic auth is on


class Turns:
    """Who may start a bcrypt check now; bookkeeping only, no waiting.

    At most ``threads`` checks run, one per client. Clients whose last check failed
    (the suspects, the most recent few thousand) share all threads but one, so a flood
    from many addresses still leaves a thread for a scraper that never failed.
    """

    def __init__(self, threads: int, kept: int = SUSPECTS_KEPT) -> None:
        if threads < 2:
            raise ValueError("bcrypt needs two threads: one is kept for clients in good standing")
        self.threads, self.kept = threads, kept
        self.running: dict[str, bool] = {}  # client → whether it was a suspect
        self.suspects: OrderedDict[str, None] = OrderedDict()  # oldest failure first

    def take(self, client: str) -> bool:
        """A thread for ``client``; False when none is free to it or it already has one."""
        if len(self.running) >= self.threads or client in self.running:
            return False
        suspect = client in self.suspects
        if suspect and sum(self.running.values()) >= self.threads - 1:
            return False
        self.running[client] = suspect
        return True

    def give_back(self, client: str, failed: bool) -> None:
        """Free ``client``'s thread; a failure makes it a suspect, a success clears it."""
        del self.running[client]
        if not failed:
            self.suspects.pop(client, None)
            return
        self.suspects[client] = None
        self.suspects.move_to_end(client)
        if len(self.suspects) > self.kept:
            self.suspects.popitem(last=False)


def uniform_checkpw(password: bytes, hashed: bytes, top_cost: int) -> bool:
    """bcrypt's verdict; a failure does the work of a check at ``top_cost`` whatever the hash.

    A hash of cost c does 2**c rounds. After a failure, decoys of costs c, c+1, …,
    top_cost-1 add 2**top_cost - 2**c rounds: the same total for every user named,
    so a failure takes as long as one at the costliest hash, on a busy machine too.
    """
    import bcrypt  # only with basic auth: 0.4 MiB of resident memory otherwise (issue 31)

    if bcrypt.checkpw(password, hashed):
        return True
    for cost in range(int(hashed[4:6]), top_cost):
        bcrypt.checkpw(password, _decoy(cost))
    return False


def _decoy(cost: int) -> bytes:
    """A well-formed bcrypt hash of ``cost`` whose salt matches no password."""
    return b"$2b$%02d$" % cost + b"." * 53


def client_key(remote: str | None) -> str:
    """The client's address, IPv6 by /64: the unit that gets one check at a time."""
    try:
        address = ipaddress.ip_address(remote or "")
    except ValueError:
        return remote or ""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    if isinstance(address, ipaddress.IPv6Address):
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def basic_credentials(header: str | None) -> tuple[str, bytes] | None:
    """(user, password) from an ``Authorization: Basic`` value; the password stays bytes."""
    scheme, _, encoded = (header or "").strip().partition(" ")
    try:
        user, colon, password = base64.b64decode(encoded.strip(), validate=True).partition(b":")
        return (user.decode("utf-8"), password) if scheme.lower() == "basic" and colon else None
    except (ValueError, UnicodeDecodeError):  # binascii.Error is a ValueError
        return None


def peer_has_allowed_san(request: web.Request, allowed: tuple[str, ...]) -> bool:
    """True when the client's verified certificate names one of ``allowed``.

    As in the toolkit, only DNS, IP, e-mail and URI names count; a directory name,
    an ``otherName`` or a registered ID is skipped, never compared (Python spells
    some as nested tuples, others as ``<unsupported>``).
    """
    transport = request.transport
    cert = transport.get_extra_info("peercert") if transport is not None else None
    sans = cert.get("subjectAltName", ()) if isinstance(cert, dict) else ()
    names = {
        _normal(value) for kind, value in sans if kind in _SAN_KINDS and isinstance(value, str)
    }
    return any(_normal(name) in names for name in allowed)


def _normal(name: str) -> str:
    """IP addresses compare by value (Python spells IPv6 SANs in full)."""
    try:
        return str(ipaddress.ip_address(name.strip()))
    except ValueError:
        return name.strip()
