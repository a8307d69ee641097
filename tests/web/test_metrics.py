"""The telemetry path without PostgreSQL: admission (B1), formats, what the answer holds,
and the log throttle. The target is unreachable, so every pass fails at once and
answers ``pg_up 0``; passes against a real server are in tests/integration/.
"""

from __future__ import annotations

import asyncio
import gzip
import time
from collections.abc import Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp.plugin import AiohttpClient

from exporter.collect.admission import Admission
from exporter.config.definitions import Definitions
from exporter.config.settings import Settings
from exporter.expose.exposition import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE
from exporter.web.app import create_app
from exporter.web.appstate import STATE
from exporter.web.metrics import Answer, Throttle, expose

Client = TestClient[web.Request, web.Application]
NOWHERE = "postgresql://monitor@127.0.0.1:1/postgres?sslmode=disable"
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def _settings(**fields: object) -> Settings:
    return Settings(url=NOWHERE, connect_timeout=0.1, auto_discovery=False, **fields)  # type: ignore[arg-type]


async def _client(aiohttp_client: AiohttpClient, **fields: object) -> Client:
    client: Client = await aiohttp_client(create_app(_settings(**fields), Definitions(())))
    return client


def _names(body: str) -> set[str]:
    """The family names an exposition declares."""
    return {line.split()[2] for line in body.splitlines() if line.startswith("# TYPE ")}


async def test_an_unreachable_target_answers_pg_up_0(aiohttp_client: AiohttpClient) -> None:
    """The exposition is served (200, text format) with pg_up 0, the self-metrics and the
    process's own metrics."""
    client = await _client(aiohttp_client)
    response = await client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"] == TEXT_CONTENT_TYPE
    body = await response.text()
    assert "\npg_up 0.0\n" in body
    names = _names(body)
    assert {"pg_exporter_scrape_total_count", "process_cpu_seconds_total"} <= names


async def test_disable_intro_leaves_out_the_self_metrics(aiohttp_client: AiohttpClient) -> None:
    """``--disable-intro``: no ``pg_exporter_*`` family; the process metrics stay."""
    client = await _client(aiohttp_client, disable_intro=True)
    names = _names(await (await client.get("/metrics")).text())
    assert not {n for n in names if n.startswith("pg_exporter_")}
    assert "process_cpu_seconds_total" in names


async def test_openmetrics_only_when_enabled_and_asked(aiohttp_client: AiohttpClient) -> None:
    """OpenMetrics is answered only with --web.enable-openmetrics and an Accept asking
    for it; otherwise the text format, as the Go exporter always answers."""
    off = await _client(aiohttp_client)
    response = await off.get("/metrics", headers={"Accept": OPENMETRICS})
    assert response.headers["Content-Type"] == TEXT_CONTENT_TYPE
    on = await _client(aiohttp_client, openmetrics=True)
    response = await on.get("/metrics", headers={"Accept": OPENMETRICS})
    assert response.headers["Content-Type"] == OPENMETRICS_CONTENT_TYPE
    assert (await response.text()).endswith("# EOF\n")
    plain = await on.get("/metrics", headers={"Accept": "text/plain"})
    assert plain.headers["Content-Type"] == TEXT_CONTENT_TYPE


async def test_gzip_only_when_accepted(aiohttp_client: AiohttpClient) -> None:
    """The answer is gzipped when the client accepts gzip, plain otherwise."""
    client = await _client(aiohttp_client)
    zipped = await client.get("/metrics", headers={"Accept-Encoding": "gzip"})
    assert zipped.headers["Content-Encoding"] == "gzip"
    plain = await client.get("/metrics", headers={"Accept-Encoding": "identity"})
    assert "Content-Encoding" not in plain.headers
    assert "\npg_up 0.0\n" in await plain.text()


