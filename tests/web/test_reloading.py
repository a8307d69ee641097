"""Reload without a database: what a reload reads, when it parses, and how a flood of
requests shares at most two reloads (exporter.web.reloading)."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import ssl
import subprocess
import threading
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from exporter.collect.exporter import Exporter
from exporter.config.definitions import Definitions
from exporter.config.loading import load_for_settings
from exporter.config.settings import Settings
from exporter.config.targetsfile import Declared, load_targets
from exporter.fleet.members import Fleet
from exporter.pg.connections import Logins
from exporter.web import reloading
from exporter.web.reloading import Reloader, ReloadResult, fingerprint, settle_heap
from exporter.web.webconfig import load_web_config, ssl_context
from tests.fixtures.polling import poll

NOWHERE = "postgresql://monitor@127.0.0.1:1/postgres?sslmode=disable"
WAIT = 30.0  # seconds: a deadline on conditions that hold in milliseconds


def collectors(count: int) -> str:
    """A valid collector file of ``count`` branches."""
    return "".join(
        f"pg_c{n}:\n  query: SELECT 1 AS one\n  metrics:\n    - one: {{usage: GAUGE}}\n"
        for n in range(count)
    )


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "collectors.yml"
    path.write_text(collectors(1))
    return path


class CountedLoads:
    """The real loader, counted; ``gate`` (when set) holds each load, once it has read
    the files, until it is set."""

    def __init__(self) -> None:
        self.calls = 0
        self.entered = threading.Event()
        self.gate: threading.Event | None = None

    def __call__(self, settings: Settings) -> Definitions:
        self.calls += 1
        definitions = load_for_settings(settings)
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(WAIT), "the test never released the load"
        return definitions


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> CountedLoads:
    counted = CountedLoads()
    monkeypatch.setattr(reloading, "load_for_settings", counted)
    return counted


@pytest.fixture
async def exporter(config: Path) -> AsyncIterator[Exporter]:
    """A single target's exporter that never connects (nothing scrapes it)."""
    settings = Settings(url=NOWHERE, config=str(config))
    made = Exporter(settings, load_for_settings(settings))
    yield made
    await made.close()


async def _write(path: Path, text: str) -> None:
    await asyncio.to_thread(path.write_text, text)


def _reloader(exporter: Exporter) -> Reloader:
    return Reloader(exporter.settings, exporter=exporter)


# --- fingerprint ---------------------------------------------------------------------------


def _print(
    path: Path | str, tls: ssl.SSLContext | None = None, web: str | None = None
) -> tuple[str, str]:
    return fingerprint(Settings(url=NOWHERE, config=str(path), web_config_file=web), tls)


def test_fingerprint_follows_content_not_time(config: Path) -> None:
    """Same bytes written again keep the fingerprint; one changed byte changes it."""
    before = _print(config)
    config.write_text(collectors(1))
    os.utime(config, (1, 1))
    assert _print(config) == before
    config.write_text(collectors(1).replace("one", "two"))
    assert _print(config) != before


def test_fingerprint_of_a_directory_sees_files_come_and_go(tmp_path: Path) -> None:
    """In directory mode a new or removed file changes the fingerprint; a subdirectory
    does not count."""
    (tmp_path / "a.yml").write_text(collectors(1))
    before = _print(tmp_path)
    (tmp_path / "sub").mkdir()
    assert _print(tmp_path) == before
    (tmp_path / "b.yml").write_text(collectors(1))
    assert _print(tmp_path) != before
    (tmp_path / "b.yml").unlink()
    assert _print(tmp_path) == before


def test_files_the_loader_ignores_do_not_count(tmp_path: Path) -> None:
    """In directory mode only the collector files the loader reads (``*.yml``,
    ``*.yaml``) count: an editor's swap file or a README changing is no reason to parse
    again and drop every plan and cache."""
    (tmp_path / "a.yml").write_text(collectors(1))
    before = _print(tmp_path)
    (tmp_path / ".a.yml.swp").write_text("editing")
    (tmp_path / "README").write_text("notes")
    (tmp_path / "a.yml~").write_text(collectors(2))
    assert _print(tmp_path) == before
    (tmp_path / "b.yaml").write_text(collectors(1))
    assert _print(tmp_path) != before


def test_fingerprint_of_a_missing_file_changes_when_it_appears(tmp_path: Path) -> None:
    """A missing config has a stable fingerprint of its own, until it is created."""
    path = tmp_path / "later.yml"
    assert _print(path) == _print(path)
    before = _print(path)
    path.write_text("")
    assert _print(path) != before


