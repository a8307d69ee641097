"""Reload (/reload and SIGHUP) and the operator pages, against a real PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from exporter import __version__
from exporter.collect.budget import Budget
from exporter.config.flags import version_text
from exporter.config.loading import load_definitions
from exporter.report.explain import plan_all
from exporter.web.appstate import STATE
from rigs.localpg import LocalCluster
from tests.fixtures.helpers import REPO, settings_for, value
from tests.fixtures.polling import poll, wait_for
from tests.fixtures.rawhttp import RawClient, Served, get, serving


def _collector(key: str, column: str, value: str = "1", source: str = "") -> str:
    return (
        f"{key}:\n  query: SELECT {value} AS {column} {source}\n  timeout: 5\n  metrics:\n"
        f"    - {column}: {{usage: GAUGE, description: a value}}\n"
    )


@pytest.fixture
async def served_dir(pg18: LocalCluster, tmp_path: Path) -> AsyncIterator[tuple[Served, Path]]:
    """The exporter serving a directory config of one collector file."""
    (tmp_path / "0100-first.yml").write_text(_collector("first", "a"))
    settings = replace(settings_for(pg18, auto_discovery=False), config=str(tmp_path))
    async with serving(settings, load_definitions(str(tmp_path))) as served:
        yield served, tmp_path


async def _reload(served: Served, method: str = "POST") -> tuple[int, str]:
    client = await RawClient.send(served.port, "/reload", method=method)
    response = await client.response()
    return response.status, response.text


async def test_added_collector_appears_after_reload(served_dir: tuple[Served, Path]) -> None:
    """A collector file added to the directory is served after /reload."""
    served, directory = served_dir
    assert value((await get(served.port)).text, "first_a") == 1
    (directory / "0200-second.yml").write_text(_collector("second", "b", "2"))
    status, text = await _reload(served)
    assert status == 200, text
    body = (await get(served.port)).text
    assert value(body, "first_a") == 1
    assert value(body, "second_b") == 2


async def test_broken_config_keeps_the_running_one(
    pg18: LocalCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An invalid file makes /reload answer 500 with the reasons; the old config serves on."""
    path = tmp_path / "collectors.yml"
    path.write_text(_collector("kept", "a"))
    settings = replace(settings_for(pg18, auto_discovery=False), config=str(path))
    async with serving(settings, load_definitions(str(path))) as served:
        path.write_text("kept:\n  query: ''\n  ttl: -5\n  metrics: []\n")
        status, text = await _reload(served, "GET")
        assert status == 500
        assert "kept.query" in text
        assert "kept.ttl" in text  # every problem, not only the first
        assert "reload failed" in caplog.text
        assert value((await get(served.port)).text, "kept_a") == 1


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH"])
async def test_other_methods_are_not_allowed(served_dir: tuple[Served, Path], method: str) -> None:
    """/reload takes GET and POST only."""
    status, _ = await _reload(served_dir[0], method)
    assert status == 405


async def test_reload_waits_for_no_pass_and_breaks_none(pg18: LocalCluster, tmp_path: Path) -> None:
    """A reload during a pass answers at once; that pass keeps the old collectors and the
    next pass uses the new ones, with statistics reset."""
    m = f"m{uuid.uuid4().hex[:8]}"
    path = tmp_path / "collectors.yml"
    path.write_text(_collector("slow", m, source="FROM pg_sleep(0.8)"))
    settings = replace(settings_for(pg18, auto_discovery=False), config=str(path))
    async with serving(settings, load_definitions(str(path))) as served:
        in_flight = await RawClient.send(served.port)
        exporter = served.app[STATE].exporter
        await poll(exporter.lock.locked, "the pass to start")
        path.write_text(path.read_text() + _collector("added", "b"))
        started = time.monotonic()
        status, _ = await _reload(served)
        assert status == 200
        assert time.monotonic() - started < 0.5  # did not wait for the pass
        assert exporter.lock.locked(), "answered while the pass still ran"
        old = (await in_flight.response()).text
        assert value(old, f"slow_{m}") == 1
        assert "added_b" not in old
        new = (await get(served.port)).text
        assert value(new, "added_b") == 1
        assert value(new, "pg_exporter_query_scrape_total_count", query="slow") == 1


async def test_explain_and_stat_render_html_for_browsers(
    served_dir: tuple[Served, Path],
) -> None:
    """/explain and /stat are plain text by default and HTML when a browser asks."""
    served, _ = served_dir
    await get(served.port)
    for path in ("/explain", "/stat"):
        text = await get(served.port, path)
        assert text.headers["Content-Type"].startswith("text/plain")
        page = await get(served.port, path, Accept="text/html,application/xhtml+xml")
        assert page.headers["Content-Type"].startswith("text/html")
        assert "<pre>" in page.text
        assert "first" in page.text


async def test_version_page_says_what_the_version_flag_says(
    served_dir: tuple[Served, Path],
) -> None:
    """/version is the text of --version: the exporter's, Python's and the platform's."""
    served, _ = served_dir
    page = await get(served.port, "/version")
    assert page.status == 200
    assert page.text == version_text() + "\n"
    assert f"pg_exporter version {__version__}" in page.text


async def test_explain_waits_for_a_pass_only_within_its_budget(
    served_dir: tuple[Served, Path],
) -> None:
    """--explain's planning behind a pass that holds the lock answers when its budget
    ends, and then plans again once the lock is free: like a scrape, it waits within its
    budget (B5)."""
    served, _ = served_dir
    exporter = served.app[STATE].exporter
    await exporter.lock.acquire()  # a pass that outlives the budget
    try:
        started = time.monotonic()
        busy = await plan_all(exporter, Budget.starting_now(0.3))
        assert time.monotonic() - started < 0.3 + 2.0
        assert "still running" in busy
    finally:
        exporter.lock.release()
    assert "first" in await plan_all(exporter, Budget.starting_now(10))


def test_sighup_reloads_a_running_process(pg18: LocalCluster, tmp_path: Path) -> None:
    """SIGHUP reloads the config of a running exporter process."""
    (tmp_path / "0100-first.yml").write_text(_collector("first", "a"))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "exporter", "-u", pg18.dsn(), "-c", str(tmp_path),
         "--web.listen-address", f"127.0.0.1:{port}", "-T", "5000", "--no-auto-discovery"],
        cwd=REPO, env={**os.environ}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(lambda: _scrape(port) is not None, "the exporter to serve")
        (tmp_path / "0200-second.yml").write_text(_collector("second", "b", "2"))
        process.send_signal(signal.SIGHUP)
        wait_for(lambda: "second_b 2" in (_scrape(port) or ""), "the reloaded collector")
    finally:
        process.terminate()
        process.wait(timeout=30)


def _scrape(port: int) -> str | None:
    try:
        return asyncio.run(get(port)).text
    except OSError:
        return None