async def test_head_gets_the_headers_and_no_body(aiohttp_client: AiohttpClient) -> None:
    """HEAD on the telemetry path answers GET's status and headers without the body (as
    the Go exporter's server does), so the kept-alive connection stays in step: a body
    sent after a HEAD answer would be read as the next answer's status line."""
    client = await _client(aiohttp_client)
    for encoding in ("gzip", "identity"):
        head = await client.head("/metrics", headers={"Accept-Encoding": encoding})
        assert head.status == 200
        assert head.headers["Content-Type"] == TEXT_CONTENT_TYPE
        assert int(head.headers["Content-Length"]) > 0
        assert await head.read() == b""
        after = await client.get("/metrics", headers={"Accept-Encoding": encoding})
        assert after.status == 200
        assert "\npg_up 0.0\n" in await after.text()
    admission = client.app[STATE].admission
    assert (admission.collecting, admission.writing) == (0, 0)


async def test_a_full_admission_answers_503_at_once_without_a_pass(
    aiohttp_client: AiohttpClient,
) -> None:
    """Every slot held: 503 saying how many are served, counted as rejected, and no
    pass runs (B1)."""
    client = await _client(aiohttp_client)
    state = client.app[STATE]
    state.admission = Admission(limit=1)
    with state.admission.slot() as held:
        assert held
        response = await client.get("/metrics")
        assert response.status == 503
        text = await response.text()
    assert text.startswith("too many concurrent scrapes (1 are being served)")
    assert state.admission.rejected == 1
    assert state.exporter.stats.scrapes == 0
    assert (await client.get("/metrics")).status == 200  # the slot back: admitted again


async def test_answers_to_non_readers_fill_admission_with_their_own_message(
    aiohttp_client: AiohttpClient,
) -> None:
    """As many answers being written as allowed: 503 blaming clients that do not read."""
    client = await _client(aiohttp_client)
    state = client.app[STATE]
    state.admission = Admission(limit=2, write_limit=1)
    with state.admission.writer():
        response = await client.get("/metrics")
    assert response.status == 503
    assert "1 answers are being sent to clients that do not read them" in await response.text()


async def test_the_slot_is_given_back_after_every_answer(aiohttp_client: AiohttpClient) -> None:
    """After answers (plain, gzipped, refused) no slot or writer place stays taken (B3)."""
    client = await _client(aiohttp_client)
    admission = client.app[STATE].admission
    for encoding in ("gzip", "identity", "gzip"):
        assert (await client.get("/metrics", headers={"Accept-Encoding": encoding})).status == 200
    assert (admission.collecting, admission.writing) == (0, 0)
    assert admission.admitted == 3


async def test_a_fleet_probe_leaves_out_the_process_metrics(aiohttp_client: AiohttpClient) -> None:
    """``runtime=False`` (a fleet's /probe): the target's families without the process's."""
    app = create_app(_settings(), Definitions(()))

    async def probe(request: web.Request) -> web.StreamResponse:
        return await expose(request, request.app[STATE], runtime=False)

    app.router.add_get("/probe", probe)
    client: Client = await aiohttp_client(app)
    names = _names(await (await client.get("/probe")).text())
    assert "pg_up" in names
    assert not {n for n in names if n.startswith(("process_", "python_"))}


async def test_a_gzipped_body_is_made_once_and_survives_a_hang_up() -> None:
    """Requests sharing an answer share one compression; one requester cancelled does
    not stop it for the others."""
    answer = Answer(b"pg_up 1\n" * 1000, TEXT_CONTENT_TYPE)
    first = asyncio.create_task(answer.gzipped())
    second = asyncio.create_task(answer.gzipped())
    await asyncio.sleep(0)
    first.cancel()
    body = await second
    assert gzip.decompress(body) == answer.body
    assert await answer.gzipped() is body


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], None]:
    """time.monotonic, moved by hand (Throttle reads it); returns the mover."""
    fake = _Clock()
    monkeypatch.setattr(time, "monotonic", fake)

    def advance(seconds: float) -> None:
        fake.now += seconds

    return advance


def test_throttle_lets_one_line_a_period_and_counts_the_rest(
    clock: Callable[[float], None],
) -> None:
    """The first line passes; those within the period are held and counted; the next
    one after the period passes and reports how many were held."""
    throttle = Throttle(10.0)
    assert throttle.allow() == 0
    clock(1.0)
    assert throttle.allow() is None
    clock(8.0)
    assert throttle.allow() is None
    assert throttle.suppressed == 2
    clock(1.5)
    assert throttle.allow() == 2
    assert throttle.suppressed == 0
    clock(10.0)
    assert throttle.allow() == 0