def test_fingerprint_never_opens_a_fifo(tmp_path: Path) -> None:
    """A FIFO as the config is fingerprinted by its kind: opening it would block forever."""
    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)
    done = threading.Event()
    found: list[tuple[str, str]] = []

    def work() -> None:
        found.append(_print(fifo))
        done.set()

    threading.Thread(target=work, daemon=True).start()
    assert done.wait(WAIT), "fingerprint blocked on a FIFO"
    assert found == [_print(fifo)]


def test_a_huge_file_is_fingerprinted_by_size_and_time(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beyond the hashing limit only size and mtime count (the content is not read)."""
    monkeypatch.setattr(reloading, "_HASH_LIMIT", 8)
    os.utime(config, ns=(10**18, 10**18))
    before = _print(config)
    config.write_text(collectors(1).replace("one", "two"))  # same size
    os.utime(config, ns=(10**18, 10**18))
    assert _print(config) == before
    os.utime(config, ns=(10**18, 10**18 + 1))
    assert _print(config) != before


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A fresh self-signed certificate and key at the same two paths each time."""
    cert, key = directory / "tls.crt", directory / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=x"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def _tls_web_config(directory: Path) -> Path:
    cert, key = _self_signed(directory)
    web = directory / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    return web


def test_the_web_config_counts_apart_from_the_collectors(tmp_path: Path, config: Path) -> None:
    """A change of the web config changes its own fingerprint, not the collectors'."""
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users: {}\n")
    before = _print(config, None, str(web))
    web.write_text("{}\n")
    after = _print(config, None, str(web))
    assert after[0] == before[0]
    assert after[1] != before[1]


def test_the_certificate_counts_only_with_tls_on(tmp_path: Path, config: Path) -> None:
    """A renewed certificate changes the web fingerprint when TLS is on, and nothing
    when it is off (the listener has no certificate to renew)."""
    web = _tls_web_config(tmp_path)
    tls = ssl_context(load_web_config(str(web)).tls)  # type: ignore[arg-type]
    off, on = _print(config, None, str(web)), _print(config, tls, str(web))
    _self_signed(tmp_path)
    assert _print(config, None, str(web)) == off
    renewed = _print(config, tls, str(web))
    assert renewed[0] == on[0]
    assert renewed[1] != on[1]


# --- one reload ----------------------------------------------------------------------------


async def test_unchanged_files_parse_nothing(exporter: Exporter, loads: CountedLoads) -> None:
    """A reload of the same files says so, parses nothing and schedules nothing."""
    result = await _reloader(exporter).reload()
    assert result == ReloadResult(True, f"{exporter.settings.config} unchanged; "
                                        "the running config stays as it is")  # fmt: skip
    assert loads.calls == 0
    assert exporter.pending is None


async def test_a_changed_config_is_scheduled_for_the_next_pass(
    exporter: Exporter, config: Path, loads: CountedLoads
) -> None:
    """A changed valid config is parsed once and handed to the exporter for its next pass."""
    reloader = _reloader(exporter)
    await _write(config, collectors(3))
    result = await reloader.reload()
    assert result.ok
    assert result.message.startswith(f"reloaded 3 collectors from {config}")
    assert exporter.pending is not None
    assert len(exporter.pending.collectors) == 3
    assert (loads.calls, reloader.reloads) == (1, 1)
    assert (await reloader.reload()).message.endswith(
        "unchanged; the running config stays as it is"
    )
    assert loads.calls == 1


async def test_a_broken_config_keeps_the_running_one_and_is_parsed_once(
    exporter: Exporter, config: Path, loads: CountedLoads, caplog: pytest.LogCaptureFixture
) -> None:
    """A broken config fails the reload (not ok, saying why), schedules nothing, and the
    same broken files are not parsed again by the next requests; fixing them works."""
    reloader = _reloader(exporter)
    await _write(config, "pg_bad:\n  query: SELECT 1\n  metrics: nope\n")
    caplog.set_level(logging.ERROR, logger=reloading.__name__)
    first = await reloader.reload()
    assert not first.ok
    assert first.message.startswith("reload failed, the running config stays:\n")
    assert str(config) in first.message
    assert await reloader.reload() == first
    assert loads.calls == 1
    assert len(caplog.records) == 1  # one log line, not one per request
    assert exporter.pending is None
    await _write(config, collectors(2))
    assert (await reloader.reload()).ok
    assert exporter.pending is not None
    assert len(exporter.pending.collectors) == 2


async def test_a_reload_lets_refused_logins_try_again_at_once(exporter: Exporter) -> None:
    """The operator may have fixed the password: a reload forgets the login back-off."""
    logins = exporter.connections.logins

    async def refused() -> None:
        raise psycopg.OperationalError('FATAL:  password authentication failed for user "m"')

    with pytest.raises(psycopg.OperationalError):
        await logins.connect(None, refused)
    assert logins.wait() > 0
    await _reloader(exporter).reload()
    assert logins.wait() == 0


async def test_removing_tls_from_the_web_config_needs_a_restart(
    exporter: Exporter, tmp_path: Path, config: Path
) -> None:
    """With TLS on, a web config that drops tls_server_config fails the reload, saying a
    restart is needed, and the running listener keeps its certificate."""
    web = tmp_path / "web.yml"
    await _write(web, "{}\n")
    settings = Settings(url=NOWHERE, config=str(config), web_config_file=str(web))
    reloader = Reloader(settings, exporter=exporter)
    reloader.tls_context = ssl.create_default_context()
    reloader.rebase()
    await _write(web, "basic_auth_users: {}\n")
    result = await reloader.reload()
    assert not result.ok
    assert f"{web}: tls_server_config was removed; TLS changes need a restart" in result.message


async def test_a_changed_web_config_alone_keeps_plans_and_caches(
    exporter: Exporter, config: Path, tmp_path: Path, loads: CountedLoads
) -> None:
    """Only the web config changed (a renewed certificate, say): the collector config
    is not parsed again, and the exporter keeps its plans and caches."""
    web = tmp_path / "web.yml"
    await _write(web, "{}\n")
    settings = Settings(url=NOWHERE, config=str(config), web_config_file=str(web))
    reloader = Reloader(settings, exporter=exporter)
    await _write(web, "basic_auth_users: {}\n")
    assert await reloader.reload() == ReloadResult(True, "the web config was read again")
    assert loads.calls == 0
    assert exporter.pending is None


async def test_a_renewed_certificate_is_loaded_without_touching_the_collectors(
    exporter: Exporter, config: Path, tmp_path: Path, loads: CountedLoads
) -> None:
    """With TLS on, a reload after the certificate was renewed loads it, and parses no
    collector file: the exporter keeps its plans and caches."""
    web = await asyncio.to_thread(_tls_web_config, tmp_path)
    settings = Settings(url=NOWHERE, config=str(config), web_config_file=str(web))
    reloader = Reloader(settings, exporter=exporter)
    reloader.tls_context = ssl_context(load_web_config(str(web)).tls)  # type: ignore[arg-type]
    reloader.rebase()
    await asyncio.to_thread(_self_signed, tmp_path)
    result = await reloader.reload()
    assert result == ReloadResult(True, f"certificate {tmp_path / 'tls.crt'} reloaded")
    assert loads.calls == 0
    assert exporter.pending is None


# --- a flood -------------------------------------------------------------------------------


async def test_a_flood_costs_at_most_two_reloads_and_misses_no_change(
    exporter: Exporter, config: Path, loads: CountedLoads
) -> None:
    """Requests arriving during a reload share one more reload, which starts when the
    running one ends and reads the files as they are then: a change made meanwhile is
    applied, and fifty requests cost two parses."""
    reloader = _reloader(exporter)
    loads.gate = threading.Event()
    await _write(config, collectors(2))
    first = asyncio.create_task(reloader.reload())
    await poll(loads.entered.is_set)
    await _write(config, collectors(5))  # changed while the first reload parses
    flood = [asyncio.create_task(reloader.reload()) for _ in range(50)]
    await asyncio.sleep(0)
    assert loads.calls == 1  # the flood waits behind the running reload
    loads.gate.set()
    results = await asyncio.gather(first, *flood)
    assert loads.calls == 2
    assert results[0].message.startswith("reloaded 2 collectors")
    assert all(r == results[1] for r in results[1:])
    assert results[1].message.startswith("reloaded 5 collectors")
    assert exporter.pending is not None
    assert len(exporter.pending.collectors) == 5
    assert (reloader.running, reloader.queued) == (None, None)


async def test_a_requester_that_hangs_up_does_not_cancel_the_reload(
    exporter: Exporter, config: Path, loads: CountedLoads
) -> None:
    """A request cancelled while its reload runs (a client gone) leaves the reload to
    finish for everyone else."""
    reloader = _reloader(exporter)
    loads.gate = threading.Event()
    await _write(config, collectors(4))
    gone = asyncio.create_task(reloader.reload())
    await poll(loads.entered.is_set)
    gone.cancel()
    staying = asyncio.create_task(reloader.reload())  # queued behind the running one
    loads.gate.set()
    assert (await staying).ok
    assert gone.cancelled()
    assert exporter.pending is not None
    assert len(exporter.pending.collectors) == 4


# --- fleet ---------------------------------------------------------------------------------


TARGETS = "targets:\n" + "".join(
    f"  - {{name: t{n}, url: 'postgresql://monitor@127.0.0.1:1/d{n}?sslmode=disable'}}\n"
    for n in range(3)
)


@pytest.fixture
async def fleet(tmp_path: Path, config: Path) -> AsyncIterator[Fleet]:
    targets = tmp_path / "targets.yml"
    await _write(targets, TARGETS)
    settings = Settings(url=NOWHERE, config=str(config), targets_file=str(targets))
    declared: Declared = load_targets(str(targets), settings)
    started = Fleet(settings, declared, load_for_settings(settings))
    started.start()
    yield started
    await started.close()


async def test_fleet_reload_of_unchanged_files_names_both(fleet: Fleet) -> None:
    """In fleet mode the unchanged answer names the config and the targets file."""
    settings = fleet.settings
    result = await Reloader(settings, fleet=fleet).reload()
    assert result == ReloadResult(
        True,
        f"{settings.config} and {settings.targets_file} unchanged; "
        "the running config stays as it is",
    )


async def test_fleet_reload_applies_a_changed_targets_file(
    fleet: Fleet, loads: CountedLoads
) -> None:
    """A changed targets file is applied (the summary says what changed) without parsing
    the unchanged collector config; the members left as they were are kept."""
    reloader = Reloader(fleet.settings, fleet=fleet)
    kept = fleet.member("t0")
    assert fleet.settings.targets_file is not None
    await _write(
        Path(fleet.settings.targets_file),
        TARGETS.replace("name: t2", "name: t9").replace("/d1?", "/other?"),
    )
    result = await reloader.reload()
    assert result == ReloadResult(True, "targets: 1 added, 1 changed, 1 removed, 3 in all")
    assert loads.calls == 0
    assert fleet.member("t0") is kept
    assert sorted(fleet.members) == ["t0", "t1", "t9"]


async def test_fleet_reload_of_a_broken_targets_file_keeps_the_fleet(fleet: Fleet) -> None:
    """A broken targets file fails the reload and leaves every member in place."""
    before = dict(fleet.members)
    reloader = Reloader(fleet.settings, fleet=fleet)
    assert fleet.settings.targets_file is not None
    await _write(Path(fleet.settings.targets_file), "targets: [{name: t0}]\n")
    result = await reloader.reload()
    assert not result.ok
    assert fleet.settings.targets_file in result.message
    assert fleet.members == before


async def test_fleet_reload_of_the_web_config_alone_keeps_every_members_caches(
    fleet: Fleet, tmp_path: Path, loads: CountedLoads
) -> None:
    """In a fleet too, a web config change reschedules no member's collectors."""
    web = tmp_path / "web.yml"
    await _write(web, "{}\n")
    settings = replace(fleet.settings, web_config_file=str(web))
    reloader = Reloader(settings, fleet=fleet)
    await _write(web, "basic_auth_users: {}\n")
    assert (await reloader.reload()).ok
    assert loads.calls == 0
    assert all(m.state.exporter.pending is None for m in fleet.members.values())


async def test_a_flood_forgets_refused_logins_once_a_reload_not_once_a_request(
    fleet: Fleet, loads: CountedLoads, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every reload lets each target log in at once again, but a flood of requests
    does it once per reload run, not once per request: at 10 000 targets each pass
    over them holds the event loop for milliseconds (issue 25 made /reload harmless)."""
    resets = 0

    def counted(self: object) -> None:
        nonlocal resets
        resets += 1

    monkeypatch.setattr(Logins, "reset", counted)
    reloader = Reloader(fleet.settings, fleet=fleet)
    loads.gate = threading.Event()
    assert fleet.settings.config is not None
    await _write(Path(fleet.settings.config), collectors(2))
    first = asyncio.create_task(reloader.reload())
    await poll(loads.entered.is_set)
    flood = [asyncio.create_task(reloader.reload()) for _ in range(50)]
    await asyncio.sleep(0)
    loads.gate.set()
    await asyncio.gather(first, *flood)
    assert resets == 2 * len(fleet.members)  # two reload runs, each member once


async def test_a_fleet_reload_lets_every_member_log_in_again(fleet: Fleet) -> None:
    """After a reload, no member waits for a refused login's back-off."""
    member = fleet.member("t1")
    assert member is not None
    logins = member.state.exporter.connections.logins

    async def refused() -> None:
        raise psycopg.OperationalError('FATAL:  password authentication failed for user "m"')

    with pytest.raises(psycopg.OperationalError):
        await logins.connect(None, refused)
    assert logins.wait() > 0
    await Reloader(fleet.settings, fleet=fleet).reload()
    assert logins.wait() == 0


def test_settle_heap_freezes_what_is_alive() -> None:
    """After settle_heap the objects alive are exempt from later collections."""
    try:
        gc.unfreeze()
        assert gc.get_freeze_count() == 0
        settle_heap()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
